"""save / load: identity, bit-for-bit resume, mismatches, damaged files, pickle, atomicity."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import pickle
import struct
import warnings
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ALL_RULES, fitting, rule_id
from optimisers import (
    AccumGrad,
    Adam,
    ClipGrad,
    ClipNorm,
    Descent,
    Leaf,
    MixedPrecision,
    Momentum,
    Nesterov,
    OptimiserChain,
    RAdam,
    RMSProp,
    Rprop,
    Rule,
    adjust_,
    backends,
    fmap,
    freeze_,
    isnumeric,
    load,
    save,
    select,
    setup,
    update,
    update_,
)

DAMAGED = (r"not an intact optimisers checkpoint|checkpoint is damaged|checkpoint is "
           r"malformed|not an optimisers checkpoint")


# ----------------------------------------------------------------------------- helpers


def as_numpy(a: Any) -> np.ndarray:
    """Any library's array as NumPy, bfloat16 as its bits."""
    lib = backends.library(a)
    if lib == "torch":
        import torch

        t = a.detach().cpu()
        return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
    return np.asarray(a)


def assert_same_state(x: Any, y: Any, where: str = "state") -> None:
    """Equal bit for bit: arrays by library, device, dtype, shape and bytes; numbers by type
    and bits (so -0.0, nan and 0.1 + 0.2 are told apart)."""
    lib = backends.library(x)
    if lib is not None or isinstance(x, np.generic):
        assert type(x) is type(y), where
        assert str(x.dtype) == str(y.dtype) and tuple(x.shape) == tuple(y.shape), where
        assert getattr(x, "device", None) == getattr(y, "device", None), where
        assert getattr(x, "weak_type", None) == getattr(y, "weak_type", None), where
        assert as_numpy(x).tobytes() == as_numpy(y).tobytes(), where
    elif isinstance(x, (tuple, list)):
        assert type(x) is type(y) and len(x) == len(y), where
        for i, (a, b) in enumerate(zip(x, y)):
            assert_same_state(a, b, f"{where}[{i}]")
    elif isinstance(x, dict):
        assert type(y) is dict and list(x) == list(y), where
        for k in x:
            assert_same_state(x[k], y[k], f"{where}[{k!r}]")
    elif isinstance(x, float):
        assert type(y) is float and struct.pack("<d", x) == struct.pack("<d", y), where
    elif isinstance(x, complex):
        assert type(y) is complex, where
        assert_same_state(x.real, y.real, where)
        assert_same_state(x.imag, y.imag, where)
    else:
        assert type(x) is type(y) and x == y, where


def assert_same_tree(a: Any, b: Any) -> None:
    """Same structure, rules, frozen flags, states and sharing (as a bijection of Leafs)."""
    pairs: dict[int, int] = {}
    back: dict[int, int] = {}

    def go(x: Any, y: Any, kp: tuple) -> None:
        if isinstance(x, Leaf):
            assert isinstance(y, Leaf), kp
            assert pairs.setdefault(id(x), id(y)) == id(y), f"sharing differs at {kp}"
            assert back.setdefault(id(y), id(x)) == id(x), f"sharing differs at {kp}"
            assert type(x.rule) is type(y.rule) and x.rule == y.rule, kp
            assert x.frozen is y.frozen, kp
            assert_same_state(x.state, y.state, f"{kp} state")
        elif isinstance(x, dict):
            assert type(y) is type(x) and set(x) == set(y), kp
            for k in x:
                go(x[k], y[k], kp + (k,))
        elif isinstance(x, (tuple, list)):
            assert type(x) is type(y) and len(x) == len(y), kp
            for i, (u, v) in enumerate(zip(x, y)):
                go(u, v, kp + (i,))
        else:
            assert x is None and y is None, kp

    go(a, b, ())


def model_of(rng: np.random.Generator, dtype: Any = np.float32) -> dict:
    """A small model: a tied weight, a float64 bias, a non-trainable integer array, a string."""
    w = rng.standard_normal((3, 2)).astype(dtype)
    return {"enc": {"w": w, "b": rng.standard_normal(2).astype(np.float64)},
            "dec": [w, rng.standard_normal(4).astype(dtype)],
            "steps": np.arange(3), "name": "net"}


def grads_of(model: dict, step: int) -> dict:
    """Deterministic gradients for ``model_of``'s models, in the parameters' dtypes."""
    r = np.random.default_rng(1000 + step)

    def g(x: np.ndarray) -> np.ndarray:
        return r.standard_normal(x.shape).astype(x.dtype)

    return {"enc": {"w": g(model["enc"]["w"]), "b": g(model["enc"]["b"])},
            "dec": [g(model["dec"][0]), g(model["dec"][1])]}


def train(tree: Any, model: Any, steps: range) -> tuple[Any, Any]:
    for s in steps:
        tree, model = update_(tree, model, grads_of(model, s))
    return tree, model


def rewrite(path: Any, replace: dict[str, bytes]) -> None:
    """Rewrite a checkpoint with some members replaced (or added)."""
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members.update(replace)
    with zipfile.ZipFile(path, "w") as zf:
        for n, data in members.items():
            zf.writestr(n, data)


