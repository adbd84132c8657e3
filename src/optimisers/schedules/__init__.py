"""Schedules: a hyper-parameter as a function of the step count.

Each schedule is a frozen dataclass of its numbers (checked as a rule's hyper-parameters):
it prints, compares, hashes and checkpoints as a rule does. Called on a step count ``t``
from 0, it returns a Python ``float`` for an ``int``, or a 0-d array of ``t``'s library,
computed without a Python ``if`` on ``t`` (so it runs under ``jax.jit``; with JAX every
schedule is a pytree whose numbers are leaves).

The values are those of optax and ``torch.optim.lr_scheduler`` (``tests/test_schedules.py``
compares them at many steps):

==========================================  =================================================
this                                        optax / torch
==========================================  =================================================
``Constant(v)``                             ``constant_schedule(v)``
``Linear(a, b, n)``                         ``linear_schedule(a, b, n)``
``Cosine(a, b, n)``                         ``cosine_decay_schedule(a, n, alpha=b/a)``;
                                            ``CosineAnnealingLR(T_max=n, eta_min=b)``, t <= n
``Exponential(a, r, n, staircase)``         ``exponential_decay(a, n, r, staircase=...)``
``Step(a, r, n)``                           ``StepLR(step_size=n, gamma=r)``
``Polynomial(a, b, n, p)``                  ``polynomial_schedule(a, b, p, n)``
``Warmup(Cosine(p, b, n - w), w, a)``       ``warmup_cosine_decay_schedule(a, p, w, n, b)``
``Join(schedules, boundaries)``             ``join_schedules(schedules, boundaries)``
``OneCycle(p, n)``                          ``OneCycleLR(max_lr=p, total_steps=n)``, t < n
``OneCycle(lo, n, start=hi, end=hi)``       its momentum, ``cycle_momentum=True`` with
                                            ``base_momentum=lo, max_momentum=hi``
``Function(f)``, or ``f`` itself            ``f``: an optax schedule; ``LambdaLR``'s
                                            ``lr_lambda`` (times the base rate)
``0.1 * s``, ``Scaled(s, 0.1)``             ``0.1 * s(t)``
==========================================  =================================================

A plain function ``step -> value`` is a schedule wherever one is taken: a rule's number
field (``Adam(eta=f)``, ``Adam(beta=(f, 0.999))``), ``Warmup``'s and ``Join``'s schedules.
It becomes :class:`Function` ``(f)``, called with the Leaf's clock: a Python ``int`` on
NumPy and PyTorch, traced under ``jax.jit`` (so there it must compute with ``jnp``, as an
optax schedule does, and never branch in Python on ``t``).
"""

from optimisers.schedules.base import (
    SCHEDULES,
    Function,
    Scaled,
    Schedule,
    as_schedule,
    at,
    check_schedule,
    importable_name,
    timed,
)
from optimisers.schedules.curves import (
    Constant,
    Cosine,
    Exponential,
    Join,
    Linear,
    OneCycle,
    Polynomial,
    Step,
    Warmup,
)

__all__ = ["Schedule", "SCHEDULES", "at", "timed", "as_schedule", "check_schedule",
           "importable_name", "Constant", "Linear", "Cosine", "Exponential", "Step",
           "Polynomial", "Warmup", "Join", "OneCycle", "Function", "Scaled"]
