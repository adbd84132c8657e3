"""adjust, adjust_, freeze_, thaw_ and selection by key path."""

from __future__ import annotations

import numpy as np
import pytest

import optimisers as O


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