def edit_json(path: Any, change: Any) -> None:
    with zipfile.ZipFile(path) as zf:
        doc = json.loads(zf.read("checkpoint.json"))
    change(doc)
    rewrite(path, {"checkpoint.json": json.dumps(doc).encode()})


@pytest.fixture
def ckpt(tmp_path: Any) -> Any:
    return tmp_path / "opt.ckpt"


@pytest.fixture
def trained(ckpt: Any) -> tuple[Any, Any]:
    """A model, its tree after 3 Adam steps, saved at ``ckpt``."""
    model = model_of(np.random.default_rng(0))
    tree, model = train(setup(Adam(0.01), model), model, range(3))
    save(ckpt, tree)
    return tree, model


# ----------------------------------------------------------------------------- identity


@pytest.mark.parametrize("rule", ALL_RULES, ids=rule_id)
def test_save_load_is_identity(rule: Rule, ckpt: Any) -> None:
    model = model_of(np.random.default_rng(0))
    tree, model = train(setup(fitting(rule), model), model, range(3))
    save(ckpt, tree)
    back = load(ckpt, like=setup(fitting(rule), model))
    assert_same_tree(tree, back)
    assert back["enc"]["w"] is back["dec"][0]  # the tie is one Leaf
    assert back["steps"] is None and back["name"] is None


@pytest.mark.parametrize("rule", ALL_RULES, ids=rule_id)
def test_resume_is_bit_for_bit(rule: Rule, ckpt: Any) -> None:
    start = model_of(np.random.default_rng(1))
    tree_a, model_a = train(setup(fitting(rule), copy.deepcopy(start)), copy.deepcopy(start),
                            range(7))

    model_b = copy.deepcopy(start)
    tree_b, model_b = train(setup(fitting(rule), model_b), model_b, range(3))
    save(ckpt, tree_b)
    del tree_b
    tree_b, model_b = train(load(ckpt, like=setup(fitting(rule), model_b)), model_b,
                            range(3, 7))

    assert_same_tree(tree_a, tree_b)
    for x, y in [(model_a["enc"]["w"], model_b["enc"]["w"]), (model_a["enc"]["b"],
                 model_b["enc"]["b"]), (model_a["dec"][1], model_b["dec"][1])]:
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    assert model_b["dec"][0] is model_b["enc"]["w"]


@pytest.mark.parametrize("inner", [
    Adam(0.01), RAdam(0.01), Rprop(0.01), OptimiserChain(AccumGrad(3), Adam(0.01)),
    OptimiserChain(ClipNorm(1.0), Nesterov(0.01)), OptimiserChain(AccumGrad(5), Momentum(0.01)),
], ids=rule_id)
def test_resume_mixed_precision_mid_accumulation_frozen_adjusted_tied(inner: Rule,
                                                                      ckpt: Any) -> None:
    """float16 parameters through MixedPrecision, a frozen sub-tree (holding a tied weight),
    an adjusted learning rate, and AccumGrad saved between two of its accumulations."""
    rule = MixedPrecision(inner)
    start = model_of(np.random.default_rng(2), np.float16)

    def run(model: Any, tree: Any, steps: range) -> tuple[Any, Any]:
        for s in steps:
            if s == 2:
                freeze_(tree["enc"])
                adjust_(tree, 0.003)
            tree, model = update_(tree, model, grads_of(model, s))
        return tree, model

    model_a = copy.deepcopy(start)
    tree_a, model_a = run(model_a, setup(rule, model_a), range(11))

    model_b = copy.deepcopy(start)
    tree_b, model_b = run(model_b, setup(rule, model_b), range(4))
    save(ckpt, tree_b)
    loaded = load(ckpt, like=setup(rule, model_b))  # like: fresh, default eta, unfrozen
    assert loaded["enc"]["b"].frozen and loaded["dec"][0].frozen
    assert not loaded["dec"][1].frozen
    assert loaded["dec"][1].rule == tree_b["dec"][1].rule != rule
    if isinstance(inner, OptimiserChain) and isinstance(inner.rules[0], AccumGrad):
        counter = loaded["dec"][1].state[1][0][1]
        assert counter == 4 % inner.rules[0].n + 1 != 1  # mid-accumulation
    tree_b, model_b = run(model_b, loaded, range(4, 11))

    assert_same_tree(tree_a, tree_b)
    assert model_a["enc"]["w"].dtype == np.float16
    for k in ("w", "b"):
        assert model_a["enc"][k].tobytes() == model_b["enc"][k].tobytes()
    assert model_a["dec"][1].tobytes() == model_b["dec"][1].tobytes()
    assert model_a["dec"][1].tobytes() != start["dec"][1].tobytes()


def test_resume_with_pure_update(ckpt: Any) -> None:
    rule = OptimiserChain(AccumGrad(2), RAdam(0.01))
    model = model_of(np.random.default_rng(3))
    tree = setup(rule, model)
    trees = []
    for s in range(6):
        tree, model = update(tree, model, grads_of(model, s))
        trees.append((tree, model))
    save(ckpt, trees[2][0])
    tree, model = load(ckpt, like=setup(rule, trees[2][1])), trees[2][1]
    for s in range(3, 6):
        tree, model = update(tree, model, grads_of(model, s))
    assert_same_tree(trees[-1][0], tree)
    assert model["enc"]["w"].tobytes() == trees[-1][1]["enc"]["w"].tobytes()


