"""Gradient transforms: decay terms added to the gradient, and clipping."""

from __future__ import annotations

from dataclasses import dataclass

from optimisers import backends
from optimisers.rules.base import Rule
from optimisers.rules.fields import hyperparameter

__all__ = ["WeightDecay", "SignDecay", "ClipGrad", "ClipNorm"]


@dataclass(frozen=True)
class WeightDecay(Rule):
    """WeightDecay(lambd=5e-4): L2 decay added to the gradient, ``d = g + lambd*x``; put it
    before the optimiser in a chain.

    Example:
        >>> import numpy as np
        >>> WeightDecay(0.1).apply(None, np.array([2.0]), np.array([1.0]))[1]
        array([1.2])
    """

    elementwise = True
    reads_x = True

    lambd: float = hyperparameter(5e-4, "[0, inf)")

    def apply(self, state, x, dx):
        (lambd,) = backends.of(x).hyper(x, self.lambd)
        return state, dx + lambd * x


@dataclass(frozen=True)
class SignDecay(Rule):
    """SignDecay(lambd=1e-3): L1 decay added to the gradient, ``d = g + lambd*sign(x)``.

    Example:
        >>> import numpy as np
        >>> SignDecay(0.1).apply(None, np.array([-2.0]), np.array([1.0]))[1]
        array([0.9])
    """

    elementwise = True
    reads_x = True

    lambd: float = hyperparameter(1e-3, "[0, inf)")

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (lambd,) = xp.hyper(x, self.lambd)
        return state, dx + lambd * xp.sign(x)


@dataclass(frozen=True)
class ClipGrad(Rule):
    """ClipGrad(delta=10.0): clamp each gradient element to ``[-delta, delta]`` (a complex
    element's parts each).

    Example:
        >>> import numpy as np
        >>> ClipGrad(1.0).apply(None, np.zeros(2), np.array([-3.0, 0.5]))[1]
        array([-1. ,  0.5])
    """

    elementwise = True

    delta: float = hyperparameter(10.0, "[0, inf)")

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (delta,) = xp.hyper(x, self.delta)
        return state, xp.clip(dx, -delta, delta)


@dataclass(frozen=True)
class ClipNorm(Rule):
    """ClipNorm(omega=10.0, p=2.0, throw=True): rescale the gradient to norm at most ``omega``.

    ``d = g * min(omega/n, 1)``, ``n = norm(g, p)``, ``p`` in ``(0, inf]``. A non-finite
    norm raises ``FloatingPointError`` when ``throw`` (not under ``jax.jit``).

    Example:
        >>> import numpy as np
        >>> ClipNorm(1.0).apply(None, np.zeros(2), np.array([3.0, 4.0]))[1]
        array([0.6, 0.8])
    """

    omega: float = hyperparameter(10.0, "[0, inf)")
    p: float = hyperparameter(2.0, "(0, inf]", static=True)  # not traced by JAX
    throw: bool = hyperparameter(True, kind="flag")

    def raises(self) -> bool:
        return bool(self.throw)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        n = xp.norm(dx, self.p)
        if self.throw and xp.isfinite(n) is False:
            raise FloatingPointError(f"ClipNorm: the gradient's {self.p}-norm is {n}; "
                                     f"pass throw=False to clip anyway")
        (omega,) = xp.hyper(x, self.omega)
        big = n > omega
        return state, dx * xp.where(big, omega / xp.where(big, n, 1), 1)
