"""The optimisation rules: each a small frozen dataclass with ``init`` and ``apply``.

A rule sees one array at a time and never walks a tree. ``apply(state, x, dx)`` returns
the new state and the step ``d``; the parameter then becomes ``x - d`` (a step of
``None`` means "no step"). Arithmetic goes through the array's backend, so one rule
serves NumPy, PyTorch and JAX, and hyper-parameters are used in the array's own dtype.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimisers import backends

__all__ = [
    "Rule", "Descent", "Momentum", "Nesterov", "RMSProp", "Rprop", "Adam", "RAdam",
    "AdaMax", "OAdam", "AdaGrad", "AdaDelta", "AMSGrad", "NAdam", "AdamW", "AdaBelief",
    "Lion", "WeightDecay", "SignDecay", "ClipGrad", "ClipNorm", "OptimiserChain",
    "AccumGrad", "MixedPrecision", "NewValue", "RULES",
]

RULES: dict[str, type] = {}
"""RULES: every subclass of :class:`Rule` by name: the registry that checkpoints load from.

Example:
    >>> RULES["Adam"] is Adam, "Lion" in RULES
    (True, True)
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
    across arrays): such rules may run fused over many arrays at once (fused.py)."""
    reads_x = False
    """Whether ``apply`` reads the parameter's values (else only its dtype)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        RULES.setdefault(cls.__name__, cls)
        jax_backend = sys.modules.get("optimisers.backends.jax")
        if jax_backend is not None:  # JAX seen already: the new rule is a pytree too
            jax_backend.register_rule(cls)

    def init(self, x: Any) -> Any:
        """The initial state for the array ``x``; ``None`` for a stateless rule."""
        return None

    def apply(self, state: Any, x: Any, dx: Any, *higher: Any) -> tuple[Any, Any]:
        """One step: ``(new_state, d)``; the parameter becomes ``x - d``."""
        raise NotImplementedError(f"{type(self).__name__} must define apply(state, x, dx)")

    def __post_init__(self) -> None:
        eta = getattr(self, "eta", 0)
        if isinstance(eta, (int, float)) and eta < 0:
            raise ValueError(f"{type(self).__name__}: the learning rate eta must be >= 0, "
                             f"got {eta}; a negative step would ascend the loss")


_NGRADS: dict[type, float] = {}


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


def _adam_moments(xp, state_m, state_v, dx, b1, b2):
    m = xp.assign(state_m, b1 * state_m + (1 - b1) * dx)
    v = xp.assign(state_v, b2 * state_v + (1 - b2) * xp.abs2(dx))
    return m, v


def _bias(bt: tuple, beta: tuple) -> tuple:
    return (bt[0] * beta[0], bt[1] * beta[1])


@dataclass(frozen=True)
class Descent(Rule):
    """Descent(eta=0.1): plain gradient descent, ``d = eta * g``.

    Example:
        >>> import numpy as np
        >>> Descent(0.5).apply(None, np.zeros(2), np.array([1.0, -2.0]))[1]
        array([ 0.5, -1. ])
    """

    elementwise = True

    eta: float = 0.1

    def apply(self, state, x, dx):
        (eta,) = backends.of(x).hyper(x, self.eta)
        return state, eta * dx


@dataclass(frozen=True)
class Momentum(Rule):
    """Momentum(eta=0.01, rho=0.9): ``v = rho*v + eta*g``; ``d = v``.

    Classical momentum (Polyak 1964) with the learning rate inside the velocity. With a
    constant ``eta`` the steps are those of ``torch.optim.SGD(lr=eta, momentum=rho)`` and
    ``optax.sgd(eta, momentum=rho)``, whose velocity leaves ``eta`` out (theirs is
    ``v/eta``); by design, after ``adjust`` of ``eta`` ours still carries the old rate in
    ``v`` and changes pace smoothly.

    Example:
        >>> import numpy as np
        >>> r, x = Momentum(0.1, 0.5), np.zeros(1)
        >>> s, d = r.apply(r.init(x), x, np.ones(1)); s, d = r.apply(s, x, np.ones(1)); d
        array([0.15])
    """

    elementwise = True

    eta: float = 0.01
    rho: float = 0.9

    def init(self, x):
        return backends.of(x).zeros_like(x)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, rho = xp.hyper(x, self.eta, self.rho)
        v = xp.assign(state, rho * state + eta * dx)
        return v, v