def test_numbers_round_trip_exactly(ckpt: Any) -> None:
    """Step counters, bias corrections and odd floats come back with their exact bits."""
    a = np.arange(4.0).reshape(2, 2)
    state = (0.1 + 0.2, -0.0, math.inf, -math.inf, 5e-324, 1.7976931348623157e308, 2**80, -7,
             True, None, "text", complex(0.1, -2.5), np.float32(0.1), np.int64(-3),
             [1, (2.5, [None])], {"m": a, "again": a, "nested": {"k": (1,)}}, np.asarray(1.5))
    tree = {"w": Leaf(Descent(), state)}
    save(ckpt, tree)
    back = load(ckpt, like={"w": Leaf(Descent(), copy.deepcopy(state))})
    assert_same_tree(tree, back)
    got = back["w"].state
    assert got[15]["m"] is got[15]["again"]  # one array reached twice stays one array


def test_nan_state_round_trips(ckpt: Any) -> None:
    tree = {"w": Leaf(Descent(), (math.nan, np.array([np.nan, 1.0])))}
    save(ckpt, tree)
    back = load(ckpt, like=tree)["w"].state
    assert math.isnan(back[0]) and np.isnan(back[1][0]) and back[1][1] == 1.0


def test_hyperparameters_come_from_the_file(ckpt: Any) -> None:
    model = {"w": np.ones(3)}
    tree = adjust_(setup(Adam(0.1, (0.8, 0.9)), model), 0.02)
    save(ckpt, tree)
    back = load(ckpt, like=setup(Adam(), model))
    assert back["w"].rule == Adam(0.02, (0.8, 0.9))
    assert isinstance(back["w"].rule.beta, tuple)


@pytest.mark.parametrize("dtype", [np.float64, np.dtype("float64"), np.float32], ids=repr)
def test_dtype_fields_round_trip(dtype: Any, ckpt: Any) -> None:
    model = {"w": np.ones(2, np.float16)}
    tree = setup(MixedPrecision(Descent(0.1), dtype), model)
    save(ckpt, tree)
    back = load(ckpt, like=tree)
    assert back["w"].rule == tree["w"].rule
    assert type(back["w"].rule.dtype) is type(dtype)


def test_like_is_not_changed_and_result_is_fresh(trained: tuple, ckpt: Any) -> None:
    tree, model = trained
    like = setup(Adam(), model)
    before = copy.deepcopy(like)
    back = load(ckpt, like=like)
    assert_same_tree(before, like)
    assert back["enc"]["w"] is not like["enc"]["w"]
    assert back["enc"]["w"].state[0].flags.writeable
    assert back["enc"]["w"].state[0] is not tree["enc"]["w"].state[0]


def test_loaded_states_are_laid_out_as_setup_lays_them_out(trained: tuple, ckpt: Any) -> None:
    """Whichever states setup packs into one buffer (for the fused path), load does too."""
    _, model = trained
    like = setup(Adam(), model)
    back = load(ckpt, like=like)

    def sharing(tree: Any) -> list[bool]:
        firsts = [tree["enc"]["w"].state[0], tree["enc"]["b"].state[0], tree["dec"][1].state[0]]
        return [np.shares_memory(a, b) for i, a in enumerate(firsts) for b in firsts[i + 1:]]

    assert sharing(back) == sharing(like)


def test_same_tree_same_bytes_and_numpy_can_read_it(trained: tuple, ckpt: Any,
                                                    tmp_path: Any) -> None:
    tree, _ = trained
    other = tmp_path / "again.ckpt"
    save(other, tree)
    assert ckpt.read_bytes() == other.read_bytes()
    with np.load(ckpt, allow_pickle=False) as npz:
        doc = json.loads(npz["checkpoint.json"])
        assert doc["format"] == "optimisers.checkpoint" and doc["version"] == 2
        assert np.array_equal(npz["arrays/0"], tree["enc"]["w"].state[0])


POOL_SHAPES = st.sampled_from([(), (2,), (2, 3)])
SPEC = st.recursive(
    st.one_of(st.tuples(st.just("arr"), st.integers(0, 3)),
              st.tuples(st.just("lit"), st.sampled_from([1, "s", None]))),
    lambda kids: st.tuples(st.sampled_from(["tuple", "list", "dict"]),
                           st.lists(kids, min_size=1, max_size=3)),
    max_leaves=8)


def build(spec: tuple, pool: list) -> Any:
    tag, body = spec
    if tag == "arr":
        return pool[body]
    if tag == "lit":
        return body
    kids = [build(s, pool) for s in body]
    return {f"k{i}": k for i, k in enumerate(kids)} if tag == "dict" else (
        tuple(kids) if tag == "tuple" else kids)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=SPEC, rule=st.sampled_from(ALL_RULES), seed=st.integers(0, 2**16),
       data=st.data())
