"""adjust, adjust_, freeze_, thaw_ and selection by key path."""

from __future__ import annotations

import numpy as np
import pytest

import optimisers as O
from optimisers.adjust import covering, matches
from optimisers.keypath import KeyPath
from optimisers.leaf import leaves


def model():
    w = np.ones((2, 2))
    return {"encoder": {"weight": w, "bias": np.zeros(2), "norm": {"scale": np.ones(2)}},
            "decoder": {"weight": w, "bias": np.zeros(2)}}


def test_adjust_a_bare_rule():
    assert O.adjust(O.Adam(), 0.01) == O.Adam(0.01)
    assert O.adjust(O.OptimiserChain(O.ClipGrad(), O.Adam()), 0.5, delta=1.0) == \
        O.OptimiserChain(O.ClipGrad(1.0), O.Adam(0.5))
    assert O.adjust(O.MixedPrecision(O.Momentum()), rho=0.5).rule == O.Momentum(rho=0.5)


def test_adjust_keeps_state_and_is_pure():
    m = model()
    tree = O.setup(O.Adam(), m)
    tree, m = O.update_(tree, m, O.fmap(np.ones_like, m))
    new = O.adjust(tree, 0.1, beta=(0.8, 0.9))
    assert new["encoder"]["bias"].rule == O.Adam(0.1, (0.8, 0.9))
    assert tree["encoder"]["bias"].rule == O.Adam()
    assert new["encoder"]["bias"].state is tree["encoder"]["bias"].state
    assert new["encoder"]["weight"] is new["decoder"]["weight"]  # sharing kept


def test_adjust_in_place_through_chains():
    m = model()
    tree = O.setup(O.OptimiserChain(O.WeightDecay(0.1), O.Adam()), m)
    O.adjust_(tree, 0.01, lambd=0.0)
    leaf = tree["encoder"]["weight"]
    assert leaf.rule == O.OptimiserChain(O.WeightDecay(0.0), O.Adam(0.01))


def test_adjust_typo_guard():
    tree = O.setup(O.Adam(), model())
    with pytest.raises(TypeError, match="no rule here has a field 'bta'"):
        O.adjust(tree, bta=(0.8, 0.9))
    with pytest.raises(TypeError, match="no rule here has a field 'lambd'"):
        O.adjust_(tree, lambd=0.1)
    # a field that some rules have is fine, the others ignore it
    tree = O.setup(O.OptimiserChain(O.ClipGrad(), O.Descent()), model())
    assert O.adjust(tree, delta=2.0)["decoder"]["bias"].rule.rules[0] == O.ClipGrad(2.0)


def test_adjust_validates_new_values_before_writing():
    tree = O.setup(O.Adam(), model())
    with pytest.raises(ValueError, match="eta must be >= 0"):
        O.adjust_(tree, -1.0)
    assert all(leaf.rule == O.Adam() for leaf in O.select(tree))


def test_where_globs_and_predicates():
    tree = O.setup(O.AdamW(lambd=0.1), model())
    O.adjust_(tree, where="*.bias", lambd=0.0)
    assert tree["encoder"]["bias"].rule.lambd == 0.0 and tree["decoder"]["bias"].rule.lambd == 0
    assert tree["encoder"]["weight"].rule.lambd == 0.1
    O.freeze_(tree, where="encoder.*")
    assert tree["encoder"]["norm"]["scale"].frozen and tree["encoder"]["bias"].frozen
    # the tied weight is reached from encoder too, so it is frozen
    assert tree["decoder"]["weight"].frozen and not tree["decoder"]["bias"].frozen
    O.thaw_(tree, where=lambda kp, leaf: kp[-1] == "scale")
    assert not tree["encoder"]["norm"]["scale"].frozen and tree["encoder"]["bias"].frozen
    new = O.adjust(tree, 0.5, where="decoder.bias")
    assert new["decoder"]["bias"].rule.eta == 0.5 and new["encoder"]["bias"].rule.eta == 0.001


def test_where_matching_nothing_is_an_error():
    tree = O.setup(O.Adam(), model())
    with pytest.raises(ValueError, match=r"where='\*\.biass' matches no Leaf; the paths are: "
                                         r"encoder.weight"):
        O.freeze_(tree, where="*.biass")
    with pytest.raises(TypeError, match="where= takes a glob string or a predicate"):
        O.freeze_(tree, where=3)


def test_freeze_refuses_model_arrays():
    with pytest.raises(TypeError, match="expected a state tree"):
        O.freeze_(np.ones(2))


