"""Closed-form schedules and those joining schedules in time (optax's and torch's values)."""

from __future__ import annotations

import dataclasses
import math
import types
from dataclasses import dataclass
from typing import Any

from optimisers import backends
from optimisers.rules.fields import Allowed, Interval, InvalidKind, hyperparameter
from optimisers.schedules.base import Schedule, as_schedule, check_schedule

__all__ = ["Constant", "Linear", "Cosine", "Exponential", "Step", "Polynomial", "Warmup",
           "Join", "OneCycle"]


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
        >>> Cosine(1.0)
        Traceback (most recent call last):
        ...
        optimisers.rules.fields.InvalidKind: Cosine needs steps, how many steps its decay lasts, such as Cosine(1e-3, steps=10_000)
    """  # noqa: E501

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

    schedule: Schedule
    steps: int = _count()
    start: float = _number(0.0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", as_schedule(self.schedule))
        check_schedule("Warmup", "schedule", self.schedule)
        Schedule.__post_init__(self)

    def __call__(self, t: Any) -> Any:
        xp = _maths(t, self.steps)
        ramp = _line(xp, t, self.start, self.schedule(0), self.steps)
        return xp.where(t < self.steps, ramp, self.schedule(xp.maximum(t - self.steps, 0)))


_BOUNDARY = Interval.parse("[0, inf)")


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
        for name in ("schedules", "boundaries"):  # optax's users write lists: kept as tuples
            if type(getattr(self, name)) is list:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "schedules", as_schedule(self.schedules))
        _check_join(self.schedules, self.boundaries)

    def __call__(self, t: Any) -> Any:
        xp = _maths(t, *self.boundaries)
        value = self.schedules[0](t)
        for b, schedule in zip(self.boundaries, self.schedules[1:]):
            value = xp.where(t < b, value, schedule(xp.maximum(t - b, 0)))
        return value


def _check_join(schedules: Any, boundaries: Any) -> None:
    if type(schedules) is not tuple or not schedules:
        raise InvalidKind(f"Invalid schedules parameter: {schedules!r}; Join's schedules "
                          f"must be a tuple of one or more schedules, such as "
                          f"(Linear(0.0, 1e-3, 100), Cosine(1e-3, steps=900))")
    for i, s in enumerate(schedules):
        check_schedule("Join", f"schedules[{i}]", s)
    n = len(schedules) - 1
    if type(boundaries) is not tuple or len(boundaries) != n:
        raise InvalidKind(f"Invalid boundaries parameter: {boundaries!r}; Join's boundaries "
                          f"must be a tuple of {n} step count{'s' * (n != 1)}, one fewer "
                          f"than its {n + 1} schedule{'s' * (n != 0)}: the step at which "
                          f"each schedule after the first takes over")
    Allowed("whole", (_BOUNDARY,) * n).check("Join", "boundaries", boundaries)
    for i in range(n - 1):
        if boundaries[i] >= boundaries[i + 1]:
            raise ValueError(f"Invalid boundaries parameter: {boundaries!r}; Join's "
                             f"boundaries must increase, but boundaries[{i}] = "
                             f"{boundaries[i]} >= boundaries[{i + 1}] = {boundaries[i + 1]}")


_RISE, _DIV, _FINAL_DIV = 0.3, 25.0, 1e4  # torch's OneCycleLR: pct_start and the divisors


@dataclass(frozen=True, slots=True)
class OneCycle(Schedule):
    """OneCycle(peak, steps, start=None, end=None): from ``start`` to ``peak`` over the first
    30% of ``steps``, then to ``end``, along half cosines (Smith & Topin 2018,
    "Super-Convergence").

    torch's ``OneCycleLR(max_lr=peak, total_steps=steps)`` with its defaults: ``start`` is
    ``peak / 25`` and ``end`` is ``start / 1e4`` unless given; ``end`` from ``steps - 1`` on.
    Its cycled momentum is ``OneCycle(0.85, steps, start=0.95, end=0.95)``.

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
