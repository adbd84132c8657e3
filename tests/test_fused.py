"""The fused paths give the same arrays as the plain path, for every rule and chain."""

from __future__ import annotations

import numpy as np
import pytest

import optimisers as O
from conftest import (
    ALL_RULES,
    alone_and_together,
    numpy_adam_job,
    rule_id,
    rules_param,
    run_fused,
    spy_runs,
)
from optimisers import backends
from optimisers.backends import packs
from optimisers.fast import fused


def make_model(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    tied = rng.normal(size=(3, 2)).astype(dtype)
    return {
        "layers": [{"w": rng.normal(size=(4, 3)).astype(dtype),
                    "b": rng.normal(size=3).astype(dtype)} for _ in range(4)],
        "tied_a": tied, "tied_b": tied,
        "scalar": np.array(0.5, dtype), "frozen": rng.normal(size=5).astype(dtype),
        "wide": rng.normal(size=(2, 2, 2)).astype(dtype),
    }


def grads_for(model, step, rng):
    g = O.fmap(lambda x: rng.normal(size=x.shape).astype(x.dtype) if O.isnumeric(x) else None,
               model, cache=False)
    if step % 3 == 1:
        g["layers"][1] = None  # no gradient for one layer in some steps
    return g


@pytest.fixture(params=["vectorised", "chunked"])
def path(request, monkeypatch):
    """Which fused path runs: the rule's own apply over the group's concatenation (its
    packed state), or piece by piece (for large arrays; here pieces of 2 elements make
    every array large)."""
    if request.param == "chunked":
        monkeypatch.setattr(fused, "CHUNK", 2)
    return request.param


def run(rule, steps, inplace, fuse, monkeypatch, dtype=np.float32):
    rng = np.random.default_rng(1)
    return run_fused(rule, make_model(dtype), lambda m, step: grads_for(m, step, rng),
                     steps, inplace, fuse, monkeypatch)


def assert_same(a, b):
    la, lb = O.fleaves(a), O.fleaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


@rules_param()
@pytest.mark.parametrize("inplace", [True, False], ids=["update_", "update"])
def test_fused_equals_plain(rule, inplace, monkeypatch, path):
    tree_f, model_f = run(rule, 7, inplace, True, monkeypatch)
    tree_p, model_p = run(rule, 7, inplace, False, monkeypatch)
    assert_same(model_f, model_p)
    assert model_f["tied_a"] is model_f["tied_b"]
    assert (model_f["frozen"] == make_model()["frozen"]).all()
    for (_kp, lf), (_, lp) in zip(O.state.leaves(tree_f), O.state.leaves(tree_p)):
        assert_same(lf.state, lp.state)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.complex64])
@rules_param([O.Adam(0.1), O.OptimiserChain(O.WeightDecay(0.1), O.Momentum(0.1)),
              O.AdamW(0.1, lambd=0.1)])
def test_fused_equals_plain_in_other_dtypes(rule, dtype, monkeypatch, path):
    _, model_f = run(rule, 4, True, True, monkeypatch, dtype)
    _, model_p = run(rule, 4, True, False, monkeypatch, dtype)
    assert_same(model_f, model_p)


def test_fused_path_is_taken_and_groups_are_reused(monkeypatch):
    runs = spy_runs(monkeypatch)
    model = {f"p{i}": np.ones(8, np.float32) for i in range(50)}
    tree = O.setup(O.Adam(), model)
    g = {k: np.ones(8, np.float32) for k in model}
    for _ in range(3):
        tree, model = O.update_(tree, model, g)
    assert [n for _, n in runs] == [50, 50, 50]
    assert runs[1][0] == runs[2][0]  # the group found in step 2 is kept for step 3


# Adam's Leafs fuse only while their bias corrections agree: the events that make one
# Leaf lag behind (skipped, frozen, replaced) come last
EVENTS = ["", "", "", "float64", "", "adjust", "", "state", "", "none", "freeze", "thaw",
          "rule", ""]


