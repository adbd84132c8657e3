"""Tree-level rules (CONTRACT.md section 8): ClipGlobalNorm and SkipNonFinite see every
gradient of one update, through one reduction between gathering and stepping (reduce.py)."""

from __future__ import annotations

import numpy as np
import pytest

import optimisers as O
from conftest import beside_optax


def _draw(rng, n=5, size=100):
    return [rng.normal(size=size).astype(np.float32) for _ in range(n)]


def _global_clip(grads, omega):
    n = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    return [g * np.float32(min(1.0, omega / n)) for g in grads]


@pytest.mark.parametrize("n,size", [(1, 50), (5, 100), (3, 300_000), (120, 8)])
def test_clip_global_norm_equals_clipping_all_gradients_together(n, size):
    rng = np.random.default_rng(0)
    model = _draw(rng, n, size)
    other = [a.copy() for a in model]
    tree = O.setup(O.OptimiserChain(O.ClipGlobalNorm(0.5), O.Adam(0.01)), model)
    ref = O.setup(O.Adam(0.01), other)
    for _ in range(8):
        g = _draw(rng, n, size)
        O.update_(tree, model, g)
        O.update_(ref, other, _global_clip(g, 0.5))
    for a, b in zip(model, other):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_clip_global_norm_equals_torch_clip_grad_norm_with_a_tied_weight():
    torch = pytest.importorskip("torch")

    def net():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10, bias=False))
        m[1].weight = m[0].weight  # tied: its gradient counts once in the norm
        return m

    ours, theirs = net(), net()
    tree = O.setup(O.OptimiserChain(O.ClipGlobalNorm(0.5), O.AdamW(1e-2, lambd=0.01)), ours)
    opt = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.01)
    for _ in range(10):
        x = torch.randint(0, 10, (16,))
        for m in (ours, theirs):
            m.zero_grad()
            torch.nn.functional.cross_entropy(m[1](m[0](x)), x).backward()
        O.update_(tree, ours)
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5)
        opt.step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=2e-6)


def test_clip_global_norm_under_jit_equals_optax():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    optax = pytest.importorskip("optax")
    rng = np.random.default_rng(1)
    shapes = {"a": (8,), "b": (3, 40), "c": (70_000,)}

    def draw():
        return {k: jnp.asarray(rng.normal(size=s).astype(np.float32)) for k, s in shapes.items()}

    model = draw()
    tree = O.setup(O.OptimiserChain(O.ClipGlobalNorm(1.0), O.Adam(1e-2)), model)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    _, ours, theirs = beside_optax(jax.jit(O.update), tree, model, tx, draw, 10)
    for k in shapes:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-5, atol=1e-6)


def test_frozen_and_gradless_leafs_are_out_of_the_norm():
    model = {"a": np.ones(2, np.float32), "b": np.ones(2, np.float32),
             "c": np.ones(2, np.float32)}
    tree = O.setup(O.OptimiserChain(O.ClipGlobalNorm(1.0), O.Descent(1.0)), model)
    O.freeze_(tree, "c")
    O.update_(tree, model, {"a": np.array([3.0, 0.0], np.float32),
                            "c": np.array([100.0, 0.0], np.float32)})
    np.testing.assert_allclose(model["a"], [0.0, 1.0])  # clipped by its own norm, 3
    np.testing.assert_array_equal(model["b"], [1.0, 1.0])
    np.testing.assert_array_equal(model["c"], [1.0, 1.0])


def test_after_accumgrad_the_norm_is_of_the_accumulated_gradient():
    model = [np.zeros(1, np.float32), np.zeros(1, np.float32)]
    tree = O.setup(O.OptimiserChain(O.AccumGrad(2), O.ClipGlobalNorm(1.0), O.Descent(1.0)),
                   model)
    O.update_(tree, model, [np.array([6.0], np.float32), np.array([0.0], np.float32)])
    np.testing.assert_array_equal(model[0], [0.0])  # accumulated only
    O.update_(tree, model, [np.array([0.0], np.float32), np.array([8.0], np.float32)])
    np.testing.assert_allclose([model[0][0], model[1][0]], [-0.6, -0.8], rtol=1e-6)
    assert tree[0].clock == 1


def test_an_ema_of_a_clipped_chain():
    model = [np.zeros(1), np.zeros(1)]
    rule = O.EMA(O.OptimiserChain(O.ClipGlobalNorm(1.0), O.Descent(1.0)), 0.5)
    tree = O.setup(rule, model)
    O.update_(tree, model, [np.array([3.0]), np.array([4.0])])
    np.testing.assert_allclose([model[0][0], model[1][0]], [-0.6, -0.8])
    np.testing.assert_allclose(O.averaged(tree, model)[1], [-0.4])


