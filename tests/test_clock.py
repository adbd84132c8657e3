"""A schedule in a rule's field, and the Leaf's clock it is evaluated at (CONTRACT.md
section 8): equal to adjust_ with the schedule's value before every step, bit for bit, on
every path (plain, fused groups, NumPy, PyTorch, JAX); the clock stops when frozen, counts
real steps after AccumGrad, survives checkpoints and adjust; under jit nothing re-traces."""

from __future__ import annotations

import numpy as np
import pytest

import optimisers as O
from conftest import beside_optax, counted
from optimisers.schedules import at

SCHED = O.Warmup(O.Cosine(3e-2, 3e-3, 20), 5)


def _copy(a):
    return a.clone() if hasattr(a, "clone") else np.array(a)


def _model(lib, n, size, rng):
    arrays = [rng.normal(size=size).astype(np.float32) for _ in range(n)]
    if lib == "torch":
        torch = pytest.importorskip("torch")
        return [torch.tensor(a) for a in arrays]
    return arrays


def _against_adjust(lib, n, size, rule_of, steps=25, freeze_at=(), seed=0):
    """Train ``rule_of(SCHED)`` and, beside it, ``rule_of(number)`` adjusted to the schedule's
    value at the clock before every step; return both models and trees."""
    rng = np.random.default_rng(seed)
    m1 = _model(lib, n, size, rng)
    m2 = [_copy(a) for a in m1]
    t1, t2 = O.setup(rule_of(SCHED), m1), O.setup(rule_of(SCHED(0)), m2)
    clock = 0
    for k in range(steps):
        frozen = k in freeze_at
        for t in (t1, t2):
            (O.freeze_ if frozen else O.thaw_)(t, "0")
        g = [_copy(a) for a in _model(lib, n, size, rng)]
        O.update_(t1, m1, g)
        O.adjust_(t2, eta=SCHED(clock))
        O.update_(t2, m2, [_copy(a) for a in g])
        clock += 1
    return m1, m2, t1, t2


def _as_function(e):
    """The schedule ``SCHED`` as a plain function (a number as it is)."""
    return (lambda t: SCHED(t)) if isinstance(e, O.Schedule) else e


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("n,size", [(1, 64), (3, 64), (3, 300_000), (150, 16)])
@pytest.mark.parametrize("rule_of", [
    lambda e: O.AdamW(eta=e, lambd=0.1),
    lambda e: O.OptimiserChain(O.ClipGrad(1.0), O.Momentum(eta=e)),
    lambda e: O.EMA(O.Nesterov(eta=e), 0.9),
    lambda e: O.OptimiserChain(O.ClipGrad(1.0), O.AdamW(eta=_as_function(e), lambd=0.1)),
], ids=["AdamW", "chain", "EMA", "function"])
def test_a_scheduled_field_equals_adjust_before_every_step(lib, n, size, rule_of):
    m1, m2, t1, _ = _against_adjust(lib, n, size, rule_of)
    for a, b in zip(m1, m2):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert all(leaf.clock == 25 for leaf in t1)


def test_every_leaf_counts_its_steps_and_a_frozen_one_stops():
    """Unscheduled rules count too (adjust may put a schedule in later); freeze_ stops the
    clock, and the schedule resumes where it was."""
    m1, m2, t1, _ = _against_adjust("numpy", 3, 64, lambda e: O.Adam(eta=e),
                                    freeze_at=range(4, 9))
    assert [leaf.clock for leaf in t1] == [20, 25, 25]
    model = [np.ones(2)]
    tree = O.setup(O.Descent(0.1), model)
    for _ in range(3):
        O.update_(tree, model, [np.ones(2)])
    assert tree[0].clock == 3


def test_a_frozen_leaf_resumes_its_schedule_where_it_stopped():
    rng = np.random.default_rng(1)
    model = [rng.normal(size=8).astype(np.float32) for _ in range(2)]
    tree = O.setup(O.Descent(eta=O.Linear(1.0, 0.0, 10)), model)
    for k in range(6):
        (O.freeze_ if 2 <= k < 5 else O.thaw_)(tree, "0")
        before = [x.copy() for x in model]
        O.update_(tree, model, [np.ones(8, np.float32)] * 2)
        if 2 <= k < 5:
            np.testing.assert_array_equal(model[0], before[0])
    assert [leaf.clock for leaf in tree] == [3, 6]
    eta0, eta1 = (at(leaf.rule, leaf.clock).eta for leaf in tree)
    assert (eta0, eta1) == (pytest.approx(0.7), pytest.approx(0.4))


