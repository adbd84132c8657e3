"""What every rule shares: :class:`Rule`, the registry :data:`RULES`, :func:`call`."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

from optimisers import backends
from optimisers.rules import fields

__all__ = ["Rule", "RULES", "NewValue", "call", "ngrads", "dtype_misfit"]

RULES: dict[str, type] = {}
"""RULES: every subclass of :class:`Rule` by name: the registry that checkpoints load from.

Example:
    >>> RULES["Adam"].__name__, "Lion" in RULES
    ('Adam', True)
"""


class Rule:
    """Rule: the base class of every optimisation rule.

    Subclass it as a frozen dataclass of hyper-parameters with ``init(x) -> state`` and
    ``apply(state, x, dx) -> (state, d)``; the parameter becomes ``x - d`` (``d = None``:
    no step). Write state through ``backends.of(x).assign`` to update in place.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class SignSGD(Rule):
        ...     eta: float = 0.01
        ...     def apply(self, state, x, dx):
        ...         return state, self.eta * np.sign(dx)
        >>> SignSGD().apply(None, np.zeros(2), np.array([-3.0, 2.0]))
        (None, array([-0.01,  0.01]))
    """

    elementwise = False  # each element's step depends on that element alone: fusable
    reads_x = False  # apply reads the parameter's values (else only its dtype)
    stacks = False  # apply steps a stack of like arrays (on its last axes) as each alone
    outermost = False  # acts on the parameter after the whole step: wraps, never inside

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        RULES.setdefault(cls.__name__, cls)
        backends.rule_defined(cls)  # JAX seen already: the new rule is a pytree too

    def direction(self) -> Rule | None:
        """An ``elementwise`` rule of the same state whose step ``a`` gives this rule's as
        :meth:`scaled` ``(x, a)`` (``LAMB``: ``Adam``), or ``None`` (most rules)."""
        return None

    def scaled(self, x: Any, a: Any) -> Any:
        """The step for the parameter ``x`` from its :meth:`direction`'s step ``a``."""
        raise NotImplementedError(f"{type(self).__name__} has no direction")

    def raises(self) -> bool:
        """Whether ``apply`` may raise (``ClipNorm``; assumed of rules from outside the library):
        ``update_`` then runs it on a copy of its state first, never fused."""
        return not type(self).__module__.startswith("optimisers.")

    def init(self, x: Any) -> Any:
        """The initial state for the array ``x``; ``None`` for a stateless rule. A number in
        the state (a step count) may depend on the rule's numbers and on the state's own
        numbers, never on the array's shape: under ``jax.jit`` a group of Leafs steps one
        such number for all its members."""
        return None

    def apply(self, state: Any, x: Any, dx: Any, *higher: Any) -> tuple[Any, Any]:
        """One step: ``(new_state, d)``; the parameter becomes ``x - d``."""
        raise NotImplementedError(f"{type(self).__name__} must define apply(state, x, dx)")

    def stepped(self, state: Any) -> Any:
        """Whether the step that gave ``state`` was real (``AccumGrad``: not while it only
        accumulates; traced under ``jax.jit``), read off its non-array parts."""
        return True

    def refuses(self, x: Any) -> str | None:
        """Why this rule cannot train ``x`` (``setup`` raises it with the path), or ``None``;
        by default, what the rules in its fields refuse."""
        for name in getattr(self, "__dataclass_fields__", {}):
            v = getattr(self, name, None)
            for r in v if isinstance(v, tuple) else (v,):  # (a chain's rules)
                if isinstance(r, Rule) and (why := r.refuses(x)) is not None:
                    return why
        return None

    def averaged(self, state: Any, x: Any) -> Any:
        """The parameter to evaluate with, kept in ``state`` (an average), or ``None`` for
        ``x`` itself: what :func:`~optimisers.averaged` puts in the model."""
        return None

    def misfit(self, state: Any, x: Any) -> tuple | None:
        """``None`` when ``state`` fits ``x``, else ``(found, needed)`` shapes or dtype names;
        by default every state array has ``x``'s shape and dtype (:func:`dtype_misfit`)."""
        need = tuple(x.shape)
        for a in _arrays(state):
            if tuple(a.shape) != need:
                return tuple(a.shape), need
        return dtype_misfit(state, x)

    def __post_init__(self) -> None:
        """Check every hyper-parameter (:func:`~optimisers.rules.fields.check`)."""
        fields.check(self)


fields.RULE = (Rule,)  # what a field of kind "rule" must hold


def ngrads(rule: Rule) -> float:
    """How many gradient arguments ``rule.apply`` takes (``inf`` for ``*dx``)."""
    return _ngrads(type(rule))


@functools.cache
def _ngrads(cls: type) -> float:
    params = list(inspect.signature(cls.apply).parameters.values())[3:]  # after self, state, x
    return float("inf") if any(p.kind is p.VAR_POSITIONAL for p in params) else len(params)


def call(rule: Rule, state: Any, x: Any, grads: tuple) -> tuple[Any, Any]:
    """``rule.apply`` with as many of the gradients as it takes."""
    n = ngrads(rule)
    return rule.apply(state, x, *(grads if n >= len(grads) else grads[: int(n)]))


@dataclasses.dataclass(slots=True, eq=False)
class NewValue:
    """NewValue(value): a step that sets the parameter to ``value`` (``MixedPrecision``).

    Example:
        >>> NewValue(3.0).value
        3.0
    """

    value: Any


def dtype_misfit(state: Any, x: Any) -> tuple[str, str] | None:
    """dtype_misfit(state, x) -> ``(found, needed)`` dtype names for the first state array
    whose dtype is neither ``x``'s nor its real part's, or ``None``."""
    same, need = x.dtype, ""
    for a in _arrays(state):
        if a.dtype is same:
            continue
        need = need or backends.of(x).dtype_name(x)
        found = backends.of(a).dtype_name(a)
        if found not in (need, real_dtype_name(x)):
            return found, need
    return None


def real_dtype_name(x: Any) -> str:
    """real_dtype_name(x) -> the name of ``x``'s dtype, or of its real part's if complex."""
    name = backends.of(x).dtype_name(x)
    return f"float{int(name[7:]) // 2}" if name.startswith("complex") else name


def _arrays(state: Any) -> list:
    """The arrays in a state (a weakly typed 0-d one, JAX's counter under ``jit``, is none)."""
    stack, found = [state], []
    while stack:
        s = stack.pop()
        if isinstance(s, (tuple, list)):
            stack.extend(s)
        elif isinstance(s, dict):
            stack.extend(s.values())
        elif backends.library(s) is not None and (
                len(s.shape) or getattr(s, "weak_type", False) is not True):
            found.append(s)
    return found
