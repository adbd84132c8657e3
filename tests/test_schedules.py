"""Schedules: values against optax and torch.optim.lr_scheduler at many steps, every kind
of step count (Python, NumPy, PyTorch, JAX, traced), pytrees that trace once, and their
checks, printing, equality and pickling."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle

import numpy as np
import pytest

import optimisers as O
from optimisers import (
    Constant,
    Cosine,
    Exponential,
    Join,
    Linear,
    OneCycle,
    Polynomial,
    Step,
    Warmup,
)
from optimisers.rules.fields import InvalidKind


def around(*ns: int) -> list[int]:
    """Steps 0, 1, 2 and each of ``ns`` with its neighbours, a middle, and far past them."""
    ts = {0, 1, 2, 10 * max(ns)}
    for n in ns:
        ts |= {n - 1, n, n + 1, n // 2, 2 * n}
    return sorted(t for t in ts if t >= 0)


@pytest.fixture
def jax():
    jax = pytest.importorskip("jax")
    O.backends.ops("jax")  # schedules are pytrees once optimisers has seen JAX
    return jax


# (our schedule, its optax equivalent as a function of the optax module, steps to compare)
OPTAX = [
    (Constant(3e-4), lambda o: o.constant_schedule(3e-4), around(5)),
    (Linear(1e-3, 1e-5, 100), lambda o: o.linear_schedule(1e-3, 1e-5, 100), around(100)),
    (Linear(0.0, 1e-3, 100), lambda o: o.linear_schedule(0.0, 1e-3, 100), around(100)),
    (Linear(0.5, 0.9, 7), lambda o: o.linear_schedule(0.5, 0.9, 7), around(7)),
    (Cosine(1e-3, steps=100), lambda o: o.cosine_decay_schedule(1e-3, 100), around(100)),
    (Cosine(1e-3, 1e-5, 1000), lambda o: o.cosine_decay_schedule(1e-3, 1000, alpha=1e-5 / 1e-3),
     around(1000)),
    (Exponential(1e-2, 0.96, 1000), lambda o: o.exponential_decay(1e-2, 1000, 0.96),
     around(1000, 5000)),
    (Exponential(1e-2, 0.5, 10, staircase=True),
     lambda o: o.exponential_decay(1e-2, 10, 0.5, staircase=True), around(10, 30)),
    (Exponential(1.0, 1.1), lambda o: o.exponential_decay(1.0, 1, 1.1), around(3, 40)),
    (Polynomial(1.0, 0.01, 100, power=2.0), lambda o: o.polynomial_schedule(1.0, 0.01, 2.0, 100),
     around(100)),
    (Polynomial(1e-3, 0.0, 50, 0.5), lambda o: o.polynomial_schedule(1e-3, 0.0, 0.5, 50),
     around(50)),
    (Join([Linear(0.0, 1e-3, 10), Constant(1e-3), Cosine(1e-3, 0.0, 50)], [10, 30]),
     lambda o: o.join_schedules([o.linear_schedule(0.0, 1e-3, 10), o.constant_schedule(1e-3),
                                 o.cosine_decay_schedule(1e-3, 50)], [10, 30]),
     around(10, 30, 80)),
    (Warmup(Cosine(1e-3, 1e-5, 900), 100, start=1e-6),
     lambda o: o.warmup_cosine_decay_schedule(1e-6, 1e-3, 100, 1000, 1e-5), around(100, 1000)),
    (Warmup(Exponential(1e-3, 0.5, 20, staircase=True), 10),
     lambda o: o.warmup_exponential_decay_schedule(0.0, 1e-3, 10, 20, 0.5, staircase=True),
     around(10, 30, 50)),
]
OPTAX_IDS = [repr(case[0])[:60] for case in OPTAX]


@pytest.mark.parametrize(("ours", "theirs", "ts"), OPTAX, ids=OPTAX_IDS)
def test_python_steps_equal_optax_in_float64(ours, theirs, ts):
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    with jax.enable_x64(True):
        want = [float(theirs(optax)(t)) for t in ts]
    got = [ours(t) for t in ts]
    assert all(type(v) is float for v in got)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-18)


@pytest.mark.parametrize(("ours", "theirs", "ts"), OPTAX, ids=OPTAX_IDS)
def test_jax_steps_equal_optax_in_float32(jax, ours, theirs, ts):
    optax = pytest.importorskip("optax")
    jnp = jax.numpy
    schedule = theirs(optax)
    got = [ours(jnp.int32(t)) for t in ts]
    want = [schedule(jnp.int32(t)) for t in ts]
    assert all(getattr(v, "dtype", np.float32) == np.float32 for v in got)
    np.testing.assert_allclose(np.array(got, np.float64), np.array(want, np.float64), rtol=1e-6)


def assert_float32_close(got: list, want: list, message: str = "") -> None:
    """Values computed in float32 (by XLA, which contracts ``a * b + c`` and divides by
    constants as it sees fit) against the double-precision closed form: to float32's
    accuracy, relative to each value and to the largest one (where a value cancels)."""
    got, want = np.array(got, np.float64), np.array(want, np.float64)
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * scale, err_msg=message)


@pytest.mark.parametrize(("ours", "theirs", "ts"), OPTAX, ids=OPTAX_IDS)
def test_jitted_steps_equal_the_closed_form(jax, ours, theirs, ts):
    jitted = jax.jit(lambda s, t: s(t))
    assert_float32_close([jitted(ours, t) for t in ts], [ours(t) for t in ts])
    close = jax.jit(lambda t: ours(t))  # the schedule a constant of the trace
    assert_float32_close([close(t) for t in ts], [ours(t) for t in ts])


def _torch_lrs(make, steps: int, base: float) -> list[float]:
    """The learning rates a torch scheduler reports at steps 0..steps, stepped as in
    training (an optimizer step, then the scheduler's)."""
    torch = pytest.importorskip("torch")
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    scheduler = make(torch.optim.lr_scheduler, opt)
    lrs = [scheduler.get_last_lr()[0]]
    for _ in range(steps):
        opt.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    return lrs


# (our schedule, its torch scheduler on an SGD of base rate `base`, how many steps)
TORCH = [
    (Step(0.1, 0.5, 3), 0.1, lambda L, o: L.StepLR(o, step_size=3, gamma=0.5), 40),
    (Step(1e-3, 0.1, 30), 1e-3, lambda L, o: L.StepLR(o, step_size=30), 200),
    (Cosine(1e-3, steps=100), 1e-3, lambda L, o: L.CosineAnnealingLR(o, T_max=100), 100),
    (Cosine(0.1, 1e-4, 37), 0.1, lambda L, o: L.CosineAnnealingLR(o, 37, eta_min=1e-4), 37),
    (OneCycle(0.1, 100), 0.1, lambda L, o: L.OneCycleLR(o, max_lr=0.1, total_steps=100), 99),
    (OneCycle(1e-3, 7), 1e-3, lambda L, o: L.OneCycleLR(o, max_lr=1e-3, total_steps=7), 6),
    (OneCycle(2.0, 1), 2.0, lambda L, o: L.OneCycleLR(o, max_lr=2.0, total_steps=1), 0),
    (Exponential(0.1, 0.9), 0.1, lambda L, o: L.ExponentialLR(o, gamma=0.9), 60),
    (Polynomial(0.1, 0.0, 20, 2.0), 0.1, lambda L, o: L.PolynomialLR(o, 20, power=2.0), 30),
    (Linear(0.1 * 0.25, 0.1, 10), 0.1, lambda L, o: L.LinearLR(o, 0.25, 1.0, 10), 20),
]


@pytest.mark.parametrize(("ours", "base", "make", "steps"), TORCH,
                         ids=[repr(case[0]) for case in TORCH])
def test_python_steps_equal_torch(ours, base, make, steps):
    want = _torch_lrs(make, steps, base)
    np.testing.assert_allclose([ours(t) for t in range(steps + 1)], want, rtol=1e-12,
                               atol=1e-16)


SCHEDULES = [case[0] for case in OPTAX] + [case[0] for case in TORCH]
IDS = OPTAX_IDS + [repr(case[0]) for case in TORCH]


@pytest.mark.parametrize("ours", SCHEDULES, ids=IDS)
def test_a_schedule_is_a_lambda_for_torch(ours):
    lrs = _torch_lrs(lambda L, o: L.LambdaLR(o, lr_lambda=ours), 60, 1.0)
    assert lrs == [ours(t) for t in range(61)]


def test_onecycle_past_its_end_stays_at_its_last_value():
    s = OneCycle(1.0, 10)
    assert s(9) == s(10) == s(10**6) == 1.0 / 25 / 1e4
    assert s(2) == 1.0  # the rise ends at step 0.3 * 10 - 1


@pytest.mark.parametrize("ours", SCHEDULES, ids=IDS)
def test_array_steps_give_arrays_of_their_library(ours):
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax").numpy
    ts = [t for t in around(10, 100, 500) if abs(ours(t)) < 1e30]  # float32's range
    want = [ours(t) for t in ts]
    assert_float32_close([ours(np.array(t)) for t in ts], want)
    np.testing.assert_allclose([ours(np.int64(t)) for t in ts], want, rtol=1e-14)
    for lib, step, array in (("torch", torch.tensor, torch.Tensor), ("jax", jnp.asarray,
                                                                    jnp.ndarray)):
        got = [ours(step(t)) for t in ts]
        if not isinstance(ours, Constant):  # (a constant gives its number)
            assert all(isinstance(v, array) and v.shape == () for v in got), lib
        assert_float32_close([float(v) for v in got], want, lib)


def test_torch_steps_may_be_batched():
    torch = pytest.importorskip("torch")
    s = Warmup(Cosine(1.0, 0.1, 20), 5)
    got = s(torch.arange(40))
    assert got.shape == (40,) and got.dtype == torch.float32
    assert_float32_close(got.numpy(), [s(t) for t in range(40)])


# --- JAX: traced steps, pytrees, tracing once -----------------------------------------------


def test_a_jitted_function_of_the_step_traces_once(jax):
    schedule = Warmup(Join([Cosine(1e-3, 1e-4, 50), OneCycle(1e-3, 30)], [50]), 10)
    ts = range(0, 120, 3)
    for step in (int, jax.numpy.int32, np.int64):  # a Python int is weakly typed: its own trace
        traces = []

        @jax.jit
        def rate(t, traces=traces):
            traces.append(t)
            return schedule(t)

        got = [rate(step(t)) for t in ts]
        assert len(traces) == 1
        assert_float32_close(got, [schedule(t) for t in ts])


@pytest.mark.parametrize("ours", SCHEDULES, ids=IDS)
def test_a_schedule_of_other_numbers_does_not_retrace(jax, ours):
    traces = []

    @jax.jit
    def rate(schedule, t):
        traces.append(t)
        return schedule(t)

    other = jax.tree.map(lambda v: v + 1 if v.dtype.kind == "i" else v * 0.5, ours)
    assert type(other) is type(ours)
    ts = [t for t in (0, 3, 70, 2000) if abs(ours(t)) < 1e30]  # float32's range
    assert_float32_close([rate(ours, t) for t in ts], [ours(t) for t in ts])
    assert_float32_close([rate(other, t) for t in ts], [float(other(t)) for t in ts])
    assert len(traces) == 1


def test_a_schedule_is_a_pytree_of_its_numbers(jax):
    s = Warmup(Exponential(1.0, 0.5, 10, staircase=True), 5)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(s)[0]]
    assert paths == [".schedule.start", ".schedule.decay", ".schedule.steps", ".steps",
                     ".start"]  # staircase, a flag, is static
    back = jax.tree.map(lambda v: v.item(), s)
    assert back == s and repr(back) == repr(s)
    j = Join((Constant(1.0), Constant(2.0)), (4,))
    assert len(jax.tree.leaves(j)) == 3