@rules_param([O.Adam(0.1), O.OptimiserChain(O.WeightDecay(0.1), O.Momentum(0.1))])
def test_whole_group_step_falls_back_whenever_anything_changed(rule, path, monkeypatch):
    """update_ steps a training loop's single group of every Leaf straight from the
    gradients (no per-Leaf entries); each change between steps must be noticed."""
    fast = []
    original = O.plan.Plan.whole

    def spy(self, *args):
        fast.append(original(self, *args))
        return fast[-1]

    monkeypatch.setattr(O.plan.Plan, "whole", spy)

    def run(fuse):
        with monkeypatch.context() as m:
            if not fuse:
                m.setattr(fused, "MIN_GROUP", 10**9)
            rng = np.random.default_rng(3)
            model = {f"p{i}": rng.normal(size=5).astype(np.float32) for i in range(6)}
            tree = O.setup(rule, model)
            for event in EVENTS:
                g = {k: rng.normal(size=5).astype(np.float32) for k in model}
                if event == "freeze":
                    O.freeze_(tree["p1"])
                elif event == "thaw":
                    O.thaw_(tree)
                elif event == "adjust":
                    O.adjust_(tree, eta=0.05)
                elif event == "float64":
                    g["p2"] = g["p2"].astype(np.float64)
                elif event == "state":
                    tree["p3"].state = O.fmap(lambda a: np.asarray(a) * 0.5 if O.isnumeric(a)
                                              else a, tree["p3"].state)
                elif event == "none":
                    g["p4"] = None
                elif event == "rule":
                    tree["p5"].rule = O.Descent(0.1)
                tree, model = O.update_(tree, model, g)
            return tree, model

    tree_f, model_f = run(True)
    # direct except where the step before changed something (from the 2nd step: a plan)
    assert fast[:9] == [True, True, False, True, False, True, False, True, False]
    tree_p, model_p = run(False)
    assert_same(model_f, model_p)
    leaves_f, leaves_p = O.fleaves(tree_f), O.fleaves(tree_p)
    assert [x.rule for x in leaves_f] == [x.rule for x in leaves_p]
    assert_same([x.state for x in leaves_f], [x.state for x in leaves_p])


def test_setup_packs_state_contiguously():
    model = [np.ones(3, np.float32), np.ones((2, 2), np.float32), np.ones(1, np.float64)]
    tree = O.setup(O.Adam(), model)
    (m0, v0, _), (m1, _, _) = tree[0].state, tree[1].state
    assert m0.base is not None and m0.base is m1.base
    flat, isview = backends.ops("numpy").joined((m0, m1))
    assert isview and flat.base is m0.base and flat.size == 7
    assert flat.ctypes.data == m0.ctypes.data and m1.ctypes.data == m0.ctypes.data + 12
    # the first moments and the second begin at different places in a 4 KiB page
    places = {m0.ctypes.data % 4096, v0.ctypes.data % 4096}
    assert len(places) == 2 and places <= set(packs.SLOTS)
    assert tree[2].state[0].base is None  # alone in its dtype: not packed
    # a pure update keeps the layout
    new_tree, _ = O.update(tree, model, [np.ones_like(x) for x in model])
    n0, n1 = new_tree[0].state[0], new_tree[1].state[0]
    assert n0.base is n1.base and n0.base is not m0.base


def test_state_replaced_by_hand_is_respected():
    model = {f"p{i}": np.ones(4) for i in range(3)}
    tree = O.setup(O.Momentum(0.1, 0.5), model)
    g = {k: np.ones(4) for k in model}
    tree, model = O.update_(tree, model, g)
    tree, model = O.update_(tree, model, g)  # the group is now known
    tree["p1"].state = np.full(4, 10.0)      # replaced: the known group must notice
    tree, model = O.update_(tree, model, g)
    np.testing.assert_allclose(tree["p1"].state, 5.0 + 0.1)
    np.testing.assert_allclose(tree["p0"].state, 0.075 + 0.1)


def test_model_array_replaced_by_hand_is_respected():
    model = {f"p{i}": np.ones(4) for i in range(3)}
    tree = O.setup(O.Descent(0.5), model)
    g = {k: np.ones(4) for k in model}
    for _ in range(2):
        tree, model = O.update_(tree, model, g)
    model["p2"] = np.full(4, 7.0)
    tree, model = O.update_(tree, model, g)
    assert model["p2"].tolist() == [6.5] * 4 and model["p0"].tolist() == [-0.5] * 4


