"""Adaptive rules: a per-element step from running moments; the Adam family's maths once."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Any

from optimisers import backends
from optimisers.rules.base import Rule
from optimisers.rules.descent import Momentum
from optimisers.rules.fields import hyperparameter

__all__ = ["RMSProp", "Adam", "RAdam", "AdaMax", "OAdam", "AdaGrad", "AdaDelta", "AMSGrad",
           "NAdam", "AdamW", "AdaBelief", "Lion", "ADOPT", "ScheduleFreeAdamW"]


def decays(xp: Any, x: Any, *b: Any) -> tuple:
    """decays(xp, x, *b) -> each ``b``, then each ``1 - b`` (computed before the cast), in
    ``x``'s dtype: ``decays(xp, x, 0.5, 0.75) == (0.5, 0.75, 0.5, 0.25)``."""
    return xp.hyper(x, *b, *map(xp.complement, b))


def moment(xp: Any, m: Any, b: Any, c: Any, g: Any, own: bool = False) -> Any:
    """moment(xp, m, b, c, g, own=False) -> ``b*m + c*g`` (a factor ``None`` left out), into
    ``m`` where ``xp.maywrite(m)``; ``own``: ``g`` may be written over."""
    if c is not None:
        g = xp.multiply(g, c, out=g if own else None)
    into = m if xp.maywrite(m) else None
    new = m if b is None else xp.multiply(m, b, out=into)
    if new is m and into is None:
        new = m + g
    else:
        new += g
    return new if new is m else xp.assign(m, new)


def _larger(xp: Any, u: Any, v: Any, b: Any = None) -> Any:
    """``max(b*u, v)`` (``b`` None: ``max(u, v)``), into ``u`` as :func:`moment` writes."""
    into = u if xp.maywrite(u) else None
    new = u if b is None else xp.multiply(u, b, out=into)
    new = xp.maximum(new, v, out=into if new is u else new)
    return new if new is u else xp.assign(u, new)


def adam_moments(xp: Any, m: Any, v: Any, g: Any, b1: Any, b2: Any, c1: Any, c2: Any
                 ) -> tuple:
    """adam_moments(xp, m, v, g, b1, b2, c1, c2) -> ``(b1*m + c1*g, b2*v + c2*|g|^2)``."""
    return moment(xp, m, b1, c1, g), moment(xp, v, b2, c2, xp.abs2(g), own=True)


def bias_corrections(beta: tuple, t: Any) -> tuple:
    """bias_corrections(beta, t) -> ``(1 - b1^t, 1 - b2^t)``, the current decays (as
    torch.optim and optax), ``t`` from 1."""
    return (1 - beta[0] ** t, 1 - beta[1] ** t)


def adaptive_step(xp: Any, m: Any, v: Any, eps: Any, eta: Any = None, k1: Any = None,
                  k2: Any = None) -> Any:
    """adaptive_step(xp, m, v, eps, eta=None, k1=None, k2=None) -> ``eta*m/k1 /
    (sqrt(v/k2) + eps)``, new (a ``None`` left out): the Adam family's step."""
    den = v if k2 is None else xp.divide(v, k2)
    den = xp.sqrt(den, out=None if k2 is None else den)
    den += eps
    if eta is not None and k1 is not None:
        eta = eta / k1  # (one scalar: one pass over m, as torch.optim's step size)
    u = xp.divide(m, k1) if eta is None else xp.multiply(m, eta)
    return xp.divide(u, den, out=u)


_Hyper = namedtuple("_Hyper", "xp eta b1 b2 c1 c2 eps")


def _hyper(rule: Rule, x: Any) -> _Hyper:
    """``x``'s backend and ``rule``'s ``eta``, ``beta`` (:func:`decays`) and ``epsilon``."""
    xp = backends.BACKENDS.get(type(x)) or backends.of(x)  # the table: no call on a step
    (eta,) = xp.hyper(x, rule.eta)
    return _Hyper(xp, eta, *decays(xp, x, *rule.beta), xp.eps(x, rule.epsilon))


def _adam(rule: Rule, h: _Hyper, state: tuple, dx: Any, eta: Any) -> tuple:
    """``((m, v, t + 1), d)``: Adam's step at the rate ``eta`` (``None``: 1)."""
    m, v, t = state
    m, v = adam_moments(h.xp, m, v, dx, h.b1, h.b2, h.c1, h.c2)
    k1, k2 = bias_corrections(rule.beta, t + 1)
    return (m, v, t + 1), adaptive_step(h.xp, m, v, h.eps, eta, k1, k2)


