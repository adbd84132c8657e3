"""state_dict and load_state_dict: a flat dict of the tree's own arrays and plain values
that loads back into a tree for the same model; training resumed from it continues bit
for bit. (Through torch.distributed.checkpoint, resharding: test_distributed.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

import optimisers as O
from conftest import ALL_RULES, fitting, rules_param
from optimisers.checkpoint.statedict import rule_form
from optimisers.leaf import Leaf
from optimisers.state import leaves


def make_model(rng):
    return {"enc": {"weight": rng.normal(size=(3, 2)).astype(np.float32),
                    "bias": np.zeros(3, np.float32)},
            "layers": [rng.normal(size=4).astype(np.float32), np.float32(1.0) * np.ones(())],
            "steps": 7}


def copy_model(model):
    return O.fmap(lambda x: x.copy() if isinstance(x, np.ndarray) else x, model)


def grads_at(model, step):
    rng = np.random.default_rng(step)
    return O.fmap(lambda x: rng.normal(size=x.shape).astype(x.dtype)
                  if isinstance(x, np.ndarray) else None, model)


@rules_param(ALL_RULES)
def test_training_resumed_from_a_state_dict_continues_bit_for_bit(rule, rng):
    model = make_model(rng)
    tree = O.setup(fitting(rule), model)
    for step in range(3):
        tree, model = O.update_(tree, model, grads_at(model, step))
    d = O.state_dict(tree)
    json.dumps({k: v for k, v in d.items() if not isinstance(v, np.ndarray)})  # plain
    resumed_model = copy_model(model)
    resumed = O.load_state_dict(O.setup(fitting(rule), resumed_model), d)
    for step in range(3, 6):
        tree, model = O.update_(tree, model, grads_at(model, step))
        resumed, resumed_model = O.update_(resumed, resumed_model, grads_at(model, step))
    for a, b in zip(O.trainables(model), O.trainables(resumed_model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_keys_arrays_and_plain_values(rng):
    model = make_model(rng)
    tree = O.setup(O.OptimiserChain(O.ClipGrad(1.0), O.Adam(0.1)), model)
    O.freeze_(tree, "layers")
    d = O.state_dict(tree)
    assert list(d)[:6] == ["enc.weight.rule", "enc.weight.frozen", "enc.weight.clock",
                           "enc.weight.state.1.0", "enc.weight.state.1.1",
                           "enc.weight.state.1.2"]
    # (ClipGrad's state, None: no key)
    assert d["enc.weight.state.1.0"] is tree["enc"]["weight"].state[1][0]  # the tree's own
    assert d["layers.0.frozen"] is True and d["enc.bias.frozen"] is False
    assert d["enc.weight.rule"] == {"rule": "OptimiserChain", "fields": {"rules": {"tuple": [
        {"rule": "ClipGrad", "fields": {"delta": {"float": "1.0"}}},
        {"rule": "Adam", "fields": {"eta": {"float": "0.1"}, "beta": {"tuple": [
            {"float": "0.9"}, {"float": "0.999"}]}, "epsilon": {"float": "1e-08"}}}]}}}
    assert not any(k.startswith("steps") for k in d)


def test_a_tied_leaf_is_given_once_and_loads_tied():
    w = np.ones(2)
    model = {"a": w, "b": w, "c": np.ones(2)}
    tree = O.setup(O.Momentum(0.1), model)
    O.update_(tree, model, {"a": np.ones(2), "b": np.ones(2), "c": np.ones(2)})
    d = O.state_dict(tree)
    assert [k for k in d if k.endswith(".state")] == ["a.state", "c.state"]
    v = np.ones(2)
    back = O.load_state_dict(O.setup(O.Momentum(0.1), {"a": v, "b": v, "c": np.ones(2)}), d)
    assert back["a"] is back["b"]
    np.testing.assert_array_equal(back["a"].state, tree["a"].state)


def test_loading_writes_into_the_trees_arrays_and_takes_rules_and_flags(rng):
    model = make_model(rng)
    tree = O.adjust_(O.setup(O.Adam(), model), 0.05)
    O.update_(tree, model, grads_at(model, 0))
    O.freeze_(tree, "enc.bias")
    target = O.setup(O.Adam(), make_model(rng))
    before = target["enc"]["weight"].state[0]
    same = O.load_state_dict(target, O.state_dict(tree))
    assert same is target and target["enc"]["weight"].state[0] is before  # in place
    np.testing.assert_array_equal(before, tree["enc"]["weight"].state[0])
    assert target["enc"]["weight"].rule == O.Adam(0.05) and target["enc"]["bias"].frozen
    assert target["enc"]["weight"].state[2] == tree["enc"]["weight"].state[2]


def test_a_rule_equal_to_the_trees_is_kept_as_it_is(rng):
    model = make_model(rng)
    target = O.setup(O.Adam(), make_model(rng))
    rule = target["enc"]["weight"].rule
    O.load_state_dict(target, O.state_dict(O.setup(O.Adam(), model)))
    assert target["enc"]["weight"].rule is rule


def test_a_numpy_scalar_in_a_state_is_a_plain_number():
    class Counting(O.Rule):
        def init(self, x):
            return np.int64(0)

        def apply(self, state, x, dx):
            return state + 1, dx

    model = [np.ones(2)]
    tree = O.setup(Counting(), model)
    O.update_(tree, model, [np.ones(2)])
    d = O.state_dict(tree)
    assert type(d["0.state"]) is int and d["0.state"] == 1
    back = O.load_state_dict(O.setup(Counting(), [np.ones(2)]), d)
    assert type(back[0].state) is np.int64 and back[0].state == 1


def test_an_array_hyper_parameter_is_given_as_its_number():
    tree = O.setup(O.Descent(np.array(0.5, np.float32)), [np.ones(2)])
    assert O.state_dict(tree)["0.rule"] == {"rule": "Descent", "fields": {"eta": {
        "float": "0.5"}}}


def test_a_clock_is_one_more_key_and_optional():
    tree = {"w": Leaf(O.Descent(), None, clock=3)}
    d = O.state_dict(tree)
    assert d == {"w.rule": {"rule": "Descent", "fields": {"eta": {"float": "0.1"}}},
                 "w.frozen": False, "w.clock": 3}
    fresh = {"w": Leaf(O.Descent(), None)}
    assert O.load_state_dict(fresh, d)["w"].clock == 3
    del d["w.clock"]
    assert O.load_state_dict(fresh, d)["w"].clock == 3  # absent: left as it is
    with pytest.raises(ValueError, match="'w.clock' is -1; a clock is a whole number"):
        O.load_state_dict(fresh, {**d, "w.clock": -1})


def test_a_schedule_resumes_at_its_clock(rng):
    rule = O.Adam(O.Cosine(0.1, 0.0, steps=6))
    model = make_model(rng)
    tree = O.setup(rule, model)
    for step in range(3):
        tree, model = O.update_(tree, model, grads_at(model, step))
    d = O.state_dict(tree)
    assert d["enc.weight.clock"] == 3 and d["enc.weight.rule"]["fields"]["eta"] == (
        rule_form(rule)["fields"]["eta"])
    resumed_model = copy_model(model)
    resumed = O.load_state_dict(O.setup(O.Adam(), resumed_model), d)
    for step in range(3, 6):
        tree, model = O.update_(tree, model, grads_at(model, step))
        resumed, resumed_model = O.update_(resumed, resumed_model, grads_at(model, step))
    for a, b in zip(O.trainables(model), O.trainables(resumed_model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_torch_state_stays_packed_and_in_place():
    torch = pytest.importorskip("torch")
    model = [torch.ones(3), torch.ones(2)]
    tree = O.setup(O.Adam(0.1), model)
    O.update_(tree, model, [torch.ones(3), torch.ones(2)])
    target = O.setup(O.Adam(0.1), [torch.ones(3), torch.ones(2)])
    arrays = [a for _, leaf in leaves(target) for a in leaf.state[:2]]
    O.load_state_dict(target, O.state_dict(tree))
    assert [a for _, leaf in leaves(target) for a in leaf.state[:2]] == arrays  # the same
    for (_, a), (_, b) in zip(leaves(tree), leaves(target), strict=True):
        torch.testing.assert_close(a.state[1], b.state[1])
        assert a.state[2] == b.state[2]


def test_jax_arrays_are_replaced():
    jnp = pytest.importorskip("jax.numpy")
    model = {"w": jnp.ones(3)}
    tree = O.setup(O.Adam(0.1), model)
    tree, model = O.update(tree, model, {"w": jnp.ones(3)})
    d = O.state_dict(tree)
    assert d["w.state.0"] is tree["w"].state[0]
    back = O.load_state_dict(O.setup(O.Adam(0.1), {"w": jnp.ones(3)}), d)
    np.testing.assert_array_equal(back["w"].state[1], tree["w"].state[1])
    _, m1 = O.update(tree, model, {"w": jnp.ones(3)})
    _, m2 = O.update(back, model, {"w": jnp.ones(3)})
    np.testing.assert_array_equal(m1["w"], m2["w"])


@pytest.mark.parametrize(("change", "match"), [
    (lambda d: d.pop("w.state.0"), "has no 'w.state.0'"),
    (lambda d: d.update({"v.state": np.ones(2)}),
     r"keys that the tree lacks: 'v.state' \(1 in all\)"),
    (lambda d: d.update({"w.state.0": np.ones(3)}), "'w.state.0' is an array of shape "
                                                    r"\(3,\).*shape \(2,\) and dtype float64"),
    (lambda d: d.update({"w.state.0": np.ones(2, np.float32)}), "dtype float32.*float64"),
    (lambda d: d.update({"w.state.2": "x"}), "'w.state.2' is the str"),
    (lambda d: d.update({"w.frozen": 1}), "'w.frozen' is 1; a frozen flag is a bool"),
    (lambda d: d.update({"w.rule": rule_form(O.Momentum())}),
     "'w.rule' does not fit.*Momentum.*Adam"),
    (lambda d: d.update({"w.rule": O.Momentum()}), "'w.rule' does not fit.*Momentum.*Adam"),
    (lambda d: d.update({"w.rule": {"rule": "Nope", "fields": {}}}), "not in optimisers.RULES"),
    (lambda d: d.update({"w.rule": 3}), "'w.rule'"),
])
def test_a_dict_that_does_not_fit_is_refused_before_anything_is_written(change, match):
    model = {"w": np.ones(2), "u": np.ones(2)}
    tree = O.setup(O.Adam(0.1), model)
    O.update_(tree, model, {"w": np.ones(2), "u": np.ones(2)})
    d = O.state_dict(tree)
    change(d)
    target = O.setup(O.Adam(), {"w": np.ones(2), "u": np.ones(2)})
    before = [(leaf.rule, leaf.state[2], leaf.state[0].copy()) for _, leaf in leaves(target)]
    with pytest.raises(ValueError, match=match):
        O.load_state_dict(target, d)
    for (rule, bt, m), (_, leaf) in zip(before, leaves(target), strict=True):
        assert leaf.rule == rule and leaf.state[2] == bt
        np.testing.assert_array_equal(leaf.state[0], m)


def test_bad_arguments():
    with pytest.raises(TypeError, match="state tree"):
        O.state_dict({"w": np.ones(2)})
    with pytest.raises(TypeError, match="takes a dict second"):
        O.load_state_dict(O.setup(O.Adam(), [np.ones(1)]), [1])


def test_a_rule_form_with_sorted_keys_loads():
    """A checkpointer may give the rule's dicts back with their keys sorted."""
    import json

    rule = O.OptimiserChain(O.ClipNorm(1.0), O.AdamW(O.Cosine(1e-2, 1e-3, 50)))
    d = O.state_dict(O.setup(rule, {"w": np.ones(2)}))
    d["w.rule"] = json.loads(json.dumps(d["w.rule"], sort_keys=True))
    assert list(d["w.rule"]) == ["fields", "rule"]
    like = O.setup(O.OptimiserChain(O.ClipNorm(2.0), O.AdamW()), {"w": np.ones(2)})
    assert O.load_state_dict(like, d)["w"].rule == rule