@dataclass(frozen=True)
class Nesterov(Rule):
    """Nesterov(eta=0.001, rho=0.9): Nesterov's accelerated gradient (Sutskever et al. 2013).

    ``d = -rho^2*v + (1+rho)*eta*g``, then ``v = rho*v - eta*g``; the same steps as
    ``torch.optim.SGD(lr=eta, momentum=rho, nesterov=True)``.

    Example:
        >>> import numpy as np
        >>> r, x = Nesterov(0.1, 0.5), np.zeros(1)
        >>> r.apply(r.init(x), x, np.ones(1))[1]
        array([0.15])
    """

    elementwise = True

    eta: float = 0.001
    rho: float = 0.9

    def init(self, x):
        return backends.of(x).zeros_like(x)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, rho = xp.hyper(x, self.eta, self.rho)
        d = -(rho * rho) * state + (1 + rho) * eta * dx
        v = xp.assign(state, rho * state - eta * dx)
        return v, d


@dataclass(frozen=True)
class RMSProp(Rule):
    """RMSProp(eta=0.001, rho=0.9, epsilon=1e-8, centred=False) (Tieleman & Hinton 2012).

    ``q = rho*q + (1-rho)*|g|^2``; centred: ``l = rho*l + (1-rho)*g``;
    ``d = eta*g / (sqrt(q - |l|^2) + eps)``; as ``torch.optim.RMSprop(alpha=rho)``.

    Example:
        >>> import numpy as np
        >>> r, x = RMSProp(0.01), np.zeros(1)
        >>> r.apply(r.init(x), x, np.ones(1))[1].round(6)
        array([0.031623])
    """

    elementwise = True

    eta: float = 0.001
    rho: float = 0.9
    epsilon: float = 1e-8
    centred: bool = False

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x, real_=True), (xp.zeros_like(x) if self.centred else None)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, rho = xp.hyper(x, self.eta, self.rho)
        eps = xp.eps(x, self.epsilon)
        q, l = state
        q = xp.assign(q, rho * q + (1 - rho) * xp.abs2(dx))
        if l is None:
            return (q, l), eta * dx / (xp.sqrt(q) + eps)
        l = xp.assign(l, rho * l + (1 - rho) * dx)
        return (q, l), eta * dx / (xp.sqrt(q - xp.abs2(l)) + eps)


@dataclass(frozen=True)
class Rprop(Rule):
    """Rprop(eta=0.001, ell=(0.5, 1.2), gamma=(1e-6, 50.0)): resilient backprop
    (Riedmiller & Braun 1993).

    Per element, the step size grows by ``ell[1]`` while the gradient keeps its sign and
    shrinks by ``ell[0]`` when it flips (then that gradient is forgotten), clamped to
    ``gamma``; ``d = s * sign(g)``. As ``torch.optim.Rprop(etas=ell, step_sizes=gamma)``.

    Example:
        >>> import numpy as np
        >>> r, x = Rprop(0.1), np.zeros(1)
        >>> s, d = r.apply(r.init(x), x, np.ones(1)); r.apply(s, x, np.ones(1))[1]
        array([0.12])
    """

    elementwise = True

    eta: float = 0.001
    ell: tuple = (0.5, 1.2)
    gamma: tuple = (1e-6, 50.0)

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.full_like(x, self.eta)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        lo, hi, gmin, gmax = xp.hyper(x, *self.ell, *self.gamma)
        gp, s = state
        sgn = xp.sign(gp * dx)
        s = xp.assign(s, xp.where(sgn > 0, xp.minimum(s * hi, gmax),
                                  xp.where(sgn < 0, xp.maximum(s * lo, gmin), s)))
        gp = xp.assign(gp, xp.where(sgn < 0, 0 * dx, dx))
        return (gp, s), s * xp.sign(gp)