def test_property_save_load_is_identity(spec: tuple, rule: Rule, seed: int, data: Any,
                                        tmp_path: Any) -> None:
    """Random nesting, random ties, random frozen Leafs, random missing gradients."""
    rng = np.random.default_rng(seed)
    pool = [rng.standard_normal(data.draw(POOL_SHAPES)).astype(
        data.draw(st.sampled_from([np.float32, np.float64]))) for _ in range(4)]
    model = build(spec, pool)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a model without parameters
        tree = setup(fitting(rule), model)
    for leaf in select(tree):
        leaf.frozen = data.draw(st.booleans())
    for _ in range(data.draw(st.integers(0, 3))):
        grads = fmap(lambda x: None if not isnumeric(x) or rng.random() < 0.3 else
                     rng.standard_normal(np.shape(x)).astype(x.dtype), model)
        tree, model = update_(tree, model, grads)
    path = tmp_path / f"{seed}.ckpt"
    save(path, tree)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        like = setup(fitting(rule), model)
    assert_same_tree(tree, load(path, like=like))


# ----------------------------------------------------------------------------- user rules


@dataclass(frozen=True)
class CheckpointSignSGD(Rule):
    """A user-defined rule with odd hyper-parameters and a dict state."""

    eta: float = 0.01
    clip: tuple = (-1.0, 1.0)
    names: list | None = None
    dtype: Any = np.float64

    def init(self, x: Any) -> Any:
        return {"count": 0, "m": np.zeros_like(x), "history": [1.5, math.inf]}

    def apply(self, state: Any, x: Any, dx: Any) -> tuple[Any, Any]:
        m = state["m"]
        m[...] = 0.5 * m + np.clip(dx, *self.clip)
        state = dict(state, count=state["count"] + 1)
        return state, self.eta * np.sign(m)


class CheckpointPlainRule(Rule):
    """A user rule that is not a dataclass, with its hyper-parameter as an attribute."""

    def __init__(self, eta: float = 0.1) -> None:
        self.eta = eta

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.eta == self.eta  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.eta))

    def __repr__(self) -> str:
        return f"CheckpointPlainRule({self.eta})"

    def apply(self, state: Any, x: Any, dx: Any) -> tuple[Any, Any]:
        return state, self.eta * dx


@pytest.mark.parametrize("rule", [CheckpointSignSGD(0.1, (-0.5, 0.5), ("a", 1)),
                                  CheckpointPlainRule(0.25)], ids=rule_id)
def test_user_defined_rule_round_trips_and_resumes(rule: Rule, ckpt: Any) -> None:
    start = model_of(np.random.default_rng(4))
    tree_a, model_a = train(setup(rule, copy.deepcopy(start)), copy.deepcopy(start), range(5))
    model_b = copy.deepcopy(start)
    tree_b, model_b = train(setup(rule, model_b), model_b, range(2))
    save(ckpt, tree_b)
    tree_b, model_b = train(load(ckpt, like=setup(rule, model_b)), model_b, range(2, 5))
    assert_same_tree(tree_a, tree_b)
    assert model_a["dec"][1].tobytes() == model_b["dec"][1].tobytes()


def test_list_and_dict_hyperparameters_round_trip(ckpt: Any) -> None:
    rule = CheckpointSignSGD(names=[1, {"k": (2.5, None)}, [np.float32]])
    tree = {"w": Leaf(rule, None)}
    save(ckpt, tree)
    back = load(ckpt, like={"w": Leaf(CheckpointSignSGD(), None)})
    assert back["w"].rule == rule
    assert_same_state(back["w"].rule.names, rule.names)


def test_unsaveable_hyperparameter_is_a_type_error(ckpt: Any) -> None:
    tree = {"w": Leaf(CheckpointSignSGD(names=[print]), None)}
    with pytest.raises(TypeError, match=r"cannot save CheckpointSignSGD.names at "
                                        r"KeyPath\('w'\).*builtin_function_or_method"):
        save(ckpt, tree)
    assert not ckpt.exists()


def test_rule_shadowing_a_registered_name_is_refused(ckpt: Any) -> None:
    @dataclass(frozen=True)
    class Adam(Rule):  # noqa: F811 - a user class named like the built-in one
        eta: float = 0.1

    with pytest.raises(TypeError, match=r"RULES maps 'Adam' to .*not to this class"):
        save(ckpt, {"w": Leaf(Adam(), None)})


def test_object_array_in_state_is_refused(ckpt: Any) -> None:
    with pytest.raises(TypeError, match=r"the state at KeyPath\('w'\): an array of dtype "
                                        r"object"):
        save(ckpt, {"w": Leaf(Descent(), np.array([None]))})


def test_save_of_a_model_is_a_type_error(ckpt: Any) -> None:
    with pytest.raises(TypeError, match=r"expected a state tree .* at KeyPath\('w'\)"):
        save(ckpt, {"w": np.ones(2)})


# ----------------------------------------------------------------------------- mismatch


