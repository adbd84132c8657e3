"""Schedules: frozen dataclasses called on a step count ``t`` from 0, giving a hyper-parameter."""

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