def test_the_clock_counts_real_steps_after_accumgrad():
    """OptimiserChain(AccumGrad(3), Adam(eta=schedule)): the schedule moves once per three
    updates, and equals adjust_ with its value at the real steps taken."""
    rng = np.random.default_rng(2)
    model = [rng.normal(size=16).astype(np.float32) for _ in range(3)]
    other = [a.copy() for a in model]
    t1 = O.setup(O.OptimiserChain(O.AccumGrad(3), O.Adam(eta=SCHED)), model)
    t2 = O.setup(O.OptimiserChain(O.AccumGrad(3), O.Adam(eta=SCHED(0))), other)
    for k in range(30):
        g = [rng.normal(size=16).astype(np.float32) for _ in range(3)]
        O.update_(t1, model, g)
        O.adjust_(t2, eta=SCHED(k // 3))  # (k // 3 real steps done before this update)
        O.update_(t2, other, [a.copy() for a in g])
        assert t1[0].clock == (k + 1) // 3
    for a, b in zip(model, other):
        np.testing.assert_array_equal(a, b)


def test_adjust_swaps_numbers_and_schedules_and_the_clock_continues():
    model = [np.ones(4, np.float32) for _ in range(2)]
    tree = O.setup(O.Momentum(0.1), model)
    for _ in range(4):
        O.update_(tree, model, [np.ones(4, np.float32)] * 2)
    O.adjust_(tree, eta=O.Linear(1.0, 0.0, 8))
    assert at(tree[0].rule, tree[0].clock).eta == 0.5  # step 4 of 8
    O.update_(tree, model, [np.ones(4, np.float32)] * 2)
    O.adjust_(tree, eta=0.25)
    O.update_(tree, model, [np.ones(4, np.float32)] * 2)
    assert [leaf.clock for leaf in tree] == [6, 6] and tree[0].rule.eta == 0.25


def test_a_schedule_out_of_its_fields_range_is_an_error_naming_the_path():
    """Checked before anything is written: the other subset's arrays stay as they were."""
    model = {"a": np.ones(3), "w": np.ones(3)}
    tree = O.setup({"a": O.Descent(0.1), "w": O.Descent(eta=O.Linear(1.0, -1.0, 4))}, model)
    grads = {"a": np.ones(3), "w": np.ones(3)}
    for _ in range(2):
        O.update_(tree, model, grads)
    O.update_(tree, model, grads)  # at eta 0
    before = {k: v.copy() for k, v in model.items()}
    with pytest.raises(ValueError, match=r"eta must be >= 0.*KeyPath\('w'\)"):
        O.update_(tree, model, grads)
    assert tree["w"].clock == tree["a"].clock == 3
    for k in model:
        np.testing.assert_array_equal(model[k], before[k])


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_resume_mid_schedule_from_a_checkpoint_is_bit_exact(tmp_path, lib):
    rng = np.random.default_rng(3)
    model = _model(lib, 3, 64, rng)
    rule = O.OptimiserChain(O.ClipGrad(1.0), O.AdamW(eta=SCHED, beta=(0.9, O.Constant(0.99)),
                                                    lambd=0.1))
    tree = O.setup(rule, model)
    grads = [[_copy(a) for a in _model(lib, 3, 64, rng)] for _ in range(20)]
    for g in grads[:8]:
        O.update_(tree, model, g)
    O.save(tmp_path / "ckpt", tree)
    saved = [_copy(a) for a in model]
    for g in grads[8:]:
        O.update_(tree, model, g)
    back = O.load(tmp_path / "ckpt", like=O.setup(rule, saved))
    assert back[0].rule == rule and back[0].clock == 8
    for g in grads[8:]:
        O.update_(back, saved, g)
    for a, b in zip(model, saved):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_checkpoint_without_clocks_loads_them_as_zero(tmp_path):
    import json
    import zipfile

    model = [np.ones(3)]
    tree = O.setup(O.Adam(), model)
    O.update_(tree, model, [np.ones(3)])
    O.save(tmp_path / "c", tree)
    path = next(tmp_path.iterdir())
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    name = next(n for n in members if n.endswith(".json"))
    doc = json.loads(members[name])
    assert [rec.pop("clock") for rec in doc["leaves"]] == [1]
    members[name] = json.dumps(doc).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for n, data in members.items():
            zf.writestr(n, data)
    assert O.load(path, like=O.setup(O.Adam(), model))[0].clock == 0


def test_torch_adamw_with_a_schedule_equals_lambdalr():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    ref.load_state_dict(net.state_dict())
    sched = O.Warmup(O.Cosine(1e-2, 1e-3, 30), 10)
    tree = O.setup(O.AdamW(eta=sched, lambd=0.01), net)
    opt = torch.optim.AdamW(ref.parameters(), lr=1.0, weight_decay=0.01)
    lr = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=sched)
    for _ in range(40):
        x = torch.randn(8, 6)
        for m in (net, ref):
            m.zero_grad()
            m(x).pow(2).mean().backward()
        O.update_(tree, net)
        opt.step()
        lr.step()
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_under_jit_a_schedule_tracks_optax_and_adjust_never_retraces():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    optax = pytest.importorskip("optax")
    rng = np.random.default_rng(4)
    shapes = {"a": (8,), "b": (70_000,)}  # the plain path and the fused one

    def draw():
        return {k: jnp.asarray(rng.normal(size=s).astype(np.float32)) for k, s in shapes.items()}

    step, traces = counted(O.update)
    jitted = jax.jit(step)
    model = draw()
    tx = optax.adam(optax.warmup_cosine_decay_schedule(0.0, 3e-2, 5, 25, 3e-3))
    tree, ours, theirs = beside_optax(jitted, O.setup(O.Adam(eta=SCHED), model), model, tx,
                                      draw, 25)
    for k in shapes:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-5, atol=1e-6)
    assert int(tree["a"].clock) == 25
    tree = O.adjust(tree, eta=O.Warmup(O.Cosine(2e-2, 1e-3, 9), 3))
    tree, ours = jitted(tree, ours, draw())
    tree = O.adjust(tree, eta=O.Warmup(O.Cosine(1e-2, 1e-4, 7), 2, 1e-3))
    tree, ours = jitted(tree, ours, draw())
    assert len(traces) == 1 and int(tree["b"].clock) == 27


