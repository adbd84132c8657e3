"""Random nested models, their gradients, and bitwise snapshots: shared by the reliability
suite (test_reliability.py).

A model is a random nesting of tuples, lists, dicts, namedtuples, dataclasses (frozen or
not), registered classes with a trainable subset (declared by ``register`` or by an
instance-dependent ``__trainable__``) and shared sub-trees, over a pool of float16/32/64
arrays of which some are read-only (never tied) and the others are tied wherever they recur.
It is described by a plain value (``desc``) and built afresh from it by :func:`make_model`,
so a test can make any number of independent, identical copies of one model.
"""

from __future__ import annotations

import dataclasses
import struct
import warnings
from collections import namedtuple
from typing import Any

import numpy as np
from hypothesis import strategies as st

import optimisers as O
from conftest import ALL_RULES, fitting
from optimisers.state import Leaf, leaves

# ----------------------------------------------------------------------------- models

Pair = namedtuple("Pair", "left right")


@dataclasses.dataclass
class Box:
    inner: Any
    label: Any = "box"


@dataclasses.dataclass(frozen=True)
class FrozenBox:
    inner: Any
    other: Any = None


class Affine:
    """A registered class training ``w`` only."""

    def __init__(self, w: Any, b: Any) -> None:
        self.w, self.b = w, b


O.register(Affine, children=("w", "b"), trainable=("w",))


class Gate:
    """A registered class whose trainable subset depends on the instance."""

    def __init__(self, beta: Any, mu: Any, affine: bool) -> None:
        self.beta, self.mu, self.affine = beta, mu, affine

    def __trainable__(self) -> tuple:
        return ("beta",) if self.affine else ()


O.register(Gate, children=("beta", "mu"))

LITERALS = [lambda: 1, lambda: 2.5, lambda: "s", lambda: None, lambda: np.arange(3),
            lambda: np.float64(1.5), lambda: True]
NODES = ["tuple", "list", "dict", "pair", "box", "frozen", "affine", "gate_on", "gate_off"]
SHAPES = [(), (1,), (3,), (2, 3)]
DTYPES = ["float16", "float32", "float64"]
POOL = 6  # arrays that recur: a writable one recurring is a tie, a read-only one is not


def build(spec: tuple, pool: list, made: list) -> Any:
    tag, body = spec
    if tag == "arr":
        return pool[body]
    if tag == "lit":
        return LITERALS[body]()
    if tag == "ref":  # a container built before (never an ancestor): shared sub-trees
        return made[body % len(made)] if made else None
    kids = [build(s, pool, made) for s in body]
    first, last = kids[0], kids[-1]
    node = {"tuple": lambda: tuple(kids), "list": lambda: list(kids),
            "dict": lambda: {f"k{i}": k for i, k in enumerate(kids)},
            "pair": lambda: Pair(first, last), "box": lambda: Box(first, last),
            "frozen": lambda: FrozenBox(first, last), "affine": lambda: Affine(first, last),
            "gate_on": lambda: Gate(first, last, True),
            "gate_off": lambda: Gate(first, last, False)}[tag]()
    made.append(node)
    return node


def make_model(desc: tuple) -> Any:
    """A fresh model from its description: the same ``desc``, an equal independent copy."""
    spec, pool_spec, seed = desc
    rng = np.random.default_rng(seed)
    pool = []
    for shape, dtype, readonly in pool_spec:
        a = np.asarray(rng.standard_normal(shape), dtype)
        a.setflags(write=not readonly)
        pool.append(a)
    return build(spec, pool, [])


LEAF_SPEC = st.one_of(
    st.tuples(st.just("arr"), st.integers(0, POOL - 1)),
    st.tuples(st.just("arr"), st.integers(0, POOL - 1)),
    st.tuples(st.just("lit"), st.integers(0, len(LITERALS) - 1)),
    st.tuples(st.just("ref"), st.integers(0, 7)),
)
SPEC = st.recursive(
    LEAF_SPEC,
    lambda kids: st.tuples(st.sampled_from(NODES), st.lists(kids, min_size=1, max_size=3)),
    max_leaves=12)
# The root's first child is a pool array, at a trainable position (not under gate_off).
TOP = st.builds(lambda tag, first, rest: (tag, [first, *rest]),
                st.sampled_from(NODES[:-1]),
                st.tuples(st.just("arr"), st.integers(0, POOL - 1)),
                st.lists(SPEC, max_size=3))
MODELS = st.tuples(
    TOP,
    st.lists(st.tuples(st.sampled_from(SHAPES), st.sampled_from(DTYPES),
                       st.sampled_from([False, False, True])), min_size=POOL, max_size=POOL),
    st.integers(0, 2**16))

RULES = ALL_RULES + [
    O.MixedPrecision(O.OptimiserChain(O.AccumGrad(2), O.Adam(0.05)), np.float64),
    O.MixedPrecision(O.Momentum(0.05)),
    O.OptimiserChain(O.AccumGrad(3), O.ClipNorm(1.0), O.Nesterov(0.1)),
]

