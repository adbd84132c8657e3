"""Packed state: one buffer per fused group with a view per Leaf (see ``fused.pack``).

A backend's ``packed`` makes the buffer and its views and records them here, by weak
reference only: a checkpoint, a copied tree or a dropped tree never keeps a buffer
alive, and its record goes when the buffer does. From any array, :meth:`Packs.find`
tells whether it is such a view, so that a fused step can use the whole buffer in place
of a concatenation and a copy of the tree can keep the layout.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from operator import is_
from typing import Any

_deref = weakref.ref.__call__


class Packs:
    """The packed buffers of one array library; ``base(a)`` is the buffer a view is of
    (``a.base`` in NumPy, ``a._base`` in PyTorch), or ``None``."""

    def __init__(self, base: Callable[[Any], Any]) -> None:
        self.base = base
        self._records: dict[int, tuple] = {}  # id(buffer) -> (ref to it, refs to views)

    def add(self, buf: Any, views: list) -> list:
        key = id(buf)
        self._records[key] = (weakref.ref(buf), tuple(map(weakref.ref, views)))
        weakref.finalize(buf, self._records.pop, key, None)  # the views keep buf alive
        return views

    def find(self, a: Any) -> tuple[Any, tuple] | None:
        """``(buffer, weak references to its views in order)`` when ``a`` is one of them."""
        base = self.base(a)
        record = self._records.get(id(base)) if base is not None else None
        if record is None or record[0]() is not base:
            return None
        return base, record[1]

    def whole(self, parts: tuple) -> Any:
        """The buffer when ``parts`` are exactly its views, in order; else ``None``."""
        hit = self.find(parts[0])
        if hit is not None and len(hit[1]) == len(parts) and all(
                map(is_, map(_deref, hit[1]), parts)):
            return hit[0]
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
