"""The evaluation model: each Leaf's averaged parameter in place of its array."""

from __future__ import annotations

from typing import Any

from optimisers import backends
from optimisers.gather import pair
from optimisers.walk import place

__all__ = ["averaged"]


def averaged(tree: Any, model: Any) -> Any:
    """averaged(tree, model) -> a model with each Leaf's averaged parameter (``EMA``'s, any
    rule's ``averaged``) in place of its array; others keep theirs. Pure; ties kept.

    Raises:
        ValueError: the tree does not match the model, naming the path, as ``update``.

    Example:
        >>> from optimisers import EMA, Descent, setup, update
        >>> model = {"w": np.array([1.0]), "n": 3}
        >>> tree = setup(EMA(Descent(0.5), decay=0.9), model)
        >>> tree, model = update(tree, model, {"w": np.array([1.0])})
        >>> averaged(tree, model), model["w"]
        ({'w': array([0.95]), 'n': 3}, array([0.5]))
    """
    made: dict[int, Any] = {}
    for e in pair(tree, model):  # checked as update checks it
        avg = e.leaf.rule.averaged(e.leaf.state, e.x)
        if avg is not None:
            xp = backends.of(e.x)
            made[id(e.leaf)] = xp.like(xp.copy(avg), e.x)
    return place(tree, model, lambda leaf, x: made.get(id(leaf), x), inplace=False)
