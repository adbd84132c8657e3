"""LAMB, LARS, ADOPT and ScheduleFreeAdamW (CONTRACT section 9) against optax, their
reference: under ``jax.jit`` and on NumPy arrays, over several shapes and many steps;
Schedule-Free's training point and its evaluation point both. Then what each must keep
beside: no re-trace when a number is adjusted, a bit-exact resume from a checkpoint after
an ``adjust_``, complex parameters, and the fused paths equal to the plain one."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import optimisers as O
from conftest import counted, normal, rule_id, run_fused

jax = pytest.importorskip("jax")
jnp = jax.numpy
optax = pytest.importorskip("optax")

CASES = [
    (O.LAMB(0.01), lambda: optax.lamb(0.01, weight_decay=0.0)),
    (O.LAMB(0.005, (0.8, 0.99), 1e-5, lambd=0.1),
     lambda: optax.lamb(0.005, b1=0.8, b2=0.99, eps=1e-5, weight_decay=0.1)),
    (O.LARS(0.5, trust=0.01), lambda: optax.lars(0.5, trust_coefficient=0.01)),
    (O.LARS(0.3, lambd=0.01, trust=0.02, epsilon=1e-3, rho=0.8, nesterov=True),
     lambda: optax.lars(0.3, weight_decay=0.01, trust_coefficient=0.02, eps=1e-3,
                        momentum=0.8, nesterov=True)),
    (O.ADOPT(0.01), lambda: optax.contrib.adopt(0.01)),
    (O.ADOPT(0.02, (0.8, 0.99), 1e-5, clip=False),
     lambda: optax.contrib.adopt(0.02, b1=0.8, b2=0.99, eps=1e-5, use_clipping=False)),
    (O.ScheduleFreeAdamW(0.01), lambda: optax.contrib.schedule_free_adamw(0.01)),
    (O.ScheduleFreeAdamW(0.02, (0.8, 0.99), 1e-6, lambd=0.05, warmup=4, weight_lr_power=1.0),
     lambda: optax.contrib.schedule_free_adamw(0.02, warmup_steps=4, b1=0.8, b2=0.99,
                                               eps=1e-6, weight_decay=0.05,
                                               weight_lr_power=1.0)),
]
IDS = [rule_id(r) for r, _ in CASES]
SHAPES = [(7,), (5, 3), (2, 3, 4)]
STEPS = 12
TOL = {"rtol": 1e-5, "atol": 1e-6}  # atol: elements passing near zero (the scale is 1)


def problem(shape, seed=0, dtype=np.float32):
    """A start and ``STEPS`` gradients of a noisy quadratic, the gradient depending on the
    point it is taken at (as Schedule-Free's ``y`` needs): ``g(x) = x - target + noise``."""
    rng = np.random.default_rng(seed)
    target = normal(rng, shape, dtype)
    noise = [normal(rng, shape, dtype) / 2 for _ in range(STEPS)]
    return normal(rng, shape, dtype), lambda x, k: x - target + noise[k]


def optax_path(make, shape, seed=0, dtype=np.float32):
    """optax's parameters after each step under ``jax.jit``, and its evaluation points
    (``schedule_free_eval_params``, where the transformation is Schedule-Free)."""
    tx = make()
    x0, grad = problem(shape, seed, dtype)
    params, state = jnp.asarray(x0), tx.init(jnp.asarray(x0))
    schedule_free = isinstance(state, optax.contrib.ScheduleFreeState)

    @jax.jit
    def step(params, state, g):
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
        point = optax.contrib.schedule_free_eval_params(state, params) if schedule_free \
            else params
        return params, state, point

    out = []
    for k in range(STEPS):
        params, state, point = step(params, state, grad(params, k))
        out.append((np.asarray(params), np.asarray(point)))
    return out


def assert_follows(ours, theirs, what):
    for k, ((x, e), (px, pe)) in enumerate(zip(ours, theirs, strict=True)):
        np.testing.assert_allclose(x, px, **TOL, err_msg=f"{what}: parameter, step {k + 1}")
        np.testing.assert_allclose(e, pe, **TOL, err_msg=f"{what}: evaluated, step {k + 1}")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rule, make", CASES, ids=IDS)
def test_matches_optax_under_jit(rule, make, shape):
    x0, grad = problem(shape)
    model, tree = {"w": jnp.asarray(x0)}, O.setup(rule, {"w": jnp.asarray(x0)})

    @jax.jit
    def step(tree, model, g):
        tree, model = O.update(tree, model, {"w": g})
        return tree, model, O.averaged(tree, model)

    ours = []
    for k in range(STEPS):
        tree, model, point = step(tree, model, grad(model["w"], k))
        ours.append((np.asarray(model["w"]), np.asarray(point["w"])))
    assert_follows(ours, optax_path(make, shape), rule_id(rule))
    assert not np.allclose(ours[-1][0], x0)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rule, make", CASES, ids=IDS)
def test_matches_optax_on_numpy(rule, make, shape):
    x0, grad = problem(shape)
    model = {"w": x0.copy()}
    tree = O.setup(rule, model)
    ours = []
    for k in range(STEPS):
        tree, model = O.update_(tree, model, {"w": grad(model["w"], k)})
        ours.append((model["w"].copy(), O.averaged(tree, model)["w"].copy()))
    assert ours[-1][0].dtype == np.float32
    assert_follows(ours, optax_path(make, shape), rule_id(rule))


@pytest.mark.parametrize("rule, make", [c for c in CASES if not isinstance(c[0], O.ADOPT)],
                         ids=[i for i, (r, _) in zip(IDS, CASES) if not isinstance(r, O.ADOPT)])
def test_complex_parameters_match_optax(rule, make):
    """optax's LAMB, LARS and Schedule-Free take complex parameters too (``|g|^2`` real,
    norms over the moduli); its ADOPT clips, which complex numbers refuse there."""
    x0, grad = problem((4, 3), dtype=np.complex64)
    model = {"w": x0.copy()}
    tree = O.setup(rule, model)
    ours = []
    for k in range(STEPS):
        tree, model = O.update_(tree, model, {"w": grad(model["w"], k)})
        ours.append((model["w"].copy(), O.averaged(tree, model)["w"].copy()))
    assert ours[-1][0].dtype == np.complex64
    assert_follows(ours, optax_path(make, (4, 3), dtype=np.complex64), rule_id(rule))


def test_adopt_clips_a_complex_step_by_its_parts_in_every_library():
    """ADOPT's clamp on a complex ``u``: real and imaginary parts each, as ClipGrad does."""
    torch = pytest.importorskip("torch")
    rule = O.ADOPT(1.0, (0.0, 0.5))  # m = u, so the step is the clamped u
    g0, g1 = np.array([1.0 + 0j], np.complex64), np.array([3.0 - 0.5j], np.complex64)
    for wrap in (np.asarray, torch.tensor, jnp.asarray):
        model = {"w": wrap(np.zeros(1, np.complex64))}
        tree = O.setup(rule, model)
        tree, model = O.update(tree, model, {"w": wrap(g0)})  # v = |1|^2: no step
        tree, model = O.update(tree, model, {"w": wrap(g1)})  # u = 3 - 0.5j, clamped to 1
        np.testing.assert_allclose(np.asarray(model["w"]), [-1.0 + 0.5j], rtol=1e-6)


def test_schedule_free_averaged_is_the_evaluation_point():
    """``averaged`` is ``x``: the average of the ``z`` iterates, with optax's weights. With
    ``b1 = 1`` the training point is ``x`` itself."""
    x0, grad = problem((6,))
    model = {"w": x0.copy()}
    tree = O.setup(O.ScheduleFreeAdamW(0.05, (1.0, 0.999)), model)
    for k in range(5):
        tree, model = O.update(tree, model, {"w": grad(model["w"], k)})
        np.testing.assert_allclose(O.averaged(tree, model)["w"], model["w"], rtol=1e-6)
    assert not np.allclose(tree["w"].state[0], model["w"])  # z is not x


def test_warmup_zero_is_optax_without_warmup():
    theirs = optax_path(lambda: optax.contrib.schedule_free_adamw(0.01, warmup_steps=None),
                        (5,))
    x0, grad = problem((5,))
    model = {"w": x0.copy()}
    tree = O.setup(O.ScheduleFreeAdamW(0.01, warmup=0), model)
    for k in range(STEPS):
        tree, model = O.update_(tree, model, {"w": grad(model["w"], k)})
    np.testing.assert_allclose(model["w"], theirs[-1][0], **TOL)


@pytest.mark.parametrize("make, match", [
    (lambda: O.ScheduleFreeAdamW(beta=(0.0, 0.999)), r"beta\[0\] must be in \(0, 1\]"),
    (lambda: O.ScheduleFreeAdamW(warmup=1.5), "whole number"),
    (lambda: O.LARS(rho=1.5), r"LARS's rho must be in \[0, 1\]"),
    (lambda: O.LARS(trust=-1.0), "LARS's trust must be >= 0"),
    (lambda: O.LAMB(beta=(0.9, 1.0)), r"LAMB's beta\[1\] must be in \[0, 1\)"),
    (lambda: O.ADOPT(clip=1), "True or False"),
])
def test_bad_hyperparameters_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_fields_and_defaults_are_the_contracts():
    assert O.LAMB() == O.LAMB(1e-3, (0.9, 0.999), 1e-6, 0.0)
    assert O.LARS() == O.LARS(1.0, 0.0, 0.001, 0.0, 0.9, False)
    assert O.ADOPT() == O.ADOPT(1e-3, (0.9, 0.9999), 1e-6, True)
    assert O.ScheduleFreeAdamW() == O.ScheduleFreeAdamW(0.0025, (0.9, 0.999), 1e-8, 0.0, 0,
                                                        2.0)
    elementwise = {r: type(r).elementwise for r in
                   (O.LAMB(), O.LARS(), O.ADOPT(), O.ScheduleFreeAdamW())}
    assert list(elementwise.values()) == [False, False, True, True]


# ------------------------------------------------------------------ jit, fused, checkpoints



ADJUSTED = [
    (O.LAMB(0.01), {"eta": 0.003, "beta": (0.8, 0.99), "epsilon": 1e-5, "lambd": 0.01}),
    (O.LARS(0.5, trust=0.01), {"eta": 0.1, "lambd": 0.01, "trust": 0.02, "epsilon": 1e-4,
                               "rho": 0.8}),
    (O.ADOPT(0.01), {"eta": 0.003, "beta": (0.8, 0.99), "epsilon": 1e-5}),
    (O.ScheduleFreeAdamW(0.01, warmup=2), {"eta": 0.003, "beta": (0.8, 0.99),
                                           "epsilon": 1e-6, "lambd": 0.01,
                                           "weight_lr_power": 1.0}),
]


@pytest.mark.parametrize("rule, change", ADJUSTED, ids=[rule_id(r) for r, _ in ADJUSTED])
def test_adjusting_a_number_does_not_retrace(rule, change):
    f, traces = counted(lambda t, m, g: O.update(t, m, g))
    step = jax.jit(f)
    x0, grad = problem((4, 3))
    model = {"w": jnp.asarray(x0)}
    tree = O.setup(rule, model)
    for k in range(3):
        tree, model = step(tree, model, {"w": grad(model["w"], k)})
    tree = O.adjust(tree, **change)
    g = {"w": grad(model["w"], 3)}
    _, jitted = step(tree, model, g)
    assert len(traces) == 1
    _, eager = O.update(tree, model, g)
    np.testing.assert_allclose(np.asarray(jitted["w"]), np.asarray(eager["w"]), rtol=1e-5,
                               atol=1e-7)


def libraries():
    out = [("numpy", np.asarray)]
    try:
        import torch

        out.append(("torch", torch.tensor))
    except ImportError:
        pass
    return out + [("jax", jnp.asarray)]


@pytest.mark.parametrize("lib, wrap", libraries(), ids=[name for name, _ in libraries()])
@pytest.mark.parametrize("rule, change", ADJUSTED, ids=[rule_id(r) for r, _ in ADJUSTED])
def test_resume_after_adjust_is_bit_for_bit(rule, change, lib, wrap, tmp_path):
    """Train 7 steps, adjusting the numbers after step 2; or train 4, save, load into a
    fresh tree (default numbers) and train 3 more: the same bits, parameters and state."""
    x0, grad = problem((5, 3))
    ckpt = tmp_path / "opt.ckpt"

    def run(model, tree, steps):
        for k in steps:
            if k == 2:
                O.adjust_(tree, **change)
            g = {"w": wrap(np.asarray(grad(np.asarray(model["w"]), k)))}
            tree, model = O.update_(tree, model, g)
        return tree, model

    model_a = {"w": wrap(x0.copy())}
    tree_a, model_a = run(model_a, O.setup(rule, model_a), range(7))
    model_b = {"w": wrap(x0.copy())}
    tree_b, model_b = run(model_b, O.setup(rule, model_b), range(4))
    O.save(ckpt, tree_b)
    loaded = O.load(ckpt, like=O.setup(rule, copy.deepcopy(model_b)))
    assert loaded["w"].rule == tree_b["w"].rule != rule
    tree_b, model_b = run(model_b, loaded, range(4, 7))
    assert np.asarray(model_a["w"]).tobytes() == np.asarray(model_b["w"]).tobytes()
    for a, b in zip(jax.tree.leaves(tree_a["w"].state), jax.tree.leaves(tree_b["w"].state)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.parametrize("rule", [O.ADOPT(0.05), O.ADOPT(0.05, clip=False),
                                  O.ScheduleFreeAdamW(0.05, lambd=0.01, warmup=2)], ids=rule_id)
def test_elementwise_rules_fused_steps_equal_plain(rule, monkeypatch):
    """ADOPT's and Schedule-Free's fused groups give the plain path's bits."""
    rng = np.random.default_rng(0)
    model = {f"p{i}": rng.normal(size=40).astype(np.float32) for i in range(6)}
    model["frozen"] = rng.normal(size=40).astype(np.float32)

    def grads(m, k):
        r = np.random.default_rng(100 + k)
        return {key: r.normal(size=v.shape).astype(np.float32) for key, v in m.items()}

    fast = run_fused(rule, copy.deepcopy(model), grads, 5, True, True, monkeypatch)
    plain = run_fused(rule, copy.deepcopy(model), grads, 5, True, False, monkeypatch)
    for k in model:
        np.testing.assert_array_equal(fast[1][k], plain[1][k])
        for a, b in zip(fast[0][k].state, plain[0][k].state):
            np.testing.assert_array_equal(a, b)


def test_chains_and_mixed_precision_pass_the_evaluation_point_on():
    """``averaged`` of a chain ending in Schedule-Free (after a clip that never clips) is
    Schedule-Free's own; through MixedPrecision, the master copy's, rounded."""
    x0, grad = problem((6,))
    alone, chained, mixed = ({"w": x0.copy()}, {"w": x0.copy()},
                             {"w": x0.astype(np.float16)})
    rule = O.ScheduleFreeAdamW(0.05)
    trees = [O.setup(rule, alone), O.setup(O.OptimiserChain(O.ClipNorm(1e6), rule), chained),
             O.setup(O.MixedPrecision(rule), mixed)]
    for k in range(5):
        for i, m in enumerate((alone, chained, mixed)):
            O.update_(trees[i], m, {"w": grad(m["w"].astype(np.float32), k).astype(
                m["w"].dtype)})
    want = O.averaged(trees[0], alone)["w"]
    np.testing.assert_array_equal(O.averaged(trees[1], chained)["w"], want)
    point = O.averaged(trees[2], mixed)["w"]
    assert point.dtype == np.float16 and not np.allclose(point, mixed["w"], rtol=1e-3)
    master = trees[2]["w"].state
    np.testing.assert_array_equal(point, rule.averaged(master[1], master[0]).astype(np.float16))


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("n", [2, 40], ids=["plain", "fused"])
@pytest.mark.parametrize("rule_of", [
    lambda e: O.LAMB(eta=e, lambd=0.01), lambda e: O.LARS(eta=e, trust=0.01),
    lambda e: O.ADOPT(eta=e), lambda e: O.ScheduleFreeAdamW(eta=e, warmup=3),
], ids=["LAMB", "LARS", "ADOPT", "ScheduleFreeAdamW"])
def test_a_scheduled_eta_equals_adjust_before_every_step(rule_of, n, lib):
    """A schedule in ``eta`` (evaluated at the Leaf's clock), bit for bit as ``adjust_``
    with its value before each step; Schedule-Free's weights follow the rates it sees."""
    schedule = O.Warmup(O.Cosine(3e-2, 3e-3, 10), 4)
    wrap = np.asarray if lib == "numpy" else pytest.importorskip("torch").tensor
    rng = np.random.default_rng(0)
    start = [rng.normal(size=16).astype(np.float32) for _ in range(n)]
    scheduled, adjusted = [wrap(a.copy()) for a in start], [wrap(a.copy()) for a in start]
    t1, t2 = O.setup(rule_of(schedule), scheduled), O.setup(rule_of(schedule(0)), adjusted)
    for k in range(12):
        g = [rng.normal(size=16).astype(np.float32) for _ in range(n)]
        O.update_(t1, scheduled, [wrap(a.copy()) for a in g])
        O.adjust_(t2, eta=schedule(k))
        O.update_(t2, adjusted, [wrap(a.copy()) for a in g])
    for a, b in zip(scheduled, adjusted):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert not np.allclose(np.asarray(scheduled[0]), start[0])
