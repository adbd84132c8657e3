"""JAX under jax.jit on the CPU: groups of like large Leafs step as one XLA custom call
into the numba one-pass kernel (``fast/xla.py``). Every test compares with the
plain path (``xla.LARGE`` set beyond every array), which runs XLA's own kernels."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import optimisers as O  # noqa: E402
from conftest import alone_and_together, numpy_adam_job, rules_param  # noqa: E402
from optimisers.fast import (  # noqa: E402
    kernels,
    trace,  # noqa: E402
    xla,
)
from optimisers.leaf import leaves  # noqa: E402

pytestmark = pytest.mark.skipif(not kernels.available() or jax.default_backend() != "cpu",
                                reason="needs numba, and JAX on the CPU")

# every rule with a one-pass kernel, alone and in chains
FUSED = [
    O.Descent(0.1), O.Momentum(0.01, 0.9), O.Nesterov(0.01, 0.9), O.Adam(0.01),
    O.AdamW(0.01, lambd=0.1), O.AdamW(0.01, lambd=0.01, couple=False), O.RMSProp(0.01),
    O.RMSProp(0.01, centred=True), O.Lion(0.01), O.ADOPT(0.01), O.ADOPT(0.01, clip=False),
    O.OptimiserChain(O.WeightDecay(0.01), O.Adam(0.01)),
    O.OptimiserChain(O.ClipGrad(0.5), O.SignDecay(0.01), O.Nesterov(0.01)),
    O.OptimiserChain(O.ClipGrad(0.5), O.WeightDecay(0.1), O.Lion(0.01)),
    O.OptimiserChain(),
]
SIZE = 64  # elements that count as large here (monkeypatched into xla.LARGE)


def make_model(dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.normal(size=(8, 16)), dtype),
            "layers": [jnp.asarray(rng.normal(size=100), dtype) for _ in range(3)],
            "small": jnp.asarray(rng.normal(size=5), dtype),    # below SIZE: plain path
            "frozen": jnp.asarray(rng.normal(size=70), dtype),  # frozen: never stepped
            "skipped": jnp.asarray(rng.normal(size=90), dtype)}  # no gradient


def grads_for(model, step):
    rng = np.random.default_rng(100 + step)
    g = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype), model)
    g["skipped"] = None
    return g


def fresh_jit():
    """``jax.jit`` of a new function: JAX caches traces by function, and each test must
    trace afresh under its own settings."""
    return jax.jit(lambda *args: O.update(*args))


def calls(f, *args) -> int:
    """How many of our custom calls the jitted ``f`` makes."""
    return f.lower(*args).as_text().count("optimisers_onepass")


def run(rule, monkeypatch, fuse, *, inplace=False, donate=False, dtype=jnp.float32,
        steps=3, before=None):
    with monkeypatch.context() as m:
        m.setattr(xla, "LARGE", SIZE if fuse else 10**12)
        step = O.update_ if inplace else O.update
        f = jax.jit(lambda t, mo, g: step(t, mo, g), donate_argnums=(0, 1) if donate else ())
        model = make_model(dtype)
        tree = O.setup(rule, model)
        O.freeze_(tree["frozen"])
        n = None
        for k in range(steps):
            if before is not None:
                tree = before(tree, k)
            g = grads_for(model, k)
            if n is None:
                n = calls(f, tree, model, g)
            tree, model = f(tree, model, g)
        return tree, model, n


def assert_close(a, b, rtol, atol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = jnp.asarray(x), jnp.asarray(y)
        assert (x.dtype, x.shape, x.weak_type) == (y.dtype, y.shape, y.weak_type)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@rules_param(FUSED)
@pytest.mark.parametrize("inplace", [False, True], ids=["update", "update_"])
@pytest.mark.parametrize("donate", [False, True], ids=["kept", "donated"])
def test_custom_call_equals_plain(rule, inplace, donate, monkeypatch):
    """The same arrays as XLA's own kernels, to rounding (XLA contracts ``a*b + c`` into
    one fused multiply-add where the kernel rounds twice); the same dtypes and weak types
    of every counter; the frozen and the skipped Leafs untouched."""
    tree, model, n = run(rule, monkeypatch, True, inplace=inplace, donate=donate)
    plain_tree, plain_model, n0 = run(rule, monkeypatch, False, inplace=inplace)
    assert n == 1 and n0 == 0
    assert_close((tree, model), (plain_tree, plain_model), rtol=1e-5, atol=1e-6)
    first = make_model()
    for k in ("frozen", "skipped"):
        assert np.array_equal(model[k], first[k])
    assert not np.array_equal(model["small"], first["small"])


@rules_param([O.Adam(0.01), O.OptimiserChain(O.WeightDecay(0.01), O.Nesterov(0.01))])
def test_custom_call_in_float64(rule, monkeypatch):
    with jax.enable_x64(True):
        tree, model, n = run(rule, monkeypatch, True, dtype=jnp.float64)
        plain = run(rule, monkeypatch, False, dtype=jnp.float64)[:2]
    assert n == 1
    assert model["w"].dtype == jnp.float64
    assert_close((tree, model), plain, rtol=1e-12, atol=1e-14)


def test_each_dtype_and_rule_is_its_own_call(monkeypatch):
    """Leafs group by rule (structure and static fields) and dtype; hyper-parameters may
    differ between the Leafs of one call, each Leaf reading its own."""
    model = {"a": jnp.ones(100), "b": jnp.ones(100), "c": jnp.ones(100, jnp.bfloat16),
             "d": jnp.ones(100)}
    tree = O.setup(O.Adam(0.1), model)
    tree["b"] = O.Leaf(O.Adam(0.01, (0.5, 0.6)), tree["b"].state)
    tree["d"] = O.setup(O.Momentum(0.1), model["d"])
    g = jax.tree.map(jnp.ones_like, model)
    monkeypatch.setattr(xla, "LARGE", SIZE)
    f = fresh_jit()
    assert calls(f, tree, model, g) == 2  # Adam over a and b, Momentum over d; c plain
    new_tree, new = f(tree, model, g)
    monkeypatch.setattr(xla, "LARGE", 10**12)
    plain_tree, plain = fresh_jit()(tree, model, g)
    assert_close((new_tree, new), (plain_tree, plain), rtol=1e-6, atol=1e-6)
    assert not np.allclose(new["a"], new["b"])  # each Leaf its own eta and betas


def test_adjust_between_steps_does_not_retrace(monkeypatch):
    traces = []

    def step(t, m, g):
        traces.append(1)
        return O.update(t, m, g)

    def before(tree, k):
        return O.adjust(tree, 0.01 * (k + 1), beta=(0.8, 0.9 + k / 100))

    monkeypatch.setattr(xla, "LARGE", SIZE)
    f = jax.jit(step)
    model = make_model()
    tree = O.setup(O.Adam(), model)
    for k in range(3):
        tree, model = f(before(tree, k), model, grads_for(model, k))
    assert len(traces) == 1
    plain_tree, plain_model, _ = run(O.Adam(), monkeypatch, False, before=before)
    fused_tree, fused_model, _ = run(O.Adam(), monkeypatch, True, before=before)
    assert_close((fused_tree, fused_model), (plain_tree, plain_model), rtol=1e-5,
                 atol=1e-6)


def test_not_used_where_it_cannot_apply(monkeypatch):
    """Eager steps, derivatives through a step (the call has none), ``vmap``, rules
    whose ``apply`` the code generator cannot follow (RAdam branches on its step count),
    and rules it gives no program: plain path."""
    monkeypatch.setattr(xla, "LARGE", SIZE)
    model = {"w": jnp.ones(100)}
    g = {"w": jnp.full(100, 0.5)}
    spy = []
    call = xla._call
    monkeypatch.setattr(xla, "_call", lambda *a: spy.append(1) or call(*a))
    tree = O.setup(O.Adam(0.1), model)
    eager = O.update(tree, model, g)[1]["w"]
    assert not spy

    def loss(eta):
        return jnp.sum(O.update(O.adjust(tree, eta), model, g)[1]["w"])

    d = jax.jit(jax.grad(loss))(0.1)
    assert not spy and np.isfinite(d)
    many = jax.jit(jax.vmap(lambda w: O.update(tree, {"w": w}, g)[1]["w"]))(
        jnp.ones((2, 100)))
    assert not spy and np.allclose(many[0], eager)
    assert calls(fresh_jit(), O.setup(O.RAdam(), model), model, g) == 0
    monkeypatch.setattr(trace, "trace", lambda rule, sig: None)  # no program
    f = fresh_jit()
    assert calls(f, tree, model, g) == 0
    np.testing.assert_allclose(f(tree, model, g)[1]["w"], eager, rtol=1e-6)


def test_steps_in_threads_with_numpy_kernels(monkeypatch):
    """JAX custom calls (in XLA's threads) and NumPy kernels (in Python threads) running
    at once give what they give alone: parallel kernels hold one process-wide mutex."""
    monkeypatch.setattr(xla, "LARGE", SIZE)
    monkeypatch.setattr(kernels, "PARALLEL_FROM", 1)
    f = fresh_jit()

    def jax_run(key):
        model = make_model(seed=key)
        tree = O.setup(O.Adam(0.01), model)
        for k in range(10):
            tree, model = f(tree, model, grads_for(model, k))
        return jax.block_until_ready(model)

    numpy_run = numpy_adam_job(300, 20, 10)
    jobs = [(jax_run, k) for k in range(2)] + [(numpy_run, k) for k in range(2, 4)]
    alone, together = alone_and_together(jobs)
    for one, both in zip(alone, together, strict=True):
        for a, b in zip(jax.tree.leaves(both), jax.tree.leaves(one), strict=True):
            assert np.array_equal(np.asarray(a), np.asarray(b))


def test_a_kernel_that_cannot_be_built_warns_once_and_steps_plainly(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(xla, "LARGE", SIZE)
    monkeypatch.setattr(xla, "_TARGETS", {})
    monkeypatch.setattr(kernels, "build", broken)
    model = {"w": jnp.ones(100)}
    g = {"w": jnp.full(100, 0.5)}
    tree = O.setup(O.Momentum(0.1), model)
    with pytest.warns(RuntimeWarning, match="no compiler today"):
        new = fresh_jit()(tree, model, g)[1]["w"]
    np.testing.assert_allclose(new, 1 - 0.05, rtol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # remembered: no second warning
        assert calls(fresh_jit(), tree, model, g) == 0


def test_the_custom_call_takes_the_complements_of_the_python_floats(monkeypatch):
    """``1 - b2`` reaches the kernel as the Leaf's pack carries it, computed from the
    Python float, not from float32 ``b2``: after one step with a unit gradient,
    ``v = 1 - 0.999`` exactly as float32 rounds 0.001 (``1 - float32(0.999)`` is
    1.3e-5 off); after 30 steps the second moments are the plain path's under ``jit``
    to 1e-6 (with float32 complements they were 2e-5 off)."""
    monkeypatch.setattr(xla, "LARGE", SIZE)
    model = {"a": jnp.zeros(SIZE), "b": jnp.zeros(SIZE)}
    g = {"a": jnp.ones(SIZE), "b": jnp.ones(SIZE)}
    f = fresh_jit()
    tree = O.setup(O.Adam(), model)
    assert calls(f, tree, model, g) == 1
    v = np.asarray(f(tree, model, g)[0]["a"].state[1])
    assert np.all(v == np.float32(1 - 0.999)) and np.float32(1 - 0.999) != 1 - np.float32(0.999)

    def steps(large):
        monkeypatch.setattr(xla, "LARGE", large)
        step, t, m = fresh_jit(), O.setup(O.Adam(), make_model()), make_model()
        for k in range(30):
            t, m = step(t, m, grads_for(m, k))
        return t, m

    fused_tree, plain_tree = steps(SIZE)[0], steps(10**12)[0]
    for k in ("w", "layers"):
        for a, b in zip(leaves(fused_tree[k]), leaves(plain_tree[k]), strict=True):
            np.testing.assert_allclose(a[1].state[1], b[1].state[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("donate", [(), (1,), (0, 1)], ids=["kept", "model", "both"])
def test_kept_operands_are_read_and_donated_ones_written_in_place(donate, monkeypatch):
    """Where the caller keeps an array, the call's result is fresh memory (the caller's
    array unchanged, and XLA copies nothing first); where it donates it, the result is
    its memory (in place). The arrays are the plain path's either way, also where only
    the model is donated."""
    monkeypatch.setattr(xla, "LARGE", SIZE)
    model = {"w": jnp.arange(128.0).reshape(8, 16), "b": jnp.arange(100.0)}
    g = jax.tree.map(jnp.ones_like, model)
    f = jax.jit(lambda t, m, gr: O.update(t, m, gr), donate_argnums=donate)
    tree = O.setup(O.Adam(0.1), model)
    lowered = f.lower(tree, model, g).as_text()
    aliased = lowered.count("output_operand_alias<")
    nstate = 2  # Adam's moments; with the parameter, its pack and clock: 3 + nstate a Leaf
    assert aliased == (0 if not donate else 2 if donate == (1,) else 2 * (3 + nstate))
    entry = f.lower(tree, model, g).compile().as_text().split("ENTRY")[-1]
    if donate != (1,):  # (JAX pairs a donated parameter with a moment of its shape)
        assert "copy" not in entry
    kept = jax.tree.map(np.array, (tree, model))
    new_tree, new = f(tree, model, g)
    monkeypatch.setattr(xla, "LARGE", 10**12)
    plain = jax.jit(lambda t, m, gr: O.update(t, m, gr))(
        O.setup(O.Adam(0.1), kept[1]), jax.tree.map(jnp.asarray, kept[1]), g)
    assert_close((new_tree, new), plain, rtol=1e-6, atol=1e-7)
    if not donate:
        for a, b in zip(jax.tree.leaves((tree, model)), jax.tree.leaves(kept)):
            np.testing.assert_array_equal(np.asarray(a), b)