def test_mismatch_structure(trained: tuple, ckpt: Any) -> None:
    _, model = trained
    other = dict(model, extra=np.ones(2))
    with pytest.raises(ValueError, match=r"does not match like at KeyPath\(\): the file has "
                                         r"a dict with keys \['enc', 'dec', 'steps', 'name'\], "
                                         r"like has a dict with keys \['enc', 'dec', 'steps', "
                                         r"'name', 'extra'\]"):
        load(ckpt, like=setup(Adam(), other))
    longer = dict(model, dec=[*model["dec"], np.ones(1)])
    with pytest.raises(ValueError, match=r"at KeyPath\('dec'\): the file has a list of length "
                                         r"2, like has a list of length 3"):
        load(ckpt, like=setup(Adam(), longer))
    as_tuple = dict(model, dec=tuple(model["dec"]))
    with pytest.raises(ValueError, match=r"at KeyPath\('dec'\): the file has a list of length "
                                         r"2, like has a tuple of length 2"):
        load(ckpt, like=setup(Adam(), as_tuple))


def test_mismatch_leaf_against_none(trained: tuple, ckpt: Any) -> None:
    _, model = trained
    other = copy.deepcopy(model)
    other["enc"]["b"] = np.arange(2)  # an integer array: not trainable
    with pytest.raises(ValueError, match=r"at KeyPath\('enc', 'b'\): the file has a Leaf, "
                                         r"like has None"):
        load(ckpt, like=setup(Adam(), other))
    other = dict(model, steps=np.ones(3))  # now trainable
    with pytest.raises(ValueError, match=r"at KeyPath\('steps'\): the file has None, like has "
                                         r"a Leaf"):
        load(ckpt, like=setup(Adam(), other))


def test_mismatch_shape(trained: tuple, ckpt: Any) -> None:
    _, model = trained
    other = copy.deepcopy(model)
    other["dec"][1] = np.ones(5, np.float32)
    with pytest.raises(ValueError, match=r"at KeyPath\('dec', 1\), state\[0\]: the file has an "
                                         r"array of shape \(4,\) and dtype float32, like has an "
                                         r"array of shape \(5,\) and dtype float32"):
        load(ckpt, like=setup(Adam(), other))


def test_mismatch_dtype(trained: tuple, ckpt: Any) -> None:
    _, model = trained
    other = copy.deepcopy(model)
    other["dec"][1] = other["dec"][1].astype(np.float64)
    with pytest.raises(ValueError, match=r"at KeyPath\('dec', 1\), state\[0\]: the file has an "
                                         r"array of shape \(4,\) and dtype float32, like has an "
                                         r"array of shape \(4,\) and dtype float64"):
        load(ckpt, like=setup(Adam(), other))


def test_mismatch_rule(trained: tuple, ckpt: Any) -> None:
    _, model = trained
    with pytest.raises(ValueError, match=r"at KeyPath\('enc', 'w'\): the file has the rule "
                                         r"Adam, like has Momentum"):
        load(ckpt, like=setup(Momentum(), model))
    save(ckpt, setup(OptimiserChain(ClipGrad(), Adam()), model))
    with pytest.raises(ValueError, match=r"the file has the rule OptimiserChain\(ClipGrad, "
                                         r"Adam\), like has OptimiserChain\(ClipGrad, "
                                         r"Descent\)"):
        load(ckpt, like=setup(OptimiserChain(ClipGrad(), Descent()), model))


def test_mismatch_state_structure_from_hyperparameters(ckpt: Any) -> None:
    model = {"w": np.ones(2)}
    save(ckpt, setup(RMSProp(centred=True), model))
    with pytest.raises(ValueError, match=r"at KeyPath\('w'\), state\[1\]: the file has an "
                                         r"array of shape \(2,\) and dtype float64, like has "
                                         r"None"):
        load(ckpt, like=setup(RMSProp(), model))


def test_mismatch_sharing(ckpt: Any) -> None:
    w = np.ones(2)
    tied, untied = {"a": w, "b": w}, {"a": np.ones(2), "b": np.ones(2)}
    save(ckpt, setup(Descent(), tied))
    with pytest.raises(ValueError, match=r"at KeyPath\('b'\): the file's Leaf there is shared "
                                         r"with KeyPath\('a'\), but like's Leafs are separate"):
        load(ckpt, like=setup(Descent(), untied))
    save(ckpt, setup(Descent(), untied))
    with pytest.raises(ValueError, match=r"at KeyPath\('b'\): like's Leaf there is shared with "
                                         r"KeyPath\('a'\), but the file's Leafs are separate"):
        load(ckpt, like=setup(Descent(), tied))


def test_like_must_be_a_state_tree(trained: tuple, ckpt: Any) -> None:
    _, model = trained
    with pytest.raises(TypeError, match=r"expected a state tree"):
        load(ckpt, like=model)


# ----------------------------------------------------------------------------- damaged files


def test_truncated_file_is_a_value_error(trained: tuple, ckpt: Any) -> None:
    tree, model = trained
    data = ckpt.read_bytes()
    cuts = sorted({*range(0, len(data), 37), len(data) - 1, len(data) - 22, 1, 4})
    for n in cuts:
        ckpt.write_bytes(data[:n])
        with pytest.raises(ValueError, match=DAMAGED):
            load(ckpt, like=setup(Adam(), model))
    assert len(cuts) > 20


