"""What every rule shares: :class:`Rule`, the registry :data:`RULES`, :func:`call`."""

from __future__ import annotations

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
        >>> import numpy as np
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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        RULES.setdefault(cls.__name__, cls)
        backends.rule_defined(cls)  # JAX seen already: the new rule is a pytree too

    def direction(self) -> Rule | None:
        """direction() -> an ``elementwise`` rule of the same state whose step ``a`` gives
        this rule's as :meth:`scaled` ``(x, a)``, or ``None`` (most rules).

        Example:
            >>> from optimisers import LAMB
            >>> LAMB(0.1).direction()
            Adam(eta=1.0, beta=(0.9, 0.999), epsilon=1e-06)
        """
        return None

    def scaled(self, x: Any, a: Any) -> Any:
        """The step for the parameter ``x`` from its :meth:`direction`'s step ``a``."""
        raise NotImplementedError(f"{type(self).__name__} has no direction")

    def raises(self) -> bool:
        """Whether ``apply`` may raise (``ClipNorm``): ``update_`` then runs it on a copy of
        its state first, never fused. Assumed of rules defined outside the library."""
        return not type(self).__module__.startswith("optimisers.")

    def init(self, x: Any) -> Any:
        """The initial state for the array ``x``; ``None`` for a stateless rule."""
        return None

    def apply(self, state: Any, x: Any, dx: Any, *higher: Any) -> tuple[Any, Any]:
        """One step: ``(new_state, d)``; the parameter becomes ``x - d``."""
        raise NotImplementedError(f"{type(self).__name__} must define apply(state, x, dx)")

    def stepped(self, state: Any) -> Any:
        """Whether the step that gave ``state`` was real (``AccumGrad``: not while it only
        accumulates; traced under ``jax.jit``): the Leaf's clock counts real steps. Reads
        only the non-array parts of ``state``."""
        return True

    def refuses(self, x: Any) -> str | None:
        """refuses(x) -> why this rule cannot train ``x`` (``setup`` raises it with the
        path), or ``None``. By default, what the rules in its fields refuse.

        Example:
            >>> import numpy as np
            >>> from optimisers import Adam, Muon, OptimiserChain
            >>> OptimiserChain(Muon()).refuses(np.zeros(3))
            'Muon trains matrices (2-D arrays), not arrays of shape (3,)'
        """
        for v in _inner_values(self):
            if isinstance(v, Rule):
                why = v.refuses(x)
                if why is not None:
                    return why
        return None

    def averaged(self, state: Any, x: Any) -> Any:
        """The parameter to evaluate with, kept in ``state`` (an average), or ``None`` for
        ``x`` itself: what :func:`~optimisers.averaged` puts in the model."""
        return None

    def misfit(self, state: Any, x: Any) -> tuple | None:
        """misfit(state, x) -> ``None`` when ``state`` fits ``x``, else ``(found, needed)``:
        two shapes or two dtype names. By default every state array has ``x``'s shape and
        dtype (:func:`dtype_misfit`). ``update`` asks it of Leafs it has not seen step.

        Example:
            >>> import numpy as np
            >>> from optimisers import Adam
            >>> Adam().misfit(Adam().init(np.zeros(3)), np.zeros(4))
            ((3,), (4,))
        """
        need = tuple(x.shape)
        for a in _arrays(state):
            if tuple(a.shape) != need:
                return tuple(a.shape), need
        return dtype_misfit(state, x)

    def __post_init__(self) -> None:
        """Check every hyper-parameter (:func:`~optimisers.rules.fields.check`)."""
        fields.check(self)


_NGRADS: dict[type, float] = {}
fields.RULE = (Rule,)  # what a field of kind "rule" must hold


def ngrads(rule: Rule) -> float:
    """How many gradient arguments ``rule.apply`` takes (``inf`` for ``*dx``)."""
    cls = type(rule)
    if cls not in _NGRADS:
        params = list(inspect.signature(cls.apply).parameters.values())[3:]  # after self, state, x
        _NGRADS[cls] = (float("inf") if any(p.kind is p.VAR_POSITIONAL for p in params)
                        else len(params))
    return _NGRADS[cls]


def call(rule: Rule, state: Any, x: Any, grads: tuple) -> tuple[Any, Any]:
    """``rule.apply`` with as many of the gradients as it takes."""
    n = ngrads(rule)
    return rule.apply(state, x, *(grads if n >= len(grads) else grads[: int(n)]))


class NewValue:
    """NewValue(value): a step that sets the parameter to ``value`` (``MixedPrecision``).

    Example:
        >>> NewValue(3.0).value
        3.0
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def dtype_misfit(state: Any, x: Any) -> tuple[str, str] | None:
    """dtype_misfit(state, x) -> ``(found, needed)`` for the first state array whose dtype
    is neither ``x``'s nor its real part's, or ``None``.

    Args:
        state: a rule's state.
        x: the parameter.

    Returns:
        ``(found, needed)`` dtype names, or ``None``.

    Example:
        >>> import numpy as np
        >>> dtype_misfit((np.zeros(2, np.float32),), np.zeros(2, np.float64))
        ('float32', 'float64')
    """
    same, need = x.dtype, ""
    for a in _arrays(state):
        if a.dtype is same:
            continue
        need = need or backends.of(x).dtype_name(x)
        real = f"float{int(need[7:]) // 2}" if need.startswith("complex") else need
        found = backends.of(a).dtype_name(a)
        if found not in (need, real):
            return found, need
    return None


def _inner_values(rule: Rule) -> list:
    """The values of a rule's fields, a tuple field's elements each (a chain's rules)."""
    out: list = []
    for f in getattr(rule, "__dataclass_fields__", {}):
        v = getattr(rule, f, None)
        out.extend(v if isinstance(v, tuple) else (v,))
    return out


def _arrays(state: Any) -> list:
    """The arrays in a state's tuples, lists and dicts; a weakly typed 0-d one (JAX's
    counters under ``jit``) is a number."""
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
