"""LowPrecision: any rule's array state kept in a narrower dtype, its arithmetic in the
parameter's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optimisers import backends
from optimisers.rules.adaptive import Adam
from optimisers.rules.base import Rule, call, real_dtype_name
from optimisers.rules.fields import dtype_name, hyperparameter

__all__ = ["LowPrecision"]


@dataclass(frozen=True)
class LowPrecision(Rule):
    """LowPrecision(rule=Adam(), dtype="bfloat16"): keep ``rule``'s state arrays in ``dtype``.

    Each array of the state with the parameter's shape and a real floating dtype (Adam's
    ``m`` and ``v``) is stored in ``dtype``; a tuple of dtypes gives the first such array
    (in the state's order) ``dtype[0]``, the next ``dtype[1]``, ..., ``None`` keeping one
    as the rule made it. Each step reads them back in the parameter's dtype, runs ``rule``
    there, and rounds its new state to the stored dtypes (to nearest, ties to even): the
    arithmetic is the rule's own. Adam's float32 state is 8 bytes a parameter, 4 in
    bfloat16. Wrap a chain to keep all its rules' state narrow; for a low-precision
    parameter put it inside :class:`MixedPrecision` (optax: ``adam(mu_dtype=...)``, the
    first moment only; torchao: ``AdamW(bf16_stochastic_round=...)`` state).

    Example:
        >>> rule, x = LowPrecision(Adam(0.1), "float16"), np.ones(3, np.float32)
        >>> s = rule.init(x)
        >>> s, d = rule.apply(s, x, np.full(3, 0.3, np.float32))
        >>> s[0].dtype, s[1].dtype, d.round(4)
        (dtype('float16'), dtype('float16'), array([0.1, 0.1, 0.1], dtype=float32))
    """

    elementwise = True
    rule: Rule = hyperparameter(default_factory=Adam, kind="rule")
    dtype: Any = hyperparameter("bfloat16", kind="dtypes")

    def __repr__(self) -> str:
        """Dtypes by name, so that the text is code that makes this rule again."""
        names = tuple(map(_name, self.dtype)) if type(self.dtype) is tuple else _name(self.dtype)
        return f"LowPrecision(rule={self.rule!r}, dtype={names!r})"

    def raises(self) -> bool:
        return self.rule.raises()

    def init(self, x):
        return self._stored(self.rule.init(x), x)

    def apply(self, state, x, dx, *higher):
        new, d = call(self.rule, self._read(state, x), x, (dx, *higher))
        return self._stored(new, x, state), d

    def misfit(self, state: Any, x: Any) -> tuple | None:
        """The rule's own test of the state read back."""
        return self.rule.misfit(self._read(state, x), x)

    def stepped(self, state: Any) -> Any:
        return self.rule.stepped(state)

    def held(self, state: Any, x: Any, dx: Any) -> tuple:
        """``(state, x, dx)`` as the rule it runs sees them (the state read back)."""
        return (state if x is None else self._read(state, x)), x, dx

    def _read(self, state: Any, x: Any) -> Any:
        """``state`` with its stored arrays in the parameter's (real) dtype."""
        xp, wide = backends.of(x), real_dtype_name(x)
        return _each(state, x, lambda i, a: a if xp.dtype_name(a) == wide else xp.astype(a, wide))

    def _stored(self, new: Any, x: Any, old: Any = None) -> Any:
        """``new`` with its arrays rounded to the stored dtypes, into ``old``'s where it may."""
        xp = backends.of(x)
        olds = [] if old is None else _each(old, x, None)
        many = type(self.dtype) is tuple

        def store(i: int, a: Any) -> Any:
            dtype = (self.dtype[i] if i < len(self.dtype) else None) if many else self.dtype
            name = None if dtype is None else dtype_name(dtype)
            if name is None or name == xp.dtype_name(a):
                return a
            old = olds[i] if i < len(olds) else None
            if old is not None and xp.dtype_name(old) == name and xp.maywrite(old):
                return xp.assign(old, a)  # (rounded by the cast)
            return xp.astype(a, dtype)

        return _each(new, x, store)


def _name(dtype: Any) -> Any:
    return None if dtype is None else dtype_name(dtype)


def _each(state: Any, x: Any, f: Any) -> Any:
    """``state`` with ``f(i, a)`` in place of its ``i``-th real floating array of ``x``'s
    shape; ``f`` None: the list of those arrays."""
    found: list = []
    shape = tuple(x.shape)

    def visit(s: Any) -> Any:
        if isinstance(s, (tuple, list)):
            items = [visit(v) for v in s]
            return type(s)(*items) if hasattr(s, "_fields") else type(s)(items)
        if isinstance(s, dict):
            return type(s)((k, visit(v)) for k, v in s.items())
        xp = backends.library(s) and backends.of(s)
        if not xp or tuple(s.shape) != shape or xp.dtype_name(s)[:5] not in ("float", "bfloa"):
            return s
        found.append(s)
        return s if f is None else f(len(found) - 1, s)

    out = visit(state)
    return found if f is None else out
