"""Packed state: one buffer per fused group with a view per Leaf (see ``fused.pack``),
recorded by weak reference only, so that a fused step can use the whole buffer. Successive
buffers begin ``SLOTS`` apart within a 4 KiB page, against 4K aliasing (benchmarks/README.md).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from operator import is_
from typing import Any

_deref = weakref.ref.__call__


PAD = 4096
"""Spare bytes at the front of each buffer: room to begin its data where it should."""
SLOTS = (1024, 2048, 3072, 512, 1536, 2560, 3584)
"""Where successive buffers' data begins, in bytes modulo 4096 (away from 0 and each other)."""
_NEXT = itertools.cycle(SLOTS)


class Packs:
    """The packed buffers of one array library: ``base(a)`` the buffer a view is of,
    ``segment(buf, lo, n)`` a view of ``n`` elements from ``lo``, ``address(buf)``."""

    def __init__(self, base: Callable[[Any], Any], segment: Callable[[Any, int, int], Any],
                 address: Callable[[Any], int]) -> None:
        self.base, self.segment, self.address = base, segment, address
        # id(buffer) -> (ref to it, refs to views, first element, length)
        self._records: dict[int, tuple] = {}

    def start(self, buf: Any, itemsize: int) -> int:
        """The element of ``buf`` (``PAD`` bytes longer) where its data should begin."""
        return (next(_NEXT) - self.address(buf)) % PAD // itemsize

    def add(self, buf: Any, lo: int, n: int, views: list) -> list:
        """Record ``views``, of the ``n`` elements of ``buf`` from ``lo``; return them."""
        key = id(buf)
        self._records[key] = (weakref.ref(buf), tuple(map(weakref.ref, views)), lo, n)
        weakref.finalize(buf, self._records.pop, key, None)  # the views keep buf alive
        return views

    def _record(self, a: Any) -> tuple | None:
        base = self.base(a)
        record = self._records.get(id(base)) if base is not None else None
        return record if record is not None and record[0]() is base else None

    def whole(self, parts: tuple) -> Any:
        """The buffer as one flat view when ``parts`` are exactly its views; else ``None``."""
        record = self._record(parts[0])
        if record is not None and len(record[1]) == len(parts) and all(
                map(is_, map(_deref, record[1]), parts)):
            return self.segment(record[0](), record[2], record[3])
        return None

    def copier(self, copy: Callable[[Any], Any], pack: Callable[[tuple], list]
               ) -> Callable[[Any], Any]:
        """A function copying arrays with ``copy``, the views of a buffer by ``pack``, together."""
        memo: dict[int, tuple[list, dict]] = {}

        def copy_(a: Any) -> Any:
            record = self._record(a)  # (a view of a buffer of ours: copied with its buffer)
            if record is None:
                return copy(a)
            base = record[0]()
            if id(base) not in memo:
                views = [r() for r in record[1]]
                if any(v is None for v in views):  # a view was dropped: copy one by one
                    return copy(a)
                memo[id(base)] = (pack(tuple(views)),
                                  {id(v): i for i, v in enumerate(views)})
            new, index = memo[id(base)]
            i = index.get(id(a))
            return new[i] if i is not None else copy(a)

        return copy_
