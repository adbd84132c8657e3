"""Packed state: one buffer per fused group with a view per Leaf (see ``fused.pack``).

A backend's ``packed`` makes the buffer and its views and records them here, by weak
reference only: a checkpoint, a copied tree or a dropped tree never keeps a buffer
alive, and its record goes when the buffer does. From any array, :meth:`Packs.find`
tells whether it is such a view, so that a fused step can use the whole buffer in place
of a concatenation and a copy of the tree can keep the layout.

Each buffer has ``PAD`` spare bytes, so that its views can begin at a chosen place
within a 4 KiB page: successive buffers (a group's first moments, its second moments,
...) begin ``SLOTS`` apart. Where every stream of a step (parameter, gradient
and each state) begins at the same address modulo 4096, as large allocations of the
same sizes do, the processor mistakes loads for reloads of just-stored data (4K
aliasing) and a bandwidth-bound step runs slower (benchmarks/README.md).
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
"""Where successive buffers' data begins, in bytes modulo 4096: away from 0, where large
allocations (a model's own parameters and gradients) tend to begin, and from each
other."""
_NEXT = itertools.cycle(SLOTS)


class Packs:
    """The packed buffers of one array library. ``base(a)`` is the buffer a view is of
    (``a.base`` in NumPy, ``a._base`` in PyTorch) or ``None``; ``segment(buf, lo, n)``
    the ``n`` elements of ``buf`` from ``lo``, as a view; ``address(buf)`` where its
    data begins."""

    def __init__(self, base: Callable[[Any], Any], segment: Callable[[Any, int, int], Any],
                 address: Callable[[Any], int]) -> None:
        self.base, self.segment, self.address = base, segment, address
        # id(buffer) -> (ref to it, refs to views, first element, length)
        self._records: dict[int, tuple] = {}

    def start(self, buf: Any, itemsize: int) -> int:
        """The element of ``buf`` (made ``PAD`` bytes longer than needed) at which its
        data should begin: the next of ``SLOTS``."""
        return (next(_NEXT) - self.address(buf)) % PAD // itemsize

    def add(self, buf: Any, lo: int, n: int, views: list) -> list:
        """Record ``views``, of the ``n`` elements of ``buf`` from ``lo``; return them."""
        key = id(buf)
        self._records[key] = (weakref.ref(buf), tuple(map(weakref.ref, views)), lo, n)
        weakref.finalize(buf, self._records.pop, key, None)  # the views keep buf alive
        return views

    def find(self, a: Any) -> tuple[Any, tuple] | None:
        """``(buffer, weak references to its views in order)`` when ``a`` is one of them."""
        record = self._record(a)
        return None if record is None else (record[0](), record[1])

    def _record(self, a: Any) -> tuple | None:
        base = self.base(a)
        record = self._records.get(id(base)) if base is not None else None
        if record is None or record[0]() is not base:
            return None
        return record

    def whole(self, parts: tuple) -> Any:
        """The buffer's data, as one flat view, when ``parts`` are exactly its views, in
        order; else ``None``."""
        record = self._record(parts[0])
        if record is not None and len(record[1]) == len(parts) and all(
                map(is_, map(_deref, record[1]), parts)):
            return self.segment(record[0](), record[2], record[3])
        return None

    def copier(self, copy: Callable[[Any], Any], pack: Callable[[tuple], list]
               ) -> Callable[[Any], Any]:
        """A function copying arrays with ``copy``, except that the views of one buffer
        are copied together, by ``pack``, into one new buffer (once per buffer)."""
        memo: dict[int, tuple[list, dict]] = {}

        def copy_(a: Any) -> Any:
            hit = self.find(a)
            if hit is None:
                return copy(a)
            base, refs = hit
            if id(base) not in memo:
                views = [r() for r in refs]
                if any(v is None for v in views):  # a view was dropped: copy one by one
                    return copy(a)
                memo[id(base)] = (pack(tuple(views)),
                                  {id(v): i for i, v in enumerate(views)})
            new, index = memo[id(base)]
            i = index.get(id(a))
            return new[i] if i is not None else copy(a)

        return copy_
