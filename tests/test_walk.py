"""fmap and friends: structure kept, ties of mutable objects kept, immutables never tied."""

from __future__ import annotations

import dataclasses
import re
from collections import namedtuple

import numpy as np
import pytest

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


# ----------------------------------------------------------------------------- depth, cycles

DEEPEST = """
    import sys
    import numpy as np
    import optimisers as O
    lib, depth = sys.argv[1], int(sys.argv[2])
    if lib == "torch":
        import torch
        arr = lambda: torch.ones(2)
    elif lib == "jax":
        import jax.numpy as jnp
        arr = lambda: jnp.ones(2)
    else:
        arr = lambda: np.ones(2)

    def nest(x):
        for i in range(depth):
            x = [x] if i % 2 else {"k": x}
        return x

    model, grads = nest(arr()), nest(arr())
    try:
        tree = O.setup(O.EMA(O.Adam(0.1)), model)
    except ValueError as e:
        print("ValueError:", e)
        raise SystemExit
    tree, model = O.update(tree, model, grads)
    if lib != "jax":
        tree, model = O.update_(tree, model, grads)
        tree, model = O.update_(tree, model, grads)  # the plan's walks too
    O.averaged(tree, model)
    O.fmap(lambda v: v, model)
    O.reinit(tree, model)
    O.summary(tree)
    O.adjust(tree, 0.01)
    O.load_state_dict(tree, O.state_dict(tree))
    O.save(sys.argv[3], tree)
    back = O.load(sys.argv[3], like=tree)
    flat, re = O.destructure(model)
    re(flat)
    from optimisers.leaf import leaves
    print("walked", len(next(iter(leaves(back)))[0]))
"""


def walk_in_a_fresh_process(lib, depth, tmp_path):
    import subprocess
    import sys
    import textwrap

    done = subprocess.run([sys.executable, "-c", textwrap.dedent(DEEPEST), lib, str(depth),
                           str(tmp_path / "deep.ckpt")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_a_model_nested_to_the_limit_walks_everywhere_in_a_fresh_process(lib, tmp_path):
    """A model nested MAX_DEPTH containers deep walks through setup, both updates (and the
    plan), averaged, fmap, reinit, summary, adjust, state_dict, save and load and
    destructure in a fresh process, where the array library's backend is first imported
    at the bottom of the walk (before, 480 levels raised RecursionError there)."""
    pytest.importorskip(lib)
    assert walk_in_a_fresh_process(lib, O.walk.MAX_DEPTH, tmp_path) == (
        f"walked {O.walk.MAX_DEPTH}")


@pytest.mark.parametrize("depth", [O.walk.MAX_DEPTH + 1, 480, 5000])
def test_a_model_nested_past_the_limit_is_a_value_error_naming_the_path(depth, tmp_path):
    out = walk_in_a_fresh_process("numpy", depth, tmp_path)
    assert re.match(r"ValueError: the model is nested more than 100 containers deep: the "
                    r"(list|dict) at KeyPath\(('k', 0, 'k'|0, 'k', 0), \.\.\., "
                    r"(0, 'k', 0|'k', 0, 'k')\) \(100 keys down\)", out), out


def deep_tree(depth):
    """A state tree nested ``depth`` lists deep, made by hand (setup makes none deeper than
    MAX_DEPTH), with its model and gradients."""
    leaf = O.Leaf(O.Descent(0.1), None)
    tree, model, grads = leaf, np.ones(2), np.ones(2)
    for _ in range(depth):
        tree, model, grads = [tree], [model], [grads]
    return tree, model, grads


@pytest.mark.parametrize("call", ["update", "update_", "averaged", "reinit"])
def test_a_state_tree_nested_past_the_limit_is_a_value_error(call):
    """Hand-made state trees are walked with the model by update's gather, averaged's and
    reinit's: each refuses past MAX_DEPTH, naming the path, instead of recursing."""
    tree, model, grads = deep_tree(600)
    run = {"update": lambda: O.update(tree, model, grads),
           "update_": lambda: O.update_(tree, model, grads),
           "averaged": lambda: O.averaged(tree, model),
           "reinit": lambda: O.reinit(tree, model)}[call]
    with pytest.raises(ValueError, match=r"the state tree is nested more than 100 containers "
                                         r"deep: the list at KeyPath\(0, 0, 0, \.\.\., 0, 0, 0\)"
                                         r" \(100 keys down\)"):
        run()
    tree, model, grads = deep_tree(O.walk.MAX_DEPTH)
    O.update(tree, model, grads)
    O.averaged(tree, model)


@O.functor(trainable=("w",))
@dataclasses.dataclass
class Layer:
    w: object
    config: object


def test_a_cyclic_model_is_a_value_error_naming_the_cycle():
    """A model that contains itself recursed until RecursionError: setup, fmap and
    update's walk of the whole model (untrained children too) name where the cycle
    closes."""
    loop = {"w": np.ones(2), "more": []}
    loop["more"].append(loop)
    message = (r"the model contains itself: the dict at KeyPath\(\) is reached again at "
               r"KeyPath\('more', 0\), inside itself \(a cycle")
    with pytest.raises(ValueError, match=message):
        O.setup(O.Adam(), loop)
    with pytest.raises(ValueError, match=message):
        O.fmap(lambda v: v, loop)
    config: dict = {"n": 3}
    config["self"] = config  # an untrained child that setup does not walk
    model = {"layer": Layer(np.ones(2), config)}
    tree = O.setup(O.Descent(0.1), model)
    with pytest.raises(ValueError, match=r"the dict at KeyPath\('layer', 'config'\) is "
                                         r"reached again at KeyPath\('layer', 'config', "
                                         r"'self'\)"):
        O.update(tree, model, {"layer": {"w": np.ones(2)}})


def test_a_cyclic_torch_module_is_a_value_error():
    torch = pytest.importorskip("torch")
    seq = torch.nn.Sequential(torch.nn.Linear(2, 2))
    seq.add_module("again", seq)
    with pytest.raises(ValueError, match=r"the Sequential at KeyPath\(\) is reached again at "
                                         r"KeyPath\('again'\)"):
        O.setup(O.Adam(), seq)


def test_a_tie_is_not_a_cycle():
    """The same node at two paths, neither inside the other, is a tie, walked as before."""
    shared = {"w": np.ones(2)}
    model = {"a": shared, "b": [shared, {"c": shared}]}
    tree = O.setup(O.Descent(0.5), model)
    tree, model = O.update(tree, model, {"a": {"w": np.ones(2)}})
    assert tree["a"]["w"] is tree["b"][0]["w"] is tree["b"][1]["c"]["w"]
    assert model["a"] is model["b"][0] is model["b"][1]["c"]
    np.testing.assert_array_equal(model["a"]["w"], [0.5, 0.5])
