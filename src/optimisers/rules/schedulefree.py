"""Schedule-Free rules: no learning-rate decay, an average of the iterates instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optimisers import backends
from optimisers.rules.base import Rule
from optimisers.rules.fields import hyperparameter

__all__ = ["ScheduleFreeAdamW"]


def _select(cond: Any, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` holds, else ``b``, as arithmetic (Python or traced scalars alike)."""
    return cond * a + (1 - cond) * b


def _ramp(t: Any, warmup: Any) -> Any:
    """``min(t/warmup, 1)``, 1 when ``warmup`` is 0 (no division by it)."""
    return _select(t < warmup, t / (warmup + (warmup == 0)), 1)


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
        >>> import numpy as np
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
        top = _select(now > top, now, top)
        weight = top**self.weight_lr_power
        total = total + weight
        eta, c, k2, lambd = xp.hyper(x, self.eta * _ramp(t, self.warmup),
                                     weight / (total + (total == 0)),
                                     1 - self.beta[1] ** (t + 1), self.lambd)
        b1, b2, q1, q2 = xp.hyper(x, *self.beta, *map(xp.complement, self.beta))
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
        b1, q1 = xp.hyper(x, self.beta[0], xp.complement(self.beta[0]))
        return (x - q1 * state[0]) / b1
