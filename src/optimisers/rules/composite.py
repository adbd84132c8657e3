"""Composite rules (chains, accumulation, mixed precision, averaging): their state is a tuple."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.rules.base import NewValue, Rule, call
from optimisers.rules.descent import Descent
from optimisers.rules.fields import dtype_name, hyperparameter

__all__ = ["OptimiserChain", "AccumGrad", "MixedPrecision", "EMA", "chained"]


@dataclass(frozen=True, init=False, repr=False)
class OptimiserChain(Rule):
    """OptimiserChain(*rules): apply the rules in order, each one's step the next one's gradient.

    The state is the tuple of the rules' states; a step of ``None`` (``AccumGrad`` between
    accumulations) ends the chain for that update.

    Example:
        >>> from optimisers import ClipGrad
        >>> rule = OptimiserChain(ClipGrad(1.0), Descent(0.1))
        >>> rule.apply(rule.init(np.zeros(2)), np.zeros(2), np.array([5.0, 0.5]))[1]
        array([0.1 , 0.05])
    """

    rules: tuple

    def __init__(self, *rules: Rule) -> None:
        for r in rules:
            if not isinstance(r, Rule):
                raise TypeError(f"OptimiserChain takes rules, got {type(r).__name__}")
            if type(r).outermost:  # (MixedPrecision, EMA, StochasticRounding)
                raise ValueError(f"{type(r).__name__} acts on the parameter after the whole "
                                 f"step, so it cannot sit inside an OptimiserChain; wrap the "
                                 f"chain instead: {type(r).__name__}(OptimiserChain(...))")
        object.__setattr__(self, "rules", tuple(rules))

    def __repr__(self) -> str:
        return f"OptimiserChain({', '.join(map(repr, self.rules))})"

    def raises(self) -> bool:
        return any(r.raises() for r in self.rules)

    def init(self, x):
        return tuple(r.init(x) for r in self.rules)

    def misfit(self, state: Any, x: Any) -> tuple | None:
        """The first misfit of a rule's state against ``x``."""
        found = (r.misfit(s, x) for r, s in zip(self.rules, state))
        return next((f for f in found if f is not None), None)

    def stepped(self, state: Any) -> Any:
        """Real when every rule's step was."""
        real: Any = True
        for r, s in zip(self.rules, state):
            now = r.stepped(s)
            real = now if real is True else real if now is True else real & now
        return real

    def apply(self, state, x, dx, *higher):
        states = list(state)
        stepped = None  # under jax.jit, after an AccumGrad: whether it really stepped
        for i, r in enumerate(self.rules):
            old = states[i]
            states[i], dx = call(r, states[i], x, (dx, *higher))
            if dx is None:
                break
            if stepped is not None:  # keep the old state where no step was taken
                states[i] = _select(backends.of(x), stepped, states[i], old)
            real = r.stepped(states[i])  # AccumGrad's, SkipNonFinite's: traced under jit
            if backends.istraced(real):
                stepped = real if stepped is None else stepped & real
        if stepped is not None and dx is not None:
            xp = backends.of(x)  # (zeros, not 0 * dx: a skipped NaN stays out)
            dx = xp.where(stepped, dx, xp.zeros_like(dx))
        return tuple(states), dx

    def averaged(self, state: Any, x: Any) -> Any:
        """The point to evaluate at of the last rule that keeps one, else ``None``."""
        points = [r.averaged(s, x) for r, s in zip(self.rules, state)]
        return next((p for p in reversed(points) if p is not None), None)


def chained(rule: Rule, state: Any, f: Any) -> Any:
    """chained(rule, state, f) -> ``state`` with each rule's own part ``s`` replaced by
    ``f(r, s)``, through (nested) :class:`OptimiserChain` s; ``f(rule, state)`` otherwise."""
    if isinstance(rule, OptimiserChain):
        return tuple(chained(r, s, f) for r, s in zip(rule.rules, state))
    return f(rule, state)


def _select(xp: Any, cond: Any, new: Any, old: Any) -> Any:
    """``new`` where ``cond`` else ``old``, through the tuples of a rule's state."""
    if isinstance(new, tuple):  # (a NamedTuple kept: Quantised's Blocks)
        items = [_select(xp, cond, a, b) for a, b in zip(new, old)]
        return type(new)(*items) if hasattr(new, "_fields") else tuple(items)
    return new if new is None else xp.where(cond, new, old)


@dataclass(frozen=True)
class AccumGrad(Rule):
    """AccumGrad(n): average the gradients of ``n`` calls, then take one step with them.

    The first ``n-1`` updates change nothing but the accumulator; the ``n``-th passes the
    mean on. Put it first in a chain. Under ``jax.jit`` the step is zero instead of ``None``,
    and a chain keeps the later rules' states unchanged.

    Example:
        >>> r, x = AccumGrad(2), np.zeros(1)
        >>> s, d = r.apply(r.init(x), x, np.array([1.0])); d is None
        True
        >>> r.apply(s, x, np.array([3.0]))[1]
        array([2.])
    """

    elementwise = True
    n: int = hyperparameter(1, "[1, inf)", kind="whole")

    def init(self, x):
        return backends.of(x).zeros_like(x), 1

    def stepped(self, state: Any) -> Any:
        """Real when the counter came back to 1."""
        return state[1] == 1

    def apply(self, state, x, dx):
        xp = backends.of(x)
        acc, c = state
        (n,) = xp.hyper(x, self.n)
        if backends.istraced(c):  # under jax.jit: select with where; zero for "no step"
            acc = xp.where(c == 1, dx / n, acc + dx / n)
            done = c == self.n
            return (acc, xp.where(done, 1, c + 1)), xp.where(done, acc, 0 * acc)
        acc = xp.assign(acc, dx / n if c == 1 else acc + dx / n)
        if c == self.n:
            return (acc, 1), acc
        return (acc, c + 1), None


