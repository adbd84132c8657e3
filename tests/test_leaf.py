"""The Leaf record and the one walk of a state tree (nodes, leaves, map_leaves)."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref

import numpy as np
import pytest

import optimisers as O
from optimisers.leaf import Leaf, leaves, map_leaves, nodes
from optimisers.state import plan_of


def test_leaf_is_a_plain_record():
    leaf = Leaf(O.Descent(), None)
    assert (leaf.rule, leaf.state, leaf.frozen) == (O.Descent(), None, False)
    leaf.rule, leaf.state, leaf.frozen = O.Adam(), (1, 2), True
    assert (leaf.rule, leaf.state, leaf.frozen) == (O.Adam(), (1, 2), True)
    assert not hasattr(leaf, "__dict__")
    assert not any(isinstance(v, property) for v in vars(Leaf).values())


def deep(n):
    tree = Leaf(O.Descent(), None)
    for i in range(n):
        tree = [tree] if i % 2 else {"k": tree}
    return tree


def test_a_tree_of_any_depth_walks_and_maps():
    tree = deep(3000)
    ((kp, leaf),) = leaves(tree)
    assert len(kp) == 3000 and O.getkeypath(tree, kp) is leaf
    mapped = map_leaves(lambda leaf: 7, tree)
    assert O.getkeypath(mapped, kp) == 7
    assert O.plan.first_leaf(tree) is leaf


def test_the_walk_is_lazy_and_in_order():
    a, b = Leaf(O.Descent(), None), Leaf(O.Descent(), None)
    bad = [{"x": None, "y": (a,)}, [], b, np.ones(2)]
    walked = nodes(bad)
    assert [str(kp) for kp, _ in (next(walked) for _ in range(7))] == [
        "", "0", "0.x", "0.y", "0.y.0", "1", "2"]
    with pytest.raises(TypeError, match=r"found an array at KeyPath\(3\)"):
        next(walked)
    assert O.plan.first_leaf(bad) is a  # found before the array is reached


def test_map_leaves_rebuilds_plain_containers():
    a = Leaf(O.Descent(), None)
    tree = {"t": (a, None), "l": [[], a], "d": {}, "n": None}
    out = map_leaves(lambda leaf: leaf is a, tree)
    assert out == {"t": (True, None), "l": [[], True], "d": {}, "n": None}
    assert map_leaves(id, a) == id(a) and map_leaves(id, None) is None


def stepped():
    model = {"enc": np.ones(3), "dec": [np.ones(3), np.ones(3)]}
    model["tied"] = model["enc"]
    tree = O.setup(O.Adam(0.1), model)
    grads = O.fmap(np.ones_like, model)
    for _ in range(2):
        O.update_(tree, model, grads)
    assert plan_of(tree) is not None
    return tree, model


def test_copies_of_a_stepped_tree_are_plain_trees():
    """A copy or a pickle holds the Leafs' values only: not update_'s lock and plan."""
    tree, model = stepped()
    for back in (copy.deepcopy(tree), pickle.loads(pickle.dumps(tree))):
        assert back["enc"] is back["tied"] and back["enc"] is not tree["enc"]
        assert plan_of(back) is None
        np.testing.assert_array_equal(back["enc"].state[0], tree["enc"].state[0])
        assert back["dec"][1].rule == O.Adam(0.1)
    assert copy.copy(tree["enc"]).state is tree["enc"].state


def test_a_dropped_tree_is_freed_with_its_plan():
    """update_ keeps its lock and plan on the tree's first Leaf: they hold the tree, and go
    with it (a table keyed by the Leaf would keep every tree ever stepped)."""
    tree, model = stepped()
    gone = [weakref.ref(a) for a in (model["enc"], tree["enc"].state[0].base)]
    del tree, model
    gc.collect()
    assert all(ref() is None for ref in gone)