def test_jax_eager_equals_adjust_bit_for_bit():
    jnp = pytest.importorskip("jax.numpy")
    rng = np.random.default_rng(5)
    model = {"w": jnp.asarray(rng.normal(size=32).astype(np.float32))}
    t1, t2, m1, m2 = O.setup(O.Adam(eta=SCHED), model), O.setup(O.Adam(), model), model, model
    for k in range(12):
        g = {"w": jnp.asarray(rng.normal(size=32).astype(np.float32))}
        t1, m1 = O.update(t1, m1, g)
        t2, m2 = O.update(O.adjust(t2, eta=SCHED(k)), m2, g)
    np.testing.assert_array_equal(m1["w"], m2["w"])


def test_leafs_whose_clocks_differ_still_fuse_without_a_schedule_and_caches_stay_bounded():
    from optimisers import reduce, schedules

    model = [np.ones(8, np.float32) for _ in range(6)]
    tree = O.setup(O.Momentum(0.1), model)
    O.freeze_(tree, "0")
    O.update_(tree, model, [np.ones(8, np.float32)] * 6)
    O.thaw_(tree, "0")
    O.adjust_(tree, eta=0.1)  # new rules: the Leafs are grouped afresh
    for _ in range(3):
        O.update_(tree, model, [np.ones(8, np.float32)] * 6)
    assert [leaf.clock for leaf in tree] == [3, 4, 4, 4, 4, 4]
    assert [len(g.leaves) for g in O.state.plan_of(tree).groups] == [6]
    for k in range(5000):
        O.adjust_(tree, eta=0.1 + k * 1e-6)
        O.update_(tree, model, [np.ones(8, np.float32)] * 6)
    assert schedules._timed.cache_info().currsize <= 4096
    assert reduce._places.cache_info().currsize <= 4096


# --- torch.optim.lr_scheduler's runs, step for step ------------------------------------------

N = 30


def momenta():
    """OneCycleLR's momenta (cycle_momentum=True, its default), from 0.95 down to 0.85 and
    back, as a schedule."""
    return O.OneCycle(0.85, N, start=0.95, end=0.95)


