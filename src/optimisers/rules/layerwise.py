"""Layer-wise rules: each array's step depends on the whole array: scaled by a trust ratio
``|x| / |u|`` (LAMB, LARS), orthogonalised (Muon), or from a factored second moment (Adafactor)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from optimisers import backends
from optimisers.rules.adaptive import Adam
from optimisers.rules.base import Rule, dtype_misfit
from optimisers.rules.descent import Momentum
from optimisers.rules.fields import hyperparameter

__all__ = ["LAMB", "LARS", "Muon", "Adafactor"]


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

    init = Momentum.init

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, lambd, trust, rho = xp.hyper(x, self.eta, self.lambd, self.trust, self.rho)
        eps = xp.eps(x, self.epsilon)
        u = dx + lambd * x
        u = eta * (_trust_ratio(xp, x, u, trust, eps) * u)
        v = xp.assign(state, rho * state + u)
        return v, (rho * v + u if self.nesterov else v)


def _orthogonalised(xp: Any, u: Any, coefficients: tuple, steps: int, epsilon: Any) -> Any:
    """Newton–Schulz on each matrix of ``u``, every intermediate in bfloat16 as torch's."""
    low = xp.to_bfloat16
    a, b, c = coefficients
    rows, cols = xp.shape(u)[-2:]
    X = low(u)
    if rows > cols:
        X = xp.transpose(X)
    X = low(X / low(xp.maximum(xp.vector_norm(X, (-2, -1)), epsilon)))
    for _ in range(steps):
        A = low(xp.matmul(X, xp.transpose(X)))
        X = low(xp.matmul_add(X, low(xp.matmul_add(A, A, A, b, c)), X, a, 1.0))
    return xp.transpose(X) if rows > cols else X


@dataclass(frozen=True)
class Muon(Rule):
    r"""Muon(eta=1e-3, rho=0.95, lambd=0.1, nesterov=True, ns_steps=5,
    ns_coefficients=(3.4445, -4.775, 2.0315), epsilon=1e-7): momentum orthogonalised by
    Newton–Schulz iterations, for the weight matrices of hidden layers (Jordan et al. 2024).

    ``b = rho*b + (1-rho)*g``; ``u = rho*b + (1-rho)*g`` when ``nesterov``, else ``b``;
    ``d = eta*lambd*x + eta*sqrt(max(1, rows/cols))*NS(u)``, ``NS`` being ``ns_steps`` of
    ``X <- a X + (b X X^T + c (X X^T)^2) X`` from ``X = u / max(|u|_F, epsilon)`` on the wide
    orientation, in bfloat16. As ``torch.optim.Muon`` with its defaults. Real matrices only:
    ``setup`` refuses other arrays (:meth:`refuses`).

    Args:
        eta: the learning rate.
        rho: the momentum's decay.
        lambd: the decoupled weight decay, times ``eta``.
        nesterov: whether to step along Nesterov's look-ahead ``u``.
        ns_steps: how many Newton–Schulz iterations (under 100).
        ns_coefficients: ``(a, b, c)`` of the quintic.
        epsilon: the floor of the norm that ``u`` is divided by.

    Reference:
        K. Jordan et al., "Muon: An optimizer for hidden layers in neural networks", 2024,
        https://kellerjordan.github.io/posts/muon/

    Example:
        >>> r, x = Muon(0.1, lambd=0.0), np.zeros((2, 3))
        >>> g = np.array([[3.0, 0.0, 0.0], [0.0, 0.0, -1.0]])
        >>> r.apply(r.init(x), x, g)[1].round(3)  # singular values 3 and 1 made 0.75, 1.13
        array([[ 0.075,  0.   ,  0.   ],
               [ 0.   ,  0.   , -0.113]])
    """

    reads_x = True
    stacks = True
    eta: float = hyperparameter(1e-3, "[0, inf)")
    rho: float = hyperparameter(0.95, "[0, 1]")
    lambd: float = hyperparameter(0.1, "[0, inf)")
    nesterov: bool = hyperparameter(True, kind="flag")
    ns_steps: int = hyperparameter(5, "[0, 100)", kind="whole")
    ns_coefficients: tuple = hyperparameter((3.4445, -4.775, 2.0315), "(-inf, inf)",
                                            "(-inf, inf)", "(-inf, inf)")
    epsilon: float = hyperparameter(1e-7, "[0, inf)")

    def refuses(self, x: Any) -> str | None:
        """Why ``x`` is no real matrix, or ``None``."""
        xp = backends.of(x)
        shape = xp.shape(x)
        if len(shape) != 2:
            return f"Muon trains matrices (2-D arrays), not arrays of shape {shape}"
        if xp.iscomplex(x):
            return "Muon trains real matrices, not complex ones (as torch.optim.Muon)"
        return None

    init = Momentum.init

    @backends.on_whole  # a sharded matrix (FSDP2) is gathered for its orthogonalisation
    def apply(self, state, x, dx):
        xp = backends.of(x)
        shape = xp.shape(x)
        if len(shape) < 2 or xp.iscomplex(x):  # (a stack of matrices is 3-D)
            raise ValueError(self.refuses(x))
        rows, cols = shape[-2:]  # (an empty matrix has no step to scale: no cols, no 0/0)
        eta, decay = xp.hyper(x, self.eta * math.sqrt(max(1.0, rows / max(cols, 1))),
                              self.eta * self.lambd)
        c, rho = xp.hyper(x, xp.complement(self.rho), self.rho)
        b = xp.lerp(state, dx, c, inplace=True)  # (torch's lerp_, and lerp)
        u = xp.lerp(dx, b, rho) if self.nesterov else b
        o = _orthogonalised(xp, u, self.ns_coefficients, self.ns_steps, self.epsilon)
        return b, xp.scaled_sum(decay, x, eta, o)  # (o: bfloat16, widened exactly)