@dataclass(frozen=True)
class _Moments:
    """The fields that open the Adam family's rules (AdamW's its own), and their state."""

    elementwise = True
    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.999), "[0, 1)", "[0, 1)")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x, real_=True), 0.0


@dataclass(frozen=True)
class RMSProp(Rule):
    """RMSProp(eta=0.001, rho=0.9, epsilon=1e-8, centred=False) (Tieleman & Hinton 2012).

    ``q = rho*q + (1-rho)*|g|^2``; centred: ``l = rho*l + (1-rho)*g``; ``d = eta*g /
    (sqrt(q - |l|^2) + eps)``: ``torch.optim.RMSprop(alpha=rho)``, ``rho < 1``.

    Example:
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
        q, l = state
        q = moment(xp, q, rho, c, xp.abs2(dx), own=True)
        l = None if l is None else moment(xp, l, rho, c, dx)
        v = q if l is None else q - xp.abs2(l)
        return (q, l), adaptive_step(xp, dx, v, xp.eps(x, self.epsilon), eta)


@dataclass(frozen=True)
class Adam(_Moments, Rule):
    """Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8) (Kingma & Ba 2015).

    ``m = b1*m + (1-b1)*g``; ``v = b2*v + (1-b2)*|g|^2``; ``d = eta * m/(1-b1^t) /
    (sqrt(v/(1-b2^t)) + eps)``, ``t`` from 1: ``torch.optim.Adam``'s and ``optax.adam``'s.

    Example:
        >>> r, x = Adam(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1]
        array([0.1])
    """

    def apply(self, state, x, dx):
        h = _hyper(self, x)
        return _adam(self, h, state, dx, h.eta)


@dataclass(frozen=True)
class RAdam(_Moments, Rule):
    """RAdam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8): rectified Adam (Liu et al. 2020).

    Adam's step times ``sqrt((r-4)(r-2)rinf / ((rinf-4)(rinf-2)r))`` once ``r = rinf -
    2*t*b2^t/(1-b2^t) > 4`` (``rinf = 2/(1-b2) - 1``), before that ``eta*m/(1-b1^t)``:
    Optimisers.jl's form (torch's and optax's switch at ``r > 5``, ``eps`` elsewhere).

    Example:
        >>> r, x = RAdam(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1]   # first steps: momentum only
        array([0.3])
    """

    def apply(self, state, x, dx):
        h = _hyper(self, x)
        xp, eta = h.xp, h.eta
        (m, v, t), d = _adam(self, h, state, dx, eta)  # (its eta*m/k1 is not shared with the
        k1, k2 = bias_corrections(self.beta, t)  # one below: XLA would round it otherwise)
        rinf = 2 / xp.complement(self.beta[1]) - 1
        r = rinf - 2 * t * self.beta[1] ** t / k2
        traced = backends.istraced(r)  # under jax.jit: compute both branches, then select
        if not (traced or r > 4):
            return (m, v, t), eta * m / k1
        ratio = (r - 4) * (r - 2) * rinf / ((rinf - 4) * (rinf - 2) * r)
        (rect,) = xp.hyper(x, xp.sqrt(xp.where(r > 4, ratio, 1)) if traced else ratio**0.5)
        d *= rect
        return (m, v, t), xp.where(r > 4, d, eta * m / k1) if traced else d


@dataclass(frozen=True)
class AdaMax(_Moments, Rule):
    """AdaMax(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8): Adam with the infinity norm
    (Kingma & Ba 2015, section 7): ``u = max(b2*u, |g|)``; ``d = eta/(1-b1^t) * m/(u + eps)``.

    Example:
        >>> r, x = AdaMax(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1]
        array([0.1])
    """

    def apply(self, state, x, dx):
        xp, eta, b1, b2, c1, _, eps = _hyper(self, x)
        m, u, t = state
        m, u = moment(xp, m, b1, c1, dx), _larger(xp, u, xp.abs(dx), b2)
        d = xp.multiply(m, eta / bias_corrections(self.beta, t + 1)[0])
        return (m, u, t + 1), xp.divide(d, u + eps, out=d)


@dataclass(frozen=True)
class OAdam(_Moments, Rule):
    """OAdam(eta=0.001, beta=(0.5, 0.9), epsilon=1e-8): optimistic Adam (Daskalakis et al.
    2018), for saddle-point problems (GANs): ``d = 2*a - a_prev``, ``a`` Adam's step.

    Example:
        >>> r, x = OAdam(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1]
        array([0.2])
    """

    beta: tuple = hyperparameter((0.5, 0.9), "[0, 1)", "[0, 1)")

    def init(self, x):
        return (*_Moments.init(self, x)[:2], backends.of(x).zeros_like(x), 0.0)

    def apply(self, state, x, dx):
        h = _hyper(self, x)
        m, v, term, t = state
        (m, v, t), new = _adam(self, h, (m, v, t), dx, h.eta)
        d = 2 * new - term
        return (m, v, h.xp.assign(term, new), t), d


@dataclass(frozen=True)
class AdaGrad(Rule):
    """AdaGrad(eta=0.1, epsilon=1e-8) (Duchi et al. 2011): ``acc = acc + |g|^2`` (from
    ``eps``); ``d = eta*g / (sqrt(acc) + eps)``.

    Example:
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
        acc = moment(xp, state, None, None, xp.abs2(dx))
        return acc, adaptive_step(xp, dx, acc, xp.eps(x, self.epsilon), eta)