@dataclass(frozen=True)
class MixedPrecision(Rule):
    """MixedPrecision(rule, dtype=float32): train a low-precision parameter through a
    higher-precision master copy.

    The state is ``(xT, rule_state)``: ``rule`` steps ``xT`` (in ``dtype``; complex of that
    precision for a complex parameter), and the parameter becomes ``xT`` rounded to its own
    dtype (a :class:`NewValue`). Outermost only: wrap a chain, never put it inside one.

    Example:
        >>> rule, x = MixedPrecision(Descent(1e-4)), np.ones(1, np.float16)
        >>> s = rule.init(x)
        >>> for _ in range(10):
        ...     s, step = rule.apply(s, x, np.ones(1, np.float16)); x = step.value
        >>> x, s[0]     # float16 alone would never move from 1.0 in steps of 1e-4
        (array([0.999], dtype=float16), array([0.999], dtype=float32))
    """

    outermost = True
    rule: Rule = hyperparameter(default_factory=Descent, kind="rule")
    dtype: Any = hyperparameter(np.float32, kind="dtype")

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.rule, MixedPrecision):
            raise ValueError("MixedPrecision inside MixedPrecision: use one, with the "
                             "higher dtype")

    def __repr__(self) -> str:
        """The dtype by its name, so that the text is code that makes this rule again."""
        return f"MixedPrecision(rule={self.rule!r}, dtype={dtype_name(self.dtype)!r})"

    def raises(self) -> bool:
        return self.rule.raises()

    def init(self, x):
        xT = backends.of(x).astype(x, self.dtype)
        return xT, self.rule.init(xT)

    def misfit(self, state: Any, x: Any) -> tuple | None:
        """The master copy's shape against ``x``'s (its dtype is its own), then the rule's test."""
        master, need = state[0], tuple(x.shape)
        if tuple(master.shape) != need:
            return tuple(master.shape), need
        return self.rule.misfit(state[1], master)

    def stepped(self, state: Any) -> Any:
        return self.rule.stepped(state[1])

    def held(self, state: Any, x: Any, dx: Any) -> tuple:
        """``(state, x, dx)`` as the rule it runs sees them: its state, the master copy, ``dx``."""
        xT, st = state
        return st, xT, dx if dx is None else backends.of(xT).cast(dx, xT)

    def apply(self, state, x, dx, *higher):
        xp = backends.of(x)
        xT, st = state
        st, d = call(self.rule, st, xT, tuple(xp.cast(g, xT) for g in (dx, *higher)))
        if d is None:
            return (xT, st), None
        xT = xp.subtract(xT, d, inplace=True)
        return (xT, st), NewValue(xp.astype(xT, x.dtype))  # a copy, never xT itself

    def averaged(self, state: Any, x: Any) -> Any:
        """The inner rule's point to evaluate at, in ``x``'s dtype."""
        xT, st = state
        found = self.rule.averaged(st, xT)
        return None if found is None else backends.of(x).astype(found, x.dtype)


@dataclass(frozen=True)
class EMA(Rule):
    """EMA(rule, decay=0.999): run ``rule``, and keep an exponential moving average of the
    parameter in the state for :func:`~optimisers.averaged`.

    The state is ``(rule_state, avg)``: ``avg`` starts as the parameter, and after each step
    becomes ``decay*avg + (1-decay)*x`` (``optax.ema`` of the parameters, without debiasing).

    Example:
        >>> rule, x = EMA(Descent(0.5), decay=0.9), np.array([1.0])
        >>> s = rule.init(x)
        >>> s, d = rule.apply(s, x, np.array([1.0]))
        >>> x - d, s[1]     # the new x, and 0.9*1 + 0.1*0.5
        (array([0.5]), array([0.95]))
    """

    elementwise = True
    reads_x = True
    outermost = True
    rule: Rule = hyperparameter(default_factory=Descent, kind="rule")
    decay: float = hyperparameter(0.999, "[0, 1]")

    def raises(self) -> bool:
        return self.rule.raises()

    def init(self, x):
        return self.rule.init(x), backends.of(x).copy(x)

    def misfit(self, state: Any, x: Any) -> tuple | None:
        """The rule's own test, then the average's shape against ``x``'s."""
        return self.rule.misfit(state[0], x) or Rule.misfit(self, state[1], x)

    def stepped(self, state: Any) -> Any:
        return self.rule.stepped(state[0])

    def held(self, state: Any, x: Any, dx: Any) -> tuple:
        """``(state, x, dx)`` as the rule it runs sees them."""
        return state[0], x, dx

    def apply(self, state, x, dx, *higher):
        xp = backends.of(x)
        inner, avg = state
        inner, d = call(self.rule, inner, x, (dx, *higher))
        if d is None:
            return (inner, avg), None
        new = d.value if isinstance(d, NewValue) else x - d
        b, c = xp.hyper(x, self.decay, xp.complement(self.decay))
        real = self.rule.stepped(inner)
        if backends.istraced(real):  # under jit, a step that was not real keeps the average
            return (inner, xp.where(real, b * avg + c * new, avg)), d
        return (inner, xp.assign(avg, b * avg + c * new)), d

    def averaged(self, state: Any, x: Any) -> Any:
        """The average."""
        return state[1]