@dataclass(frozen=True)
class Adam(Rule):
    """Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8) (Kingma & Ba 2015).

    ``m = b1*m + (1-b1)*g``; ``v = b2*v + (1-b2)*|g|^2``;
    ``d = eta * m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps)``. ``torch.optim.Adam`` and
    ``optax.adam`` put ``eps`` at the same place, so the steps agree with both.

    Example:
        >>> import numpy as np
        >>> r, x = Adam(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1]
        array([0.1])
    """

    elementwise = True

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-8

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), self.beta

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, b1, b2 = xp.hyper(x, self.eta, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, v, bt = state
        m, v = _adam_moments(xp, m, v, dx, b1, b2)
        d = eta * m / (1 - bt[0]) / (xp.sqrt(v / (1 - bt[1])) + eps)
        return (m, v, _bias(bt, self.beta)), d


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

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-8

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), self.beta, 1

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, b1, b2 = xp.hyper(x, self.eta, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, v, bt, t = state
        m, v = _adam_moments(xp, m, v, dx, b1, b2)
        rinf = 2 / (1 - self.beta[1]) - 1
        r = rinf - 2 * t * bt[1] / (1 - bt[1])
        traced = backends.istraced(r)  # under jax.jit: compute both branches, then select
        if traced or r > 4:
            ratio = (r - 4) * (r - 2) * rinf / ((rinf - 4) * (rinf - 2) * r)
            (rect,) = xp.hyper(x, xp.sqrt(xp.where(r > 4, ratio, 1)) if traced else ratio**0.5)
            d = eta * m / (1 - bt[0]) / (xp.sqrt(v / (1 - bt[1])) + eps) * rect
            if traced:
                d = xp.where(r > 4, d, eta * m / (1 - bt[0]))
        else:
            d = eta * m / (1 - bt[0])
        return (m, v, _bias(bt, self.beta), t + 1), d


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

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-8

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), self.beta

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, b1, b2 = xp.hyper(x, self.eta, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, u, bt = state
        m = xp.assign(m, b1 * m + (1 - b1) * dx)
        u = xp.assign(u, xp.maximum(b2 * u, xp.abs(dx)))
        return (m, u, _bias(bt, self.beta)), eta / (1 - bt[0]) * m / (u + eps)


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

    eta: float = 0.001
    beta: tuple = (0.5, 0.9)
    epsilon: float = 1e-8

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), xp.zeros_like(x), self.beta

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, b1, b2 = xp.hyper(x, self.eta, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, v, term, bt = state
        m, v = _adam_moments(xp, m, v, dx, b1, b2)
        new = eta * m / (1 - bt[0]) / (xp.sqrt(v / (1 - bt[1])) + eps)
        d = 2 * new - term
        term = xp.assign(term, new)
        return (m, v, term, _bias(bt, self.beta)), d


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

    eta: float = 0.1
    epsilon: float = 1e-8

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

    rho: float = 0.9
    epsilon: float = 1e-8

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x, real_=True), xp.zeros_like(x, real_=True)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (rho,) = xp.hyper(x, self.rho)
        eps = xp.eps(x, self.epsilon)
        acc, dacc = state
        acc = xp.assign(acc, rho * acc + (1 - rho) * xp.abs2(dx))
        d = dx * xp.sqrt(dacc + eps) / xp.sqrt(acc + eps)
        dacc = xp.assign(dacc, rho * dacc + (1 - rho) * xp.abs2(d))
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

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-8

    def init(self, x):
        xp = backends.of(x)
        return (xp.full_like(x, self.epsilon), xp.full_like(x, self.epsilon, real_=True),
                xp.full_like(x, self.epsilon, real_=True))

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, b1, b2 = xp.hyper(x, self.eta, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, v, vhat = state
        m, v = _adam_moments(xp, m, v, dx, b1, b2)
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

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-8

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), self.beta

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, b1, b2 = xp.hyper(x, self.eta, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, v, bt = state
        m, v = _adam_moments(xp, m, v, dx, b1, b2)
        c1, c2 = xp.hyper(x, 1 - self.beta[0] * bt[0], 1 - bt[0])
        d = eta * (b1 * m / c1 + (1 - b1) * dx / c2) / (xp.sqrt(v / (1 - bt[1])) + eps)
        return (m, v, _bias(bt, self.beta)), d


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

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    lambd: float = 0.0
    epsilon: float = 1e-8
    couple: bool = True

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), self.beta

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, b1, b2, lambd = xp.hyper(x, self.eta, *self.beta, self.lambd)
        eps = xp.eps(x, self.epsilon)
        m, v, bt = state
        m, v = _adam_moments(xp, m, v, dx, b1, b2)
        a = m / (1 - bt[0]) / (xp.sqrt(v / (1 - bt[1])) + eps)
        d = eta * (a + lambd * x) if self.couple else eta * a + lambd * x
        return (m, v, _bias(bt, self.beta)), d


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

    eta: float = 0.001
    beta: tuple = (0.9, 0.999)
    epsilon: float = 1e-16

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), self.beta

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, b1, b2 = xp.hyper(x, self.eta, *self.beta)
        eps = xp.eps(x, self.epsilon)
        m, s, bt = state
        m = xp.assign(m, b1 * m + (1 - b1) * dx)
        s = xp.assign(s, b2 * s + (1 - b2) * xp.abs2(dx - m) + eps)
        d = eta * m / (1 - bt[0]) / (xp.sqrt(s / (1 - bt[1])) + eps)
        return (m, s, _bias(bt, self.beta)), d


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

    eta: float = 0.001
    beta: tuple = (0.9, 0.99)

    def init(self, x):
        return backends.of(x).zeros_like(x)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, b1, b2 = xp.hyper(x, self.eta, *self.beta)
        d = eta * xp.sign(b1 * state + (1 - b1) * dx)
        m = xp.assign(state, b2 * state + (1 - b2) * dx)
        return m, d