# Random freezing and learning rates on random sub-trees: per-Leaf rules and flags.
ACTIONS = st.lists(st.tuples(st.sampled_from(["freeze", "thaw", "adjust"]),
                             st.integers(0, 10**6), st.sampled_from([0.001, 0.01, 0.3])),
                   max_size=3)



def quiet_setup(rule: O.Rule, model: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # no trainable parameter
        return O.setup(fitting(rule), model)


def tree_nodes(tree: Any) -> list:
    """Every non-None node of a state tree (containers and Leafs), in walk order."""
    out = []

    def go(t: Any) -> None:
        if t is None:
            return
        out.append(t)
        if isinstance(t, dict):
            for v in t.values():
                go(v)
        elif isinstance(t, (tuple, list)):
            for v in t:
                go(v)

    go(tree)
    return out


def decorate(tree: Any, actions: list) -> None:
    """Freeze, thaw or adjust the learning rate of random sub-trees (in place)."""
    nodes = tree_nodes(tree)
    for what, i, eta in actions:
        sub = nodes[i % len(nodes)]
        if what == "freeze":
            O.freeze_(sub)
        elif what == "thaw":
            O.thaw_(sub)
        else:
            try:
                O.adjust_(sub, eta)
            except TypeError as e:  # no rule in this sub-tree has a learning rate
                if "no rule here has a field" not in str(e):
                    raise


def make_grads(model: Any, rng: np.random.Generator, p_none: float = 0.0,
               p_dict: float = 0.5) -> Any:
    """A valid gradient tree: arrays at trainable numeric positions (in the parameter's dtype,
    sometimes float64), ``None`` elsewhere; each node as its own type or as a dict."""

    def go(x: Any, train: bool) -> Any:
        if not train:
            return None
        if O.isnumeric(x):
            if rng.random() < p_none:
                return None
            dtype = x.dtype if rng.random() < 0.8 else np.float64
            return np.asarray(rng.standard_normal(x.shape), dtype)
        kids = O.children(x)
        if not kids or rng.random() < p_none / 4:
            return None
        keys = set(O.trainable(x))
        new = {k: go(v, k in keys) for k, v in kids.items()}
        return new if rng.random() < p_dict else O.rebuild(x, new)

    return go(model, True)


# ----------------------------------------------------------------------------- snapshots


def fp(x: Any) -> Any:
    """A bitwise fingerprint of a value: arrays by dtype, shape, write flag and bytes; floats
    by their bits (so NaN equals NaN and -0.0 differs from 0.0)."""
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.shape, bool(x.flags.writeable), x.tobytes())
    if isinstance(x, np.generic):
        return ("generic", x.dtype.str, x.tobytes())
    if isinstance(x, bool) or x is None or isinstance(x, (int, str, bytes)):
        return (type(x).__name__, x)
    if isinstance(x, float):
        return ("float", struct.pack("<d", x))
    if isinstance(x, complex):
        return ("complex", struct.pack("<dd", x.real, x.imag))
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(fp(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((k, fp(v)) for k, v in x.items()))
    return (type(x).__name__, id(x))


def model_snapshot(model: Any) -> list:
    """Every path of a model (all children, trainable or not): the object there, by identity,
    and leaves by value. Equal snapshots: nothing replaced, nothing written."""
    out = []

    def go(kp: tuple, x: Any) -> None:
        kids = O.children(x)
        out.append((kp, type(x), id(x), None if kids else fp(x)))
        for k, v in kids.items():
            go(kp + (k,), v)

    go((), model)
    return out


def model_values(model: Any) -> list:
    """A model by value only (no identities): to compare independent copies."""
    return [(kp, t, v) for kp, t, _, v in model_snapshot(model)]


def tree_snapshot(tree: Any, ids: bool = True) -> list:
    """A state tree: its structure, and per Leaf its identity (or, with ``ids=False``, the
    index of its first appearance, so sharing still shows), rule, frozen flag, the identity
    of its state object and the state's bits."""
    out = []
    index: dict[int, int] = {}

    def go(kp: tuple, t: Any) -> None:
        if isinstance(t, Leaf):
            who = id(t) if ids else index.setdefault(id(t), len(index))
            extra = (id(t.rule), id(t.state)) if ids else ()
            out.append((kp, "Leaf", who, type(t.rule), repr(t.rule), t.frozen, fp(t.state),
                        *extra))
        elif isinstance(t, dict):
            out.append((kp, "dict", id(t) if ids else None, tuple(t)))
            for k, v in t.items():
                go(kp + (k,), v)
        elif isinstance(t, (tuple, list)):
            out.append((kp, type(t).__name__, id(t) if ids else None, len(t)))
            for i, v in enumerate(t):
                go(kp + (i,), v)
        else:
            out.append((kp, fp(t)))

    go((), tree)
    return out


def state_arrays(tree: Any) -> list:
    return [a for _, leaf in leaves(tree) for a in O.fleaves(leaf.state)
            if isinstance(a, np.ndarray)]
