"""Plateau and observe: torch's ReduceLROnPlateau on the same metrics, a correct relative test
for negative ones (where torch and optax are wrong), checkpoints that resume exactly,
composition inside Warmup and Join, ties kept, jit without re-tracing, a NumPy training loop."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import optimisers as O
from conftest import counted
from optimisers import Plateau, observe, observe_

torch = pytest.importorskip("torch")

SETTINGS = [dict(zip(("mode", "threshold_mode", "factor", "patience", "threshold", "cooldown",
                      "min"), combo))
            for combo in itertools.product(("min", "max"), ("rel", "abs"), (0.5, 0.1),
                                           (0, 2), (1e-4, 0.05), (0, 3), (0.0, 1e-3))]


def torch_values(metrics, lr, **kw):
    """The learning rate after each ``scheduler.step(metric)`` of torch's ReduceLROnPlateau."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    kw = dict(kw, min_lr=kw.pop("min", 0.0))
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, **kw)
    out = []
    for m in metrics:
        scheduler.step(m)
        out.append(opt.param_groups[0]["lr"])
    return out, scheduler


def our_values(metrics, lr, **kw):
    s, out = Plateau(lr, **kw), []
    for m in metrics:
        s = observe(s, m)
        out.append(s(0))
    return out, s


def walk(rng, n=60):
    """A positive metric that falls, stalls and jitters: a loss, or (mode max) an accuracy."""
    steps = rng.choice([-0.2, -0.01, 0.0, 0.0, 0.005, 0.1], size=n)
    return list(np.abs(5.0 + np.cumsum(steps)) + 0.01)


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: "-".join(map(str, kw.values())))
def test_matches_torch_reduce_lr_on_plateau(kw):
    rng = np.random.default_rng(len(str(kw)))
    for _ in range(3):
        metrics = walk(rng)
        theirs, scheduler = torch_values(metrics, 1.0, **kw)
        ours, s = our_values(metrics, 1.0, **kw)
        assert ours == theirs  # bit for bit
        assert (s.best, s.bad_epochs, s.cooldown_left) == (
            scheduler.best, scheduler.num_bad_epochs, scheduler.cooldown_counter)


def test_reductions_happen_and_epsilon_skips_the_tiny_ones():
    metrics = [1.0] * 12
    ours, _ = our_values(metrics, 1.0, factor=0.5, patience=1)
    assert ours == torch_values(metrics, 1.0, factor=0.5, patience=1)[0]
    assert ours[-1] == 0.5 ** 5
    tiny, _ = our_values(metrics, 1e-8, factor=0.5, patience=0)  # a step below epsilon
    assert tiny == torch_values(metrics, 1e-8, factor=0.5, patience=0)[0] == [1e-8] * 12
    floor, _ = our_values(metrics, 1.0, factor=0.1, patience=0, min=0.05)
    assert floor[-1] == 0.05


def test_negative_metric_that_stalls_reduces():
    """A loss that goes negative (a log-likelihood) and then stalls: a relative improvement
    means lower than best by threshold * |best|. torch's ``best * (1 - threshold)`` takes each
    stalled value for an improvement and never reduces."""
    metrics = [2.0, 0.5, -1.0, -3.0, -3.0, -3.0002, -2.9, -3.0, -3.0, -3.0]
    ours, s = our_values(metrics, 1.0, factor=0.5, patience=2)
    assert ours == [1.0] * 6 + [0.5, 0.5, 0.5, 0.25]  # -3.0002 is no improvement: -3.0003 is
    assert s.best == -3.0
    theirs, scheduler = torch_values(metrics, 1.0, factor=0.5, patience=2)
    assert theirs == [1.0] * 10 and scheduler.best == -3.0  # every -3.0 an "improvement"
    # mode max with a negative metric (a reward): torch again takes worse for better
    rewards = [-10.0, -10.0005, -10.0005, -10.0005, -10.0005]
    ours, _ = our_values(rewards, 1.0, mode="max", factor=0.5, patience=2)
    assert ours == [1.0, 1.0, 1.0, 0.5, 0.5]
    assert torch_values(rewards, 1.0, mode="max", factor=0.5, patience=2)[0] == [1.0] * 5
    # "abs" needs no sign: torch's, for negative metrics too
    kw = dict(threshold_mode="abs", threshold=0.01, factor=0.5, patience=1)
    metrics = [-1.0, -1.005, -1.02, -1.02, -1.0, -1.03, -1.03, -1.03]
    assert our_values(metrics, 1.0, **kw)[0] == torch_values(metrics, 1.0, **kw)[0]