def _torch_run(make, schedule, x0, grads):
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.tensor(x0))
    opt = make(torch.optim, [p])
    scheduler = schedule(torch.optim.lr_scheduler, opt)
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
        scheduler.step()
    return p.detach().numpy()


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
@pytest.mark.parametrize(("rule_of", "make", "schedule"), [
    (lambda: O.Momentum(O.OneCycle(0.1, N), momenta(), eta_outside=True),
     lambda T, ps: T.SGD(ps, lr=0.1, momentum=0.9), lambda L, o: L.OneCycleLR(o, 0.1, N)),
    (lambda: O.Nesterov(O.OneCycle(0.1, N), momenta(), eta_outside=True),
     lambda T, ps: T.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
     lambda L, o: L.OneCycleLR(o, 0.1, N)),
    (lambda: O.Momentum(O.Step(0.1, 0.5, 7), 0.9, eta_outside=True),
     lambda T, ps: T.SGD(ps, lr=0.1, momentum=0.9), lambda L, o: L.StepLR(o, 7, 0.5)),
    (lambda: O.Nesterov(O.Step(0.1, 0.5, 7), 0.8, eta_outside=True),
     lambda T, ps: T.SGD(ps, lr=0.1, momentum=0.8, nesterov=True),
     lambda L, o: L.StepLR(o, 7, 0.5)),
    (lambda: O.Adam(O.OneCycle(0.1, N), (momenta(), 0.999)),
     lambda T, ps: T.Adam(ps, lr=0.1), lambda L, o: L.OneCycleLR(o, 0.1, N)),
    (lambda: O.AdamW(O.OneCycle(0.1, N), (momenta(), 0.99), lambd=0.01),
     lambda T, ps: T.AdamW(ps, lr=0.1, betas=(0.9, 0.99), weight_decay=0.01),
     lambda L, o: L.OneCycleLR(o, 0.1, N)),
], ids=["SGD-OneCycleLR", "Nesterov-OneCycleLR", "SGD-StepLR", "Nesterov-StepLR",
        "Adam-OneCycleLR", "AdamW-OneCycleLR"])
def test_a_run_under_a_torch_scheduler_follows_torchs_trajectory(rule_of, make, schedule, lib):
    """SGD's momentum and Adam's beta[0] cycled by OneCycleLR (cycle_momentum=True), the
    rate stepped by StepLR: to float32 rounding (a few ulps of the displacement), on every
    library and under jax.jit. Before: Momentum's rate sat inside its velocity (0.44 of the
    displacement off), and Adam corrected its bias by the product of the betas it took
    (0.1 off; torch raises the current beta to the step count)."""
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=64).astype(np.float32)
    grads = [rng.normal(size=64).astype(np.float32) for _ in range(N)]
    want = _torch_run(make, schedule, x0, grads)
    if lib == "jax":
        jnp = pytest.importorskip("jax.numpy")
        jitted = pytest.importorskip("jax").jit(O.update)
        model, step, conv = [jnp.asarray(x0)], jitted, jnp.asarray
    else:
        conv = pytest.importorskip("torch").tensor if lib == "torch" else np.array
        model, step = [conv(x0)], O.update_
    tree = O.setup(rule_of(), model)
    for g in grads:
        tree, model = step(tree, model, [conv(g)])
    got = np.asarray(model[0])
    error = np.abs((got - x0) - (want - x0)).max() / np.abs(want - x0).max()
    assert error < (2e-5 if lib == "jax" else 2e-6)  # jit: schedules, 1 - b^t in float32


def test_the_rate_outside_the_velocity_steps_as_inside_at_a_constant_rate():
    rng = np.random.default_rng(1)
    for inside, outside in [(O.Momentum(0.05, 0.9), O.Momentum(0.05, 0.9, eta_outside=True)),
                            (O.Nesterov(0.05, 0.8), O.Nesterov(0.05, 0.8, eta_outside=True))]:
        m1, m2 = [np.zeros(16)], [np.zeros(16)]
        t1, t2 = O.setup(inside, m1), O.setup(outside, m2)
        for _ in range(20):
            g = [rng.normal(size=16)]
            O.update_(t1, m1, g)
            O.update_(t2, m2, g)
        np.testing.assert_allclose(m1[0], m2[0], rtol=1e-13, atol=1e-15)
        assert np.allclose(t2[0].state * -0.05 if type(inside) is O.Nesterov
                           else t2[0].state * 0.05, t1[0].state)


