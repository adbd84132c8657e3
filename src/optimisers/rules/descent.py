"""Gradient descent, its momentum variants and Rprop; gradient decay terms and clipping."""

from __future__ import annotations

from dataclasses import dataclass

from optimisers import backends
from optimisers.rules.base import Rule
from optimisers.rules.fields import hyperparameter

__all__ = ["Descent", "Momentum", "Nesterov", "Rprop", "WeightDecay", "SignDecay", "ClipGrad",
           "ClipNorm"]


@dataclass(frozen=True)
class Descent(Rule):
    """Descent(eta=0.1): plain gradient descent, ``d = eta * g``.

    Example:
        >>> Descent(0.5).apply(None, np.zeros(2), np.array([1.0, -2.0]))[1]
        array([ 0.5, -1. ])
    """

    elementwise = True
    eta: float = hyperparameter(0.1, "[0, inf)")

    def apply(self, state, x, dx):
        (eta,) = backends.of(x).hyper(x, self.eta)
        return state, eta * dx


@dataclass(frozen=True)
class Momentum(Rule):
    """Momentum(eta=0.01, rho=0.9, eta_outside=False): ``v = rho*v + eta*g``; ``d = v``
    (Polyak 1964, "Some methods of speeding up the convergence of iteration methods").

    The rate inside the velocity: a change of ``eta`` takes effect smoothly. With
    ``eta_outside``, ``v = rho*v + g``; ``d = eta*v``, as ``torch.optim.SGD(lr=eta,
    momentum=rho)`` and ``optax.sgd``; with a constant ``eta`` the two are the same.
    ``rho = 1`` is allowed, as ``torch.optim.SGD`` allows ``momentum=1``.

    Example:
        >>> r, x = Momentum(0.1, 0.5), np.zeros(1)
        >>> s, d = r.apply(r.init(x), x, np.ones(1)); s, d = r.apply(s, x, np.ones(1)); d
        array([0.15])
    """

    elementwise = True
    eta: float = hyperparameter(0.01, "[0, inf)")
    rho: float = hyperparameter(0.9, "[0, 1]")
    eta_outside: bool = hyperparameter(False, kind="flag")

    def init(self, x):
        return backends.of(x).zeros_like(x)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, rho = xp.hyper(x, self.eta, self.rho)
        if self.eta_outside:
            v = xp.assign(state, rho * state + dx)
            return v, eta * v
        v = xp.assign(state, rho * state + eta * dx)
        return v, v


@dataclass(frozen=True)
class Nesterov(Momentum):
    """Nesterov(eta=0.001, rho=0.9, eta_outside=False): Nesterov's accelerated gradient
    (Sutskever et al. 2013, "On the importance of initialization and momentum").

    ``d = -rho^2*v + (1+rho)*eta*g``, then ``v = rho*v - eta*g``; with ``eta_outside``,
    ``v = rho*v + g``; ``d = eta*(g + rho*v)``, as ``torch.optim.SGD(..., nesterov=True)``.
    ``rho = 1`` is allowed, as for :class:`Momentum`.

    Example:
        >>> r, x = Nesterov(0.1, 0.5), np.zeros(1)
        >>> r.apply(r.init(x), x, np.ones(1))[1]
        array([0.15])
    """

    eta: float = hyperparameter(0.001, "[0, inf)")  # (rho, eta_outside and init: Momentum's)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, rho = xp.hyper(x, self.eta, self.rho)
        if self.eta_outside:
            v = xp.assign(state, rho * state + dx)
            return v, eta * (dx + rho * v)
        d = -(rho * rho) * state + (1 + rho) * eta * dx
        v = xp.assign(state, rho * state - eta * dx)
        return v, d


@dataclass(frozen=True)
class Rprop(Rule):
    """Rprop(eta=0.001, ell=(0.5, 1.2), gamma=(1e-6, 50.0)): resilient backprop
    (Riedmiller & Braun 1993, "A direct adaptive method for faster backpropagation learning").

    Per element, the step size ``s`` grows by ``ell[1]`` while the gradient keeps its sign and
    shrinks by ``ell[0]`` when it flips (that gradient then forgotten), within ``gamma``;
    ``d = s * sign(g)``. As ``torch.optim.Rprop``; complex parts step apart.

    Example:
        >>> r, x = Rprop(0.1), np.zeros(1)
        >>> s, d = r.apply(r.init(x), x, np.ones(1)); r.apply(s, x, np.ones(1))[1]
        array([0.12])
    """

    elementwise = True
    eta: float = hyperparameter(0.001, "[0, inf)")
    ell: tuple = hyperparameter((0.5, 1.2), "(0, 1)", "(1, inf)")
    gamma: tuple = hyperparameter((1e-6, 50.0), "[0, inf)", "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        eta = self.eta * (1 + 1j) if xp.iscomplex(x) else self.eta
        return xp.zeros_like(x), xp.full_like(x, eta)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        hyper = xp.hyper(x, *self.ell, *self.gamma)
        gp, s = state
        if not xp.iscomplex(x):
            return _rprop(xp, gp, s, dx, *hyper)
        (gr, sr), dr = _rprop(xp, gp.real, s.real, dx.real, *hyper)
        (gi, si), di = _rprop(xp, gp.imag, s.imag, dx.imag, *hyper)
        return (xp.complex_from(gr, gi), xp.complex_from(sr, si)), xp.complex_from(dr, di)


def _rprop(xp, gp, s, dx, lo, hi, gmin, gmax):
    """Rprop's step on real arrays: ``((previous gradient, step sizes), d)``."""
    sgn = xp.sign(gp * dx)
    s = xp.assign(s, xp.where(sgn > 0, xp.minimum(s * hi, gmax),
                              xp.where(sgn < 0, xp.maximum(s * lo, gmin), s)))
    gp = xp.assign(gp, xp.where(sgn < 0, 0 * dx, dx))
    return (gp, s), s * xp.sign(gp)


@dataclass(frozen=True)
class WeightDecay(Rule):
    """WeightDecay(lambd=5e-4): L2 decay added to the gradient, ``d = g + lambd*x``; put it
    before the optimiser in a chain.

    Example:
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