def test_optax_reduce_on_plateau_never_reduces_a_stalled_negative_loss():
    """optax's ``avg_value < (1 - rtol) * best_value - atol`` has the same fault."""
    optax = pytest.importorskip("optax")
    jnp = pytest.importorskip("jax.numpy")
    tx = optax.contrib.reduce_on_plateau(factor=0.5, patience=2, rtol=1e-4, atol=0.0)
    params = {"w": jnp.ones(1)}
    state, s = tx.init(params), Plateau(1.0, factor=0.5, patience=2)
    for _ in range(10):
        _, state = tx.update(params, state, params, value=-3.0)
        s = observe(s, -3.0)
    assert float(state.scale) == 1.0 and float(state.plateau_count) == 0
    assert s.value == 0.125


def test_fields_checked():
    with pytest.raises(ValueError, match="Plateau's mode must be 'min' or 'max'"):
        Plateau(1.0, mode="minimum")
    with pytest.raises(ValueError, match="Plateau's threshold_mode must be 'rel' or 'abs'"):
        Plateau(1.0, threshold_mode="relative")
    with pytest.raises(ValueError, match="Plateau's factor must be in"):
        Plateau(1.0, factor=1.0)
    with pytest.raises(TypeError, match="positional"):
        Plateau(1.0, 0.5)
    assert Plateau(1, mode="max").best == -np.inf and Plateau(1).value == 1.0
    assert Plateau(1.0, best=2.0) != Plateau(1.0)


def test_metric_must_be_one_number():
    s = Plateau(1.0)
    for ok in (2, np.float32(2.0), np.array(2.0), torch.tensor(2.0)):
        assert observe(s, ok).best == 2.0
    for bad in ("2.0", np.ones(2), torch.ones(2), None, True):
        with pytest.raises(TypeError, match="observe's metric must be one real number"):
            observe(s, bad)
    with pytest.raises(ValueError, match="observe found no Plateau in the rules"):
        observe(O.setup(O.Adam(), {"w": np.ones(2)}), 1.0)
    tree = O.setup({"a": O.Adam(Plateau(1.0)), "b": O.Adam()}, {"a": np.ones(2), "b": np.ones(2)})
    with pytest.raises(ValueError, match="no Plateau in the rules picked by where='b'"):
        observe_(tree, 1.0, where="b")
    assert tree["a"].rule.eta == Plateau(1.0)  # nothing written


def stalled(tree, n):
    for _ in range(n):
        tree = observe(tree, 1.0)
    return tree


def test_inside_warmup_join_scaled_and_chains():
    plateau = Plateau(1.0, factor=0.5, patience=0)
    rule = O.OptimiserChain(O.WeightDecay(0.5 * plateau),
                            O.Adam(O.Join([O.Warmup(plateau, 2), O.Constant(1e-3)], [100])))
    new = stalled(rule, 3)  # the first observation is an improvement, then two reductions
    assert new.rules[1].eta.schedules[0].schedule.value == 0.25
    assert new.rules[0].lambd.schedule.value == 0.25
    assert new.rules[1].eta.schedules[1] is rule.rules[1].eta.schedules[1]  # kept
    assert [O.schedules.at(new, t).rules[1].eta for t in (0, 1, 2, 50, 100)] == [
        0.0, 0.125, 0.25, 0.25, 1e-3]
    assert O.schedules.at(new, 7).rules[0].lambd == 0.125
    assert rule.rules[1].eta.schedules[0].schedule == plateau  # pure


