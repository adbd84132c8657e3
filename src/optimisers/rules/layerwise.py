"""Layer-wise rules: a step scaled per array by a trust ratio, ``|x| / |u|``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optimisers import backends
from optimisers.rules.adaptive import Adam
from optimisers.rules.base import Rule
from optimisers.rules.fields import hyperparameter

__all__ = ["LAMB", "LARS"]


def _trust_ratio(xp: Any, x: Any, u: Any, coefficient: Any = 1.0, eps: Any = 0.0) -> Any:
    """``coefficient*|x| / (|u| + eps)`` of whole-array 2-norms, 1 where either is zero."""
    nx, nu = xp.norm(x, 2.0), xp.norm(u, 2.0)
    zero = (nx == 0) | (nu == 0)
    return xp.where(zero, 1, coefficient * nx / xp.where(zero, 1, nu + eps))


@dataclass(frozen=True)
class LAMB(Rule):
    """LAMB(eta=0.001, beta=(0.9, 0.999), epsilon=1e-6, lambd=0.0): Adam's direction with
    weight decay, scaled per array by its trust ratio (You et al. 2020, "Large Batch
    Optimization for Deep Learning: Training BERT in 76 minutes").

    ``m``, ``v`` as Adam; ``u = m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + lambd*x``;
    ``d = eta * trust_ratio(x, u) * u``. The steps of ``optax.lamb`` (whose default
    ``weight_decay`` is ``1e-4``). Train float16 through :class:`MixedPrecision`.

    Example:
        >>> import numpy as np
        >>> r, x = LAMB(0.1), np.array([3.0, 4.0])
        >>> r.apply(r.init(x), x, np.array([1.0, 0.0]))[1].round(6)  # |d| = eta * |x|
        array([0.5, 0. ])
    """

    reads_x = True
    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.999), "[0, 1)", "[0, 1)")
    epsilon: float = hyperparameter(1e-6, "[0, inf)")
    lambd: float = hyperparameter(0.0, "[0, inf)")

    def init(self, x):
        return self.direction().init(x)

    def direction(self) -> Rule:
        """Adam's step at learning rate 1: ``u`` without the decay."""
        return Adam(1.0, self.beta, self.epsilon)

    def scaled(self, x: Any, a: Any) -> Any:
        """``eta * trust_ratio * u`` for ``u = a + lambd*x``."""
        xp = backends.of(x)
        eta, lambd = xp.hyper(x, self.eta, self.lambd)
        u = a + lambd * x
        return eta * _trust_ratio(xp, x, u) * u

    def apply(self, state, x, dx):
        state, a = self.direction().apply(state, x, dx)
        return state, self.scaled(x, a)


@dataclass(frozen=True)
class LARS(Rule):
    """LARS(eta=1.0, lambd=0.0, trust=0.001, epsilon=0.0, rho=0.9, nesterov=False):
    momentum on the gradient with weight decay, scaled per array by its trust ratio (You
    et al. 2017, "Large Batch Training of Convolutional Networks").

    ``u = g + lambd*x``; ``u = eta * trust_ratio(x, u, trust, eps) * u``; ``v = rho*v + u``;
    ``d = v``, or ``rho*v + u`` when ``nesterov``: the steps of ``optax.lars`` (give the
    arrays its mask leaves out another rule with ``setup``'s mapping).

    Example:
        >>> import numpy as np
        >>> r, x = LARS(1.0, trust=0.01), np.array([3.0, 4.0])
        >>> r.apply(r.init(x), x, np.array([0.0, 2.0]))[1]   # |d| = trust * |x|
        array([0.  , 0.05])
    """

    reads_x = True
    eta: float = hyperparameter(1.0, "[0, inf)")
    lambd: float = hyperparameter(0.0, "[0, inf)")
    trust: float = hyperparameter(0.001, "[0, inf)")
    epsilon: float = hyperparameter(0.0, "[0, inf)")
    rho: float = hyperparameter(0.9, "[0, 1]")
    nesterov: bool = hyperparameter(False, kind="flag")

    def init(self, x):
        return backends.of(x).zeros_like(x)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, lambd, trust, rho = xp.hyper(x, self.eta, self.lambd, self.trust, self.rho)
        eps = xp.eps(x, self.epsilon)
        u = dx + lambd * x
        u = eta * (_trust_ratio(xp, x, u, trust, eps) * u)
        v = xp.assign(state, rho * state + u)
        return v, (rho * v + u if self.nesterov else v)