@dataclass(frozen=True)
class AdaDelta(Rule):
    """AdaDelta(rho=0.9, epsilon=1e-8) (Zeiler 2012), no learning rate: ``acc = rho*acc +
    (1-rho)*|g|^2``; ``d = g*sqrt(dacc + eps)/sqrt(acc + eps)``; ``dacc = rho*dacc +
    (1-rho)*|d|^2``.

    Example:
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
        acc = moment(xp, acc, rho, c, xp.abs2(dx), own=True)
        d = dx * xp.sqrt(dacc + eps) / xp.sqrt(acc + eps)
        return (acc, moment(xp, dacc, rho, c, xp.abs2(d), own=True)), d


@dataclass(frozen=True)
class AMSGrad(_Moments, Rule):
    """AMSGrad(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8) (Reddi et al. 2018): Adam's
    moments (from ``eps``), ``vhat = max(vhat, v)``, ``d = eta*m / (sqrt(vhat) + eps)``.

    Example:
        >>> r, x = AMSGrad(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([1.0]))[1].round(4)
        array([0.3161])
    """

    def init(self, x):
        full = backends.of(x).full_like
        return (full(x, self.epsilon), full(x, self.epsilon, real_=True),
                full(x, self.epsilon, real_=True))

    def apply(self, state, x, dx):
        xp, eta, b1, b2, c1, c2, eps = _hyper(self, x)
        m, v, vhat = state
        m, v = adam_moments(xp, m, v, dx, b1, b2, c1, c2)
        vhat = _larger(xp, vhat, v)
        return (m, v, vhat), adaptive_step(xp, m, vhat, eps, eta)


@dataclass(frozen=True)
class NAdam(_Moments, Rule):
    """NAdam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8): Adam with Nesterov momentum
    (Dozat 2016), as ``optax.nadam``: ``d = eta * (b1*m/(1-b1^(t+1)) + (1-b1)*g/(1-b1^t))
    / (sqrt(v/(1-b2^t)) + eps)`` (Optimisers.jl v0.4: a stray ``b2`` in the root).

    Example:
        >>> r, x = NAdam(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1].round(4)
        array([0.1474])
    """

    def apply(self, state, x, dx):
        xp, eta, b1, b2, c1, c2, eps = _hyper(self, x)
        m, v, t = state
        m, v = adam_moments(xp, m, v, dx, b1, b2, c1, c2)
        k1, k2 = bias_corrections(self.beta, t + 1)
        k0, k1 = xp.hyper(x, 1 - self.beta[0] ** (t + 2), k1)
        n = xp.multiply(m, b1)
        n = xp.divide(n, k0, out=n)
        n += c1 * dx / k1
        return (m, v, t + 1), adaptive_step(xp, n, v, eps, eta, k2=k2)


@dataclass(frozen=True)
class AdamW(Rule):
    """AdamW(eta=0.001, beta=(0.9, 0.999), lambd=0.0, epsilon=1e-8, couple=True): Adam with
    decoupled weight decay (Loshchilov & Hutter 2019). With ``a`` Adam's step at ``eta = 1``:
    ``d = eta*(a + lambd*x)`` when ``couple`` (``torch.optim.AdamW(weight_decay=lambd)``,
    ``optax.adamw``), else ``d = eta*a + lambd*x`` (the paper's fully decoupled form).

    Example:
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

    init = _Moments.init

    def apply(self, state, x, dx):
        h = _hyper(self, x)
        state, d = _adam(self, h, state, dx, None)
        (lambd,) = h.xp.hyper(x, self.lambd)
        decay = h.xp.multiply(x, lambd)
        if self.couple:
            d += decay
        d = h.xp.multiply(d, h.eta, out=d)
        if not self.couple:
            d += decay
        return state, d


@dataclass(frozen=True)
class AdaBelief(_Moments, Rule):
    """AdaBelief(eta=0.001, beta=(0.9, 0.999), epsilon=1e-16) (Zhuang et al. 2020): Adam
    whose second moment tracks ``s = b2*s + (1-b2)*|g - m|^2 + eps``, the belief in ``g``.

    Example:
        >>> r, x = AdaBelief(0.1), np.zeros(1)
        >>> r.apply(r.init(x), x, np.array([3.0]))[1].round(4)
        array([0.1111])
    """

    epsilon: float = hyperparameter(1e-16, "[0, inf)")

    def apply(self, state, x, dx):
        xp, eta, b1, b2, c1, c2, eps = _hyper(self, x)
        m, s, t = state
        m = moment(xp, m, b1, c1, dx)
        s = moment(xp, s, b2, c2, xp.abs2(dx - m), own=True)
        s += eps
        k1, k2 = bias_corrections(self.beta, t + 1)
        return (m, s, t + 1), adaptive_step(xp, m, s, eps, eta, k1, k2)


@dataclass(frozen=True)
class Lion(Rule):
    """Lion(eta=0.001, beta=(0.9, 0.99)): evolved sign momentum (Chen et al. 2023):
    ``d = eta * sign(b1*m + (1-b1)*g)``, then ``m = b2*m + (1-b2)*g``, the paper's
    Algorithm 1, ``optax.lion(eta, weight_decay=0.0)`` (Optimisers.jl swaps the weights).

    Example:
        >>> r, x = Lion(0.1), np.zeros(2)
        >>> r.apply(r.init(x), x, np.array([3.0, -1.0]))[1]
        array([ 0.1, -0.1])
    """

    elementwise = True
    eta: float = hyperparameter(0.001, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.99), "[0, 1]", "[0, 1]")

    init = Momentum.init

    def apply(self, state, x, dx):
        xp = backends.of(x)
        (eta,) = xp.hyper(x, self.eta)
        b1, b2, c1, c2 = decays(xp, x, *self.beta)
        d = eta * xp.sign(b1 * state + c1 * dx)
        return moment(xp, state, b2, c2, dx), d