def _factored(xp: Any, x: Any) -> bool:
    """Whether Adafactor factors ``x``'s second moment: a non-empty matrix (or stack)."""
    return len(xp.shape(x)) >= 2 and xp.size(x) > 0


@dataclass(frozen=True)
class Adafactor(Rule):
    """Adafactor(eta=1e-2, beta2_decay=-0.8, epsilon=(None, 1e-3), d=1.0, lambd=0.0):
    Adam's second moment factored into a row and a column mean per matrix, and a step
    relative to the parameter's size (Shazeer & Stern 2018).

    ``t`` from 1, ``w = t^beta2_decay``; a matrix keeps ``R = (1-w)*R + w*mean(|g|^2, -1)``,
    ``C = (1-w)*C + w*mean(|g|^2, -2)`` and ``v = R*C / max(mean(R, -2), eps1)``, another
    array ``v = (1-w)*v + w*|g|^2``; ``u = g / sqrt(max(v, eps1^2))``,
    ``alpha = max(eps2, rms(x)) * min(eta, 1/sqrt(t))``,
    ``d = eta*lambd*x + alpha * u / max(1, rms(u)/d)``; ``eps1 = None`` is the dtype's
    epsilon. As ``torch.optim.Adafactor``; complex parameters train too.

    Args:
        eta: the cap of the relative step size, and the weight decay's factor.
        beta2_decay: the exponent of the second moment's decay (``<= 0``).
        epsilon: ``(eps1, eps2)``: the floors of the second moment and of ``rms(x)``.
        d: the RMS a step direction is clipped to.
        lambd: the decoupled weight decay, times ``eta``.

    Reference:
        N. Shazeer and M. Stern, "Adafactor: Adaptive Learning Rates with Sublinear
        Memory Cost", ICML 2018, https://arxiv.org/abs/1804.04235

    Example:
        >>> r, x = Adafactor(), np.ones((2, 3), np.float32)
        >>> state, d = r.apply(r.init(x), x, np.full((2, 3), 5.0, np.float32))
        >>> d[0], [a.shape for a in state[:2]]
        (array([0.01, 0.01, 0.01], dtype=float32), [(2, 1), (1, 3)])
    """

    reads_x = True
    eta: float = hyperparameter(1e-2, "[0, inf)")
    beta2_decay: float = hyperparameter(-0.8, "(-inf, 0]")
    epsilon: tuple = hyperparameter((None, 1e-3), "[0, inf) or None", "[0, inf)")
    d: float = hyperparameter(1.0, "[1, inf)")
    lambd: float = hyperparameter(0.0, "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        if not _factored(xp, x):
            return xp.zeros_like(x, real_=True), None, 0
        return xp.zeros_like(x[..., :1], real_=True), xp.zeros_like(x[..., :1, :], real_=True), 0

    def misfit(self, state: Any, x: Any) -> tuple | None:
        """The factored moments' shapes against ``x``'s, then their dtype."""
        xp = backends.of(x)
        shape = tuple(xp.shape(x))
        need = ((shape,) if not _factored(xp, x) else
                (shape[:-1] + (1,), shape[:-2] + (1, shape[-1])))
        found = tuple(tuple(a.shape) for a in state[:2] if a is not None)
        if found != need:
            return found if len(found) > 1 else found[0], shape
        return dtype_misfit(state, x)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        r, c, t = state
        t = t + 1
        eps1, eps2 = self.epsilon
        traced = backends.istraced(self.eta) or backends.istraced(t)
        rho = (xp.minimum if traced else min)(self.eta, t**-0.5)
        w, rho, decay = xp.hyper(x, t**self.beta2_decay, rho, self.eta * self.lambd)
        eps1, eps2, clip = xp.hyper(x, xp.machine_epsilon(x) if eps1 is None else eps1,
                                    eps2, self.d)
        if c is None:  # (torch's lerp_, and lerp)
            r = xp.lerp(r, xp.abs2(dx), w, inplace=True)
            v = xp.maximum(r, eps1 * eps1)
        else:
            rows, cols = xp.shape(x)[-2:]
            r = xp.lerp(r, xp.vector_norm(dx, (-1,)) ** 2 / cols, w, inplace=True)
            c = xp.lerp(c, xp.vector_norm(dx, (-2,)) ** 2 / rows, w, inplace=True)
            v = r / xp.maximum(xp.mean(r, (-2,)), eps1) * c  # (one array-sized product)
            v = xp.maximum(v, eps1 * eps1, out=v)
        # v is this step's own array: u and the step go into it where dtypes agree
        own = v if xp.dtype_name(dx) == xp.dtype_name(v) else None
        u = xp.multiply(dx, xp.rsqrt(v, out=v), out=own)
        every = tuple(range(len(xp.shape(x))))
        n = math.sqrt(max(xp.size(x), 1))  # (an empty array's rms: 0, not 0/0)
        alpha = xp.maximum(xp.vector_norm(x, every) / n, eps2) * rho
        scale = alpha / xp.maximum(xp.vector_norm(u, every) / (n * clip), 1.0)
        if backends.istraced(self.lambd) or self.lambd != 0:  # (torch's test too)
            return (r, c, t), xp.scaled_sum(decay, x, scale, u)
        return (r, c, t), xp.multiply(u, scale, out=u if own is not None else None)