@dataclass(frozen=True)
class WeightDecay(Rule):
    """WeightDecay(lambd=5e-4): L2 decay added to the gradient, ``d = g + lambd*x``.

    Put it before the optimiser in an :class:`OptimiserChain`.

    Example:
        >>> import numpy as np
        >>> WeightDecay(0.1).apply(None, np.array([2.0]), np.array([1.0]))[1]
        array([1.2])
    """

    elementwise = True
    reads_x = True

    lambd: float = 5e-4

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

    lambd: float = 1e-3

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (lambd,) = xp.hyper(x, self.lambd)
        return state, dx + lambd * xp.sign(x)


@dataclass(frozen=True)
class ClipGrad(Rule):
    """ClipGrad(delta=10.0): clamp each gradient element to ``[-delta, delta]``.

    Example:
        >>> import numpy as np
        >>> ClipGrad(1.0).apply(None, np.zeros(2), np.array([-3.0, 0.5]))[1]
        array([-1. ,  0.5])
    """

    elementwise = True

    delta: float = 10.0

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (delta,) = xp.hyper(x, self.delta)
        return state, xp.clip(dx, -delta, delta)


@dataclass(frozen=True)
class ClipNorm(Rule):
    """ClipNorm(omega=10.0, p=2.0, throw=True): rescale the gradient to norm at most ``omega``.

    ``n = norm(g, p)`` (``p`` may be 1, 2, ``inf``, 0 for the count of non-zeros,
    ``-inf``, or any real); ``d = g * min(omega/n, 1)``. A non-finite norm raises
    ``FloatingPointError`` when ``throw`` (not under ``jax.jit``, where the norm is not
    known while tracing: the step is then non-finite instead).

    Example:
        >>> import numpy as np
        >>> ClipNorm(1.0).apply(None, np.zeros(2), np.array([3.0, 4.0]))[1]
        array([0.6, 0.8])
    """

    omega: float = 10.0
    p: float = dataclasses.field(default=2.0, metadata={"static": True})  # not traced by JAX
    throw: bool = True

    def apply(self, state, x, dx):
        xp = backends.of(x)
        n = xp.norm(dx, self.p)
        if self.throw and xp.isfinite(n) is False:
            raise FloatingPointError(f"ClipNorm: the gradient's {self.p}-norm is {n}; "
                                     f"pass throw=False to clip anyway")
        (omega,) = xp.hyper(x, self.omega)
        big = n > omega
        return state, dx * xp.where(big, omega / xp.where(big, n, 1), 1)