def test_corrupted_bytes_never_crash(trained: tuple, ckpt: Any) -> None:
    """Each byte flipped in turn: a ValueError, or (a byte nobody reads) the same tree."""
    tree, model = trained
    data = ckpt.read_bytes()
    like = setup(Adam(), model)
    outcomes = {"error": 0, "same": 0}
    for i in range(0, len(data), 5):
        bad = bytearray(data)
        bad[i] ^= 0x55
        ckpt.write_bytes(bytes(bad))
        try:
            back = load(ckpt, like=like)
        except ValueError:
            outcomes["error"] += 1
        else:
            assert_same_tree(tree, back)
            outcomes["same"] += 1
    assert outcomes["error"] > 0.8 * sum(outcomes.values())


@pytest.mark.parametrize("content", [
    b"", b"hello, world\n", bytes(range(256)) * 4, b"PK\x03\x04" + b"\0" * 100,
    json.dumps({"format": "optimisers.checkpoint"}).encode(),
], ids=["empty", "text", "binary", "zip-magic", "json"])
def test_garbage_file_is_a_value_error(content: bytes, trained: tuple, ckpt: Any) -> None:
    ckpt.write_bytes(content)
    with pytest.raises(ValueError, match=DAMAGED):
        load(ckpt, like=setup(Adam(), trained[1]))


def test_other_numpy_files_are_value_errors(trained: tuple, tmp_path: Any) -> None:
    like = setup(Adam(), trained[1])
    np.savez(tmp_path / "plain.npz", x=np.ones(2))
    with pytest.raises(ValueError, match=r"ZIP archive but not an optimisers checkpoint: it "
                                         r"has no checkpoint.json"):
        load(tmp_path / "plain.npz", like=like)
    np.save(tmp_path / "plain.npy", np.ones(2))
    with pytest.raises(ValueError, match=DAMAGED):
        load(tmp_path / "plain.npy", like=like)


def test_missing_file_is_file_not_found(tmp_path: Any) -> None:
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "nothing.ckpt", like=None)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(version=3), r"format version 3; this version of optimisers reads "
                                    r"versions \(1, 2\)"),
    (lambda d: d.update(format="other"), r"not an optimisers checkpoint: its checkpoint.json "
                                         r"lacks"),
    (lambda d: d["leaves"][0]["rule"].update(rule="NoSuchRule"),
     r"names the rule 'NoSuchRule' at KeyPath\('enc', 'w'\), which is not in "
     r"optimisers.RULES"),
    (lambda d: d["leaves"][0]["rule"]["fields"].update(eta={"float": "-1.0"}),
     r"rule Adam at KeyPath\('enc', 'w'\) cannot be rebuilt: ValueError: Invalid learning "
     r"rate: -1.0; Adam's learning rate eta must be >= 0"),
    (lambda d: d["leaves"][0]["rule"]["fields"].update(bogus=1),
     r"gives the rule Adam at KeyPath\('enc', 'w'\) a field 'bogus'"),
    (lambda d: d["leaves"][0].update(state={"array": 99, "dtype": "float32", "shape": []}),
     r"at KeyPath\('enc', 'w'\), state: the file has an array of shape \(\) and dtype "
     r"float32, like has a tuple of length 3"),
    (lambda d: d["leaves"][0]["state"]["tuple"][0].update(array=99),
     r"checkpoint is damaged: array 99 \(at KeyPath\('enc', 'w'\)\) is missing"),
    (lambda d: d["leaves"][0]["state"]["tuple"][0].update(array=2),
     r"checkpoint is damaged: array 2 \(at KeyPath\('enc', 'w'\)\) holds float64 \(2,\) in 16 "
     r"bytes, its record says float32 \(3, 2\)"),
    (lambda d: d["leaves"][0]["state"]["tuple"].__setitem__(2, 0.5),
     r"bare JSON number 0.5"),
    (lambda d: d["nodes"].__setitem__(d["nodes"][1]["dict"][0][1], {"leaf": 7}),
     r"malformed: a Leaf reference 7 at KeyPath\('enc', 'w'\)"),
    (lambda d: d["nodes"].__setitem__(0, {"eval": "print(1)"}),
     r"malformed: expected a node of the state"),
], ids=["version", "format", "unknown-rule", "invalid-hyperparameter", "unknown-field",
        "state-kind", "missing-array", "wrong-array", "bare-float", "bad-leaf", "bad-node"])
def test_tampered_document_is_a_value_error(change: Any, message: str, trained: tuple,
                                            ckpt: Any) -> None:
    edit_json(ckpt, change)
    with pytest.raises(ValueError, match=message):
        load(ckpt, like=setup(Adam(), trained[1]))