@dataclass(frozen=True)
class ADOPT(_Moments, Rule):
    """ADOPT(eta=0.001, beta=(0.9, 0.9999), epsilon=1e-6, clip=True): Adam with ``g``
    normalised by the second moment of the steps before it (Taniguchi et al. 2024).

    The first step only sets ``v = |g|^2`` (``d = 0``); then, ``t`` the steps before:
    ``u = g / max(sqrt(v), eps)`` (the old ``v``), clamped to ``[-t^(1/4), t^(1/4)]`` when
    ``clip`` (a complex ``u`` by parts); ``m = b1*m + (1-b1)*u``; ``v = b2*v +
    (1-b2)*|g|^2``; ``d = eta*m``: ``optax.contrib.adopt(use_clipping=clip)``.

    Example:
        >>> r, x = ADOPT(0.1), np.zeros(1)
        >>> s, d = r.apply(r.init(x), x, np.array([2.0])); d, s[1]   # the first: v only
        (array([0.]), array([4.]))
        >>> r.apply(s, x, np.array([3.0]))[1]   # u = 3/2, clamped to 1^(1/4)
        array([0.01])
    """

    beta: tuple = hyperparameter((0.9, 0.9999), "[0, 1)", "[0, 1)")
    epsilon: float = hyperparameter(1e-6, "[0, inf)")
    clip: bool = hyperparameter(True, kind="flag")

    def apply(self, state, x, dx):
        xp, eta, b1, b2, c1, c2, eps = _hyper(self, x)
        m, v, t = state
        (on,) = xp.hyper(x, t > 0)  # 0 at the first step: u = 0 (m stays 0), v = |g|^2
        u = on * dx / xp.maximum(xp.sqrt(v), eps)
        if self.clip:
            (c,) = xp.hyper(x, t**0.25)
            u = xp.clip(u, -c, c)
        m = moment(xp, m, b1, c1, u, own=True)
        v = moment(xp, v, b2 * on, c2 * on + (1 - on), xp.abs2(dx), own=True)
        return (m, v, t + 1), eta * m


