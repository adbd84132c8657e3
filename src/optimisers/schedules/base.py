"""The schedules' protocol: the base class :class:`Schedule` and its registry, a rule at
its Leaf's clock (:func:`at`, :func:`timed`), and the schedules made of what users write: a
plain function (:class:`Function`) and a schedule times a number (:class:`Scaled`). The
package's docstring (:mod:`optimisers.schedules`) says what a schedule is.
"""

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
"""SCHEDULES: every subclass of :class:`Schedule` by name, as :data:`~optimisers.RULES` is
for rules (what a checkpoint loads a schedule from).

Example:
    >>> SCHEDULES["Cosine"].__name__, "OneCycle" in SCHEDULES
    ('Cosine', True)
"""


class Schedule:
    """Schedule: the base class of the schedules; ``schedule(t) -> value`` at step ``t``.

    Subclass it as a frozen dataclass whose fields are numbers (declared with
    :func:`~optimisers.rules.fields.hyperparameter`), tuples and other schedules, and
    define ``__call__(t)`` for ``t`` a Python int or a 0-d array, with no Python ``if`` on
    ``t`` (choose with the backend's ``where``). The new class registers itself in
    :data:`SCHEDULES` and, once JAX is in use, as a pytree.

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
        known = SCHEDULES.get(cls.__name__)
        if known is None or (known.__module__, known.__qualname__) == (cls.__module__,
                                                                        cls.__qualname__):
            SCHEDULES[cls.__name__] = cls  # (slots=True makes the class anew: the new one)
        jax_backend = sys.modules.get("optimisers.backends.jax")
        register = getattr(jax_backend, "register_schedule", None)
        if register is not None:  # JAX seen already: the new schedule is a pytree too
            register(cls)

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
        """Check every declared field (as a rule's are); a Python ``int`` given for a
        number becomes a ``float``, so that a Python int ``t`` always gives a float."""
        fields.check(self)
        for f in dataclasses.fields(self):
            allowed = f.metadata.get("allowed")
            if allowed is not None and allowed.kind == "number":
                value = getattr(self, f.name)
                if type(value) is int:
                    object.__setattr__(self, f.name, float(value))


def timed(rule: Any) -> bool:
    """timed(rule) -> whether a schedule sits in any field of ``rule`` (in a tuple, or in a
    rule it holds): whether its steps depend on the Leaf's clock.

    Example:
        >>> from optimisers import Adam, ClipGrad, Cosine, OptimiserChain
        >>> timed(Adam()), timed(OptimiserChain(ClipGrad(), Adam(eta=Cosine(1e-3, steps=9))))
        (False, True)
    """
    try:
        return _TIMED[rule]
    except (KeyError, TypeError):  # not seen; or unhashable (a value traced under jit)
        pass
    found = _holds_schedule(rule)
    if len(_TIMED) > 4096:  # (a rule adjusted at every step is a new rule each time)
        _TIMED.clear()
    try:
        _TIMED[rule] = found
    except TypeError:
        pass
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
    """at(rule, t) -> ``rule`` with each schedule in its fields replaced by its value at
    step ``t`` (the Leaf's clock); ``rule`` itself when it holds none. What every path of
    ``update`` steps with. The new rule is checked as ``adjust`` checks one: a schedule
    that reaches a value its field does not allow raises here.

    Example:
        >>> from optimisers import AdamW, Constant, Warmup
        >>> at(AdamW(eta=Warmup(Constant(1e-3), steps=10), lambd=0.1), 5).eta
        0.0005
    """
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
    """as_schedule(value) -> ``value``, with a plain function ``step -> value`` (in a tuple
    too) made the schedule :class:`Function` ``(value)``: what a rule's number field and
    a schedule's schedule field do with what they are given.

    Example:
        >>> def halving(t):
        ...     return 0.5 ** t
        >>> as_schedule(halving)(2), as_schedule((0.1, halving))[0]
        (0.25, 0.1)
    """
    if type(value) is tuple:
        return tuple(map(as_schedule, value)) if any(map(_isfunction, value)) else value
    return Function(value) if _isfunction(value) else value


def _isfunction(value: Any) -> bool:
    """Whether ``value`` is a plain function to call on a step (not a schedule, a rule, a
    class or an array)."""
    return (callable(value) and not isinstance(value, (Schedule, Rule, type))
            and backends.library(value) is None)


def check_schedule(owner: str, name: str, value: Any) -> None:
    """Raise unless ``value`` (in the field ``name`` of the schedule ``owner``) is a
    :class:`Schedule`."""
    if not isinstance(value, Schedule):
        raise InvalidKind(f"Invalid {name} parameter: {value!r} ({type(value).__name__}); "
                          f"{owner}'s {name} must be a Schedule, such as Cosine(1e-3, "
                          f"steps=9_000); wrap a number in Constant(value)")


@dataclass(frozen=True, slots=True)
class Function(Schedule):
    """Function(function): a plain Python function ``step -> value`` as a schedule.

    What a rule's number field makes of a function given in a number's place
    (``Adam(eta=f)`` holds ``Function(f)``), so that optax's schedules and the
    ``lr_lambda`` of torch's ``LambdaLR`` (a factor of the base rate: ``eta=lr *
    Function(lr_lambda)``) work as they are. It is called with the Leaf's clock: a Python
    ``int`` on NumPy and PyTorch, whose value it gives as a Python ``float``; under
    ``jax.jit`` a traced integer, so there ``function`` must compute with ``jnp``
    (``jnp.where``, never a Python ``if`` on the step), as optax's schedules do.

    It compares equal for the same function object, prints the function's name, and
    is static under ``jax.jit`` (another function traces anew). A checkpoint stores it
    by its importable name (:attr:`reference`), never its code, and ``load`` takes the
    function again from ``like``; :func:`~optimisers.save` refuses a function without
    such a name (a ``lambda``, one defined inside another function, optax's).

    Args:
        function: a callable taking a step count (from 0) and returning a number.

    Example:
        >>> s = Function(lambda step: 0.1 * 0.5 ** step)
        >>> s(2), s, s.reference
        (0.025, Function(<lambda>), None)
        >>> import math
        >>> Function(math.exp).reference    # a function that its name imports again
        'math:exp'
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
    """importable_name(f) -> ``"module:qualified.name"``, the name under which ``f`` itself
    is found in its module (as a checkpoint stores a :class:`Function`), or ``None`` when
    there is none (a ``lambda``, a function made inside another, a callable object).

    Example:
        >>> import math
        >>> importable_name(math.exp), importable_name(lambda t: t)
        ('math:exp', None)
    """
    module, name = getattr(f, "__module__", None), getattr(f, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str) or "<" in name:
        return None
    found: Any = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return f"{module}:{name}" if found is f else None


@dataclass(frozen=True, slots=True)
class Scaled(Schedule):
    """Scaled(schedule, factor): ``factor * schedule(t)``, what ``factor * schedule`` (or
    ``schedule * factor``) makes: one schedule shared by groups at different rates.

    Args:
        schedule: the schedule to scale, a :class:`Schedule` (or a plain function).
        factor: the number it is multiplied by.

    Example:
        >>> from optimisers import Cosine
        >>> lr = Cosine(1e-3, steps=100)
        >>> 0.1 * lr
        Scaled(schedule=Cosine(start=0.001, end=0.0, steps=100), factor=0.1)
        >>> (0.1 * lr)(0) == 0.1 * lr(0)
        True
    """

    schedule: Schedule
    factor: float = hyperparameter(dataclasses.MISSING, "(-inf, inf)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", as_schedule(self.schedule))
        check_schedule("Scaled", "schedule", self.schedule)
        Schedule.__post_init__(self)

    def __call__(self, t: Any) -> Any:
        return self.factor * self.schedule(t)
