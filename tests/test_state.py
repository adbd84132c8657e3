"""setup, update and update_: the state tree, gradient trees, ties and errors."""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from typing import Any

import numpy as np
import pytest

import optimisers as O
from conftest import fitting, rules_param

P = namedtuple("P", "w b")


@dataclasses.dataclass
class Dense:
    w: object
    b: object
    act: object = np.tanh


def mlp():
    return {"layers": [Dense(np.ones((2, 3)), np.zeros(3)), Dense(np.ones((3, 1)), np.zeros(1))],
            "scale": P(np.ones(1), 2), "steps": np.arange(3), "name": "mlp"}


def test_setup_mirrors_the_model():
    tree = O.setup(O.Adam(), mlp())
    assert set(tree) == {"layers", "scale", "steps", "name"}
    assert isinstance(tree["layers"], list) and isinstance(tree["layers"][0], dict)
    assert isinstance(tree["layers"][0]["w"], O.Leaf) and tree["layers"][0]["act"] is None
    assert isinstance(tree["scale"]["w"], O.Leaf) and tree["scale"]["b"] is None
    assert tree["steps"] is None and tree["name"] is None
    assert tree["layers"][0]["w"].state[0].shape == (2, 3)
    assert isinstance(O.setup(O.Descent(), (np.ones(1), 1)), tuple)
    assert isinstance(O.setup(O.Descent(), np.ones(1)), O.Leaf)


def test_setup_warns_without_trainable_parameters():
    with pytest.warns(UserWarning, match="no trainable parameter"):
        O.setup(O.Adam(), {"a": 1, "b": np.arange(2)})


def test_setup_refuses_a_non_rule():
    with pytest.raises(TypeError, match=r"takes a Rule first, got dict"):
        O.setup({"w": np.ones(1)}, O.Adam())


def test_update_is_pure():
    model = mlp()
    before = {"w0": model["layers"][0].w.copy(), "b1": model["layers"][1].b.copy()}
    tree = O.setup(O.Adam(0.1), model)
    m0 = tree["layers"][0]["w"].state[0].copy()
    grads = O.fmap(lambda x: np.ones_like(x) if O.isnumeric(x) else None, model)
    new_tree, new = O.update(tree, model, grads)
    np.testing.assert_array_equal(model["layers"][0].w, before["w0"])
    np.testing.assert_array_equal(model["layers"][1].b, before["b1"])
    np.testing.assert_array_equal(tree["layers"][0]["w"].state[0], m0)
    assert new_tree["layers"][0]["w"] is not tree["layers"][0]["w"]
    assert not np.array_equal(new["layers"][0].w, before["w0"])
    assert new["steps"] is model["steps"] and new["name"] == "mlp"
    assert type(new["layers"][0]) is Dense and new["layers"][0].act is np.tanh


def test_update_in_place_returns_the_same_model():
    model = mlp()
    w = model["layers"][0].w
    tree = O.setup(O.Descent(0.5), model)
    tree, new = O.update_(tree, model, {"layers": [{"w": np.ones((2, 3))}, None]})
    assert new is model and new["layers"][0].w is w and w[0, 0] == 0.5


@pytest.mark.parametrize("grads", [
    {"layers": [Dense(np.ones((2, 3)), None, None), None]},      # the model's own classes
    {"layers": [{"w": np.ones((2, 3))}, None]},                    # dicts for any node
    {"layers": {0: {"w": np.ones((2, 3)), "b": None}}},            # dict for a list too
    {"layers": [{"w": np.ones((2, 3)), "act": "ignored"}, {}], "steps": np.ones(3)},
])
def test_gradient_tree_forms(grads):
    model = mlp()
    tree = O.setup(O.Descent(1.0), model)
    _, new = O.update(tree, model, grads)
    assert (new["layers"][0].w == 0).all()
    assert (new["layers"][0].b == 0).all() and (new["layers"][1].w == 1).all()


