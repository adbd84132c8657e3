"""Schedules: a hyper-parameter as a function of the step count.

Each schedule is a frozen dataclass of its numbers, called on a step count ``t`` from 0:
a Python ``float`` for an ``int``, a 0-d array for an array (traced under ``jax.jit``).
The values are optax's and ``torch.optim.lr_scheduler``'s (each class names its own).
A plain function ``step -> value`` is a schedule wherever one is taken (:class:`Function`);
``0.1 * s`` is :class:`Scaled`.
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
