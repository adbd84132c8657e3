"""Hyper-parameter fields that declare the values they allow, checked by :func:`check` at
construction (so ``adjust`` and ``load`` validate too), with ``torch.optim``'s messages."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any

import numpy as np

from optimisers import backends

__all__ = ["Allowed", "Interval", "hyperparameter", "check", "InvalidKind", "dtype_name"]


class InvalidKind(TypeError, ValueError):
    """A hyper-parameter of the wrong kind: a ``TypeError``, and a ``ValueError`` as torch's."""


_INTERVAL = re.compile(r"\s*([\[(])\s*([^,\s]+)\s*,\s*([^\]\s)]+)\s*([\])])\s*(or None)?\s*")


@dataclasses.dataclass(frozen=True)
class Interval:
    """Interval.parse("[0, 1)"): the numbers a hyper-parameter allows (never NaN; an infinite
    end only when closed), and whether it may also be ``None``."""

    low: float
    high: float
    closed_low: bool
    closed_high: bool
    none: bool = False

    @classmethod
    def parse(cls, text: str) -> Interval:
        """Interval.parse("[0, 1)") -> the interval that text writes."""
        got = _INTERVAL.fullmatch(text)
        if got is None:
            raise ValueError(f"cannot read {text!r} as an interval; write it as \"[0, 1)\", "
                             f"\"(0, inf)\" or \"[-inf, inf]\", with \" or None\" after it "
                             f"where None is allowed too")
        left, low, high, right, none = got.groups()
        return cls(float(low), float(high), left == "[", right == "]", none is not None)

    def __contains__(self, v: float | None) -> bool:
        if v is None:
            return self.none
        above = v >= self.low if self.closed_low else v > self.low
        below = v <= self.high if self.closed_high else v < self.high
        return bool(above and below)

    def __str__(self) -> str:
        if self.high == math.inf and not self.closed_high and self.low > -math.inf:
            text = f"{'>=' if self.closed_low else '>'} {_short(self.low)} and finite"
        else:
            text = (f"in {'[' if self.closed_low else '('}{_short(self.low)}, "
                    f"{_short(self.high)}{']' if self.closed_high else ')'}")
        return f"{text}, or None" if self.none else text


def _short(v: float) -> str:
    return str(int(v)) if v.is_integer() else str(v)


_KINDS = {"number": "a number", "whole": "a whole number", "flag": "True or False",
          "dtype": "a floating dtype (such as np.float32, torch.bfloat16, jnp.float16)",
          "dtypes": "a floating dtype (such as \"bfloat16\"), or a tuple of them and None",
          "rule": "a Rule (such as Adam())", "schedule": "a Schedule, such as Cosine(1e-3, "
          "steps=9_000); wrap a number in Constant(value)"}