def test_none_gradient_leaves_state_untouched():
    model = {"a": np.ones(2), "b": np.ones(2)}
    tree = O.setup(O.Momentum(0.1), model)
    tree, model = O.update_(tree, model, {"a": np.ones(2), "b": None})
    assert (tree["b"].state == 0).all() and (tree["a"].state == 0.1).all()
    tree, model = O.update_(tree, model, None)
    assert (model["a"] == 0.9).all()


def test_gradients_are_cast_to_the_parameter_dtype():
    model = [np.ones(2, np.float32)]
    tree = O.setup(O.Adam(), model)
    tree, new = O.update(tree, model, [np.ones(2, np.float64)])
    assert new[0].dtype == np.float32 and tree[0].state[0].dtype == np.float32
    _, new = O.update(tree, model, [np.ones(2, int)])
    assert new[0].dtype == np.float32


# ---------------------------------------------------------------- ties


def tied_model():
    w = np.array([1.0, 2.0])
    return {"enc": Dense(w, np.zeros(2)), "dec": Dense(w, np.zeros(2)), "w": w}, w


@rules_param()
def test_tied_parameters_share_one_leaf_and_stay_tied(rule):
    model, w = tied_model()
    tree = O.setup(fitting(rule), model)
    assert tree["enc"]["w"] is tree["dec"]["w"] is tree["w"]
    g = {"enc": {"w": np.array([1.0, 0.0])}, "dec": {"w": np.array([0.0, 2.0])}}
    new_tree, new = O.update(tree, model, g)
    assert new["enc"].w is new["dec"].w is new["w"]
    assert new_tree["enc"]["w"] is new_tree["dec"]["w"]
    tree, same = O.update_(tree, model, g)
    assert same["enc"].w is w and same["dec"].w is w
    np.testing.assert_array_equal(new["w"], w)


def test_tied_gradients_are_summed_once():
    model, w = tied_model()
    tree = O.setup(O.Descent(1.0), model)
    g = {"enc": {"w": np.array([1.0, 0.0])}, "dec": {"w": np.array([0.0, 2.0])},
         "w": np.array([0.5, 0.5])}
    _, new = O.update(tree, model, g)
    assert new["w"].tolist() == [-0.5, -0.5]
    # the rule ran once: Momentum's velocity saw the summed gradient once
    tree = O.setup(O.Momentum(1.0, 0.0), model)
    tree, _ = O.update_(tree, model, g)
    assert tree["w"].state.tolist() == [1.5, 2.5]


def test_mutable_containers_stay_tied():
    shared = [np.ones(2)]
    model = {"a": shared, "b": shared}
    tree = O.setup(O.Descent(), model)
    _, new = O.update(tree, model, {"a": [np.ones(2)]})
    assert new["a"] is new["b"] and new["a"] is not shared


def test_immutable_values_are_never_tied():
    ro = np.ones(2)
    ro.setflags(write=False)
    model = {"a": ro, "b": ro}
    tree = O.setup(O.Descent(1.0), model)
    assert tree["a"] is not tree["b"]
    tree, new = O.update_(tree, model, {"a": np.ones(2)})
    assert new["a"].tolist() == [0.0, 0.0] and new["b"] is ro and ro.tolist() == [1.0, 1.0]