def test_vmap_over_steps(jax):
    s = OneCycle(1.0, 20)
    got = jax.vmap(s)(jax.numpy.arange(25))
    assert_float32_close(got, [s(t) for t in range(25)])


def test_a_schedule_of_ones_own_is_registered(jax):
    @dataclasses.dataclass(frozen=True)
    class Quartering(O.Schedule):
        start: float = O.rules.fields.hyperparameter(1.0, "(0, inf)")

        def __call__(self, t):
            return self.start * 0.5**t

    assert O.SCHEDULES["Quartering"] is Quartering
    assert jax.jit(lambda s, t: s(t))(Quartering(8.0), 2) == 2.0
    assert jax.tree.leaves(Quartering(8.0))[0] == 8.0
    del O.SCHEDULES["Quartering"]


# --- printing, equality, hashing, checks ----------------------------------------------------


@pytest.mark.parametrize("ours", SCHEDULES, ids=IDS)
def test_schedules_are_values(ours):
    again = eval(repr(ours), vars(O))
    assert again == ours and hash(again) == hash(ours)
    assert pickle.loads(pickle.dumps(ours)) == ours
    assert copy.deepcopy(ours) == ours
    assert dataclasses.replace(ours) == ours
    name = dataclasses.fields(ours)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(ours, name, 1.0)
    assert not hasattr(ours, "__dict__")  # slotted
    assert O.SCHEDULES[type(ours).__name__] is type(ours)


