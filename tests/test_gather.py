"""Gradients as users hold them (flat dicts of dotted names), and ties declared by the
state tree alone (Optimisers.jl's "artificial shared leaf")."""

from __future__ import annotations

import numpy as np
import pytest

import optimisers as O
from optimisers.gather import nest_dotted


def test_dotted_names_become_nested_dicts():
    model = {"enc": [np.ones(2), {"w": np.ones(3)}], "b": np.ones(1), "a.b": np.ones(1)}
    g = nest_dotted({"enc.0": 1, "enc.1.w": 2, "b": 3, "a.b": 4}, model)
    assert g == {"enc": {0: 1, 1: {"w": 2}}, "b": 3, "a.b": 4}
    nested = {"enc": [None, None]}
    assert nest_dotted(nested, model) is nested  # nothing to do: the very object


def test_dotted_and_plain_keys_merge_without_writing_the_callers_dicts():
    model = {"enc": [np.ones(2), np.ones(2)]}
    for order in ("dotted first", "plain first"):
        user = {0: 1}
        g = {"enc.1": 2, "enc": user} if order == "dotted first" else {"enc": user, "enc.1": 2}
        assert nest_dotted(g, model) == {"enc": {0: 1, 1: 2}}
        assert user == {0: 1}  # copied before the merge, never written
    with pytest.raises(ValueError, match="already given by another key"):
        nest_dotted({"enc.1": 2, "enc": {1: 3}}, model)
    with pytest.raises(ValueError, match="runs into the gradient given for 'enc'"):
        nest_dotted({"enc": [1, 2], "enc.1": 2}, model)


def test_dotted_name_that_leads_nowhere_is_the_gathers_error():
    model = {"enc": [np.ones(2)]}
    tree = O.setup(O.Descent(), model)
    with pytest.raises(ValueError, match="has key 'enc.5', which the model lacks"):
        O.update(tree, model, {"enc.5": np.ones(2)})


def test_numpy_model_with_flat_gradient_dict():
    model = {"layers": [{"w": np.ones(3), "b": np.zeros(3)}, {"w": np.ones(2)}]}
    tree = O.setup(O.Momentum(0.1), model)
    flat = {"layers.0.w": np.ones(3), "layers.1.w": np.full(2, 2.0)}
    tree, new = O.update(tree, model, flat)
    np.testing.assert_allclose(new["layers"][0]["w"], 0.9)
    np.testing.assert_allclose(new["layers"][1]["w"], 0.8)
    np.testing.assert_array_equal(new["layers"][0]["b"], 0.0)  # no gradient: left alone


def artificial_tie(lib):
    """Optimisers.jl's "artificial shared leaf": two equal immutable arrays, one Leaf."""
    a, b = lib.asarray([1.0, 2.0]), lib.asarray([1.0, 2.0])
    if lib is np:
        a.flags.writeable = b.flags.writeable = False
    leaf = O.setup(O.Momentum(0.1, 0.9), a)
    return {"x": leaf, "y": leaf}, {"x": a, "y": b}


@pytest.mark.parametrize("fn", [O.update, O.update_], ids=["update", "update_"])
def test_artificial_shared_leaf_is_a_tie(fn):
    tree, model = artificial_tie(np)
    grads = {"x": np.array([1.0, 1.0]), "y": np.array([1.0, 0.0])}
    for _ in range(2):
        tree, model = fn(tree, model, grads)
    # gradients summed ([2, 1]), one step per update, the result at both paths
    expected = np.array([1.0, 2.0]) - 0.1 * np.array([2.0, 1.0]) * (1 + 1.9)
    np.testing.assert_allclose(model["x"], expected)
    assert model["x"] is model["y"] and tree["x"] is tree["y"]


def test_artificial_tie_of_writable_arrays_writes_both_in_place():
    a, b = np.ones(2), np.ones(2)
    leaf = O.setup(O.Descent(0.5), a)
    tree, model = [leaf, leaf], [a, b]
    tree, same = O.update_(tree, model, [np.ones(2), np.full(2, 3.0)])
    assert same is model and same[0] is a and same[1] is b  # each written where it is
    np.testing.assert_array_equal(a, -1.0)
    np.testing.assert_array_equal(b, -1.0)