def test_frozen_leaves_are_skipped():
    model = {"a": np.ones(2), "b": np.ones(2)}
    tree = O.freeze_(O.setup(O.Adam(0.1), model), "a")
    tree, model = O.update_(tree, model, {"a": np.ones(2), "b": np.ones(2)})
    assert (model["a"] == 1).all() and (model["b"] < 1).all()
    assert "frozen=True" in repr(tree["a"])
    O.thaw_(tree)
    tree, model = O.update_(tree, model, {"a": np.ones(2), "b": np.ones(2)})
    assert (model["a"] < 1).all()


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("grads,error,match", [
    ({"layers": [{"w": np.ones((3, 2))}, None]}, ValueError,
     r"gradient at KeyPath\('layers', 0, 'w'\) has shape \(3, 2\) but the parameter has "
     r"shape \(2, 3\)"),
    ({"layers": [None, {"w": np.ones((3, 1)), "bias": np.ones(1)}]}, ValueError,
     r"gradient at KeyPath\('layers', 1\) has key 'bias', which the model lacks"),
    ({"layers": [{"w": np.ones((2, 3))}]}, ValueError,
     r"gradient at KeyPath\('layers',?\) has 1 children but the model has 2"),
    ({"layers": np.ones(2)}, ValueError,
     r"gradient at KeyPath\('layers',?\) is an array .* structure does not match"),
    ({"layers": [{"w": {"x": np.ones(1)}}, None]}, ValueError,
     r"gradient at KeyPath\('layers', 0, 'w'\) is a dict with children"),
    ({"layers": [{"w": "oops"}, None]}, TypeError,
     r"gradient at KeyPath\('layers', 0, 'w'\) is a str, but an array of shape \(2, 3\)"),
    ({"layers": [{"w": np.array([["a"] * 3] * 2)}, None]}, TypeError,
     r"has dtype <U1, which is not a number type"),
    ({"nonsense": 1}, ValueError, r"gradient at KeyPath\(\) has key 'nonsense'"),
])
def test_bad_gradients_name_the_path_and_write_nothing(grads, error, match):
    model = mlp()
    tree = O.setup(O.Momentum(0.1), model)
    # every Leaf's gradient valid but the bad one, so that a partial write would show
    full = O.fmap(lambda x: np.ones_like(x) if O.isnumeric(x) else None, model)
    tree, model = O.update_(tree, model, full)
    snapshot = {kp: leaf.state.copy() for kp, leaf in O.state.leaves(tree)}
    w0 = model["layers"][0].w.copy()
    with pytest.raises(error, match=match):
        O.update_(tree, model, {**full, **grads} if "nonsense" not in grads else grads)
    for kp, leaf in O.state.leaves(tree):
        np.testing.assert_array_equal(leaf.state, snapshot[kp])
    np.testing.assert_array_equal(model["layers"][0].w, w0)


def test_errors_about_many_keys_stay_short():
    """A gradient, tree or path wrong at a node of 2,000 children names the first keys and
    how many there are, not all 2,000."""
    model = [np.ones(1) for _ in range(2000)]
    tree = O.setup(O.Descent(), model)
    with pytest.raises(ValueError,
                       match=r"are \[0, 1, 2, 3, 4, 5, 6, 7, \.\.\. \(2000 in all\)\]$"):
        O.update(tree, model, [np.ones(1)] * 2001)
    with pytest.raises(ValueError, match=r"has keys \[0, .* 7, \.\.\. \(1999 in all\)\], but "):
        O.update(tree[:-1], model, [np.ones(1)] * 2000)
    with pytest.raises(KeyError, match=r"its keys are \[0, .*, 7, \.\.\. \(2000 in all\)\]'$"):
        O.getkeypath(model, O.KeyPath(5000))


def test_model_passed_as_tree():
    model = {"w": np.ones(2)}
    tree = O.setup(O.Adam(), model)
    with pytest.raises(TypeError, match=r"found an array at KeyPath\('w'\); pass the state tree "
                                        r"first: update\(tree, model, grads\)"):
        O.update(model, tree, model)
    with pytest.raises(TypeError, match="expected a state tree"):
        O.freeze_(model)
    with pytest.raises(TypeError, match="expected a state tree"):
        O.adjust(model, 0.1)


