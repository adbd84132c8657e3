"""Starting part of a state tree afresh, after a layer was resized or replaced."""

from __future__ import annotations

from typing import Any

from optimisers.adjust import Where, select
from optimisers.fast import fused
from optimisers.gather import gather
from optimisers.leaf import Leaf, map_leaves
from optimisers.state import setup

__all__ = ["reinit"]


def reinit(tree: Any, model: Any, where: Where = None) -> Any:
    """reinit(tree, model, where=None) -> tree with the Leafs ``where`` picks made afresh.

    After a parameter changed shape, ``update`` refuses its Leaf; ``reinit`` gives each
    picked Leaf ``rule.init(x)`` for the array now at its path, keeping its rule and
    frozen flag. Other Leafs are kept as they are. Pure.

    Args:
        tree: the state tree, whose structure still matches ``model``.
        model: the model as it is now.
        where: which Leafs, as in :func:`adjust`; ``None``: all.

    Returns:
        The new state tree.

    Raises:
        ValueError: when ``where`` picks no Leaf, or the tree does not match the model.

    Example:
        >>> from optimisers import Adam, setup, update_
        >>> model = {"w": np.ones(3), "b": np.zeros(1)}
        >>> tree = setup(Adam(), model)
        >>> model["w"] = np.ones(5)  # resized after setup
        >>> tree = reinit(tree, model, where="w")
        >>> tree["w"]
        Leaf(Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-08), (f64[5], f64[5], 0.0))
    """
    picked = {id(leaf) for leaf in select(tree, where)}
    arrays = {id(e.leaf): e.x for e in gather(tree, model, ())}  # checked as update checks
    made: list[Leaf] = []

    def renew(leaf: Leaf) -> Leaf:
        if id(leaf) not in picked:
            return leaf
        made.append(setup(leaf.rule, arrays[id(leaf)]))  # a Leaf: the array is numeric
        made[-1].frozen = leaf.frozen
        return made[-1]

    new_tree = map_leaves(renew, tree)
    fused.pack(made)
    return new_tree