def test_shared_rules_stay_shared_and_ties_kept():
    w = np.ones(2)
    rule = O.Adam(Plateau(1.0, factor=0.5, patience=0))
    model = {"a": w, "b": w, "c": np.ones(3)}
    tree = O.setup(rule, model)
    assert tree["a"] is tree["b"] and tree["a"].rule is tree["c"].rule
    new = stalled(tree, 2)
    assert new["a"] is new["b"] and new["a"].rule is new["c"].rule
    assert new["c"].rule.eta.value == 0.5 and tree["c"].rule.eta.value == 1.0
    assert new["c"].state is tree["c"].state
    observe_(tree, 1.0, where="c")
    observe_(tree, 1.0, where="c")
    assert tree["c"].rule.eta.value == 0.5 and tree["a"].rule.eta.value == 1.0
    assert tree["a"].rule is tree["b"].rule


def test_checkpoint_resumes_exactly(tmp_path):
    rule = O.OptimiserChain(O.ClipNorm(1.0), O.Adam(O.Warmup(
        Plateau(0.1, factor=0.5, patience=2, cooldown=1, threshold=0.01), 3)))
    model = {"w": np.ones(3), "v": np.ones(2)}
    tree = O.setup(rule, model)
    rng = np.random.default_rng(0)
    metrics = walk(rng, 40)
    for m in metrics[:17]:
        tree = observe(tree, m)
    mid = tree["w"].rule.rules[1].eta.schedule
    assert mid.bad_epochs or mid.cooldown_left or mid.value < 0.1  # mid-run
    O.save(tmp_path / "ckpt", tree)
    back = O.load(tmp_path / "ckpt", like=O.setup(rule, model))
    assert back["w"].rule == tree["w"].rule and back["w"].rule is back["v"].rule
    for m in metrics[17:]:
        tree, back = observe(tree, m), observe(back, m)
        assert back["w"].rule == tree["w"].rule
    ours = tree["w"].rule.rules[1].eta.schedule
    assert ours.value < mid.value


def test_training_loop_on_numpy():
    """update_ and observe_ on two arrays (one fused group): each step uses the value the
    Plateau holds, as adjust_ of a plain number would."""
    rng = np.random.default_rng(1)
    x, target = rng.normal(size=(32, 3)), rng.normal(size=32)

    def grads(m):
        error = 2 * (x @ m["w"] + m["b"] - target) / len(x)
        return {"w": x.T @ error, "b": error.sum(keepdims=True)}

    model, twin = ({"w": np.zeros(3), "b": np.zeros(1)} for _ in range(2))
    tree = O.setup(O.Momentum(Plateau(0.05, factor=0.5, patience=1, threshold=0.01)), model)
    mirror = O.setup(O.Momentum(0.05), twin)
    seen = []
    for _ in range(40):
        O.update_(tree, model, grads(model))
        O.update_(mirror, twin, grads(twin))
        observe_(tree, float(np.mean((x @ model["w"] + model["b"] - target) ** 2)))
        seen.append(tree["w"].rule.eta.value)
        O.adjust_(mirror, seen[-1])
    assert tree["w"].rule is tree["b"].rule
    np.testing.assert_array_equal(model["w"], twin["w"])
    np.testing.assert_array_equal(model["b"], twin["b"])
    assert seen[-1] < 0.05 and len(set(seen)) > 2


def test_jit_does_not_retrace_after_observe():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    f, traces = counted(O.update)
    step = jax.jit(f)
    model = {"w": jnp.ones(3)}
    tree = O.setup(O.Adam(O.Warmup(Plateau(0.1, factor=0.5, patience=0), 2)), model)
    values = []
    for i in range(6):
        tree, model = step(tree, model, {"w": jnp.ones(3)})
        tree = observe(tree, float(i))  # a loss that rises: a reduction at each but the first
        values.append(tree["w"].rule.eta.schedule.value)
    assert len(traces) == 1
    assert values == [0.1, 0.05, 0.025, 0.0125, 0.00625, 0.003125]
    assert O.schedules.at(tree["w"].rule, 6).eta == 0.003125
    _, jitted = step(tree, model, {"w": jnp.ones(3)})  # the reduced rate, traced as data
    _, eager = O.update(tree, model, {"w": jnp.ones(3)})
    np.testing.assert_allclose(np.asarray(jitted["w"]), np.asarray(eager["w"]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(eager["w"]), np.asarray(model["w"]) - 0.003125,
                               rtol=1e-5)  # Adam's step on constant gradients: the rate
    assert len(traces) == 1