def test_tree_that_does_not_match_the_model():
    tree = O.setup(O.Adam(), {"w": np.ones(2), "b": np.ones(2)})
    with pytest.raises(ValueError, match=r"the state tree at KeyPath\(\) has keys \['w', 'b'\], "
                                         r"but the model has \['w'\]"):
        O.update(tree, {"w": np.ones(2)}, {"w": np.ones(2)})
    with pytest.raises(ValueError, match=r"state tree has a Leaf at KeyPath\('b'\), but the "
                                         r"model has a str there"):
        O.update(tree, {"w": np.ones(2), "b": "x"}, {"w": np.ones(2)})


def test_update_needs_gradients_except_for_torch():
    model = {"w": np.ones(2)}
    with pytest.raises(TypeError, match="needs the gradients; only a torch.nn.Module"):
        O.update_(O.setup(O.Adam(), model), model)


def test_rule_errors_name_the_path():
    model = {"w": np.array([1.0, 2.0])}
    tree = O.setup(O.ClipNorm(), model)
    with pytest.raises(FloatingPointError, match=r"norm is inf.*at KeyPath\('w'\)"):
        O.update_(tree, model, {"w": np.array([np.inf, 0.0])})


@pytest.mark.parametrize("edit", ["delete", "replace", "append"])
def test_model_edited_between_steps_is_seen(edit):
    """update_ caches what it learned about (tree, model); an edit of the model between
    steps must send it back to the full check, with the path in the error."""
    model = {"a": np.ones(2), "b": [np.ones(2)]}
    tree = O.setup(O.Descent(0.1), model)
    for _ in range(2):
        O.update_(tree, model, {"a": np.ones(2)})
    if edit == "delete":
        del model["b"]
        err = "has keys"
    elif edit == "replace":
        model["a"] = np.ones(3)
        err = "shape"
    else:
        model["b"].append(np.ones(2))
        err = "b"
    with pytest.raises(ValueError, match=err):
        O.update_(tree, model, {"a": np.ones(2)})


@pytest.mark.parametrize("kind", [list, tuple, dict])
@pytest.mark.parametrize("edit", ["leaf", "none", "array"])
def test_tree_edited_between_steps_is_seen(kind, edit):
    """The plan compares a tree node whose children are all Leafs in one ``==`` (a Leaf
    equals only itself): a Leaf put in another's place, or None, steps as the uncached
    update_ would, and an array there is the uncached error, not one of ``==``."""
    def run(cached):
        arrays = [np.full(2, 1.0), np.full(2, 2.0)]
        model = {"n": dict(zip("pq", arrays)) if kind is dict else kind(arrays)}
        tree = O.setup(O.Momentum(0.1), model)
        grads = O.fmap(np.ones_like, model)
        for _ in range(2 if cached else 0):
            O.update_(tree, model, grads)
        new = {"leaf": O.Leaf(O.Descent(0.5), None), "none": None, "array": np.ones(2)}[edit]
        if kind is tuple:
            tree["n"] = (tree["n"][0], new)
        else:
            tree["n"]["q" if kind is dict else 1] = new
        if edit == "array":
            with pytest.raises(TypeError, match=r"expected a state tree .* found an array"):
                O.update_(tree, model, grads)
            return None
        for _ in range(2):
            O.update_(tree, model, grads)
        return [model["n"][k].copy() for k in ("pq" if kind is dict else range(2))]

    cached, fresh = run(True), run(False)
    if edit != "array":
        steps = {"leaf": 0.5 * 2, "none": 0.0}[edit]
        np.testing.assert_allclose(fresh[1], 2.0 - steps)  # the edit took effect
        np.testing.assert_allclose(cached[1], 2.0 - 0.1 - 0.19 - steps)  # after 2 steps


