"""The tree protocol: children, rebuild, register/@functor, trainable, isnumeric."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import MutableMapping
from types import MappingProxyType

import numpy as np
import pytest

import optimisers as O
from optimisers import children, rebuild, trainable

Pair = namedtuple("Pair", "w b")


@dataclasses.dataclass
class Dense:
    w: object
    b: object
    act: object = None


@dataclasses.dataclass(frozen=True)
class Frozen:
    w: object
    n: int = 0

    def __post_init__(self):
        Frozen.inits += 1


Frozen.inits = 0


@pytest.mark.parametrize("node,kids", [
    ((1, 2), {0: 1, 1: 2}),
    ([1, 2], {0: 1, 1: 2}),
    ({"a": 1, "b": 2}, {"a": 1, "b": 2}),
    (OrderedDict(b=1, a=2), {"b": 1, "a": 2}),
    (Pair(1, 2), {"w": 1, "b": 2}),
    (Dense(1, 2), {"w": 1, "b": 2, "act": None}),
    (1.0, {}), ("str", {}), (None, {}), (np.zeros(2), {}), (len, {}),
])
def test_children(node, kids):
    assert children(node) == kids
    assert list(children(node)) == list(kids)


@pytest.mark.parametrize("node,new,expect", [
    ((1, 2), {1: 9}, (1, 9)),
    ([1, 2], {0: 9}, [9, 2]),
    ({"a": 1, "b": 2}, {"a": 9}, {"a": 9, "b": 2}),
    (Pair(1, 2), {"b": 9}, Pair(1, 9)),
    (Dense(1, 2), {"w": 9}, Dense(9, 2)),
])
def test_rebuild_replaces_and_never_mutates(node, new, expect):
    before = repr(node)
    out = rebuild(node, new)
    assert out == expect and type(out) is type(node)
    assert repr(node) == before


def test_rebuild_keeps_mapping_types_and_order():
    od = OrderedDict(b=1, a=2)
    assert list(rebuild(od, {"a": 0}).items()) == [("b", 1), ("a", 0)]
    dd = defaultdict(list, {"x": 1})
    out = rebuild(dd, {"x": 2})
    assert type(out) is defaultdict and out.default_factory is list and dd["x"] == 1
    proxy = MappingProxyType({"x": 1})
    assert rebuild(proxy, {"x": 2})["x"] == 2


class SharedStore(MutableMapping):
    """A Mapping that keeps its items in another object, so that ``copy.copy`` of it
    shares them (as ``nnx.State`` does): writing into a copy writes into the original."""

    def __init__(self, items=()):
        self._data = dict(items)

    def __getitem__(self, k):
        return self._data[k]

    def __setitem__(self, k, v):
        self._data[k] = v

    def __delitem__(self, k):
        del self._data[k]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


class ReadOnlyDict(dict):
    def __setitem__(self, k, v):
        raise TypeError("read-only")


def test_rebuild_never_writes_into_a_mapping_whose_copy_shares_it():
    store = SharedStore({"w": 1.0, "b": 2.0})
    out = rebuild(store, {"w": 5.0})
    assert type(out) is SharedStore and dict(out) == {"w": 5.0, "b": 2.0}
    assert dict(store) == {"w": 1.0, "b": 2.0}


def test_pure_update_leaves_a_shallow_copying_mapping_alone():
    w = np.ones(2)
    w.setflags(write=False)  # (a writable array would be written in place by update_)
    model = SharedStore({"w": w, "layers": [SharedStore({"v": np.ones(1)})]})
    tree = O.setup(O.Descent(0.5), model)
    _, new = O.update(tree, model, {"w": np.ones(2), "layers": [{"v": np.ones(1)}]})
    assert model["w"] is w and model["layers"][0]["v"][0] == 1.0
    assert type(new) is SharedStore and new["w"].tolist() == [0.5, 0.5]
    assert new["layers"][0]["v"].tolist() == [0.5]
    _, new = O.update_(tree, model, {"w": np.ones(2)})
    assert model["w"] is w and new["w"].tolist() == [0.5, 0.5]


def test_rebuild_mapping_by_construction_when_item_assignment_is_refused():
    ro = ReadOnlyDict(a=1, b=2)
    out = rebuild(ro, {"a": 3})
    assert type(out) is ReadOnlyDict and out == {"a": 3, "b": 2} and ro["a"] == 1

    class NoArgs(SharedStore):
        def __init__(self):
            super().__init__({"a": 1})

    with pytest.raises(TypeError, match="cannot rebuild a NoArgs: a Mapping other than a "
                                        "dict is rebuilt as NoArgs"):
        rebuild(NoArgs(), {"a": 2})


def test_rebuild_inplace_is_rebuild_for_plain_nodes():
    xs = [1, 2]
    out = O.tree.rebuild_(xs, {0: 10})
    assert out == [10, 2] and out is not xs and xs == [1, 2]


def test_rebuild_frozen_dataclass_does_not_rerun_init():
    f = Frozen(np.ones(2), 3)
    n = Frozen.inits
    g = rebuild(f, {"w": np.zeros(2)})
    assert Frozen.inits == n and g.n == 3 and f.w[0] == 1 and g.w[0] == 0


def test_rebuild_unknown_key():
    with pytest.raises(ValueError, match="has no child 'c'; its keys are"):
        rebuild({"a": 1}, {"c": 2})


def test_register_and_functor():
    class Affine:
        def __init__(self, w, b, name):
            self.w, self.b, self.name = w, b, name

    O.register(Affine, children=("w", "b"), trainable=("w",))
    a = Affine(1.0, 2.0, "x")
    assert children(a) == {"w": 1.0, "b": 2.0} and trainable(a) == ("w",)
    b = rebuild(a, {"b": 5.0})
    assert (b.w, b.b, b.name, a.b) == (1.0, 5.0, "x", 2.0)

    @O.functor
    class Bag:
        def __init__(self):
            self.x, self.y = 1, 2

    assert children(Bag()) == {"x": 1, "y": 2} and trainable(Bag()) == ("x", "y")

    with pytest.raises(ValueError, match="trainable .* names children that Bad lacks"):
        O.register(type("Bad", (), {}), children=("a",), trainable=("b",))


def test_register_node_gives_a_class_its_functions_and_defaults_elsewhere():
    from optimisers.tree import Node, child_getter, ismutable, rebuild_, register_node

    class Box:
        def __init__(self, value):
            self.value = value

    seen = Box(1.0)
    assert children(seen) == {}  # looked up (and cached) before it is registered
    register_node(Box, Node(children=lambda b: {"v": b.value},
                            rebuild=lambda b, new: Box(new["v"]),
                            trainable=lambda b, kids: (), getter=lambda b: lambda n, k: n.value,
                            assign=lambda b, new: False, mutable=False))
    assert children(seen) == {"v": 1.0} and trainable(seen) == ()
    assert rebuild(seen, {"v": 2.0}).value == 2.0 and seen.value == 1.0
    assert rebuild_(seen, {"v": 3.0}) is not seen and child_getter(seen)(seen, "v") == 1.0
    assert not ismutable(seen)

    @dataclasses.dataclass(frozen=True)
    class Index:  # a dataclass that trains nothing: its children stay its fields
        init: object

    register_node(Index, Node(trainable=lambda x, kids: ()))
    index = Index(np.zeros(1))
    assert children(index) == {"init": index.init} and trainable(index) == ()
    assert not ismutable(Index(1.0)) and ismutable(index)  # as any frozen dataclass
    with pytest.warns(UserWarning, match="no trainable parameter"):
        assert O.setup(O.Descent(), {"i": index})["i"] == {"init": None}


def test_tree_gather_and_checkpoint_name_no_library():
    """Library code stays in backends/: the tree protocol, the gathering and checkpoints
    neither compare with a library's name nor look one up among the loaded modules."""
    import ast
    from pathlib import Path

    src = Path(O.__file__).parent
    libraries = {"torch", "jax", "jaxlib", "jax.numpy", "flax", "flax.nnx", "equinox", "numba"}
    for path in [src / "tree.py", src / "gather.py", *sorted((src / "checkpoint").glob("*.py"))]:
        tree = ast.parse(path.read_text())
        docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in docstrings:
                assert node.value not in libraries, f"{path.name}:{node.lineno} {node.value!r}"
            if isinstance(node, ast.Attribute) and node.attr == "modules":
                assert getattr(node.value, "id", None) != "sys", f"{path.name}:{node.lineno}"