def test_python_ints_become_floats_and_lists_tuples():
    assert repr(Step(1, 1, 10)) == "Step(start=1.0, decay=1.0, every=10)"
    assert type(Step(1, 1, 10)(5)) is float
    j = Join([Constant(1), Constant(2)], [3])
    assert j == Join((Constant(1.0), Constant(2.0)), (3,)) and type(j.boundaries) is tuple
    assert repr(Cosine(1e-3, 1e-5, 9_000)) == "Cosine(start=0.001, end=1e-05, steps=9000)"


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: Linear(1.0, 0.0, 0), ValueError,
     r"Invalid steps parameter: 0; Linear's steps must be >= 1 and finite"),
    (lambda: Linear(1.0, 0.0, 10.0), InvalidKind,
     r"Invalid steps parameter: 10.0 \(float\); Linear's steps must be a whole number >= 1"),
    (lambda: Linear(float("nan"), 0.0, 10), ValueError, r"Linear's start must be in \(-inf"),
    (lambda: Constant("0.1"), InvalidKind, r"Constant's value must be a number"),
    (lambda: Cosine(1e-3), InvalidKind, r"Cosine needs steps, .* Cosine\(1e-3, steps=10_000\)"),
    (lambda: Exponential(1.0, 0.0), ValueError, r"Exponential's decay must be > 0 and finite"),
    (lambda: Exponential(1.0, 0.5, staircase=1), InvalidKind,
     r"Exponential's staircase must be True or False"),
    (lambda: Step(1.0, 0.1, every=0), ValueError, r"Step's every must be >= 1"),
    (lambda: Polynomial(1.0, 0.0, 10, power=0.0), ValueError, r"Polynomial's power must be > 0"),
    (lambda: Warmup(1e-3, 10), InvalidKind,
     r"Warmup's schedule must be a Schedule, .*; wrap a number in Constant\(value\)"),
    (lambda: Warmup(Constant(1.0), 0), ValueError, r"Warmup's steps must be >= 1"),
    (lambda: Join([], []), InvalidKind, r"Join's schedules must be a tuple of one or more"),
    (lambda: Join([Constant(1.0), 2.0], [3]), InvalidKind,
     r"Join's schedules\[1\] must be a Schedule"),
    (lambda: Join([Constant(1.0), Constant(2.0)], []), InvalidKind,
     r"Join's boundaries must be a tuple of 1 step count, one fewer than its 2 schedules"),
    (lambda: Join([Constant(1.0), Constant(2.0)], [-1]), ValueError,
     r"Invalid boundaries parameter at index 0: -1"),
    (lambda: Join([Constant(1.0), Constant(2.0)], [2.5]), InvalidKind,
     r"Join's boundaries\[0\] must be a whole number"),
    (lambda: Join([Constant(1.0)] * 3, [5, 5]), ValueError,
     r"Join's boundaries must increase, but boundaries\[0\] = 5 >= boundaries\[1\] = 5"),
    (lambda: OneCycle(1.0, steps=0), ValueError, r"OneCycle's steps must be >= 1"),
    (lambda: dataclasses.replace(Linear(1.0, 0.0, 10), steps=-3), ValueError,
     r"Linear's steps must be >= 1"),
])
def test_bad_fields_are_refused_with_how_to_fix(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_numbers_of_any_library_are_checked_by_value():
    torch = pytest.importorskip("torch")
    assert Linear(torch.tensor(1.0), 0.0, np.int64(10))(5) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="Linear's steps must be >= 1"):
        Linear(1.0, 0.0, np.int64(0))