@pytest.mark.filterwarnings("error")  # (a non-finite gradient is no cause for a warning)
@pytest.mark.parametrize("n,size", [(1, 30), (5, 100), (3, 300_000)])
def test_skip_non_finite_skips_the_whole_step_then_raises_after_limit(n, size):
    rng = np.random.default_rng(2)
    model = _draw(rng, n, size)
    rule = O.OptimiserChain(O.SkipNonFinite(2), O.ClipGlobalNorm(1.0), O.Adam(0.1))
    tree = O.setup(rule, model)
    for k in range(4):
        g = _draw(rng, n, size)
        if k in (1, 2):
            g[-1][3] = np.nan if k == 1 else np.inf
        before = [x.copy() for x in model]
        states = [leaf.state[2][0].copy() for leaf in tree]
        O.update_(tree, model, g)
        unchanged = [np.array_equal(x, y) for x, y in zip(model, before)]
        assert unchanged == [k in (1, 2)] * n
        assert all(np.array_equal(leaf.state[2][0], s) == (k in (1, 2))
                   for leaf, s in zip(tree, states))
        assert [leaf.state[0] for leaf in tree] == [{1: 1, 2: 2}.get(k, 0)] * n
        assert [leaf.clock for leaf in tree] == [{0: 1, 1: 1, 2: 1}.get(k, 2)] * n
    for _ in range(2):
        g = _draw(rng, n, size)
        g[0][0] = np.nan
        O.update_(tree, model, g)
    before = [x.copy() for x in model]
    g = _draw(rng, n, size)
    g[0][0] = np.nan
    with pytest.raises(FloatingPointError, match="limit=2"):
        O.update_(tree, model, g)
    assert all(np.array_equal(x, y) for x, y in zip(model, before))
    assert [leaf.state[0] for leaf in tree] == [2] * n


def test_skip_non_finite_under_jit_skips_too():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    model = {"a": jnp.ones(4), "b": jnp.ones(70_000)}
    tree = O.setup(O.OptimiserChain(O.SkipNonFinite(), O.Adam(0.1)), model)
    step = jax.jit(O.update)
    bad = {"a": jnp.ones(4).at[1].set(jnp.nan), "b": jnp.ones(70_000)}
    tree2, out = step(tree, model, bad)
    for k in model:
        np.testing.assert_array_equal(out[k], model[k])
    assert int(tree2["a"].state[0]) == 1 and int(tree2["b"].clock) == 0
    tree3, out = step(tree2, out, {k: jnp.ones_like(v) for k, v in model.items()})
    assert float(out["a"][0]) == pytest.approx(0.9) and int(tree3["a"].state[0]) == 0
    assert int(tree3["b"].clock) == 1


def test_skip_non_finite_under_jit_equals_optax_apply_if_finite():
    """The rules reference's claim: with NaN and infinite gradients among finite ones (fewer
    in a row than the limit), the steps are optax's ``apply_if_finite`` to rounding."""
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    optax = pytest.importorskip("optax")
    rng = np.random.default_rng(3)
    shapes = {"a": (8,), "b": (3, 40)}
    bad = iter([False, True, False, True, True, False, False, True, False, False])

    def draw():
        g = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
        if next(bad):
            g["b"][1, rng.integers(40)] = rng.choice([np.nan, np.inf, -np.inf])
        return {k: jnp.asarray(v) for k, v in g.items()}

    model = {k: jnp.asarray(rng.normal(size=s).astype(np.float32)) for k, s in shapes.items()}
    rule = O.OptimiserChain(O.SkipNonFinite(2), O.ClipGlobalNorm(1.0), O.Adam(1e-2))
    tx = optax.apply_if_finite(optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
                               2)
    tree, ours, theirs = beside_optax(jax.jit(O.update), O.setup(rule, model), model, tx,
                                      draw, 10)
    for k in shapes:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-5, atol=1e-6)
    assert int(tree["a"].clock) == 6


def test_review_cases():
    """From the second review: a NaN in a large JAX array is seen; a scheduled omega clips
    globally; float16 gradients are clipped from a float32 norm; under jit, a skip before
    AccumGrad keeps the later rules still, and EMA keeps its average on a skipped step."""
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    model = {"a": jnp.ones(40_000), "b": jnp.ones(3)}
    tree = O.setup(O.OptimiserChain(O.SkipNonFinite(), O.Descent(0.1)), model)
    bad = {"a": jnp.ones(40_000).at[7].set(jnp.nan), "b": jnp.ones(3)}
    for update in (O.update, jax.jit(O.update)):
        t2, out = update(tree, model, bad)
        assert not bool(jnp.isnan(out["a"]).any()) and int(t2["b"].state[0]) == 1
    for omega in (1.0, O.Constant(1.0)):
        m = [np.zeros(1, np.float32), np.zeros(1, np.float64)]
        t = O.setup(O.OptimiserChain(O.ClipGlobalNorm(omega), O.Descent(1.0)), m)
        O.update_(t, m, [np.array([3.0], np.float32), np.array([4.0])])
        np.testing.assert_allclose([m[0][0], m[1][0]], [-0.6, -0.8], rtol=1e-6)
    m = [np.zeros(10_010, np.float16)]
    O.update_(O.setup(O.OptimiserChain(O.ClipGlobalNorm(1.0), O.Descent(1.0)), m), m,
              [np.full(10_010, 3.0, np.float16)])
    np.testing.assert_allclose(m[0][:3], -0.01, rtol=1e-3)
    for rule in (O.OptimiserChain(O.SkipNonFinite(), O.AccumGrad(2), O.Momentum(0.1, 0.9)),
                 O.EMA(O.OptimiserChain(O.SkipNonFinite(), O.Descent(0.5)), 0.5)):
        grads = [{"w": jnp.ones(2)}, {"w": jnp.full(2, jnp.nan)}, {"w": jnp.ones(2)}]
        results = []
        for update in (O.update, jax.jit(O.update)):
            t, m = O.setup(rule, {"w": jnp.zeros(2)}), {"w": jnp.zeros(2)}
            for g in grads:
                t, m = update(t, m, g)
            results.append((np.asarray(m["w"]), [np.asarray(a) for a in jax.tree.leaves(
                t["w"].state)], int(t["w"].clock)))
        np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
        for a, b in zip(results[0][1], results[1][1]):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        assert results[0][2] == results[1][2]
