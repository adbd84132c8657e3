"""fmap and friends: structure kept, ties of mutable objects kept, immutables never tied."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import numpy as np

import optimisers as O

P = namedtuple("P", "w b")


def test_fmap_rebuilds_every_node_type():
    @dataclasses.dataclass
    class D:
        x: object

    model = {"t": (1.0, [2.0]), "p": P(3.0, 4.0), "d": D(5.0), "s": "keep"}
    out = O.fmap(lambda v: v * 2 if isinstance(v, float) else v, model)
    assert out == {"t": (2.0, [4.0]), "p": P(6.0, 8.0), "d": D(10.0), "s": "keep"}
    assert model["t"] == (1.0, [2.0])


def test_fmap_keeps_ties_of_mutable_objects_only():
    w = np.ones(2)
    ro = np.ones(2)
    ro.setflags(write=False)
    inner = [w]
    calls = []

    def f(v):
        calls.append(v)
        return v + 1 if isinstance(v, np.ndarray) else v

    out = O.fmap(f, {"a": w, "b": w, "c": ro, "d": ro, "l1": inner, "l2": inner})
    assert out["a"] is out["b"] and out["l1"] is out["l2"] and out["l1"][0] is out["a"]
    assert out["c"] is not out["d"]  # immutable: mapped twice
    assert sum(v is ro for v in calls) == 2 and sum(v is w for v in calls) == 1
    out = O.fmap(f, {"a": w, "b": w}, cache=False)
    assert out["a"] is not out["b"]


def test_fmap_with_companion_trees_and_paths():
    x = {"a": 1, "b": (2, 3)}
    y = {"a": 10, "b": (20, 30)}
    assert O.fmap(lambda u, v: u + v, x, y) == {"a": 11, "b": (22, 33)}
    seen = O.fmap_with_path(lambda kp, u, v: (str(kp), v), x, {"b": (None, 7)})
    assert seen == {"a": ("a", None), "b": (("b.0", None), ("b.1", 7))}


def test_fmap_exclude_stops_early():
    out = O.fmap(lambda v: "T", {"a": (1, 2), "b": [3]}, exclude=lambda v: isinstance(v, tuple)
                 or O.isleaf(v))
    assert out == {"a": "T", "b": ["T"]}


def test_fmapstructure_and_fleaves():
    w = np.zeros(1)
    m = [P(w, 1.0), {"x": w}]
    assert O.fmapstructure(lambda v: 0, m) == [{"w": 0, "b": 0}, {"x": 0}]
    leaves = O.fleaves(m)
    assert len(leaves) == 2 and leaves[0] is w