def test_deeply_nested_document_is_a_value_error(trained: tuple, ckpt: Any) -> None:
    deep = '{"tuple":[' * 50_000 + "null" + "]}" * 50_000
    text = '{"format":"optimisers.checkpoint","version":1,"leaves":[],"tree":' + deep + "}"
    rewrite(ckpt, {"checkpoint.json": text.encode()})
    with pytest.raises(ValueError, match=r"not an intact optimisers checkpoint.*Recursion"):
        load(ckpt, like=setup(Adam(), trained[1]))


def test_decompression_bomb_is_refused(trained: tuple, ckpt: Any) -> None:
    with zipfile.ZipFile(ckpt) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["arrays/0.npy"] += bytes(10_000_000)
    with zipfile.ZipFile(ckpt, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, data in members.items():
            zf.writestr(n, data)
    assert ckpt.stat().st_size < 100_000
    with pytest.raises(ValueError, match=r"member 'checkpoint.json' is compressed or encrypted "
                                         r"\(method 8\)"):
        load(ckpt, like=setup(Adam(), trained[1]))


# ----------------------------------------------------------------------------- pickle


class Payload:
    """Unpickling this creates a directory: proof that code from the file ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.marker,))


def test_pickle_payload_never_runs(trained: tuple, ckpt: Any, tmp_path: Any) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Payload(str(marker)))
    pickle.loads(payload)  # the payload is live: unpickling it does create the marker
    assert marker.exists()
    marker.rmdir()
    like = setup(Adam(), trained[1])
    npy = io.BytesIO()
    np.save(npy, np.array([Payload(str(marker))], dtype=object), allow_pickle=True)

    plain = tmp_path / "plain.pkl"
    plain.write_bytes(payload)
    npz = tmp_path / "evil.npz"
    np.savez(npz, x=np.array([Payload(str(marker))], dtype=object))
    inside = tmp_path / "inside.ckpt"
    inside.write_bytes(ckpt.read_bytes())
    rewrite(inside, {"arrays/0.npy": npy.getvalue()})
    as_json = tmp_path / "json.ckpt"
    as_json.write_bytes(ckpt.read_bytes())
    rewrite(as_json, {"checkpoint.json": payload})

    for path, message in [(plain, DAMAGED), (npz, r"has no checkpoint.json"),
                          (inside, r"array 0 .* holds object"), (as_json, DAMAGED)]:
        with pytest.raises(ValueError, match=message):
            load(path, like=like)
        assert not marker.exists(), path


def test_names_in_the_file_are_never_imported(trained: tuple, ckpt: Any) -> None:
    def evil_rule(d: dict) -> None:
        d["leaves"][0]["rule"] = {"rule": "system", "fields": {"command": "mkdir pwned"}}

    edit_json(ckpt, evil_rule)
    with pytest.raises(ValueError, match=r"'system' .* not in optimisers.RULES"):
        load(ckpt, like=setup(Adam(), trained[1]))

    def evil_dtype(d: dict) -> None:
        d["leaves"][0]["rule"]["fields"]["dtype"] = {"dtype": "O", "as": "type"}

    mixed = setup(MixedPrecision(Adam()), trained[1])
    save(ckpt, mixed)
    edit_json(ckpt, evil_dtype)
    with pytest.raises(ValueError, match=r"unknown dtype 'O'"):
        load(ckpt, like=mixed)


# ----------------------------------------------------------------------------- atomic writes


def test_crash_during_save_keeps_the_previous_checkpoint(trained: tuple, ckpt: Any,
                                                         monkeypatch: Any) -> None:
    tree, model = trained
    before = ckpt.read_bytes()
    newer, _ = train(tree, model, range(3, 5))
    real = np.lib.format.write_array
    calls = []

    def crash(fp: Any, arr: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 3:
            fp.write(b"half an array")
            raise OSError("disk full")
        real(fp, arr, *args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", crash)
    with pytest.raises(OSError, match="disk full"):
        save(ckpt, newer)
    assert len(calls) == 3
    assert ckpt.read_bytes() == before
    assert sorted(os.listdir(ckpt.parent)) == ["opt.ckpt"]  # no temporary file left
    monkeypatch.setattr(np.lib.format, "write_array", real)
    assert load(ckpt, like=setup(Adam(), model))["enc"]["w"].state[2] == 3.0


def test_crash_before_rename_keeps_the_previous_checkpoint(trained: tuple, ckpt: Any,
                                                           monkeypatch: Any) -> None:
    tree, _ = trained
    before = ckpt.read_bytes()

    def crash(src: Any, dst: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        save(ckpt, setup(Descent(), {"w": np.ones(1)}))
    assert ckpt.read_bytes() == before
    assert sorted(os.listdir(ckpt.parent)) == ["opt.ckpt"]


def test_save_replaces_and_respects_umask(trained: tuple, ckpt: Any) -> None:
    save(ckpt, setup(Descent(), {"w": np.ones(1)}))
    assert load(ckpt, like=setup(Descent(), {"w": np.ones(1)}))["w"].rule == Descent()
    mask = os.umask(0)
    os.umask(mask)
    if os.name == "posix":
        assert os.stat(ckpt).st_mode & 0o777 == 0o666 & ~mask


# ----------------------------------------------------------------------------- torch and JAX


def test_torch_state_round_trips_and_resumes(ckpt: Any) -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)

    def fresh() -> dict:
        w = torch.randn(3, 2, generator=gen)
        return {"w": w, "tied": w, "h": torch.randn(4, generator=gen).to(torch.bfloat16),
                "d": torch.randn(2, generator=gen, dtype=torch.float64)}

    def grads(s: int) -> dict:
        g = torch.Generator().manual_seed(s)
        return {"w": torch.randn(3, 2, generator=g), "tied": torch.randn(3, 2, generator=g),
                "h": torch.randn(4, generator=g).to(torch.bfloat16),
                "d": torch.randn(2, generator=g, dtype=torch.float64)}

    rule = OptimiserChain(AccumGrad(2), Adam(0.01))
    start = fresh()
    model_a = {k: v.clone() for k, v in start.items()}
    model_a["tied"] = model_a["w"]
    tree_a = setup(rule, model_a)
    for s in range(7):
        tree_a, model_a = update_(tree_a, model_a, grads(s))

    model_b = {k: v.clone() for k, v in start.items()}
    model_b["tied"] = model_b["w"]
    tree_b = setup(rule, model_b)
    for s in range(3):
        tree_b, model_b = update_(tree_b, model_b, grads(s))
    save(ckpt, tree_b)
    loaded = load(ckpt, like=setup(rule, model_b))
    assert_same_tree(tree_b, loaded)
    assert loaded["h"].state[0][0].dtype == torch.bfloat16
    assert loaded["w"] is loaded["tied"]
    tree_b = loaded
    for s in range(3, 7):
        tree_b, model_b = update_(tree_b, model_b, grads(s))
    assert_same_tree(tree_a, tree_b)
    for k in start:
        assert as_numpy(model_a[k]).tobytes() == as_numpy(model_b[k]).tobytes(), k


def test_torch_checkpoint_loads_into_numpy(ckpt: Any) -> None:
    torch = pytest.importorskip("torch")
    model = {"w": torch.ones(3), "c": torch.ones(2, dtype=torch.complex64)}
    tree = setup(Adam(0.1), model)
    tree, model = update_(tree, model, {"w": torch.ones(3), "c": torch.ones(2) * (1 + 2j)})
    save(ckpt, tree)
    back = load(ckpt, like=setup(Adam(), {"w": np.ones(3, np.float32),
                                          "c": np.ones(2, np.complex64)}))
    assert isinstance(back["c"].state[0], np.ndarray)
    assert back["c"].state[0].tobytes() == tree["c"].state[0].numpy().tobytes()
    assert back["w"].state[2] == tree["w"].state[2]


def test_torch_loads_onto_like_device(ckpt: Any) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model = {"w": torch.ones(3, device="cuda"), "h": torch.ones(2, device="cuda",
                                                                 dtype=torch.bfloat16)}
    tree = setup(Adam(0.1), model)
    tree, model = update_(tree, model, {k: torch.ones_like(v) for k, v in model.items()})
    save(ckpt, tree)
    back = load(ckpt, like=setup(Adam(), model))
    assert back["w"].state[0].device == model["w"].device
    assert_same_tree(tree, back)


def test_jax_state_round_trips_and_resumes_under_jit(ckpt: Any) -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def grads(s: int) -> dict:
        k1, k2 = jax.random.split(jax.random.PRNGKey(s))
        return {"w": jax.random.normal(k1, (3, 2)),
                "h": jax.random.normal(k2, (4,)).astype(jnp.bfloat16)}

    rule = OptimiserChain(AccumGrad(2), Adam(0.01))
    start = {"w": jnp.arange(6.0).reshape(3, 2), "h": jnp.ones(4, jnp.bfloat16)}
    step = jax.jit(update)

    tree_a, model_a = setup(rule, start), start
    for s in range(7):
        tree_a, model_a = step(tree_a, model_a, grads(s))

    tree_b, model_b = setup(rule, start), start
    for s in range(3):
        tree_b, model_b = step(tree_b, model_b, grads(s))
    save(ckpt, tree_b)
    loaded = load(ckpt, like=setup(rule, model_b))
    assert_same_tree(tree_b, loaded)
    assert loaded["h"].state[0][0].dtype == jnp.bfloat16
    tree_b = loaded
    for s in range(3, 7):
        tree_b, model_b = step(tree_b, model_b, grads(s))
    assert_same_tree(tree_a, tree_b)
    for k in start:
        assert as_numpy(model_a[k]).tobytes() == as_numpy(model_b[k]).tobytes(), k


def test_jax_eager_state_round_trips(ckpt: Any) -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    model = {"w": jnp.ones((2, 2)), "h": jnp.ones(3, jnp.bfloat16)}
    rule = MixedPrecision(RAdam(0.01))
    tree = setup(rule, model)
    for s in range(2):
        tree, model = update(tree, model, {"w": jnp.full((2, 2), 0.5 + s),
                                           "h": jnp.full(3, 1.5, jnp.bfloat16)})
    save(ckpt, tree)
    back = load(ckpt, like=setup(rule, model))
    assert_same_tree(tree, back)
    assert back["h"].state[0].dtype == jnp.float32
