"""The schedules' protocol: :class:`Schedule`, its registry, and a rule at a clock (:func:`at`)."""

from __future__ import annotations

import copy
import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.rules import Rule, fields
from optimisers.rules.fields import InvalidKind, hyperparameter

__all__ = ["Schedule", "SCHEDULES", "at", "timed", "as_schedule", "check_schedule",
           "importable_name", "Function", "Scaled"]

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
        if isinstance(factor, Schedule) or callable(factor):
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
        found = _TIMED.get(rule)
    except TypeError:  # unhashable (a value traced under jit)
        return _holds_schedule(rule)
    if found is None:
        if len(_TIMED) > 4096:  # (a rule adjusted at every step is a new rule each time)
            _TIMED.clear()
        found = _TIMED[rule] = _holds_schedule(rule)
    return found


_TIMED: dict[Any, bool] = {}


def _holds_schedule(v: Any) -> bool:
    if isinstance(v, Schedule):
        return True
    if isinstance(v, tuple):
        return any(map(_holds_schedule, v))
    return isinstance(v, Rule) and any(  # (a rule that is no dataclass holds none)
        _holds_schedule(getattr(v, name)) for name in getattr(v, "__dataclass_fields__", ()))


def at(rule: Rule, t: Any) -> Rule:
    """at(rule, t) -> ``rule`` with each schedule replaced by its value at the Leaf's clock
    ``t``, checked as ``adjust`` checks; ``rule`` itself when it holds none."""
    if not timed(rule):
        return rule
    if type(t) is not int and not backends.istraced(t):
        t = int(t)  # a clock a jitted step returned: evaluated as a Python int's would be
    return _resolved(rule, t)


def _resolved(v: Any, t: Any) -> Any:
    if isinstance(v, Schedule):
        return v(t)
    if isinstance(v, tuple):
        return tuple(_resolved(e, t) for e in v)
    if not (isinstance(v, Rule) and timed(v)):
        return v
    new = copy.copy(v)  # (not the constructor: OptimiserChain's takes its rules unnamed)
    for f in dataclasses.fields(v):
        object.__setattr__(new, f.name, _resolved(getattr(v, f.name), t))
    new.__post_init__()
    return new


def as_schedule(value: Any) -> Any:
    """as_schedule(value) -> ``value``, a plain function (in a tuple too) as :class:`Function`."""
    if type(value) is tuple:
        return tuple(map(as_schedule, value)) if any(map(_isfunction, value)) else value
    return Function(value) if _isfunction(value) else value


def _isfunction(value: Any) -> bool:
    """Whether ``value`` is a plain function (no schedule, rule, class or array)."""
    return (callable(value) and not isinstance(value, (Schedule, Rule, type))
            and backends.library(value) is None)


def check_schedule(owner: str, name: str, value: Any) -> None:
    """Raise unless ``value``, ``owner``'s field ``name``, is a :class:`Schedule`."""
    if not isinstance(value, Schedule):
        raise InvalidKind(f"Invalid {name} parameter: {value!r} ({type(value).__name__}); "
                          f"{owner}'s {name} must be a Schedule, such as Cosine(1e-3, "
                          f"steps=9_000); wrap a number in Constant(value)")


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

    schedule: Schedule
    factor: float = hyperparameter(dataclasses.MISSING, "(-inf, inf)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", as_schedule(self.schedule))
        check_schedule("Scaled", "schedule", self.schedule)
        Schedule.__post_init__(self)

    def __call__(self, t: Any) -> Any:
        return self.factor * self.schedule(t)