def test_a_schedule_must_say_its_value():
    @dataclasses.dataclass(frozen=True)
    class Nothing(O.Schedule):
        pass

    with pytest.raises(NotImplementedError, match="Nothing must define __call__"):
        Nothing()(0)
    del O.SCHEDULES["Nothing"]


def test_closed_forms_by_hand():
    assert Linear(2.0, 1.0, 4)(2) == 1.5
    assert Cosine(2.0, 1.0, 4)(2) == 1.5
    assert Exponential(8.0, 0.5, 2)(4) == 2.0
    assert Step(8.0, 0.5, 3)(5) == 4.0 and Step(8.0, 0.5, 3)(6) == 2.0
    assert Polynomial(1.0, 0.0, 10, 3.0)(5) == 0.125
    assert Warmup(Constant(4.0), 4, start=2.0)(1) == 2.5
    assert Join([Constant(1.0), Linear(3.0, 1.0, 2)], [5])(6) == 2.0
    assert OneCycle(1.0, 20)(5) == 1.0 and OneCycle(1.0, 20)(0) == pytest.approx(0.04)
    assert math.isclose(Cosine(1.0, steps=3)(1), 0.75)


# --- momentum cycled by OneCycleLR ----------------------------------------------------------


@pytest.mark.parametrize(("optimizer", "key"), [("SGD", "momentum"), ("Adam", "betas")])
@pytest.mark.parametrize(("steps", "low", "high"), [(100, 0.85, 0.95), (7, 0.8, 0.99),
                                                    (37, 0.85, 0.95)])
