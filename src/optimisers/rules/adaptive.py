"""Adaptive rules: a per-element step size from running moments of the gradient."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optimisers import backends
from optimisers.rules.base import Rule
from optimisers.rules.fields import hyperparameter

__all__ = ["RMSProp", "Adam", "RAdam", "AdaMax", "OAdam", "AdaGrad", "AdaDelta", "AMSGrad",
           "NAdam", "AdamW", "AdaBelief", "Lion", "ADOPT"]


def adam_moments(xp: Any, state_m: Any, state_v: Any, dx: Any, b1: Any, b2: Any, c1: Any,
                 c2: Any) -> tuple:
    """adam_moments(xp, m, v, g, b1, b2, c1, c2) -> Adam's moments after one more
    gradient, written into ``m`` and ``v`` where they may be, ``c = 1 - b`` given (see
    :func:`decays`): the Adam family's shared first step.

    Example:
        >>> import numpy as np
        >>> m, v = adam_moments(backends.of(np.zeros(1)), np.zeros(1), np.zeros(1),
        ...                     np.array([2.0]), 0.9, 0.999, 0.1, 0.001)
        >>> m, v
        (array([0.2]), array([0.004]))
    """
    m = xp.assign(state_m, b1 * state_m + c1 * dx)
    v = xp.assign(state_v, b2 * state_v + c2 * xp.abs2(dx))
    return m, v


def decays(xp: Any, x: Any, *b: Any) -> tuple:
    """decays(xp, x, *b) -> each decay ``b`` and then each complement ``1 - b``, in ``x``'s
    dtype, the complements computed before the cast (in float64 from a Python number), as
    optax and torch.optim do: ``1 - float32(0.999)`` is 1.3e-5 off ``0.001``, relatively.

    Example:
        >>> import numpy as np
        >>> x = np.zeros(1, np.float32)
        >>> [float(v) for v in decays(backends.of(x), x, 0.5, 0.75)]
        [0.5, 0.75, 0.5, 0.25]
    """
    return xp.hyper(x, *b, *map(xp.complement, b))


def bias_corrections(beta: tuple, t: Any) -> tuple:
    """bias_corrections(beta, t) -> ``(1 - b1^t, 1 - b2^t)``: the Adam family's bias
    corrections at step ``t`` (counting from 1), each the current decay to the power ``t``,
    as ``torch.optim`` and optax compute them.

    The state counts the steps (a float, as ``torch.optim``'s ``step``: so that under
    ``jax.jit`` it travels packed with the Leaf's other numbers). Under a decay that
    changes (a schedule in ``beta[0]``, as ``OneCycleLR(cycle_momentum=True)`` cycles it)
    this is torch's convention, the current ``b1`` to the power ``t``, not the product of
    the ``b1`` of each step taken: a run follows torch's.

    Example:
        >>> bias_corrections((0.5, 0.75), 2.0)
        (0.75, 0.4375)
    """
    return (1 - beta[0] ** t, 1 - beta[1] ** t)


@dataclass(frozen=True)
class RMSProp(Rule):
    """RMSProp(eta=0.001, rho=0.9, epsilon=1e-8, centred=False) (Tieleman & Hinton 2012).

    ``q = rho*q + (1-rho)*|g|^2``; centred: ``l = rho*l + (1-rho)*g``;
    ``d = eta*g / (sqrt(q - |l|^2) + eps)``; as ``torch.optim.RMSprop(alpha=rho)``.
    ``rho`` is in ``[0, 1)``: ``torch.optim.RMSprop`` takes ``alpha=1`` too, but then ``q``
    stays at its initial 0 and every step is ``eta*g/eps`` (``1e5`` gradients at the
    defaults); ``torch.optim.Adam`` refuses the same decay, its ``betas[1]``, at 1.

    Example:
        >>> import numpy as np
        >>> r, x = RMSProp(0.01), np.zeros(1)
        >>> r.apply(r.init(x), x, np.ones(1))[1].round(6)
        array([0.031623])
    """

    elementwise = True

    eta: float = hyperparameter(0.001, "[0, inf)")
    rho: float = hyperparameter(0.9, "[0, 1)")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")
    centred: bool = hyperparameter(False, kind="flag")

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x, real_=True), (xp.zeros_like(x) if self.centred else None)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (eta,) = xp.hyper(x, self.eta)
        rho, c = decays(xp, x, self.rho)
        eps = xp.eps(x, self.epsilon)
        q, l = state
        q = xp.assign(q, rho * q + c * xp.abs2(dx))
        if l is None:
            return (q, l), eta * dx / (xp.sqrt(q) + eps)
        l = xp.assign(l, rho * l + c * dx)
        return (q, l), eta * dx / (xp.sqrt(q - xp.abs2(l)) + eps)


@dataclass(frozen=True)
class Adam(Rule):
    """Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8) (Kingma & Ba 2015).

    ``m = b1*m + (1-b1)*g``; ``v = b2*v + (1-b2)*|g|^2``;
    ``d = eta * m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps)``, ``t`` counting the steps from 1
    (the state's count). ``torch.optim.Adam`` and ``optax.adam`` put ``eps`` at the same
    place, so the steps agree with both. A schedule in ``beta`` is raised to the power
    ``t`` at its current value (torch's convention, :func:`bias_corrections`), so that
    ``beta=(OneCycle(0.85, n, start=0.95, end=0.95), 0.999)`` with
    ``eta=OneCycle(lr, n)`` follows ``OneCycleLR(max_lr=lr, total_steps=n)``, whose
    ``cycle_momentum`` cycles ``beta[0]`` so.

    Example:
        >>> import numpy as np
        >>> r, x = Adam(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1]
        array([0.1])
    """

    elementwise = True

    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.999), "[0, 1)", "[0, 1)")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), 0.0

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (eta,) = xp.hyper(x, self.eta)
        b1, b2, c1, c2 = decays(xp, x, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, v, t = state
        m, v = adam_moments(xp, m, v, dx, b1, b2, c1, c2)
        k1, k2 = bias_corrections(self.beta, t + 1)
        den = v / k2  # the step's two temporaries, each op then written into one (out=)
        den = xp.sqrt(den, out=den)
        den += eps
        u = eta * m
        return (m, v, t + 1), xp.divide(xp.divide(u, k1, out=u), den, out=u)


@dataclass(frozen=True)
class RAdam(Rule):
    """RAdam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8): rectified Adam (Liu et al. 2020).

    Adam with its adaptive term switched on only once the variance estimate is reliable
    (``r > 4``), and scaled by the rectification factor. This is Optimisers.jl's form;
    ``torch.optim.RAdam`` and ``optax.radam`` differ by design: they switch on at
    ``r > 5`` (one step later with the default betas) and put ``eps`` outside the bias
    correction, ``sqrt(1-b2^t) / (sqrt(v) + eps)``.

    Example:
        >>> import numpy as np
        >>> r, x = RAdam(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1]   # first steps: momentum only
        array([0.3])
    """

    elementwise = True

    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.999), "[0, 1)", "[0, 1)")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), 0.0

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (eta,) = xp.hyper(x, self.eta)
        b1, b2, c1, c2 = decays(xp, x, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, v, t = state
        m, v = adam_moments(xp, m, v, dx, b1, b2, c1, c2)
        t = t + 1
        k1, k2 = bias_corrections(self.beta, t)
        rinf = 2 / xp.complement(self.beta[1]) - 1
        r = rinf - 2 * t * self.beta[1] ** t / k2
        traced = backends.istraced(r)  # under jax.jit: compute both branches, then select
        if traced or r > 4:
            ratio = (r - 4) * (r - 2) * rinf / ((rinf - 4) * (rinf - 2) * r)
            (rect,) = xp.hyper(x, xp.sqrt(xp.where(r > 4, ratio, 1)) if traced else ratio**0.5)
            d = eta * m / k1 / (xp.sqrt(v / k2) + eps) * rect
            if traced:
                d = xp.where(r > 4, d, eta * m / k1)
        else:
            d = eta * m / k1
        return (m, v, t), d


@dataclass(frozen=True)
class AdaMax(Rule):
    """AdaMax(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8): Adam with the infinity norm
    (Kingma & Ba 2015, section 7).

    ``u = max(b2*u, |g|)``; ``d = eta/(1-b1^t) * m/(u + eps)``.

    Example:
        >>> import numpy as np
        >>> r, x = AdaMax(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1]
        array([0.1])
    """

    elementwise = True

    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.999), "[0, 1)", "[0, 1)")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), 0.0

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (eta,) = xp.hyper(x, self.eta)
        b1, b2, c1, c2 = decays(xp, x, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, u, t = state
        m = xp.assign(m, b1 * m + c1 * dx)
        u = xp.assign(u, xp.maximum(b2 * u, xp.abs(dx)))
        k1, _ = bias_corrections(self.beta, t + 1)
        return (m, u, t + 1), eta / k1 * m / (u + eps)


@dataclass(frozen=True)
class OAdam(Rule):
    """OAdam(eta=0.001, beta=(0.5, 0.9), epsilon=1e-8): optimistic Adam (Daskalakis et al.
    2018), for saddle-point problems such as GANs.

    ``term = Adam's step``; ``d = 2*term - previous term``.

    Example:
        >>> import numpy as np
        >>> r, x = OAdam(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1]
        array([0.2])
    """

    elementwise = True

    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.5, 0.9), "[0, 1)", "[0, 1)")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), xp.zeros_like(x), 0.0

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (eta,) = xp.hyper(x, self.eta)
        b1, b2, c1, c2 = decays(xp, x, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, v, term, t = state
        m, v = adam_moments(xp, m, v, dx, b1, b2, c1, c2)
        k1, k2 = bias_corrections(self.beta, t + 1)
        new = eta * m / k1 / (xp.sqrt(v / k2) + eps)
        d = 2 * new - term
        term = xp.assign(term, new)
        return (m, v, term, t + 1), d


@dataclass(frozen=True)
class AdaGrad(Rule):
    """AdaGrad(eta=0.1, epsilon=1e-8) (Duchi et al. 2011).

    ``acc = acc + |g|^2`` (starting from ``eps``); ``d = eta*g / (sqrt(acc) + eps)``.

    Example:
        >>> import numpy as np
        >>> r, x = AdaGrad(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([2.0]))[1]
        array([0.1])
    """

    elementwise = True

    eta: float = hyperparameter(0.1, "[0, inf)")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")

    def init(self, x):
        return backends.of(x).full_like(x, self.epsilon, real_=True)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (eta,) = xp.hyper(x, self.eta)
        eps = xp.eps(x, self.epsilon)
        acc = xp.assign(state, state + xp.abs2(dx))
        return acc, eta * dx / (xp.sqrt(acc) + eps)


@dataclass(frozen=True)
class AdaDelta(Rule):
    """AdaDelta(rho=0.9, epsilon=1e-8) (Zeiler 2012): no learning rate.

    ``acc = rho*acc + (1-rho)*|g|^2``; ``d = g*sqrt(dacc + eps)/sqrt(acc + eps)``;
    ``dacc = rho*dacc + (1-rho)*|d|^2``.

    Example:
        >>> import numpy as np
        >>> r, x = AdaDelta(0.5, 0.01), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([1.0]))[1].round(4)
        array([0.14])
    """

    elementwise = True

    rho: float = hyperparameter(0.9, "[0, 1]")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x, real_=True), xp.zeros_like(x, real_=True)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        rho, c = decays(xp, x, self.rho)
        eps = xp.eps(x, self.epsilon)
        acc, dacc = state
        acc = xp.assign(acc, rho * acc + c * xp.abs2(dx))
        d = dx * xp.sqrt(dacc + eps) / xp.sqrt(acc + eps)
        dacc = xp.assign(dacc, rho * dacc + c * xp.abs2(d))
        return (acc, dacc), d


@dataclass(frozen=True)
class AMSGrad(Rule):
    """AMSGrad(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8) (Reddi et al. 2018).

    Adam's moments (starting from ``eps``) with ``vhat = max(vhat, v)`` in the
    denominator and no bias correction: ``d = eta*m / (sqrt(vhat) + eps)``.

    Example:
        >>> import numpy as np
        >>> r, x = AMSGrad(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([1.0]))[1].round(4)
        array([0.3161])
    """

    elementwise = True

    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.999), "[0, 1)", "[0, 1)")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        return (xp.full_like(x, self.epsilon), xp.full_like(x, self.epsilon, real_=True),
                xp.full_like(x, self.epsilon, real_=True))

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (eta,) = xp.hyper(x, self.eta)
        b1, b2, c1, c2 = decays(xp, x, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, v, vhat = state
        m, v = adam_moments(xp, m, v, dx, b1, b2, c1, c2)
        vhat = xp.assign(vhat, xp.maximum(vhat, v))
        return (m, v, vhat), eta * m / (xp.sqrt(vhat) + eps)


@dataclass(frozen=True)
class NAdam(Rule):
    """NAdam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8): Adam with Nesterov momentum
    (Dozat 2016).

    ``d = eta * (b1*m/(1-b1^(t+1)) + (1-b1)*g/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)``, as
    ``optax.nadam``. Optimisers.jl v0.4 differs by a stray factor ``b2`` inside the
    square root; ``torch.optim.NAdam`` adds a momentum-decay schedule.

    Example:
        >>> import numpy as np
        >>> r, x = NAdam(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1].round(4)
        array([0.1474])
    """

    elementwise = True

    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.999), "[0, 1)", "[0, 1)")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), 0.0

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (eta,) = xp.hyper(x, self.eta)
        b1, b2, c1, c2 = decays(xp, x, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, v, t = state
        m, v = adam_moments(xp, m, v, dx, b1, b2, c1, c2)
        k1, k2 = bias_corrections(self.beta, t + 1)
        k0, k1 = xp.hyper(x, 1 - self.beta[0] ** (t + 2), k1)
        d = eta * (b1 * m / k0 + c1 * dx / k1) / (xp.sqrt(v / k2) + eps)
        return (m, v, t + 1), d


@dataclass(frozen=True)
class AdamW(Rule):
    """AdamW(eta=0.001, beta=(0.9, 0.999), lambd=0.0, epsilon=1e-8, couple=True): Adam with
    decoupled weight decay (Loshchilov & Hutter 2019).

    ``a`` is Adam's step with ``eta = 1``; ``d = eta*(a + lambd*x)`` when ``couple``
    (as ``torch.optim.AdamW(weight_decay=lambd)`` and ``optax.adamw``), else
    ``d = eta*a + lambd*x`` (the paper's fully decoupled form).

    Example:
        >>> import numpy as np
        >>> r, x = AdamW(0.1, lambd=0.5), np.ones(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1]
        array([0.15])
    """

    elementwise = True
    reads_x = True

    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.999), "[0, 1)", "[0, 1)")
    lambd: float = hyperparameter(0.0, "[0, inf)")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")
    couple: bool = hyperparameter(True, kind="flag")

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), 0.0

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, lambd = xp.hyper(x, self.eta, self.lambd)
        b1, b2, c1, c2 = decays(xp, x, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, v, t = state
        m, v = adam_moments(xp, m, v, dx, b1, b2, c1, c2)
        k1, k2 = bias_corrections(self.beta, t + 1)
        a = m / k1 / (xp.sqrt(v / k2) + eps)
        d = eta * (a + lambd * x) if self.couple else eta * a + lambd * x
        return (m, v, t + 1), d


@dataclass(frozen=True)
class AdaBelief(Rule):
    """AdaBelief(eta=0.001, beta=(0.9, 0.999), epsilon=1e-16) (Zhuang et al. 2020).

    Adam whose second moment tracks ``|g - m|^2 + eps``, the belief in the gradient.

    Example:
        >>> import numpy as np
        >>> r, x = AdaBelief(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1].round(4)
        array([0.1111])
    """

    elementwise = True

    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.999), "[0, 1)", "[0, 1)")
    epsilon: float = hyperparameter(1e-16, "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), 0.0

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (eta,) = xp.hyper(x, self.eta)
        b1, b2, c1, c2 = decays(xp, x, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, s, t = state
        m = xp.assign(m, b1 * m + c1 * dx)
        s = xp.assign(s, b2 * s + c2 * xp.abs2(dx - m) + eps)
        k1, k2 = bias_corrections(self.beta, t + 1)
        d = eta * m / k1 / (xp.sqrt(s / k2) + eps)
        return (m, s, t + 1), d


@dataclass(frozen=True)
class Lion(Rule):
    """Lion(eta=0.001, beta=(0.9, 0.99)): evolved sign momentum (Chen et al. 2023).

    ``d = eta * sign(b1*m + (1-b1)*g)``, then ``m = b2*m + (1-b2)*g``: the paper's
    Algorithm 1, as ``optax.lion(eta, weight_decay=0.0)`` (optax's default decays the
    weights too; Optimisers.jl v0.4 swaps the two weights).

    Example:
        >>> import numpy as np
        >>> r, x = Lion(0.1), np.zeros(2)
        >>> r.apply(r.init(x), x, np.array([3.0, -1.0]))[1]
        array([ 0.1, -0.1])
    """

    elementwise = True

    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.99), "[0, 1]", "[0, 1]")

    def init(self, x):
        return backends.of(x).zeros_like(x)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (eta,) = xp.hyper(x, self.eta)
        b1, b2, c1, c2 = decays(xp, x, *self.beta)
        d = eta * xp.sign(b1 * state + c1 * dx)
        m = xp.assign(state, b2 * state + c2 * dx)
        return m, d


@dataclass(frozen=True)
class ADOPT(Rule):
    """ADOPT(eta=0.001, beta=(0.9, 0.9999), epsilon=1e-6, clip=True): Adam with the
    gradient normalised by the second moment of the steps before it (Taniguchi et al.
    2024, "ADOPT: Modified Adam Can Converge with Any beta2 with the Optimal Rate").

    The first step only sets ``v = |g|^2`` (``d = 0``). Each later one, with ``t`` the
    steps taken before it: ``u = g / max(sqrt(v), eps)`` (the old ``v``), clamped to
    ``[-t^(1/4), t^(1/4)]`` when ``clip``; ``m = b1*m + (1-b1)*u``;
    ``v = b2*v + (1-b2)*|g|^2``; ``d = eta*m``. No bias correction. The steps of
    ``optax.contrib.adopt(eta, b1, b2, eps, use_clipping=clip)``. A complex ``u`` has its
    real and imaginary parts clamped each (as :class:`ClipGrad` does), where optax's
    clip refuses complex numbers. The step count is a float (exact to 2^24 steps in
    float32 under ``jax.jit``, where it travels packed with the rule's numbers).

    Example:
        >>> import numpy as np
        >>> r, x = ADOPT(0.1), np.zeros(1)
        >>> s, d = r.apply(r.init(x), x, np.array([2.0])); d, s[1]   # the first: v only
        (array([0.]), array([4.]))
        >>> r.apply(s, x, np.array([3.0]))[1]   # u = 3/2, clamped to 1^(1/4)
        array([0.01])
    """

    elementwise = True

    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.9999), "[0, 1)", "[0, 1)")
    epsilon: float = hyperparameter(1e-6, "[0, inf)")
    clip: bool = hyperparameter(True, kind="flag")

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), 0.0

    def apply(self, state, x, dx):
        xp = backends.of(x)
        m, v, t = state
        (eta,) = xp.hyper(x, self.eta)
        b1, b2, c1, c2 = decays(xp, x, *self.beta)
        eps = xp.eps(x, self.epsilon)
        (on,) = xp.hyper(x, t > 0)  # 0 at the first step: u = 0 (m stays 0), v = |g|^2
        u = on * dx / xp.maximum(xp.sqrt(v), eps)
        if self.clip:
            (c,) = xp.hyper(x, t**0.25)
            u = xp.clip(u, -c, c)
        m = xp.assign(m, b1 * m + c1 * u)
        v = xp.assign(v, (b2 * on) * v + (c2 * on + (1 - on)) * xp.abs2(dx))
        return (m, v, t + 1), eta * m
