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


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("n,size", [(1, 64), (3, 64), (3, 300_000), (150, 16)])
@pytest.mark.parametrize("rule_of", [
    lambda e: O.AdamW(eta=e, lambd=0.1),
    lambda e: O.OptimiserChain(O.ClipGrad(1.0), O.Momentum(eta=e)),
    lambda e: O.EMA(O.Nesterov(eta=e), 0.9),
], ids=["AdamW", "chain", "EMA"])
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
    assert len(schedules._TIMED) <= 4097 and len(reduce._PLACES) <= 4097