def test_onecycle_of_momenta_equals_torchs_cycle_momentum(optimizer, key, steps, low, high):
    """``OneCycleLR(cycle_momentum=True)`` (its default) sets SGD's momentum, or Adam's
    ``beta[0]``, at each step: ``OneCycle(low, steps, start=high, end=high)``, to the last
    bit, as its rates are ``OneCycle(peak, steps)``."""
    torch = pytest.importorskip("torch")
    opt = getattr(torch.optim, optimizer)([torch.zeros(1, requires_grad=True)], lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=steps,
                                                    base_momentum=low, max_momentum=high)
    want = []
    for _ in range(steps):
        momentum = opt.param_groups[0][key]
        want.append(momentum[0] if key == "betas" else momentum)
        opt.step()
        scheduler.step()
    ours = OneCycle(low, steps, start=high, end=high)
    assert [ours(t) for t in range(steps)] == want


def test_onecycle_of_other_divisors_equals_torchs():
    """``start`` and ``end`` given: ``OneCycleLR``'s ``div_factor`` and ``final_div_factor``."""
    want = _torch_lrs(lambda L, o: L.OneCycleLR(o, 0.1, total_steps=50, div_factor=10,
                                                final_div_factor=1e3), 49, 0.1)
    ours = OneCycle(0.1, 50, start=0.01, end=1e-5)
    np.testing.assert_allclose([ours(t) for t in range(50)], want, rtol=1e-12, atol=1e-16)
    assert OneCycle(0.1, 50) == eval(repr(OneCycle(0.1, 50)), vars(O))