@dataclass(frozen=True, init=False, repr=False)
class OptimiserChain(Rule):
    """OptimiserChain(*rules): apply the rules in order, each one's step the next one's gradient.

    The state is the tuple of the rules' states. A rule that yields no step (``None``,
    as :class:`AccumGrad` between accumulations) ends the chain for that update. An
    empty chain passes the gradient through.

    Example:
        >>> import numpy as np
        >>> rule = OptimiserChain(ClipGrad(1.0), Descent(0.1))
        >>> rule.apply(rule.init(np.zeros(2)), np.zeros(2), np.array([5.0, 0.5]))[1]
        array([0.1 , 0.05])
    """

    rules: tuple

    def __init__(self, *rules: Rule) -> None:
        for r in rules:
            if not isinstance(r, Rule):
                raise TypeError(f"OptimiserChain takes rules, got {type(r).__name__}")
            if isinstance(r, MixedPrecision):
                raise ValueError("MixedPrecision writes the parameter itself, so it cannot sit "
                                 "inside an OptimiserChain; wrap the chain instead: "
                                 "MixedPrecision(OptimiserChain(...))")
        object.__setattr__(self, "rules", tuple(rules))

    def __repr__(self) -> str:
        return f"OptimiserChain({', '.join(map(repr, self.rules))})"

    def init(self, x):
        return tuple(r.init(x) for r in self.rules)

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
            elif isinstance(r, AccumGrad) and backends.istraced(states[i][1]):
                stepped = states[i][1] == 1
        if stepped is not None and dx is not None:
            dx = backends.of(x).where(stepped, dx, 0 * dx)
        return tuple(states), dx


def _select(xp: Any, cond: Any, new: Any, old: Any) -> Any:
    """``new`` where ``cond`` else ``old``, through the tuples of a rule's state."""
    if isinstance(new, tuple):
        return tuple(_select(xp, cond, a, b) for a, b in zip(new, old))
    return new if new is None else xp.where(cond, new, old)


@dataclass(frozen=True)
class AccumGrad(Rule):
    """AccumGrad(n): average the gradients of ``n`` calls, then take one step with them.

    The first ``n-1`` updates change nothing but the accumulator; the ``n``-th passes the
    mean on (as the gradient of the next rule in a chain). Put it first in a chain.

    Under ``jax.jit`` the count is traced, so "no step" (``None``) cannot be returned:
    the step is zero instead, and an :class:`OptimiserChain` keeps the states of the
    rules after this one unchanged on those calls, so the result is the same.

    Example:
        >>> import numpy as np
        >>> r, x = AccumGrad(2), np.zeros(1)
        >>> s, d = r.apply(r.init(x), x, np.array([1.0])); d is None
        True
        >>> r.apply(s, x, np.array([3.0]))[1]
        array([2.])
    """

    elementwise = True

    n: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.n, (int, np.integer)) or self.n < 1:
            raise ValueError(f"AccumGrad(n) needs a whole number n >= 1, got {self.n!r}")

    def init(self, x):
        return backends.of(x).zeros_like(x), 1

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

    The state is ``(xT, rule_state)``: ``xT`` the parameter in ``dtype``, updated by
    ``rule``, then written back (rounded) to the parameter: the step is a
    :class:`NewValue`, so the parameter is exactly ``xT`` cast to its dtype. Must be
    outermost: wrap a chain, never put it inside one.

    Example:
        >>> import numpy as np
        >>> rule, x = MixedPrecision(Descent(1e-4)), np.ones(1, np.float16)
        >>> s = rule.init(x)
        >>> for _ in range(10):
        ...     s, step = rule.apply(s, x, np.ones(1, np.float16)); x = step.value
        >>> x, s[0]     # float16 alone would never move from 1.0 in steps of 1e-4
        (array([0.999], dtype=float16), array([0.999], dtype=float32))
    """

    rule: Rule = dataclasses.field(default_factory=Descent)
    dtype: Any = np.float32

    def __post_init__(self) -> None:
        if not isinstance(self.rule, Rule):
            raise TypeError(f"MixedPrecision wraps a rule, got {type(self.rule).__name__}")
        if isinstance(self.rule, MixedPrecision):
            raise ValueError("MixedPrecision inside MixedPrecision: use one, with the "
                             "higher dtype")

    def init(self, x):
        xT = backends.of(x).astype(x, self.dtype)
        return xT, self.rule.init(xT)

    def apply(self, state, x, dx, *higher):
        xp = backends.of(x)
        xT, st = state
        st, d = call(self.rule, st, xT, tuple(xp.cast(g, xT) for g in (dx, *higher)))
        if d is None:
            return (xT, st), None
        xT = xp.subtract(xT, d, inplace=True)
        return (xT, st), NewValue(xp.astype(xT, x.dtype))  # a copy, never xT itself