def _blend(cond: Any, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` holds, else ``b``, as arithmetic (Python or traced scalars alike)."""
    return cond * a + (1 - cond) * b


def _ramp(t: Any, warmup: Any) -> Any:
    """``min(t/warmup, 1)``, 1 when ``warmup`` is 0 (no division by it)."""
    return _blend(t < warmup, t / (warmup + (warmup == 0)), 1)


@dataclass(frozen=True)
class ScheduleFreeAdamW(Rule):
    """ScheduleFreeAdamW(eta=0.0025, beta=(0.9, 0.999), epsilon=1e-8, lambd=0.0, warmup=0,
    weight_lr_power=2.0): AdamW without a learning-rate schedule, averaging its iterates
    instead (Defazio et al. 2024, "The Road Less Scheduled").

    Step ``t`` from 1, ``eta_t = eta * min(t/warmup, 1)``: ``v = b2*v + (1-b2)*|g|^2``;
    ``u = g / (sqrt(v/(1-b2^t)) + eps) + lambd*y``; ``x = (y - (1-b1)*z) / b1``;
    ``z = z - eta_(t-1)*u``; ``c = w / sum(w)`` for ``w = max(eta_1..eta_t)^weight_lr_power``;
    ``x = (1-c)*x + c*z``; ``y = b1*x + (1-b1)*z``. As
    ``optax.contrib.schedule_free_adamw`` and its ``schedule_free_eval_params``.

    Example:
        >>> from optimisers import averaged, setup, update
        >>> model = {"w": np.array([1.0, -1.0])}
        >>> tree = setup(ScheduleFreeAdamW(0.1), model)
        >>> for _ in range(3):
        ...     tree, model = update(tree, model, {"w": model["w"]})
        >>> model["w"].round(4), averaged(tree, model)["w"].round(4)
        (array([ 0.7968, -0.7968]), array([ 0.8061, -0.8061]))
    """

    elementwise = True
    reads_x = True
    eta: float = hyperparameter(0.0025, "[0, inf)")
    beta: tuple = hyperparameter((0.9, 0.999), "(0, 1]", "[0, 1)")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")
    lambd: float = hyperparameter(0.0, "[0, inf)")
    warmup: int = hyperparameter(0, "[0, inf)", kind="whole")
    weight_lr_power: float = hyperparameter(2.0, "[0, inf)")

    def init(self, x):
        xp = backends.of(x)
        return xp.copy(x), xp.zeros_like(x, real_=True), 0.0, 0.0, 0.0

    def apply(self, state, x, dx):
        xp = backends.of(x)
        z, v, t, total, top = state
        now = self.eta * _ramp(t + 1, self.warmup)  # the rate of this step, for the weights
        top = _blend(now > top, now, top)
        weight = top**self.weight_lr_power
        total = total + weight
        eta, c, k2, lambd = xp.hyper(x, self.eta * _ramp(t, self.warmup),
                                     weight / (total + (total == 0)),
                                     bias_corrections(self.beta, t + 1)[1], self.lambd)
        b1, b2, q1, q2 = decays(xp, x, *self.beta)
        eps = xp.eps(x, self.epsilon)
        v = xp.assign(v, b2 * v + q2 * xp.abs2(dx))
        u = dx / (xp.sqrt(v / k2) + eps) + lambd * x
        mean = (x - q1 * z) / b1  # x, before this step
        z = xp.assign(z, z - eta * u)
        y = b1 * ((1 - c) * mean + c * z) + q1 * z
        return (z, v, t + 1, total, top), x - y

    def averaged(self, state: Any, x: Any) -> Any:
        """The evaluation point ``x = (y - (1-b1)*z) / b1``."""
        xp = backends.of(x)
        b1, q1 = decays(xp, x, self.beta[0])
        return (x - q1 * state[0]) / b1