def test_all_rules_list_covers_the_fused_rules():
    names = {type(r).__name__ for r in ALL_RULES}
    for r in ALL_RULES:
        names |= {type(s).__name__ for s in getattr(r, "rules", ())}
    for name, cls in O.RULES.items():
        if cls.__module__.startswith("optimisers.rules.") and cls.elementwise and not (
                name.startswith("_")):  # (a tree-level rule's per-array form: not made by hand)
            assert name in names


@rules_param([O.Adam(0.1), O.Nesterov(0.1), O.AdamW(0.1, lambd=0.1, couple=False),
              O.OptimiserChain(O.ClipGrad(0.5), O.SignDecay(0.1), O.RMSProp(0.1))])
def test_many_small_arrays(rule, monkeypatch, path):
    def once(fuse):
        with monkeypatch.context() as m:
            if not fuse:
                m.setattr(fused, "MIN_GROUP", 10**9)
            rng = np.random.default_rng(5)
            model = [rng.normal(size=int(rng.integers(1, 20))).astype(np.float32)
                     for _ in range(150)]
            tree = O.setup(rule, model)
            for _ in range(4):
                tree, model = O.update_(tree, model, [rng.normal(size=x.shape).astype(
                    np.float32) for x in model])
            return model

    assert_same(once(True), once(False))


@rules_param([O.Adam(0.1), O.Momentum(0.1)])
def test_tied_zero_dim_arrays(rule, path):
    """Gradients summed over a tie of 0-d arrays: NumPy makes a scalar of the sum, whose
    memory a compiled kernel must not read by address (it was a freed temporary)."""
    def run(inplace):
        a = np.array(0.5)
        model = (a, (a, np.array(-0.5)))
        tree = O.setup(rule, model)
        for _ in range(3):
            g = (np.array(1.0), (np.array(1.0), np.array(1.0)))
            tree, model = (O.update_ if inplace else O.update)(tree, model, g)
        return model

    assert_same(run(True), run(False))


def test_packed_state_is_freed_with_its_tree():
    """The record of packed buffers holds them weakly: a dropped tree frees its state."""
    import gc
    import weakref

    gc.collect()
    records = backends.ops("numpy")._PACKS._records
    before = len(records)
    model = [np.ones(3, np.float32), np.ones(4, np.float32)]
    tree = O.setup(O.Adam(), model)
    buf = weakref.ref(tree[0].state[0].base)
    assert len(records) == before + 2  # m and v
    copy = O.state.copy_tree(tree)  # keeps the layout, in a buffer of its own
    assert copy[0].state[0].base is copy[1].state[0].base is not buf()
    del tree, copy
    gc.collect()
    assert buf() is None and len(records) == before


def test_updates_from_several_threads(path):
    """Trees stepped in several threads at once (each its own) give what they give alone:
    nothing of one step is shared between trees."""
    alone, together = alone_and_together([(numpy_adam_job(40, 30, 20), k) for k in range(4)])
    for a, b in zip(together, alone, strict=True):
        assert_same(a, b)


def test_packing_keeps_every_bit():
    """Packing skips copying all-zero state (fresh from setup), but -0.0 is not zero."""
    model = [np.ones(3), np.ones(2)]
    tree = O.setup(O.Momentum(), model)
    tree[0].state = np.array([0.0, -0.0, 0.0])
    tree[1].state = np.array([-0.0, np.nan])
    fused.pack([tree[0], tree[1]])
    copy = O.state.copy_tree(tree)
    for t in (tree, copy):
        assert t[0].state.base is t[1].state.base is not None
        assert np.signbit(t[0].state).tolist() == [False, True, False]
        assert np.signbit(t[1].state[0]) and np.isnan(t[1].state[1])


