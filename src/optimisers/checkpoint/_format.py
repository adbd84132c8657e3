"""The names and limits of the checkpoint format shared by reading and writing."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

FORMAT = "optimisers.checkpoint"
VERSION = 1
_JSON = "checkpoint.json"
_STAMP = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same tree gives the same bytes
_STANDARD = frozenset(np.dtype(c).name for c in np.typecodes["All"]
                      if np.dtype(c).kind in "biufc")
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_TYPES = {"tuple": tuple, "list": list}


class _Invalid(ValueError):
    """A problem found while loading; :func:`load` re-raises it as a plain ValueError."""


def _params(cls: type) -> list[inspect.Parameter]:
    """The named constructor parameters of a rule class (``*rules`` included)."""
    return [p for p in inspect.signature(cls).parameters.values()
            if p.kind is not p.VAR_KEYWORD]


_FREE = object()  # the ``like`` of keys and hyper-parameters: nothing to compare with


def _dtype_name(a: Any) -> str:
    return str(a.dtype).removeprefix("torch.")