def test_adjust_keeps_shared_rules_shared():
    """Leafs that shared one rule object share the adjusted one (one group stays one)."""
    model = {"a": np.ones(2), "b": np.ones(2), "c": np.ones(2)}
    tree = O.setup(O.Adam(0.1), model)
    tree["c"].rule = O.Adam(0.1)  # equal, but its own object
    for new in (O.adjust(tree, 0.01), O.adjust_(tree, 0.01)):
        assert new["a"].rule is new["b"].rule and new["a"].rule.eta == 0.01
        assert new["c"].rule is not new["a"].rule and new["c"].rule == new["a"].rule


def paths(tree, where):
    """The dotted paths of the Leafs ``where`` picks, each tied Leaf by its first path."""
    first = {}
    for kp, leaf in leaves(tree):
        first.setdefault(id(leaf), str(kp))
    return [first[id(leaf)] for leaf in O.select(tree, where)]


def test_where_brackets_are_literal_and_an_escaped_dot_is_a_dot_in_a_key():
    model = {"a[0]": np.ones(1), "a0": np.ones(1), "b.c": np.ones(1), "b": {"c": np.ones(1)},
             "s*": np.ones(1), "q?": np.ones(1), "back\\": {"x": np.ones(1)}}
    tree = O.setup(O.Descent(), model)
    assert paths(tree, "a[0]") == ["a[0]"]  # a glob class before: matched a0
    assert paths(tree, "a?") == ["a0"]
    assert paths(tree, "b.c") == ["b.c"] and O.select(tree, "b.c") == [tree["b"]["c"]]
    assert O.select(tree, r"b\.c") == [tree["b.c"]]  # both before
    assert O.select(tree, r"s\*") == [tree["s*"]] and O.select(tree, r"q\?") == [tree["q?"]]
    assert O.select(tree, "back\\\\.x") == [tree["back\\"]["x"]]
    assert len(O.select(tree, "*c")) == 2  # a star still crosses dots: b.c and b -> c
    assert not matches("b?c", O.KeyPath("b", "c"))  # ? is one character of a key
    with pytest.raises(ValueError, match=r"where='b\\\\' ends in a lone backslash; write "):
        O.select(tree, "b\\")


def test_where_a_prefix_of_whole_keys_selects_the_sub_tree():
    model = {"transformer": {"wte": {"weight": np.ones(2), "bias": np.ones(1)},
                             "wte2": np.ones(3), "h": [{"w": np.ones(1)} for _ in range(11)]},
             "head": np.ones(2)}
    tree = O.setup(O.AdamW(lambd=0.1), model)
    assert paths(tree, "transformer.wte") == ["transformer.wte.weight", "transformer.wte.bias"]
    assert paths(tree, "transformer.h.1") == ["transformer.h.1.w"]  # never h.10
    assert len(O.select(tree, "transformer")) == 14
    assert paths(tree, "*.h.1?") == ["transformer.h.10.w"]
    O.adjust_(tree, where="transformer.wte", lambd=0.0)
    assert [leaf.rule.lambd for leaf in O.select(tree)][:4] == [0.0, 0.0, 0.1, 0.1]
    O.freeze_(tree, "transformer.h")
    assert [leaf.frozen for leaf in O.select(tree)] == [False] * 3 + [True] * 11 + [False]
    assert paths(O.adjust(tree, 0.5, where="head"), "head") == ["head"]
    with pytest.raises(ValueError, match="where='transformer.wt' matches no Leaf"):
        O.thaw_(tree, "transformer.wt")


def test_where_predicate_of_one_argument_is_a_clear_type_error():
    tree = O.setup(O.Adam(), model())
    with pytest.raises(TypeError, match=r"where= takes a predicate of two arguments, \(KeyPath, "
                                        r"Leaf\) -> bool, but <lambda>\(kp\) cannot take two; "
                                        r"write it as lambda kp, leaf: \.\.\."):
        O.freeze_(tree, where=lambda kp: "bias" in str(kp))

    def is_bias(kp, leaf, *rest):
        return kp[-1] == "bias"

    assert len(O.select(tree, is_bias)) == 2
    assert not any(leaf.frozen for leaf in O.select(tree))


def test_covering_picks_every_path_given_and_none_of_the_others():
    paths = [KeyPath("blocks", 0, "ln.1", "w*"), KeyPath("blocks", 1, "ln.1", "w*"),
             KeyPath("head", "b?"), KeyPath("w*")]
    others = [KeyPath("blocks", 0, "mlp", "w*"), KeyPath("head", "bb"), KeyPath("x")]
    found = covering(paths, others)
    assert found == [r"*.ln\.1.w\*", r"*.b\?", r"w\*"]
    assert all(any(matches(p, kp) for p in found) for kp in paths)
    assert not any(matches(p, kp) for p in found for kp in others)
