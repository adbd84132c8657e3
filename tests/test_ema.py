"""EMA(rule, decay) and averaged(tree, model) (CONTRACT section 8, "Averaging")."""

from __future__ import annotations

import numpy as np
import pytest

import optimisers as O
from optimisers.fast import fused


def by_hand(rule_eta, decay, x0, grads):
    """Descent, and the average of the parameter after each step, by hand."""
    x, avg = x0.copy(), x0.copy()
    for g in grads:
        x = x - rule_eta * g
        avg = decay * avg + (1 - decay) * x
    return x, avg


def test_ema_equals_a_hand_computation_and_averaged_is_pure():
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=4)
    grads = [rng.normal(size=4) for _ in range(5)]
    model = {"w": x0.copy(), "n": 3}
    tree = O.setup(O.EMA(O.Descent(0.1), decay=0.9), model)
    for g in grads:
        tree, model = O.update(tree, model, {"w": g})
    x, avg = by_hand(0.1, 0.9, x0, grads)
    np.testing.assert_allclose(model["w"], x, rtol=1e-12)
    evaluated = O.averaged(tree, model)
    np.testing.assert_allclose(evaluated["w"], avg, rtol=1e-12)
    assert evaluated["n"] == 3 and evaluated["w"] is not tree["w"].state[1]
    np.testing.assert_allclose(model["w"], x, rtol=1e-12)  # the model is not changed


def test_averaged_keeps_ties_and_leafs_without_an_average():
    w = np.ones(2)
    model = {"a": w, "b": w, "c": np.ones(3)}
    tree = O.setup({"c": O.Descent(0.1), "*": O.EMA(O.Descent(0.1), 0.5)}, model)
    tree, model = O.update_(tree, model, {"a": np.ones(2), "c": np.ones(3)})
    out = O.averaged(tree, model)
    assert out["a"] is out["b"]
    np.testing.assert_allclose(out["a"], [0.95, 0.95])
    assert out["c"] is model["c"]


def test_ema_runs_fused_and_equals_the_plain_path(monkeypatch):
    rng = np.random.default_rng(1)
    model = [rng.normal(size=(8, 8)).astype(np.float32) for _ in range(4)]
    plain = [a.copy() for a in model]
    rule = O.EMA(O.Adam(0.01), 0.99)
    assert fused.fusible(rule) == (True, True)
    tree, plain_tree = O.setup(rule, model), O.setup(rule, plain)
    for step in range(4):
        g = [np.random.default_rng(step).normal(size=(8, 8)).astype(np.float32)] * 4
        O.update_(tree, model, g)
        with monkeypatch.context() as m:
            m.setattr(fused, "MIN_GROUP", 10**9)
            O.update_(plain_tree, plain, g)
    assert O.state.plan_of(tree).groups  # a fused group ran
    for a, b, la, lb in zip(model, plain, tree, plain_tree):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la.state[1], lb.state[1])


def test_ema_under_jit_and_in_a_checkpoint(tmp_path):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    model = {"w": jnp.ones(3)}
    tree = O.setup(O.EMA(O.Descent(0.5), 0.9), model)
    step = jax.jit(O.update)
    for _ in range(2):
        tree, model = step(tree, model, {"w": jnp.ones(3)})
    x, avg = by_hand(0.5, 0.9, np.ones(3), [np.ones(3)] * 2)
    np.testing.assert_allclose(np.asarray(O.averaged(tree, model)["w"]), avg, rtol=1e-6)
    O.save(tmp_path / "ema.opt", tree)
    back = O.load(tmp_path / "ema.opt", like=O.setup(O.EMA(O.Descent(0.5), 0.9), model))
    assert back["w"].rule == O.EMA(O.Descent(0.5), 0.9)
    np.testing.assert_allclose(np.asarray(back["w"].state[1]), avg, rtol=1e-6)


def test_ema_with_torch_keeps_parameters():
    torch = pytest.importorskip("torch")
    net = torch.nn.Linear(3, 2)
    tree = O.setup(O.EMA(O.Descent(0.1), 0.5), net)
    net(torch.ones(1, 3)).sum().backward()
    O.update_(tree, net)
    ev = O.averaged(tree, net)
    assert ev is not net and isinstance(ev.weight, torch.nn.Parameter)
    assert not torch.equal(ev.weight, net.weight)


def test_ema_inside_a_chain_is_refused():
    with pytest.raises(ValueError, match=r"wrap the chain instead: EMA\(OptimiserChain"):
        O.OptimiserChain(O.EMA(O.Descent()), O.ClipGrad())
    O.EMA(O.OptimiserChain(O.ClipGrad(), O.Descent()))  # the way round that works


@pytest.mark.parametrize("change", ["grown", "cast", "key missing", "key added", "not array"])
def test_averaged_checks_the_model_as_update_does(change):
    """A parameter grown from (4,) to (6,) got the old (4,) average back silently, and a
    model of another structure raised a KeyError: now each is a ValueError naming the
    path, as ``update`` gives for the same model."""
    model = {"w": np.ones(4, np.float32), "b": np.ones(2, np.float32)}
    tree = O.setup(O.EMA(O.Descent(0.1), 0.9), model)
    tree, model = O.update(tree, model, {"w": np.ones(4, np.float32), "b": np.ones(2)})
    model = {
        "grown": {**model, "w": np.ones(6, np.float32)},
        "cast": {**model, "w": model["w"].astype(np.float64)},
        "key missing": {"b": model["b"]},
        "key added": {**model, "c": np.ones(3, np.float32)},
        "not array": {**model, "w": {"kernel": model["w"]}},
    }[change]
    message = {
        "grown": r"Leaf at KeyPath\('w'\) holds state of shape \(4,\), but the parameter "
                 r"there has shape \(6,\)",
        "cast": r"Leaf at KeyPath\('w'\) holds state of dtype float32, but the parameter "
                r"there has dtype float64",
        "key missing": r"the state tree at KeyPath\(\) has keys \['w', 'b'\], but the model "
                       r"has \['b'\]",
        "key added": r"the state tree at KeyPath\(\) has keys \['w', 'b'\], but the model "
                     r"has \['w', 'b', 'c'\]",
        "not array": r"the state tree has a Leaf at KeyPath\('w'\), but the model has a dict",
    }[change]
    grads = {k: np.ones_like(v) for k, v in model.items() if hasattr(v, "shape")}
    with pytest.raises(ValueError, match=message):
        O.update(tree, model, grads)
    with pytest.raises(ValueError, match=message):
        O.averaged(tree, model)


def test_averaged_reads_frozen_leafs_and_model_ties_declared_by_the_tree_alone():
    """A frozen Leaf still gives its average; where the tree ties two paths that the model
    holds as two arrays, each path without an average keeps its own array."""
    model = {"a": np.ones(2), "b": np.ones(2), "c": np.ones(3)}
    tree = O.setup({"c": O.Descent(0.1), "*": O.EMA(O.Descent(0.1), 0.5)}, model)
    tree, model = O.update(tree, model, {k: np.ones_like(v) for k, v in model.items()})
    O.freeze_(tree, "a")
    out = O.averaged(tree, model)
    np.testing.assert_allclose(out["a"], [0.95, 0.95])
    tied = O.setup(O.Descent(), {"x": np.ones(2)})
    tied = {"x": tied["x"], "y": tied["x"]}
    model = {"x": np.ones(2), "y": np.full(2, 2.0)}
    out = O.averaged(tied, model)
    assert out["x"] is model["x"] and out["y"] is model["y"]
