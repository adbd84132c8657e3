"""Layer-wise rules: a step scaled by a trust ratio, the parameter's norm over the step's.

Each array is one "layer": the ratio ``|x| / |u|`` (2-norms over the whole array) makes
every array move by about the same fraction of its own size, whatever the scale of its
gradient. The norms reduce over the whole array, so these rules are not elementwise;
LAMB's Adam direction runs fused (``Rule.direction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optimisers import backends
from optimisers.rules.adaptive import Adam
from optimisers.rules.base import Rule
from optimisers.rules.fields import hyperparameter

__all__ = ["LAMB", "LARS", "trust_ratio"]


def trust_ratio(xp: Any, x: Any, u: Any, coefficient: Any = 1.0, eps: Any = 0.0) -> Any:
    """trust_ratio(xp, x, u, coefficient=1.0, eps=0.0) -> ``coefficient*|x| / (|u| + eps)``,
    or 1 where ``|x|`` or ``|u|`` is zero: the layer-wise scale of LARS and LAMB.

    ``|.|`` is the 2-norm of the whole array (the Frobenius norm of a matrix; of a complex
    array, over the moduli), a 0-d value of ``x``'s real dtype. A parameter or a step of
    norm zero (a bias initialised to zeros, say) takes the step unscaled, as
    ``optax.scale_by_trust_ratio`` does. ``coefficient`` and ``eps`` are hyper-parameters
    already in ``x``'s dtype (``xp.hyper``), or Python numbers.

    Example:
        >>> import numpy as np
        >>> from optimisers.backends import numpy as xp
        >>> x, u = np.array([3.0, 4.0]), np.array([0.0, 0.5])
        >>> float(trust_ratio(xp, x, u)), float(trust_ratio(xp, np.zeros(2), u))
        (10.0, 1.0)
    """
    nx, nu = xp.norm(x, 2.0), xp.norm(u, 2.0)
    zero = (nx == 0) | (nu == 0)
    return xp.where(zero, 1, coefficient * nx / xp.where(zero, 1, nu + eps))


@dataclass(frozen=True)
class LAMB(Rule):
    """LAMB(eta=0.001, beta=(0.9, 0.999), epsilon=1e-6, lambd=0.0): Adam's direction with
    weight decay, scaled per array by its trust ratio (You et al. 2020, "Large Batch
    Optimization for Deep Learning: Training BERT in 76 minutes").

    ``m``, ``v`` as Adam; ``u = m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + lambd*x``;
    ``d = eta * |x|/|u| * u``, with the ratio 1 where either norm is zero (2-norms over
    the whole array: see :func:`trust_ratio`). The steps of ``optax.lamb(eta, b1, b2,
    eps, weight_decay=lambd)`` (whose default ``weight_decay`` is ``1e-4``; here 0); the
    bias corrections ``b^t`` are kept as products, computed in float64 for a NumPy or
    PyTorch parameter where optax takes ``b**t`` in the parameter's dtype, a difference of
    rounding only. Complex parameters step as Adam's do, their norms over the moduli.
    The norms are computed in the parameter's dtype: train float16 through
    :class:`MixedPrecision`, whose float32 copy keeps ``|x|^2`` from overflowing.

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
        """Adam's step at learning rate 1 (``1.0 * m`` is ``m``): ``u`` without the decay."""
        return Adam(1.0, self.beta, self.epsilon)

    def scaled(self, x: Any, a: Any) -> Any:
        """``eta * trust_ratio * u`` for ``u = a + lambd*x``."""
        xp = backends.of(x)
        eta, lambd = xp.hyper(x, self.eta, self.lambd)
        u = a + lambd * x
        return eta * trust_ratio(xp, x, u) * u

    def apply(self, state, x, dx):
        state, a = self.direction().apply(state, x, dx)
        return state, self.scaled(x, a)


@dataclass(frozen=True)
class LARS(Rule):
    """LARS(eta=1.0, lambd=0.0, trust=0.001, epsilon=0.0, rho=0.9, nesterov=False):
    momentum on the gradient with weight decay, scaled per array by its trust ratio (You
    et al. 2017, "Large Batch Training of Convolutional Networks").

    ``u = g + lambd*x``; ``u = eta * trust*|x|/(|u| + eps) * u``, with the ratio 1 where
    either norm is zero (2-norms over the whole array: see :func:`trust_ratio`);
    ``v = rho*v + u``; ``d = v``, or ``d = rho*v + u`` when ``nesterov``. The steps of
    ``optax.lars(eta, weight_decay=lambd, trust_coefficient=trust, eps=epsilon,
    momentum=rho, nesterov=nesterov)``, whose velocity, like this one, carries the
    learning rate. optax masks the trust ratio off for chosen parameters; here give those
    another rule (``setup({"bias": Momentum(...), "*": LARS()}, model)``). Complex
    parameters step alike, their norms over the moduli; the norms are computed in the
    parameter's dtype (see :class:`LAMB` for float16).

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
        u = eta * (trust_ratio(xp, x, u, trust, eps) * u)
        v = xp.assign(state, rho * state + u)
        return v, (rho * v + u if self.nesterov else v)
