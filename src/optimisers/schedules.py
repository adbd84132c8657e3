"""Schedules: frozen dataclasses called on a step count ``t`` from 0, giving a hyper-parameter;
a rule at a clock (:func:`at`); the closed forms and joins of optax and torch."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import operator
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.rules import Rule, fields
from optimisers.rules.fields import Allowed, Interval, InvalidKind, hyperparameter

__all__ = ["Schedule", "SCHEDULES", "at", "counted", "rebuilt", "timed", "as_schedule",
           "importable_name", "Constant", "Linear", "Cosine", "Exponential", "Step", "Polynomial",
           "Warmup", "Join", "OneCycle", "Function", "Scaled"]

SCHEDULES: dict[str, type] = {}
"""SCHEDULES: every subclass of :class:`Schedule` by name (what checkpoints load from).

Example:
    >>> SCHEDULES["Cosine"].__name__, "OneCycle" in SCHEDULES
    ('Cosine', True)
"""


class Schedule:
    """Schedule: the base class of the schedules; ``schedule(t) -> value`` at step ``t``.

    Subclass it as a frozen dataclass of :func:`~optimisers.rules.fields.hyperparameter`
    fields and define ``__call__(t)`` with no Python ``if`` on ``t`` (the backend's ``where``).
    It registers itself in :data:`SCHEDULES` (and as a JAX pytree).

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class Halving(Schedule):
        ...     start: float = hyperparameter(1.0, "(0, inf)")
        ...     def __call__(self, t):
        ...         return self.start * 0.5 ** t
        >>> Halving(8)(3), Halving(8)
        (1.0, Halving(start=8.0))
    """

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        known = SCHEDULES.get(cls.__name__, cls)
        if (known.__module__, known.__qualname__) == (cls.__module__, cls.__qualname__):
            SCHEDULES[cls.__name__] = cls  # (slots=True makes the class anew: the new one)
        backends.rule_defined(cls)  # JAX seen already: the new schedule is a pytree too

    def __call__(self, t: Any) -> Any:
        """The value at step ``t`` (counting from 0)."""
        raise NotImplementedError(f"{type(self).__name__} must define __call__(t)")

    def __mul__(self, factor: Any) -> Any:
        """``schedule * factor``: the schedule :class:`Scaled` by a number."""
        if callable(factor):  # (a schedule too)
            return NotImplemented
        return Scaled(self, factor)

    __rmul__ = __mul__

    def __post_init__(self) -> None:
        """Check every declared field; an ``int`` given for a number becomes a ``float``."""
        fields.check(self)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if type(value) is int and getattr(f.metadata.get("allowed"), "kind", "") == "number":
                object.__setattr__(self, f.name, float(value))


def timed(rule: Any) -> bool:
    """timed(rule) -> whether a schedule sits in a field of ``rule`` (or of a rule it holds)."""
    try:
        return _timed(rule)
    except TypeError:  # unhashable (a value traced under jit)
        return _holds_schedule(rule)


def _holds_schedule(v: Any) -> bool:
    if isinstance(v, Schedule):
        return True
    if isinstance(v, tuple):
        return any(map(_holds_schedule, v))
    return isinstance(v, Rule) and any(  # (a rule that is no dataclass holds none)
        _holds_schedule(getattr(v, name)) for name in getattr(v, "__dataclass_fields__", ()))


# (bounded: a rule adjusted at every step is a new rule each time)
_timed = functools.lru_cache(maxsize=4096)(_holds_schedule)


def at(rule: Rule, t: Any) -> Rule:
    """at(rule, t) -> ``rule`` with each schedule replaced by its value at the Leaf's clock
    ``t``, checked as ``adjust`` checks; ``rule`` itself when it holds none."""
    if not timed(rule):
        return rule
    t = counted(t)
    return rebuilt(rule, lambda schedule: schedule(t))


def counted(t: Any) -> Any:
    """counted(t) -> the clock ``t`` as schedules read it: a Python int (a clock a jitted
    step returned, evaluated as a Python int's would be), unless traced."""
    return t if type(t) is int or backends.istraced(t) else int(t)


def rebuilt(v: Any, change: Callable[[Schedule], Any]) -> Any:
    """rebuilt(v, change) -> ``v`` with each schedule ``s`` in it (a field of a rule, of a rule
    it holds, or in a tuple there) replaced by ``change(s)``, the rules made anew and checked
    as ``adjust`` checks; ``v`` itself where nothing changed (what :func:`at` and
    :func:`~optimisers.observe` walk).

    Example:
        >>> from optimisers import Adam, WeightDecay
        >>> rebuilt(WeightDecay(Linear(1.0, 0.0, 4)), lambda s: s(1)), rebuilt(Adam(), print)
        (WeightDecay(lambd=0.75), Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-08))
    """
    if isinstance(v, Schedule):
        return change(v)
    if isinstance(v, tuple):
        new = tuple(rebuilt(e, change) for e in v)
        return v if all(map(operator.is_, new, v)) else new
    if not (isinstance(v, Rule) and timed(v)):
        return v
    names = [f.name for f in dataclasses.fields(v)]
    values = [rebuilt(getattr(v, name), change) for name in names]
    if all(new is getattr(v, name) for name, new in zip(names, values)):
        return v
    rule = copy.copy(v)  # (not the constructor: OptimiserChain's takes its rules unnamed)
    for name, new in zip(names, values):
        object.__setattr__(rule, name, new)
    rule.__post_init__()
    return rule


def as_schedule(value: Any) -> Any:
    """as_schedule(value) -> ``value``, a plain function (in a tuple too) as :class:`Function`."""
    if type(value) is tuple:
        return tuple(map(as_schedule, value)) if any(map(_isfunction, value)) else value
    return Function(value) if _isfunction(value) else value


def _isfunction(value: Any) -> bool:
    """Whether ``value`` is a plain function (no schedule, rule, class or array)."""
    return (callable(value) and not isinstance(value, (Schedule, Rule, type))
            and backends.library(value) is None)


fields.SCHEDULE, fields.SCHEDULED = (Schedule,), as_schedule  # (fields cannot import them)


@dataclass(frozen=True, slots=True)
class Function(Schedule):
    """Function(function): a plain Python function ``step -> value`` as a schedule (what
    ``Adam(eta=f)`` holds): optax's schedules and ``LambdaLR``'s ``lr_lambda`` work as they are.

    Called with the Leaf's clock: a Python ``int`` (the value then a ``float``), or traced
    under ``jax.jit``, where ``function`` must compute with ``jnp``. Static under ``jit``; a
    checkpoint stores its importable name (:attr:`reference`), and ``save`` refuses one without.

    Args:
        function: a callable taking a step count (from 0) and returning a number.

    Example:
        >>> s = Function(lambda step: 0.1 * 0.5 ** step)
        >>> s(2), s, s.reference
        (0.025, Function(<lambda>), None)
    """

    function: Any = dataclasses.field(metadata={"static": True})

    def __post_init__(self) -> None:
        if not _isfunction(self.function):
            raise InvalidKind(f"Invalid function parameter: {self.function!r:.60} "
                              f"({type(self.function).__name__}); Function's function must "
                              f"be a plain function step -> value, such as lambda t: "
                              f"1e-3 * 0.99 ** t (a Schedule is one already: pass it as "
                              f"it is)")

    def __call__(self, t: Any) -> Any:
        value = self.function(t)
        if type(t) is int and type(value) is not float and (
                isinstance(value, (int, np.number)) or backends.library(value) is not None):
            return float(value)  # an optax schedule's array, at a Python step: a number
        return value

    def __repr__(self) -> str:
        name = getattr(self.function, "__qualname__", None)
        return f"Function({name if isinstance(name, str) else repr(self.function)})"

    @property
    def reference(self) -> str | None:
        """:func:`importable_name` of the function."""
        return importable_name(self.function)


def importable_name(f: Any) -> str | None:
    """importable_name(f) -> ``"module:qualified.name"`` under which ``f`` itself is found, or
    ``None`` (a ``lambda``, a nested function, a callable object)."""
    module, name = getattr(f, "__module__", None), getattr(f, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str) or "<" in name:
        return None
    found: Any = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return f"{module}:{name}" if found is f else None


@dataclass(frozen=True, slots=True)
class Scaled(Schedule):
    """Scaled(schedule, factor): ``factor * schedule(t)``, what ``factor * schedule`` makes.

    Args:
        schedule: the schedule to scale (or a plain function).
        factor: the number it is multiplied by.

    Example:
        >>> from optimisers import Cosine
        >>> 0.1 * Cosine(1e-3, steps=100)
        Scaled(schedule=Cosine(start=0.001, end=0.0, steps=100), factor=0.1)
    """

    schedule: Schedule = hyperparameter(kind="schedule")
    factor: float = hyperparameter(dataclasses.MISSING, "(-inf, inf)")

    def __call__(self, t: Any) -> Any:
        return self.factor * self.schedule(t)


def _number(default: Any = dataclasses.MISSING, within: str = "(-inf, inf)") -> Any:
    return hyperparameter(default, within)


def _count(default: Any = dataclasses.MISSING) -> Any:
    return hyperparameter(default, "[1, inf)", kind="whole")


_NUMBERS = types.SimpleNamespace(  # the functions schedules call, for Python numbers
    where=lambda condition, a, b: a if condition else b, minimum=min, maximum=max, cos=math.cos)


def _maths(t: Any, *counts: Any) -> Any:
    """The backend of the first array among ``t`` and the step counts, else Python's numbers."""
    for v in (t, *counts):
        if type(v) not in (int, float) and backends.library(v) is not None:
            return backends.of(v)
    return _NUMBERS


def _left(xp: Any, t: Any, steps: Any) -> Any:
    """The fraction of ``steps`` left at ``t``, 0 from ``steps`` on, exact at the end."""
    return (steps - xp.minimum(t, steps)) / steps


def _line(xp: Any, t: Any, start: Any, end: Any, steps: Any) -> Any:
    """From ``start`` to ``end`` over ``steps``, then ``end``."""
    return (start - end) * _left(xp, t, steps) + end


def _half_cosine(xp: Any, start: Any, end: Any, angle: Any) -> Any:
    """From ``start`` at angle 0 to ``end`` at angle pi along a half cosine."""
    return end + (start - end) / 2.0 * (xp.cos(angle) + 1)


@dataclass(frozen=True, slots=True)
class Constant(Schedule):
    """Constant(value): ``value`` at every step (optax's ``constant_schedule``).

    Example:
        >>> Constant(1e-3)(0), Constant(1e-3)(10**9)
        (0.001, 0.001)
    """

    value: float = _number()

    def __call__(self, t: Any) -> Any:
        return self.value


@dataclass(frozen=True, slots=True)
class Linear(Schedule):
    """Linear(start, end, steps): from ``start`` to ``end`` in a straight line, then ``end``.

    ``(start - end) * (steps - min(t, steps)) / steps + end``: optax's ``linear_schedule``;
    torch's ``LinearLR(f0, f1, n)`` on a rate ``lr`` is ``Linear(lr*f0, lr*f1, n)``.

    Args:
        start: the value at step 0.
        end: the value from step ``steps`` on.
        steps: how many steps the line lasts (>= 1).

    Example:
        >>> s = Linear(1.0, 0.0, 4)
        >>> [s(t) for t in range(6)]
        [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    """

    start: float = _number()
    end: float = _number()
    steps: int = _count()

    def __call__(self, t: Any) -> Any:
        return _line(_maths(t, self.steps), t, self.start, self.end, self.steps)


@dataclass(frozen=True, slots=True)
class Cosine(Schedule):
    """Cosine(start, end=0.0, steps=...): from ``start`` to ``end`` along a half cosine, then
    ``end`` (Loshchilov & Hutter 2017, "SGDR", without restarts).

    ``end + (start - end) * (1 + cos(pi * min(t, steps) / steps)) / 2``: optax's
    ``cosine_decay_schedule(start, steps, alpha=end / start)``; torch's
    ``CosineAnnealingLR(T_max=steps, eta_min=end)`` up to ``steps``.

    Args:
        start: the value at step 0.
        end: the value from step ``steps`` on.
        steps: how many steps the decay lasts (>= 1; required).

    Example:
        >>> s = Cosine(1.0, steps=4)
        >>> [round(s(t), 4) for t in range(6)]
        [1.0, 0.8536, 0.5, 0.1464, 0.0, 0.0]
    """

    start: float = _number()
    end: float = _number(0.0)
    steps: int = _count(None)

    def __post_init__(self) -> None:
        if self.steps is None:
            raise InvalidKind("Cosine needs steps, how many steps its decay lasts, such as "
                              "Cosine(1e-3, steps=10_000)")
        Schedule.__post_init__(self)

    def __call__(self, t: Any) -> Any:
        xp = _maths(t, self.steps)
        angle = math.pi * xp.minimum(t, self.steps) / self.steps
        return _half_cosine(xp, self.start, self.end, angle)


@dataclass(frozen=True, slots=True)
class Exponential(Schedule):
    """Exponential(start, decay, steps=1, staircase=False): ``start * decay ** (t / steps)``
    (``t // steps`` when ``staircase``): optax's ``exponential_decay``; torch's
    ``ExponentialLR(gamma)`` is ``Exponential(lr, gamma)``.

    Args:
        start: the value at step 0.
        decay: the factor per ``steps`` steps (> 0).
        steps: how many steps one factor of ``decay`` takes (>= 1).
        staircase: whether the value changes only at multiples of ``steps``.

    Example:
        >>> Exponential(1.0, 0.5, steps=2)(3), Exponential(1.0, 0.5, 2, staircase=True)(3)
        (0.3535533905932738, 0.5)
    """

    start: float = _number()
    decay: float = _number(within="(0, inf)")
    steps: int = _count(1)
    staircase: bool = hyperparameter(False, kind="flag", static=True)

    def __call__(self, t: Any) -> Any:
        p = t // self.steps if self.staircase else t / self.steps
        return self.start * self.decay ** p


@dataclass(frozen=True, slots=True)
class Step(Schedule):
    """Step(start, decay, every): ``start * decay ** (t // every)``, torch's ``StepLR``.

    Args:
        start: the value at step 0.
        decay: the factor applied every ``every`` steps (> 0).
        every: how many steps between two changes (>= 1).

    Example:
        >>> s = Step(1.0, 0.1, every=2)
        >>> [s(t) for t in range(5)]
        [1.0, 1.0, 0.1, 0.1, 0.010000000000000002]
    """

    start: float = _number()
    decay: float = _number(within="(0, inf)")
    every: int = _count()

    def __call__(self, t: Any) -> Any:
        return self.start * self.decay ** (t // self.every)


@dataclass(frozen=True, slots=True)
class Polynomial(Schedule):
    """Polynomial(start, end, steps, power=1.0): from ``start`` to ``end`` along a polynomial,
    then ``end``: ``(start - end) * ((steps - min(t, steps)) / steps) ** power + end``
    (optax's ``polynomial_schedule``; torch's ``PolynomialLR`` ends at 0).

    Args:
        start: the value at step 0.
        end: the value from step ``steps`` on.
        steps: how many steps the change lasts (>= 1).
        power: the polynomial's degree (> 0).

    Example:
        >>> s = Polynomial(1.0, 0.0, 4, power=2.0)
        >>> [s(t) for t in range(6)]
        [1.0, 0.5625, 0.25, 0.0625, 0.0, 0.0]
    """

    start: float = _number()
    end: float = _number()
    steps: int = _count()
    power: float = _number(1.0, "(0, inf)")

    def __call__(self, t: Any) -> Any:
        left = _left(_maths(t, self.steps), t, self.steps)
        return (self.start - self.end) * left ** self.power + self.end


@dataclass(frozen=True, slots=True)
class Warmup(Schedule):
    """Warmup(schedule, steps, start=0.0): a line from ``start`` to ``schedule(0)`` over
    ``steps`` steps, then ``schedule(t - steps)``. optax's ``warmup_cosine_decay_schedule(
    start, peak, steps, total, end)`` is ``Warmup(Cosine(peak, end, total - steps), steps, start)``.

    Args:
        schedule: the schedule that follows the warmup.
        steps: how many steps the warmup lasts (>= 1).
        start: the value at step 0.

    Example:
        >>> s = Warmup(Linear(1.0, 0.0, 2), steps=2)
        >>> [s(t) for t in range(6)]
        [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    """

    schedule: Schedule = hyperparameter(kind="schedule")
    steps: int = _count()
    start: float = _number(0.0)

    def __call__(self, t: Any) -> Any:
        xp = _maths(t, self.steps)
        ramp = _line(xp, t, self.start, self.schedule(0), self.steps)
        return xp.where(t < self.steps, ramp, self.schedule(xp.maximum(t - self.steps, 0)))


@dataclass(frozen=True, slots=True)
class Join(Schedule):
    """Join(schedules, boundaries): ``schedules[0]`` until step ``boundaries[0]``, then
    ``schedules[1]``, and so on, each from its own step 0 (optax's ``join_schedules``).

    Args:
        schedules: one or more schedules (a tuple or list).
        boundaries: increasing whole numbers >= 0, one fewer than the schedules.

    Example:
        >>> s = Join([Constant(1.0), Linear(1.0, 0.0, 2), Constant(0.5)], [2, 4])
        >>> [s(t) for t in range(6)]
        [1.0, 1.0, 1.0, 0.5, 0.5, 0.5]
    """

    schedules: tuple
    boundaries: tuple

    def __post_init__(self) -> None:
        """Check the fields; optax's lists kept as tuples, plain functions as schedules."""
        schedules, boundaries = (tuple(v) if type(v) is list else v
                                 for v in (self.schedules, self.boundaries))
        if type(schedules) is not tuple or not schedules:
            raise InvalidKind(f"Invalid schedules parameter: {schedules!r}; Join's schedules "
                              f"must be a tuple of one or more schedules, such as "
                              f"(Linear(0.0, 1e-3, 100), Cosine(1e-3, steps=900))")
        n = len(schedules) - 1
        schedules = Allowed("schedule", (None,) * (n + 1)).check("Join", "schedules", schedules)
        if type(boundaries) is not tuple or len(boundaries) != n:
            raise InvalidKind(f"Invalid boundaries parameter: {boundaries!r}; Join's "
                              f"boundaries must be a tuple of {n} step count{'s' * (n != 1)}, "
                              f"one fewer than its {n + 1} schedule{'s' * (n != 0)}: the step "
                              f"at which each schedule after the first takes over")
        Allowed("whole", (Interval.parse("[0, inf)"),) * n).check("Join", "boundaries",
                                                                 boundaries)
        for i in range(n - 1):
            if boundaries[i] >= boundaries[i + 1]:
                raise ValueError(f"Invalid boundaries parameter: {boundaries!r}; Join's "
                                 f"boundaries must increase, but boundaries[{i}] = "
                                 f"{boundaries[i]} >= boundaries[{i + 1}] = {boundaries[i + 1]}")
        object.__setattr__(self, "schedules", schedules)
        object.__setattr__(self, "boundaries", boundaries)

    def __call__(self, t: Any) -> Any:
        xp = _maths(t, *self.boundaries)
        value = self.schedules[0](t)
        for b, schedule in zip(self.boundaries, self.schedules[1:]):
            value = xp.where(t < b, value, schedule(xp.maximum(t - b, 0)))
        return value


_RISE, _DIV, _FINAL_DIV = 0.3, 25.0, 1e4  # torch's OneCycleLR: pct_start and the divisors


@dataclass(frozen=True, slots=True)
class OneCycle(Schedule):
    """OneCycle(peak, steps, start=None, end=None): from ``start`` to ``peak`` over the first
    30% of ``steps``, then to ``end``, along half cosines (Smith & Topin 2018,
    "Super-Convergence").

    torch's ``OneCycleLR(max_lr=peak, total_steps=steps)`` with its defaults, ``end`` from
    ``steps - 1`` on; its cycled momentum is ``OneCycle(0.85, steps, start=0.95, end=0.95)``.

    Args:
        peak: the value at the end of the rise.
        steps: the length of the cycle (>= 1).
        start: the value at step 0 (``None``: ``peak / 25``).
        end: the final value (``None``: ``start / 1e4``).

    Example:
        >>> s = OneCycle(1.0, steps=10)
        >>> [round(s(t), 4) for t in (0, 1, 2, 5, 9, 10)]
        [0.04, 0.52, 1.0, 0.6113, 0.0, 0.0]
    """

    peak: float = _number()
    steps: int = _count()
    start: float | None = _number(None, "(-inf, inf) or None")
    end: float | None = _number(None, "(-inf, inf) or None")

    def __call__(self, t: Any) -> Any:
        xp = _maths(t, self.steps)
        top, last = _RISE * self.steps - 1, self.steps - 1  # torch's ends of the phases
        t = xp.minimum(t, last)
        start = self.peak / _DIV if self.start is None else self.start
        end = start / _FINAL_DIV if self.end is None else self.end
        rise = _half_cosine(xp, start, self.peak, math.pi * (t / top))
        fall = _half_cosine(xp, self.peak, end, math.pi * ((t - top) / (last - top)))
        return xp.where(t <= top, rise, fall)