def test_artificial_tie_of_different_shapes_is_an_error():
    leaf = O.setup(O.Descent(), np.ones(2))
    with pytest.raises(ValueError, match=r"Leaf at KeyPath\(1\) is shared with KeyPath\(0\)"):
        O.update([leaf, leaf], [np.ones(2), np.ones(3)], [np.ones(2), np.ones(3)])


torch = pytest.importorskip("torch")


def gpt_like():
    torch.manual_seed(0)
    m = torch.nn.ModuleDict({
        "wte": torch.nn.Embedding(20, 8),
        "h": torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)]),
        "ln": torch.nn.LayerNorm(8),
        "head": torch.nn.Linear(8, 20, bias=False),
    })
    m["head"].weight = m["wte"].weight  # tied, as GPT-2's
    return m


def forward(m, ids):
    h = m["wte"](ids)
    for layer in m["h"]:
        h = torch.tanh(layer(h))
    return m["head"](m["ln"](h)).logsumexp(-1).sum()


def test_torch_flat_gradient_dict_matches_adamw_param_groups():
    ours, ref = gpt_like(), gpt_like()
    decay = [p for n, p in ref.named_parameters() if not n.endswith("bias") and "ln" not in n]
    rest = [p for n, p in ref.named_parameters() if n.endswith("bias") or "ln" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=0.01)
    tree = O.setup(O.AdamW(0.01, lambd=0.1), ours)
    O.adjust_(tree, where="*.bias", lambd=0.0)
    O.adjust_(tree, where="ln.*", lambd=0.0)
    ids = torch.arange(12)
    for _ in range(5):
        for m in (ours, ref):
            m.zero_grad()
            forward(m, ids).backward()
        flat = {name: p.grad for name, p in ours.named_parameters()}
        assert "head.weight" not in flat  # named_parameters gives a tie once
        tree, ours = O.update_(tree, ours, flat)
        opt.step()
    assert ours["head"].weight is ours["wte"].weight
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_torch_artificial_tie_between_two_parameters():
    torch.manual_seed(0)
    m = torch.nn.ModuleDict({"a": torch.nn.Linear(2, 2, bias=False),
                             "b": torch.nn.Linear(2, 2, bias=False)})
    with torch.no_grad():
        m["b"].weight.copy_(m["a"].weight)
    tree = O.setup(O.Descent(0.1), m)
    tree["b"]["weight"] = tree["a"]["weight"]
    w0, x = m["a"].weight.detach().clone(), torch.randn(3, 2)
    (m["a"](x).sum() + 2 * m["b"](x).sum()).backward()
    g = m["a"].weight.grad + m["b"].weight.grad
    tree, same = O.update_(tree, m)
    assert same is m and tree["a"]["weight"] is tree["b"]["weight"]
    for key in "ab":
        torch.testing.assert_close(m[key].weight.detach(), w0 - 0.1 * g)


jax = pytest.importorskip("jax")


@pytest.mark.parametrize("fn", ["update", "update_"])
def test_jax_artificial_tie_eager(fn):
    tree, model = artificial_tie(jax.numpy)
    grads = {"x": jax.numpy.array([1.0, 1.0]), "y": jax.numpy.array([1.0, 0.0])}
    tree, model = getattr(O, fn)(tree, model, grads)
    np.testing.assert_allclose(model["x"], [0.8, 1.9], rtol=1e-6)
    assert model["x"] is model["y"] and tree["x"] is tree["y"]


def test_jax_jit_gives_each_path_its_own_leaf():
    """What the README says: JAX's flattening does not keep object identity, so inside
    and after jax.jit a tie declared only by a shared Leaf is two Leafs, each stepped
    with its own gradient. Tie weights in JAX by using one array twice in the model."""
    tree, model = artificial_tie(jax.numpy)
    grads = {"x": jax.numpy.array([1.0, 1.0]), "y": jax.numpy.array([1.0, 0.0])}
    tree, model = jax.jit(O.update)(tree, model, grads)
    assert tree["x"] is not tree["y"]
    np.testing.assert_allclose(model["y"], [0.9, 2.0], rtol=1e-6)