@pytest.mark.parametrize("bad", ["short", "long", "tuple", "none", "shape"])
def test_list_gradients_checked_on_every_cached_step(bad):
    """A list of arrays' gradients are read by one slice once the plan is known; a
    gradient list unlike the model's must still get the full check and its error."""
    model = [np.ones(2), np.ones(2), np.ones(2)]
    tree = O.setup(O.Descent(0.5), model)
    for _ in range(2):
        O.update_(tree, model, [np.ones(2)] * 3)
    g = {"short": [np.ones(2)] * 2, "long": [np.ones(2)] * 4, "tuple": (np.ones(2),) * 3,
         "none": [np.ones(2), None, np.ones(2)], "shape": [np.ones(2), np.ones(3), np.ones(2)]}
    if bad in ("none", "tuple"):  # accepted: as the full check on a fresh tree does
        fresh = [np.zeros(2), np.zeros(2), np.zeros(2)]
        O.update_(O.setup(O.Descent(0.5), fresh), fresh, g[bad])
        O.update_(tree, model, g[bad])
        assert [x.tolist() for x in model] == [x.tolist() for x in fresh]
        return
    before = [x.copy() for x in model]
    with pytest.raises((ValueError, TypeError)):
        O.update_(tree, model, g[bad])
    assert all((x == y).all() for x, y in zip(model, before))


@dataclasses.dataclass
class _Three:
    a: Any
    b: Any
    c: Any


@pytest.mark.parametrize("kind", ["dict", "dataclass"])
@pytest.mark.parametrize("grads", ["all", "missing", "none", "extra"])
def test_node_gradients_read_on_every_cached_step(kind, grads):
    """Once the plan is known, a node's gradients are read by one getter call; a dict
    with a key left out, a None, or a key the model lacks must act as on a fresh tree."""
    def make():
        arrays = [np.full(2, 1.0), np.full(2, 2.0), np.full(2, 3.0)]
        return dict(zip("abc", arrays)) if kind == "dict" else _Three(*arrays)

    g = {"all": {"a": np.ones(2), "b": np.ones(2), "c": np.ones(2)},
         "missing": {"a": np.ones(2), "c": np.ones(2)},
         "none": {"a": np.ones(2), "b": None, "c": np.ones(2)},
         "extra": {"a": np.ones(2), "d": np.ones(2)}}[grads]
    if kind == "dataclass" and grads in ("all", "none"):
        g = _Three(**g)
    model, fresh = make(), make()
    tree, fresh_tree = O.setup(O.Descent(0.5), model), O.setup(O.Descent(0.5), fresh)
    full = {"a": np.ones(2), "b": np.ones(2), "c": np.ones(2)}
    for _ in range(2):  # learn the plan
        O.update_(tree, model, full if kind == "dict" else _Three(**full))
        O.update_(fresh_tree, fresh, full if kind == "dict" else _Three(**full))
    if grads == "extra":
        with pytest.raises(ValueError, match="'d', which the model lacks"):
            O.update_(tree, model, g)
        return
    O.update_(tree, model, g)
    _, expected = O.update(O.setup(O.Descent(0.5), fresh), fresh, g)
    values = (lambda m: [m[k] for k in "abc"]) if kind == "dict" else (
        lambda m: [m.a, m.b, m.c])
    assert [x.tolist() for x in values(model)] == [x.tolist() for x in values(expected)]


def test_plan_of_follows_the_tree():
    """update_ keeps one plan per tree: made at the first step, kept while the same tree and
    model come back, made anew for another tree whose first Leaf is the same."""
    model = {"a": np.ones(3), "b": np.ones(3)}
    tree = O.setup(O.Momentum(), model)
    grads = O.fmap(np.ones_like, model)
    assert O.state.plan_of(tree) is None
    O.update(tree, model, grads)
    assert O.state.plan_of(tree) is None  # the pure update keeps nothing
    O.update_(tree, model, grads)
    plan = O.state.plan_of(tree)
    O.update_(tree, model, grads)
    assert O.state.plan_of(tree) is plan and plan.tree is tree
    sub = {"a": tree["a"]}
    O.update_(sub, {"a": model["a"]}, {"a": grads["a"]})
    assert O.state.plan_of(tree) is O.state.plan_of(sub) is not plan