def test_trainable_by_key_tells_identical_children_apart():
    shared = np.zeros(2)
    shared.setflags(write=False)  # immutable, so never a tie

    @O.functor
    class BatchNorm:
        __trainable__ = ("beta", "gamma")

        def __init__(self):
            self.beta = self.mu = shared
            self.gamma = np.ones(2)

    bn = BatchNorm()
    assert trainable(bn) == ("beta", "gamma")
    tree = O.setup(O.Descent(), bn)
    assert tree["mu"] is None and isinstance(tree["beta"], O.Leaf)
    tree, new = O.update(tree, bn, {"beta": np.ones(2), "mu": np.ones(2)})
    assert new.beta.tolist() == [-0.1, -0.1] and new.mu.tolist() == [0.0, 0.0]


def test_trainable_method_may_depend_on_instance():
    @dataclasses.dataclass
    class Norm:
        beta: object
        affine: bool = True

        def __trainable__(self):
            return ("beta",) if self.affine else ()

    assert trainable(Norm(1.0)) == ("beta",) and trainable(Norm(1.0, False)) == ()


def test_legacy_trainable_values_are_converted_with_warning():
    @dataclasses.dataclass
    class Old:
        a: object
        b: object

        def __trainable__(self):
            return (self.a,)

    x = Old(np.ones(2), np.zeros(2))
    with pytest.warns(DeprecationWarning, match="returned child values; return the child keys"):
        assert trainable(x) == ("a",)