@dataclasses.dataclass(frozen=True)
class Allowed:
    """Allowed(kind, within): what one field allows: a kind of :data:`_KINDS`, and ``None``,
    an :class:`Interval`, or a tuple of them (one per element of a tuple value)."""

    kind: str
    within: Interval | tuple[Interval, ...] | None = None

    def requirement(self, name: str) -> str:
        """What the field ``name`` must be, in words."""
        what = _KINDS[self.kind]
        if isinstance(self.within, tuple):
            each = ", ".join(f"{name}[{i}] {w}" for i, w in enumerate(self.within))
            return f"a tuple of {len(self.within)} {what.removeprefix('a ')}s: {each}"
        return what if self.within is None else f"{what} {self.within}"

    def check(self, rule: str, name: str, value: Any) -> Any:
        """The value to store for ``rule``'s field ``name`` (a 0-d array as its Python
        number); raises unless ``value`` is allowed."""
        if not isinstance(self.within, tuple):
            return self._one(rule, name, value, self.within, "")
        if type(value) is not tuple or len(value) != len(self.within):
            raise InvalidKind(f"{_invalid(name, value)}; {_subject(rule, name)} must be "
                              f"{self.requirement(name)}")
        new = tuple(self._one(rule, name, v, within, i)
                    for i, (v, within) in enumerate(zip(value, self.within)))
        return value if all(a is b for a, b in zip(new, value)) else new

    def _one(self, rule: str, name: str, value: Any, within: Interval | None,
             index: int | str) -> Any:
        if type(value) is float and self.kind == "number" and value in within:
            return value  # the common case, kept fast
        if value is None and within is not None and within.none:
            return value
        if self.kind not in ("number", "whole"):
            value = SCHEDULED(value) if self.kind == "schedule" else value  # (a function)
            if not _fits(self.kind, value):
                self._refuse(rule, name, value, within, index)
            return value
        if backends.istraced(value) or isinstance(value, SCHEDULE):
            return value  # unknown here (a schedule's is checked where evaluated: schedules.at)
        if callable(value) and (scheduled := SCHEDULED(value)) is not value:
            return scheduled  # a plain function step -> value: a schedule
        number = _number(value)
        if number is None or (self.kind == "whole" and type(number) is not int):
            self._refuse(rule, name, value, within, index)
        if type(number) is int and abs(number) >= _TOO_LARGE:
            digits = f"an int of {len(str(abs(number)))} digits, too large for a float"
            raise ValueError(f"{_invalid(name, digits, index, shown=True)}; "
                             f"{_subject(rule, name, index)} must be {within}")
        if number not in within:
            raise ValueError(f"{_invalid(name, number, index)}; "
                             f"{_subject(rule, name, index)} must be {within}")
        return number

    def _refuse(self, rule: str, name: str, value: Any, within: Interval | None,
                index: int | str) -> None:
        """Raise :class:`InvalidKind` for ``value``, a value of the wrong kind."""
        need = Allowed(self.kind, within).requirement(name)
        array = self.kind in ("number", "whole") and backends.library(value) is not None
        if array and tuple(value.shape):
            need += (f": one number (a scalar, or a 0-d array), not an array of shape "
                     f"{tuple(value.shape)}")
        raise InvalidKind(f"{_invalid(name, value, index)} ({type(value).__name__}); "
                          f"{_subject(rule, name, index)} must be {need}")


def _number(value: Any) -> int | float | None:
    """The Python ``int`` or ``float`` that ``value`` is or holds, else ``None``."""
    if type(value) is int or type(value) is float:
        return value
    if not (isinstance(value, np.generic) or backends.library(value) is not None):
        return None
    if tuple(getattr(value, "shape", ())) != ():
        return None
    number = value.item()
    if type(number) is float:
        name = dtype_name(value.dtype)
        if name in ("float16", "float32"):  # np.float32(0.01) is 0.01, as ``repr`` shows it
            return float(str(np.dtype(name).type(number)))
        return number
    if isinstance(number, np.floating):  # (longdouble: a NumPy scalar still)
        with np.errstate(over="ignore"):
            return float(number)  # a longdouble beyond a float's range reads inf: refused
    return number if type(number) is int else None


_TOO_LARGE = int(np.finfo(float).max) + 2**970  # the least int that float() overflows on


RULE: tuple[type, ...] = ()  # (Rule,), set by rules/base.py
SCHEDULE: tuple[type, ...] = ()  # (Schedule,), set by schedules.py, which imports this module
SCHEDULED: Any = None  # schedules.as_schedule, set there too


def _fits(kind: str, value: Any) -> bool:
    """Whether ``value`` is of ``kind``: a flag, a dtype, a rule or a schedule."""
    if kind == "flag":
        return isinstance(value, (bool, np.bool_))
    if kind == "dtypes":  # one dtype, or a tuple of them and None
        if type(value) is tuple:
            return value != () and all(v is None or _fits("dtype", v) for v in value)
        return _fits("dtype", value)
    if kind == "dtype":
        name = dtype_name(value)
        return name is not None and name.startswith(("float", "bfloat"))
    return isinstance(value, RULE if kind == "rule" else SCHEDULE)


