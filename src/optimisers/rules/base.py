"""The optimisation rules: each a small frozen dataclass with ``init`` and ``apply``.

A rule sees one array at a time and never walks a tree. ``apply(state, x, dx)`` returns
the new state and the step ``d``; the parameter then becomes ``x - d`` (a step of
``None`` means "no step"). Arithmetic goes through the array's backend, so one rule
serves NumPy, PyTorch and JAX, and hyper-parameters are used in the array's own dtype.

This module holds what every rule shares: the base class :class:`Rule`, the registry
:data:`RULES` and :func:`call`; the rules themselves live beside it, by family.
"""

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

    Subclass it as a frozen dataclass whose fields are the hyper-parameters, define
    ``init(x) -> state`` and ``apply(state, x, dx) -> (state, d)``, and the new rule
    works everywhere a built-in one does (setup, update, adjust, checkpoints). Write
    state arrays through ``backends.of(x).assign`` so that they update in place where
    the array may be written.

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

    elementwise = False
    """Whether each element's step depends only on that element (and on scalars equal
    across arrays): such rules may run fused over many arrays at once (fast/fused.py)."""
    reads_x = False
    """Whether ``apply`` reads the parameter's values (else only its dtype)."""
    stacks = False
    """Whether ``apply``, given the parameter, gradient and state arrays of several Leafs
    of one shape stacked along a new first axis, steps each as it would alone (it works on
    the last axes, as ``Muon`` on matrices): such rules may run over a stack of like
    Leafs at once (``fused.Stack``), or, in JAX, vectorised by ``jax.vmap``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        RULES.setdefault(cls.__name__, cls)
        backends.rule_defined(cls)  # JAX seen already: the new rule is a pytree too

    def direction(self) -> Rule | None:
        """direction() -> an ``elementwise`` rule of the same state whose step ``a`` this
        rule's step is made of, per array, by :meth:`scaled`: ``apply(state, x, g)`` is
        ``(s, scaled(x, a))`` for ``(s, a) = direction().apply(state, x, g)``; or ``None``
        (most rules). ``LAMB``'s is Adam's direction, and a fused group runs it over
        its flat buffers (``fused.Directed``) before each array's trust ratio.

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
        """Whether ``apply`` may raise (as ``ClipNorm`` does on a non-finite norm).

        ``update_`` runs such a rule first, on a copy of its state, and writes nothing
        until every rule has returned, so that an error leaves the model and the tree as
        they were; it is never fused. The library's own rules say exactly which may; a
        rule defined elsewhere is assumed to, since ``update_`` cannot know: override
        this to return ``False`` once yours cannot raise, to skip the copy and let an
        ``elementwise`` rule run fused.
        """
        return not type(self).__module__.startswith("optimisers.")

    def init(self, x: Any) -> Any:
        """The initial state for the array ``x``; ``None`` for a stateless rule."""
        return None

    def apply(self, state: Any, x: Any, dx: Any, *higher: Any) -> tuple[Any, Any]:
        """One step: ``(new_state, d)``; the parameter becomes ``x - d``."""
        raise NotImplementedError(f"{type(self).__name__} must define apply(state, x, dx)")

    def stepped(self, state: Any) -> Any:
        """Whether the step that gave ``state`` was a real one: ``True`` for most rules;
        :class:`~optimisers.AccumGrad` says ``False`` while it only accumulates (under
        ``jax.jit``, a traced truth value). A Leaf's clock counts the real steps (see
        :meth:`~optimisers.Leaf.advance`), and a schedule in a field is evaluated at it.
        Reads only the non-array parts of ``state``: a fused group asks it of its state's
        signature, where arrays are marks.

        Example:
            >>> from optimisers import Adam
            >>> Adam().stepped(None)
            True
        """
        return True

    def refuses(self, x: Any) -> str | None:
        """refuses(x) -> why this rule cannot train the array ``x`` (a sentence saying what
        it needs), or ``None`` when it can.

        ``setup`` asks this of every array it makes a Leaf for, and refuses an array with
        a ``ValueError`` naming its path (``Muon`` trains real matrices only). By default
        a rule takes every array that the rules in its fields take (a chain's, say).

        Example:
            >>> import numpy as np
            >>> from optimisers import Adam, Muon, OptimiserChain
            >>> Adam().refuses(np.zeros(3)) is None
            True
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
        """The parameter to evaluate with, kept in ``state`` (an average of ``x``, say), or
        ``None`` for ``x`` itself: what :func:`~optimisers.averaged` puts in the model.

        Example:
            >>> import numpy as np
            >>> from optimisers import Adam
            >>> Adam().averaged(None, np.ones(1)) is None
            True
        """
        return None

    def misfit(self, state: Any, x: Any) -> tuple | None:
        """misfit(state, x) -> None when ``state`` can be this rule's state for ``x``, else
        what was found and what is needed, ``(found, needed)``: two shapes (tuples), or
        two dtype names (strings).

        ``update`` and :func:`~optimisers.averaged` ask this of every Leaf they have not
        seen step its array before, so that a parameter resized, or cast to another dtype,
        after ``setup`` is an error, never a step over the wrong memory or with state of
        another precision. By default every array in the state must have ``x``'s shape,
        and ``x``'s dtype or, for a complex ``x``, its real part's (:func:`dtype_misfit`);
        a rule whose state holds arrays of other shapes (factored moments) or dtypes (a
        master copy) overrides it.

        Example:
            >>> import numpy as np
            >>> from optimisers import Adam
            >>> Adam().misfit(Adam().init(np.zeros(3)), np.zeros(4))
            ((3,), (4,))
            >>> Adam().misfit(Adam().init(np.zeros(3, np.float32)), np.zeros(3, np.float16))
            ('float32', 'float16')
        """
        need = tuple(x.shape)
        for a in _arrays(state):
            if tuple(a.shape) != need:
                return tuple(a.shape), need
        return dtype_misfit(state, x)

    def __post_init__(self) -> None:
        """Check every hyper-parameter against what its field allows (see
        :func:`~optimisers.rules.fields.hyperparameter`); a field that declares nothing is
        not checked, except a learning rate ``eta``, which is never negative. Runs for the
        constructor, ``dataclasses.replace`` (``adjust``) and checkpoints alike. Values
        traced under ``jax.jit`` are checked for their kind only."""
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
    """NewValue(value): a step that sets the parameter to ``value`` instead of subtracting.

    For rules that compute the new parameter themselves (:class:`MixedPrecision` rounds
    its master copy), so that no rounding of ``x - (x - new)`` creeps in.

    Example:
        >>> NewValue(3.0).value
        3.0
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value



def dtype_misfit(state: Any, x: Any) -> tuple[str, str] | None:
    """dtype_misfit(state, x) -> ``(found, needed)`` dtype names for the first array of
    ``state`` whose dtype is neither ``x``'s nor, for a complex ``x``, its real part's
    (``float32`` for ``complex64``), or ``None`` when all fit.

    Example:
        >>> import numpy as np
        >>> dtype_misfit((np.zeros(2, np.float32), None), np.zeros(2, np.complex64)) is None
        True
        >>> dtype_misfit((np.zeros(2, np.float32),), np.zeros(2, np.float64))
        ('float32', 'float64')
    """
    same, need = x.dtype, ""
    for a in _arrays(state):
        if a.dtype is same:  # (the usual case, at every step: no names made)
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
    """The arrays in a state, its tuple, list and dict parts walked. A weakly typed 0-d
    array is a number (JAX carries bias corrections and counters so under ``jit``); any
    other array, 0-d too, is state that must fit its parameter."""
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