# --- a plain function is a schedule ---------------------------------------------------------


def halving(step):
    """A schedule written as users write one, importable by its name."""
    return 0.1 * 0.5 ** step


def test_a_plain_function_is_a_schedule_wherever_one_is_taken():
    """optax's schedules and torch's ``lr_lambda`` are plain callables: a rule's number field
    (in a tuple too), Warmup's and Join's schedules and Scaled take one as it is."""
    rule = O.Adam(eta=halving, beta=(lambda t: 0.9 - 0.1 * (t > 2), 0.999))
    assert rule.eta == O.Function(halving) and isinstance(rule.beta[0], O.Function)
    assert O.schedules.timed(rule) and repr(rule.eta) == "Function(halving)"
    now = O.schedules.at(rule, 3)
    assert now.eta == 0.0125 and now.beta == (0.8, 0.999) and type(now.beta[0]) is float
    assert Warmup(halving, 2)(3) == Join([halving, Constant(1.0)], [5])(1) == 0.05
    assert O.adjust(O.setup(O.Descent(), [np.ones(1)]), eta=halving)[0].rule.eta.function \
        is halving
    with pytest.raises(InvalidKind, match=r"Function's function must be a plain function"):
        O.Function(Cosine(1.0, steps=3))
    model = {"w": np.ones(1)}
    tree = O.setup(O.Descent(eta=lambda t: 0.5 - t), model)
    O.update_(tree, model, {"w": np.ones(1)})
    with pytest.raises(ValueError, match=r"learning rate: -0.5.*KeyPath\('w'\)"):
        O.update_(tree, model, {"w": np.ones(1)})


def test_an_optax_schedule_is_evaluated_at_the_clock_on_every_step_count(jax):
    """A jnp function: at a Python step a Python float, at a JAX step (traced too) JAX's."""
    optax = pytest.importorskip("optax")
    theirs = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 100, 1e-5)
    ours = O.Function(theirs)
    ts = around(10, 100)
    got = [ours(t) for t in ts]
    assert all(type(v) is float for v in got)
    np.testing.assert_allclose(got, [float(theirs(t)) for t in ts], rtol=1e-6)
    jitted = jax.jit(lambda s, t: s(t))
    assert_float32_close([jitted(ours, t) for t in ts], got)


def test_a_schedule_times_a_number_is_scaled(jax):
    """``0.1 * schedule``: a per-group multiplier without a new schedule; a pytree, saved."""
    lr = Warmup(Cosine(1e-3, 1e-5, 90), 10)
    small = 0.1 * lr
    assert small == lr * 0.1 == O.Scaled(lr, 0.1) and isinstance(small, O.Schedule)
    assert [small(t) for t in (0, 5, 10, 200)] == [0.1 * lr(t) for t in (0, 5, 10, 200)]
    assert (2 * O.Function(halving))(1) == 0.1
    assert_float32_close([jax.jit(lambda s, t: s(t))(small, t) for t in range(0, 120, 7)],
                         [small(t) for t in range(0, 120, 7)])
    with pytest.raises(TypeError):
        lr * lr
    with pytest.raises(InvalidKind, match="Scaled's factor must be a number"):
        lr * "0.1"
    model = {"w": np.ones(3), "b": np.ones(3)}
    tree = O.setup({"b": O.AdamW(eta=small), "*": O.AdamW(eta=lr)}, model)
    assert O.schedules.at(tree["b"].rule, 10).eta == 0.1 * O.schedules.at(tree["w"].rule, 10).eta