def test_isnumeric():
    assert O.isnumeric(np.zeros(3)) and O.isnumeric(np.zeros((), np.float16))
    assert O.isnumeric(np.zeros(2, np.complex64))
    for x in [np.zeros(2, int), np.zeros(2, bool), 1.0, 1, np.float32(1), "a", None, [1.0]]:
        assert not O.isnumeric(x)


def test_ismutable():
    ro = np.zeros(2)
    ro.setflags(write=False)
    assert O.ismutable(np.zeros(2)) and O.ismutable([1]) and O.ismutable({})
    assert O.ismutable(Dense(1, 2))
    assert not O.ismutable(ro) and not O.ismutable((1, [2])) and not O.ismutable(1.0)
    assert not O.ismutable(Frozen(1)) and O.ismutable(Frozen(np.ones(1)))
    assert O.maywrite(np.zeros(1)) and not O.maywrite(ro) and not O.maywrite([1.0])


def test_keypath():
    kp = O.KeyPath("layers", 0, "weight")
    assert repr(kp) == "KeyPath('layers', 0, 'weight')" and str(kp) == "layers.0.weight"
    assert kp[:2] == O.KeyPath("layers", 0) and isinstance(kp[:2], O.KeyPath)
    assert kp == ("layers", 0, "weight") and hash(kp) == hash(("layers", 0, "weight"))
    model = {"layers": [{"weight": 5}]}
    assert O.getkeypath(model, kp) == 5 and O.haskeypath(model, kp)
    assert not O.haskeypath(model, O.KeyPath("layers", 1))
    with pytest.raises(KeyError, match=r"KeyPath\('layers'\) has no child 1"):
        O.getkeypath(model, O.KeyPath("layers", 1, "weight"))
