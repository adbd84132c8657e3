"""How a Leaf reads as text (``Leaf.__repr__``, ``summary``): its rule, its state by shape."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.rules import Rule

__all__ = ["brief", "shown", "leaf_text"]

_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
          "complex64": "c64", "complex128": "c128", "int32": "i32", "int64": "i64",
          "bool": "bool"}


def leaf_text(rule: Rule, state: Any, frozen: bool) -> str:
    """leaf_text(rule, state, frozen) -> ``Leaf(rule, state)`` as its ``repr`` shows it."""
    return f"Leaf({shown(rule)}, {brief(state)}{', frozen=True' if frozen else ''})"


def brief(x: Any) -> str:
    """brief(x) -> a state as text: arrays as ``f32[3, 2]``, anything else as its ``repr``."""
    if backends.library(x) is not None:
        xp = backends.of(x)
        name = xp.dtype_name(x)
        return f"{_SHORT.get(name, name)}[{', '.join(map(str, xp.shape(x)))}]"
    if isinstance(x, tuple):
        inner = ", ".join(brief(v) for v in x)
        return f"({inner},)" if len(x) == 1 else f"({inner})"
    if isinstance(x, list):
        return "[" + ", ".join(brief(v) for v in x) + "]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {brief(v)}" for k, v in x.items()) + "}"
    return repr(x)


def shown(rule: Rule) -> str:
    """shown(rule) -> ``repr(rule)``, with 0-d array hyper-parameters shown as numbers."""
    return repr(_numbers(rule))


def _numbers(v: Any) -> Any:
    if isinstance(v, Rule) and dataclasses.is_dataclass(v):
        new = copy.copy(v)  # the rule's own repr, on numbers (fields set as __init__ would)
        for f in dataclasses.fields(v):
            object.__setattr__(new, f.name, _numbers(getattr(v, f.name)))
        return new
    if type(v) is tuple:
        return tuple(map(_numbers, v))
    if not isinstance(v, np.generic):
        if backends.library(v) is None or backends.istraced(v) or getattr(v, "shape", 0) != ():
            return v
        try:
            v = np.asarray(v)[()]
        except Exception:  # a tensor off the CPU, say: shown as it is
            return v
    return float(str(v)) if isinstance(v, np.floating) else v.item()  # float32 0.01: 0.01