@pytest.mark.parametrize("count", [3, 70])  # 70 small arrays: gradients concatenated
def test_gradient_buffers_refilled_in_place(path, count, monkeypatch):
    """A training loop may write each step's gradients into the same arrays; a kernel
    that reads them by address must read this step's values, also when the buffers are
    swapped for new arrays, or some are, between steps."""
    def grads_at(model, step):
        if step in (3, 5):  # new arrays: all of them, then just one
            bufs[:] = [b.copy() for b in bufs] if step == 3 else [*bufs[:-1], bufs[-1].copy()]
        for i, b in enumerate(bufs):
            b[...] = np.sin(np.arange(b.size) + 3.0 * step + i).reshape(b.shape)
        return {"xs": bufs}

    runs = []
    for fuse in (True, False):
        model = {"xs": [np.full((2, 3), 0.1 * i, np.float32) for i in range(count)],
                 "frozen": np.ones(2, np.float32)}
        bufs = [np.zeros_like(x) for x in model["xs"]]
        runs.append(run_fused(O.Adam(0.1), model, grads_at, 7, True, fuse, monkeypatch)[1])
    assert_same(*runs)


@pytest.mark.parametrize("edit", ["frozen", "rule", "state", "subtree"])
def test_leafs_written_between_cached_steps(path, edit, monkeypatch):
    """A training loop's fused step checks its Leafs by identity only (each as its group
    left it); a Leaf's frozen flag, rule or state set directly, or a step of a sub-tree
    (its own plan and group), must be seen, as on the plain path."""
    def run(fuse):
        with monkeypatch.context() as m:
            if not fuse:
                m.setattr(fused, "MIN_GROUP", 10**9)
            model = {"a": [np.full(4, 0.1 * i, np.float32) for i in range(3)],
                     "b": [np.full(4, -0.1 * i, np.float32) for i in range(3)]}
            grads = O.fmap(lambda x: np.linspace(-1, 1, x.size, dtype=x.dtype), model)
            tree = O.setup(O.Adam(0.1), model)
            for step in range(6):
                if step == 3:
                    leaf = tree["b"][1]
                    if edit == "frozen":
                        leaf.frozen = True
                    elif edit == "rule":
                        leaf.rule = O.Adam(0.5)
                    elif edit == "state":
                        leaf.state = leaf.rule.init(model["b"][1])
                    else:
                        O.update_(tree["b"], model["b"], grads["b"])
                O.update_(tree, model, grads)
            return [leaf.state for _, leaf in O.state.leaves(tree)], model

    assert_same(run(True), run(False))


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("inplace", [True, False])
@pytest.mark.parametrize("size", [40, 300_000])
@pytest.mark.parametrize("rule", [O.LAMB(0.02), O.LAMB(0.02, lambd=0.01)], ids=rule_id)
def test_lamb_steps_adams_direction_fused_then_each_trust_ratio(rule, size, inplace, lib,
                                                                monkeypatch):
    """LAMB's Leafs form a ``Directed`` group: Adam's direction through the fused paths
    (the pieces of large arrays, or the joined arrays), then each
    array's trust ratio: the plain path's results, bit for bit on NumPy."""
    wrap = (lambda a: a) if lib == "numpy" else pytest.importorskip("torch").from_numpy
    rng = np.random.default_rng(3)
    start = {f"p{i}": rng.normal(size=size).astype(np.float32) for i in range(3)}
    start["frozen"] = rng.normal(size=size).astype(np.float32)

    def grads(m, k):
        r = np.random.default_rng(100 + k)
        return {key: wrap(r.normal(size=v.shape).astype(np.float32)) for key, v in m.items()}

    def model():
        return {k: wrap(v.copy()) for k, v in start.items()}

    fast = run_fused(rule, model(), grads, 4, inplace, True, monkeypatch)
    plain = run_fused(rule, model(), grads, 4, inplace, False, monkeypatch)
    if inplace:
        kinds = {type(g).__name__ for g in O.state.plan_of(fast[0]).groups}
        assert kinds == {"Directed"}
    for k in start:
        a, b = np.asarray(fast[1][k]), np.asarray(plain[1][k])
        if lib == "numpy":
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        assert [fast[0][k].clock, fast[0][k].state[2]] == [plain[0][k].clock, plain[0][k].state[2]]
    assert not np.array_equal(np.asarray(fast[1]["p0"]), start["p0"])
    np.testing.assert_array_equal(np.asarray(fast[1]["frozen"]), start["frozen"])