# --- a plain function as a schedule: every path, checkpoints ---------------------------------


def warmup(step):
    """A learning-rate function as users write one for LambdaLR (importable by its name)."""
    return 1e-2 * min(1.0, (step + 1) / 5)


def test_a_function_schedule_is_saved_by_its_name_and_taken_again_from_like(tmp_path):
    model = [np.ones(4), np.ones(4)]
    tree = O.setup(O.Adam(eta=warmup), model)
    for _ in range(3):
        O.update_(tree, model, [np.ones(4)] * 2)
    O.save(tmp_path / "ckpt", tree)
    back = O.load(tmp_path / "ckpt", like=O.setup(O.Adam(eta=warmup), model))
    assert back[0].rule == tree[0].rule and back[0].rule.eta.function is warmup
    assert back[0].clock == 3
    d = O.state_dict(tree)
    assert d["0.rule"]["fields"]["eta"]["fields"]["function"] == {
        "function": f"{__name__}:warmup"}
    assert O.load_state_dict(O.setup(O.Adam(eta=warmup), model), d)[0].rule == tree[0].rule
    with pytest.raises(ValueError, match=r"holds the function '.*:warmup'.*load takes from "
                                         r"like.*pass it again through load\(path, like="):
        O.load(tmp_path / "ckpt", like=O.setup(O.Adam(), model))


@pytest.mark.parametrize("kind", ["lambda", "made inside a function"])
def test_save_refuses_a_function_without_a_name_and_says_how(tmp_path, kind):
    def made_inside(t):
        return 1e-3

    f = (lambda t: 1e-3) if kind == "lambda" else made_inside
    model = [np.ones(2)]
    tree = O.setup(O.Descent(eta=f), model)
    with pytest.raises(TypeError, match=r"KeyPath\(0\).*no name that imports it again.*"
                                        r"pass it again through load\(path, like="):
        O.save(tmp_path / "ckpt", tree)
    assert not list(tmp_path.iterdir())


def test_an_optax_schedule_under_jit_tracks_optax_and_never_retraces():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    optax = pytest.importorskip("optax")
    rng = np.random.default_rng(6)
    shapes = {"a": (8,), "b": (70_000,)}  # the plain path and the fused one

    def draw():
        return {k: jnp.asarray(rng.normal(size=s).astype(np.float32)) for k, s in shapes.items()}

    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-2, 5, 25, 3e-3)
    step, traces = counted(O.update)
    model = draw()
    tree, ours, theirs = beside_optax(jax.jit(step), O.setup(O.Adam(eta=schedule), model),
                                      model, optax.adam(schedule), draw, 25)
    for k in shapes:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-5, atol=1e-6)
    assert len(traces) == 1 and int(tree["a"].clock) == 25


def test_after_a_jitted_step_schedules_keep_python_numbers(tmp_path):
    """Read from a jitted step's output, a schedule's step counts are Python ints again (as
    its floats are): in the Leaf's repr, summary and the checkpoint. Before:
    Cosine(steps=Array(270, dtype=int32, weak_type=True)) everywhere."""
    import json
    import zipfile

    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    rule = O.AdamW(eta=O.Warmup(O.Cosine(3e-4, 3e-5, 270), 30), lambd=0.1,
                   beta=(O.Join([O.Constant(0.9), O.Constant(0.95)], [100]), 0.999))
    model = {"w": jnp.ones(4)}
    tree, model = jax.jit(O.update)(O.setup(rule, model), model, {"w": jnp.ones(4)})
    assert tree["w"].rule == rule and repr(tree["w"].rule) == repr(rule)
    assert type(tree["w"].rule.eta.schedule.steps) is int
    assert type(tree["w"].rule.beta[0].boundaries[0]) is int
    assert "Array" not in repr(tree["w"]) and "Array" not in O.summary(tree)
    O.save(tmp_path / "ckpt", tree)
    with zipfile.ZipFile(next(tmp_path.iterdir())) as zf:
        doc = json.loads(zf.read("checkpoint.json"))
    eta = doc["leaves"][0]["rule"]["fields"]["eta"]["fields"]
    assert eta["steps"] == 30 and eta["schedule"]["fields"]["steps"] == 270
