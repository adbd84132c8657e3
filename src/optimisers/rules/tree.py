"""Tree-level rules: one reduction over the Leafs in scope (``reduce.py``), then a plain rule."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.rules.base import Rule
from optimisers.rules.fields import hyperparameter

__all__ = ["TreeRule", "ClipGlobalNorm", "SkipNonFinite"]


class TreeRule(Rule):
    """TreeRule: the base of rules that reduce over all the Leafs of an update.

    Its scope: the Leafs stepped in one update whose rule holds an equal tree-level rule at
    the same place; ties once, frozen Leafs and Leafs without a gradient left out. Alone
    (``apply``), it treats its one array as the whole tree.

    Example:
        >>> from optimisers import ClipGlobalNorm
        >>> rule = ClipGlobalNorm(1.0)
        >>> total = rule.total([rule.part(np.array([3.0])), rule.part(np.array([4.0]))])
        >>> float(total), rule.given(total).apply(None, np.zeros(1), np.array([3.0]))[1]
        (5.0, array([0.6]))
    """

    def part(self, dx: Any) -> Any:
        """This Leaf's part of the reduction, from the gradient reaching the rule."""
        raise NotImplementedError

    def parts(self, dxs: list) -> list:
        """The parts of the gradients ``dxs`` (each Leaf's, or fewer that reduce the same)."""
        return [self.part(dx) for dx in dxs]

    def total(self, parts: list) -> Any:
        """The reduction of every Leaf's part."""
        raise NotImplementedError

    def given(self, total: Any) -> Rule:
        """The per-array rule each Leaf steps with, the total known (same state)."""
        raise NotImplementedError

    def check(self, total: Any, states: list, paths: list) -> None:
        """Raise, before anything is written, where the total forbids the step."""

    def apply(self, state, x, dx):
        return self.given(self.total([self.part(dx)])).apply(state, x, dx)


@dataclass(frozen=True)
class _Scaled(Rule):
    """The step of :class:`ClipGlobalNorm` once the norm is known: ``d = factor * g``."""

    elementwise = True
    factor: float = 1.0

    def apply(self, state, x, dx):
        (factor,) = backends.of(x).hyper(x, self.factor)
        return state, dx * factor


@dataclass(frozen=True)
class ClipGlobalNorm(TreeRule):
    """ClipGlobalNorm(omega=1.0, p=2.0): rescale all gradients by ``min(1, omega / n)``,
    ``n`` the ``p``-norm of all of them together.

    As ``torch.nn.utils.clip_grad_norm_`` (which divides by ``n + 1e-6``) and
    ``optax.clip_by_global_norm``. Put it first in a chain (after ``AccumGrad``).

    Example:
        >>> from optimisers import Descent, OptimiserChain, setup, update
        >>> model = [np.zeros(1), np.zeros(1)]
        >>> tree = setup(OptimiserChain(ClipGlobalNorm(1.0), Descent(1.0)), model)
        >>> update(tree, model, [np.array([3.0]), np.array([4.0])])[1]
        [array([-0.6]), array([-0.8])]
    """

    elementwise = True  # given the norm (the group's rule is given it first)
    omega: float = hyperparameter(1.0, "[0, inf)")
    p: float = hyperparameter(2.0, "(0, inf]", static=True)

    def part(self, dx: Any) -> Any:
        xp = backends.of(dx)  # (a half-precision sum of squares overflows: float32)
        return xp.norm(xp.astype(dx, np.float32) if xp.ishalf(dx) else dx, self.p)

    def parts(self, dxs: list) -> list:
        """One norm of them all where the backend has ``total_norm``, else each one's."""
        many = getattr(backends.of(dxs[0]), "total_norm", None) if len(dxs) > 1 else None
        whole = many(dxs, self.p) if many is not None else None
        return [self.part(dx) for dx in dxs] if whole is None else [whole]

    def total(self, parts: list) -> Any:
        if len(parts) == 1:
            return parts[0]
        if self.p == float("inf"):
            return functools.reduce(_larger, parts)
        return sum(n ** self.p for n in parts) ** (1 / self.p)

    def given(self, total: Any) -> Rule:
        lib = backends.library(total)
        if not backends.istraced(total) and not getattr(lib and backends.ops(lib), "ASYNC",
                                                        False):
            n = float(total)  # (a host read: only where it waits for no device)
            return _Scaled(self.omega / n if n > self.omega else 1.0)
        xp = backends.of(total)
        big = total > self.omega
        return _Scaled(xp.where(big, self.omega / xp.where(big, total, 1), 1))


def _larger(a: Any, b: Any) -> Any:
    if backends.istraced(a) or backends.istraced(b):
        xp = backends.of(a if backends.istraced(a) else b)
        return xp.maximum(a, b)
    return a if a >= b else b


class _Counting:
    """The state of :class:`SkipNonFinite` and its per-array forms: the count of skips."""

    def init(self, x):
        return 0

    def stepped(self, state: Any) -> Any:
        return state == 0


@dataclass(frozen=True)
class _Decided(_Counting, Rule):
    """Every gradient finite: passed on, the count back to 0; else no step, the count up."""

    elementwise = True
    finite: bool = True

    def apply(self, state, x, dx):
        return (0, dx) if self.finite else (state + 1, None)


@dataclass(frozen=True)
class _Skipping(_Counting, Rule):
    """Under ``jax.jit``, the decision traced: chosen with ``where``."""

    finite: Any = field(default=None, metadata={"data": True})

    def apply(self, state, x, dx):
        xp = backends.of(x)
        return (xp.where(self.finite, 0, state + 1), xp.where(self.finite, dx, xp.zeros_like(dx)))


@dataclass(frozen=True)
class SkipNonFinite(_Counting, TreeRule):
    """SkipNonFinite(limit=None): when any gradient in scope is NaN or infinite, skip the
    whole step (parameters, later rules' states, clocks) and count the skip in the state.

    After ``limit`` consecutive skips the next non-finite step raises ``FloatingPointError``
    with nothing written (``limit=0``: always raise). As ``optax.apply_if_finite``.

    Example:
        >>> from optimisers import Descent, OptimiserChain, setup, update_
        >>> model = [np.ones(1), np.ones(1)]
        >>> tree = setup(OptimiserChain(SkipNonFinite(), Descent(0.5)), model)
        >>> _ = update_(tree, model, [np.array([np.nan]), np.array([1.0])])
        >>> model, tree[1].state[0]
        ([array([1.]), array([1.])], 1)
    """

    elementwise = True  # given the decision (the group's rule is given it first)
    limit: int | None = hyperparameter(None, "[0, inf) or None", kind="whole", static=True)

    def part(self, dx: Any) -> Any:
        return backends.of(dx).allfinite(dx)

    def total(self, parts: list) -> Any:
        if not any(map(backends.istraced, parts)):
            return all(bool(ok) for ok in parts)
        return functools.reduce(lambda a, b: a & b, parts)

    def given(self, total: Any) -> Rule:
        if backends.istraced(total):
            return _Skipping(total)
        return _Decided(bool(total))

    def check(self, total: Any, states: list, paths: list) -> None:
        if total is not False or self.limit is None:
            return
        for state, kp in zip(states, paths):
            if not backends.istraced(state) and state >= self.limit:
                raise FloatingPointError(
                    f"SkipNonFinite: a non-finite gradient after {state} consecutive "
                    f"skipped steps (limit={self.limit}) at {kp!r}")
