"""The evaluation model: each Leaf's averaged parameter in place of its array."""

from __future__ import annotations

from typing import Any

from optimisers import backends
from optimisers.walk import place

__all__ = ["averaged"]


def averaged(tree: Any, model: Any) -> Any:
    """averaged(tree, model) -> a model with each Leaf's averaged parameter in place of its
    array: :class:`~optimisers.EMA`'s moving average (any rule's ``averaged``); Leafs
    without one keep their array. Pure: the average is copied, ``model`` and ``tree`` are
    not changed, and a tied parameter gets one array at all its paths.

    Example:
        >>> import numpy as np
        >>> from optimisers import EMA, Descent, setup, update
        >>> model = {"w": np.array([1.0]), "n": 3}
        >>> tree = setup(EMA(Descent(0.5), decay=0.9), model)
        >>> tree, model = update(tree, model, {"w": np.array([1.0])})
        >>> averaged(tree, model), model["w"]
        ({'w': array([0.95]), 'n': 3}, array([0.5]))
    """
    made: dict[int, Any] = {}

    def value(leaf: Any, x: Any) -> Any:
        if id(leaf) not in made:
            avg = leaf.rule.averaged(leaf.state, x)
            xp = backends.of(x)
            made[id(leaf)] = x if avg is None else xp.like(xp.copy(avg), x)
        return made[id(leaf)]

    return place(tree, model, value, inplace=False)