def dtype_name(value: Any) -> str | None:
    """dtype_name(value) -> the name of a NumPy, PyTorch or JAX dtype, or ``None``."""
    if value is None or isinstance(value, (bool, int, float)):
        return None  # np.dtype(None) is float64: a None is no dtype here
    try:
        return np.dtype(value).name
    except TypeError:
        return str(value).rpartition(".")[2]


def _subject(rule: str, name: str, index: int | str = "") -> str:
    """``Adam's beta[0]``: the rule, the field, and the element of a tuple."""
    noun = "learning rate eta" if name == "eta" else name
    return f"{rule}'s {noun}{f'[{index}]' if index != '' else ''}"


def _invalid(name: str, value: Any, index: int | str = "", shown: bool = False) -> str:
    """``Invalid beta parameter at index 0: 1.5`` (``value`` already text when ``shown``)."""
    what = "learning rate" if name == "eta" else f"{name} parameter"
    at = f" at index {index}" if index != "" else ""
    return f"Invalid {what}{at}: {value if shown else repr(value)}"


_BY_NAME = {"eta": Allowed("number", Interval.parse("[0, inf)"))}  # a user's rule's eta


def hyperparameter(default: Any = dataclasses.MISSING, *within: str, kind: str = "number",
                   static: bool = False, default_factory: Any = dataclasses.MISSING) -> Any:
    """hyperparameter(default, *within, kind="number") -> a rule's dataclass field that
    declares the values it allows.

    Args:
        default: the default value (or give ``default_factory``).
        *within: for a number, one interval (``"[0, inf)"``, ``"(0, 1)"``,
            ``"[-inf, inf]"``, ``"[0, inf) or None"`` to allow ``None`` too); for a tuple
            of numbers, one interval per element.
        kind: ``"number"``, ``"whole"``, ``"flag"``, ``"dtype"``, ``"dtypes"`` (a dtype, or a
            tuple of them and ``None``), ``"rule"`` or ``"schedule"``.
        static: whether JAX keeps the field as static data (never traced).
        default_factory: makes the default, for a mutable or composite one.

    Returns:
        A ``dataclasses.field`` for the rule's class body; :func:`check` reads it.

    Example:
        >>> from dataclasses import dataclass
        >>> from optimisers import Rule
        >>> @dataclass(frozen=True)
        ... class Scale(Rule):
        ...     eta: float = hyperparameter(0.1, "[0, inf)")
        ...     beta: tuple = hyperparameter((0.9, 0.99), "[0, 1)", "[0, 1)")
        >>> Scale(beta=(1.5, 0.9))
        Traceback (most recent call last):
        ...
        ValueError: Invalid beta parameter at index 0: 1.5; Scale's beta[0] must be in [0, 1)
    """
    if kind not in _KINDS:
        raise ValueError(f"hyperparameter: kind must be one of {sorted(_KINDS)}, got {kind!r}")
    if kind == "number" and not within:
        raise ValueError("hyperparameter: a number needs the interval it lies in, such as "
                         "\"[0, inf)\"")
    intervals = tuple(Interval.parse(w) for w in within)
    allowed = Allowed(kind, intervals if len(intervals) > 1 else
                      intervals[0] if intervals else None)
    metadata = {"allowed": allowed, **({"static": True} if static else {})}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


@functools.cache
def _declared(cls: type) -> tuple[tuple[str, Allowed], ...]:
    """``cls``'s fields with what each allows (undeclared ones by :data:`_BY_NAME`)."""
    found = ((f.name, f.metadata.get("allowed", _BY_NAME.get(f.name)))
             for f in (dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()))
    return tuple((name, allowed) for name, allowed in found if allowed is not None)


def check(rule: Any) -> None:
    """check(rule): every declared field of a rule (or schedule) against what it allows
    (``ValueError``, :class:`InvalidKind`); 0-d arrays stored as numbers, functions as
    :class:`~optimisers.schedules.Function`, once all passed."""
    cls = type(rule)
    checked = [(name, allowed.check(cls.__name__, name, getattr(rule, name)))
               for name, allowed in _declared(cls)]
    for name, new in checked:  # once every field passed: nothing written on error
        if new is not getattr(rule, name):
            object.__setattr__(rule, name, new)
