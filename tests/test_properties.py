"""Property tests: random nested models with random ties, random gradients."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optimisers as O

Pair = namedtuple("Pair", "left right")


@dataclasses.dataclass
class Box:
    inner: object
    label: str = "box"


@dataclasses.dataclass
class Norm:
    beta: object
    mu: object
    __trainable__ = ("beta",)


O.register(Norm)

POOL = 5  # arrays shared across the model: indices into it make ties


def build(spec, pool):
    """Turn a spec (nested tuples of tags) into a model over the array pool."""
    tag = spec[0]
    if tag == "arr":
        return pool[spec[1]]
    if tag == "lit":
        return spec[1]
    kids = [build(s, pool) for s in spec[1]]
    if tag == "tuple":
        return tuple(kids)
    if tag == "list":
        return list(kids)
    if tag == "dict":
        return {f"k{i}": k for i, k in enumerate(kids)}
    if tag == "pair":
        return Pair(kids[0], kids[-1])
    if tag == "box":
        return Box(kids[0])
    return Norm(kids[0], kids[-1])


leaf_spec = st.one_of(
    st.tuples(st.just("arr"), st.integers(0, POOL - 1)),
    st.tuples(st.just("lit"), st.sampled_from([1, 2.5, "s", None])),
)
spec = st.recursive(
    leaf_spec,
    lambda kids: st.tuples(st.sampled_from(["tuple", "list", "dict", "pair", "box", "norm"]),
                           st.lists(kids, min_size=1, max_size=3)),
    max_leaves=12,
)


@st.composite
def models(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    pool = []
    for i in range(POOL):
        a = rng.normal(size=draw(st.sampled_from([(), (2,), (2, 3)])))
        a = np.asarray(a, draw(st.sampled_from([np.float32, np.float64])))
        if draw(st.booleans()) and i % 2:
            a.setflags(write=False)  # immutable: never tied
        pool.append(a)
    return build(draw(spec), pool)


def paths(model, canonical=False):
    """(KeyPath, array) for every numeric array at a trainable position, every path.

    With ``canonical``, (KeyPath, canonical path) instead: the path by which the walk
    first reached the innermost mutable object on the way (array or container), plus the
    rest of the way; two paths are tied exactly when their canonical paths are equal.
    """
    out, first = [], {}

    def go(kp, canon, x):
        if O.ismutable(x):
            canon = first.setdefault(id(x), canon)
        if O.isnumeric(x):
            out.append((kp, canon if canonical else x))
            return
        kids = O.children(x)
        for k in O.trainable(x) if kids else ():
            go(kp + (k,), canon + (k,), kids[k])

    go(O.KeyPath(), O.KeyPath(), model)
    return out


def random_grads(model, rng, p_none):
    def g(x):
        if not O.isnumeric(x) or rng.random() < p_none:
            return None
        return rng.normal(size=x.shape).astype(x.dtype)
    return O.fmap(g, model, cache=False)


def snapshot(model, tree):
    arrays = [(kp, x.copy()) for kp, x in paths(model)]
    states = [(kp, [np.array(a, copy=True) for a in O.fleaves(leaf.state)
                    if isinstance(a, np.ndarray)]) for kp, leaf in O.state.leaves(tree)]
    return arrays, states


def same_snapshot(a, b):
    for (k1, x1), (k2, x2) in zip(a[0], b[0]):
        assert k1 == k2
        np.testing.assert_array_equal(x1, x2)
    for (_, s1), (_, s2) in zip(a[1], b[1]):
        for u, v in zip(s1, s2):
            np.testing.assert_array_equal(u, v)


RULES = [O.Adam(0.1), O.Momentum(0.1), O.OptimiserChain(O.ClipNorm(1.0), O.Nesterov(0.1)),
         O.OptimiserChain(O.AccumGrad(2), O.Descent(0.1))]

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(models(), st.sampled_from(RULES), st.integers(0, 2**16), st.floats(0.0, 0.5))
def test_setup_shares_leaves_exactly_for_ties(model, rule, seed, p_none):
    tree = O.setup(rule, model) if paths(model) else None
    for kp1, c1 in paths(model, canonical=True):
        for kp2, c2 in paths(model, canonical=True):
            l1, l2 = O.getkeypath(tree, kp1), O.getkeypath(tree, kp2)
            assert (l1 is l2) == (c1 == c2)


@SETTINGS
@given(models(), st.sampled_from(RULES), st.integers(0, 2**16), st.floats(0.0, 0.5))
def test_update_is_pure_and_equals_update_(model, rule, seed, p_none):
    if not paths(model):
        return
    tree = O.setup(rule, model)
    twin_tree, twin = O.update(tree, model, random_grads(model, np.random.default_rng(0), 0))
    # twin is an independent copy of model (after one step), with its own tree
    rng1, rng2 = np.random.default_rng(seed), np.random.default_rng(seed)
    for _ in range(3):
        grads = random_grads(twin, rng1, p_none)
        before = snapshot(twin, twin_tree)
        new_tree, new = O.update(twin_tree, twin, grads)
        same_snapshot(before, snapshot(twin, twin_tree))       # nothing old was changed
        grads2 = random_grads(twin, rng2, p_none)
        twin_tree, twin = O.update_(twin_tree, twin, grads2)    # the same step in place
        for (k1, x1), (k2, x2) in zip(paths(new), paths(twin)):
            assert k1 == k2
            np.testing.assert_array_equal(x1, x2)
            assert x1.dtype == x2.dtype
        ties = [c for _, c in paths(twin, canonical=True)]
        assert ties == [c for _, c in paths(new, canonical=True)]  # never lost nor invented
        for (a, x), ca in zip(paths(new), ties):
            for (b, y), cb in zip(paths(new), ties):
                assert (x is y) == (ca == cb) or not O.ismutable(x) and a != b


@SETTINGS
@given(models())
def test_fmap_identity_keeps_structure_and_ties(model):
    out = O.fmap(lambda x: x, model)
    assert [kp for kp, _ in paths(out)] == [kp for kp, _ in paths(model)]
    for (_, x), (_, y) in zip(paths(model), paths(out)):
        assert x is y
