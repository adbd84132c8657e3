"""The names and limits of the checkpoint format shared by reading and writing."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import numpy as np

from optimisers import backends

FORMAT = "optimisers.checkpoint"
VERSION = 2  # 2: the state tree as a flat list of nodes, so any depth loads (1: nested)
READS = (1, 2)
JSON_MEMBER = "checkpoint.json"
STAMP = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same tree gives the same bytes
STANDARD = frozenset(np.dtype(c).name for c in np.typecodes["All"]
                      if np.dtype(c).kind in "biufc")
BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
TYPES = {"tuple": tuple, "list": list}
MAX_DEPTH = 100  # tuples, lists, dicts and rules nested in one rule or state, saved or loaded
JSON_BASE = 1 << 20  # the document may be this many bytes more than 4 times like's own


class Invalid(ValueError):
    """A problem found while loading; :func:`load` re-raises it as a plain ValueError."""


@functools.lru_cache(maxsize=256)
def constructor_params(cls: type) -> tuple[inspect.Parameter, ...]:
    """The named constructor parameters of a rule class (``*rules`` included)."""
    return tuple(p for p in inspect.signature(cls).parameters.values()
                 if p.kind is not p.VAR_KEYWORD)


FREE = object()  # the ``like`` of keys and hyper-parameters: nothing to compare with


def dtype_name(a: Any) -> str:
    """The name of the dtype of an array of any library, or of a NumPy scalar."""
    lib = backends.library(a)
    return backends.ops(lib).dtype_name(a) if lib is not None else str(a.dtype)
