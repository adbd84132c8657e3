"""Flattening: all trainable parameters as one vector, and back."""

from __future__ import annotations

import itertools
from typing import Any

from optimisers import backends
from optimisers.keypath import KeyPath
from optimisers.state import walk_trainable
from optimisers.walk import mirror, place

__all__ = ["destructure", "Restructure", "trainables"]


def _index(model: Any) -> tuple[Any, list[tuple[KeyPath, Any]]]:
    """A mirror of ``model`` holding each trainable array's index, and ``(path, array)``s."""
    found: list[tuple[KeyPath, Any]] = []

    def mark(kp: KeyPath, x: Any) -> int:
        found.append((kp, x))
        return len(found) - 1

    return walk_trainable(mark, model, cache=True, build=mirror), found


class Restructure:
    """Restructure: the inverse of :func:`destructure`; ``re(v)`` rebuilds the model from ``v``.

    Each parameter gets its shape and dtype back, ties are restored and non-trainable
    parts kept; ``len(re)`` is the vector's length. Differentiable by the array library's
    autodiff (gradients through a tie accumulate).

    Example:
        >>> flat, re = destructure({"w": np.ones((2, 2)), "b": np.zeros(2)})
        >>> re
        Restructure(dict, ..., 6)
        >>> re(np.arange(6.0))["b"]
        array([4., 5.])
    """

    def __init__(self, model: Any, index: Any, params: list[Any]) -> None:
        self.model, self._index, self._params = model, index, params
        # where each parameter's segment of the vector ends
        self._stops = list(itertools.accumulate(backends.of(x).size(x) for x in params))
        self.length = self._stops[-1] if params else 0

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"Restructure({type(self.model).__name__}, ..., {self.length})"

    def __call__(self, flat: Any) -> Any:
        """re(flat) -> the model with its trainable parameters taken from ``flat`` (a
        ``ValueError`` unless a vector of length ``len(re)``)."""
        shape = getattr(flat, "shape", None)
        if shape is None or len(shape) != 1 or shape[0] != self.length:
            got = f"shape {tuple(shape)}" if shape is not None else f"a {type(flat).__name__}"
            raise ValueError(f"Restructure expected a 1-D vector of length {self.length}, "
                             f"got {got}")
        if not self._params:
            return self.model
        new = backends.of(flat).split(flat, self._stops, self._params)
        return place(self._index, self.model, lambda i, old: new[i])


def destructure(model: Any) -> tuple[Any, Restructure]:
    """destructure(model) -> (flat, re): every trainable parameter in one vector.

    ``flat`` is a 1-D array of the model's library holding each trainable array once, in
    walk order, in their common dtype. ``re(v)`` rebuilds the model (:class:`Restructure`).

    Example:
        >>> w = np.array([1.0, 2.0])
        >>> flat, re = destructure({"enc": w, "dec": w, "bias": np.array([3.0], np.float32)})
        >>> flat
        array([1., 2., 3.])
        >>> new = re(flat * 10)
        >>> new["enc"] is new["dec"], new["bias"].dtype
        (True, dtype('float32'))
    """
    index, found = _index(model)
    params = [x for _, x in found]
    xp = backends.of(params[0]) if params else backends.ops("numpy")
    return xp.concat(params, params), Restructure(model, index, params)


def trainables(model: Any, path: bool = False) -> list:
    """trainables(model, path=False) -> the trainable numeric arrays of ``model``, each once.

    In walk order; with ``path=True``, ``(KeyPath, array)`` pairs (a tie's first path).

    Example:
        >>> w = np.ones(2)
        >>> [str(kp) for kp, _ in trainables({"a": w, "b": w, "c": np.ones(1)}, path=True)]
        ['a', 'c']
    """
    _, found = _index(model)
    return found if path else [x for _, x in found]
