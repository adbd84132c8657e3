"""JAX models: pytrees, jax.jit, no re-trace on adjust, equinox, agreement with optax."""

from __future__ import annotations

import copy
import dataclasses
import gc
import subprocess
import sys
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import optimisers as O  # noqa: E402
from conftest import ALL_RULES, counted, fitting, normal, rule_id, rules_param  # noqa: E402
from optimisers import backends  # noqa: E402


def make_model(seed: int = 0) -> dict:
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    return {"layers": [{"w": jax.random.normal(k1, (3, 8)) / 2, "b": jnp.zeros(8)},
                       {"w": jax.random.normal(k2, (8, 2)) / 3, "b": jnp.zeros(2)}],
            "scale": jax.random.normal(k3, ())}


def loss(model: dict, x: jax.Array) -> jax.Array:
    h = x
    for layer in model["layers"]:
        h = jnp.tanh(h @ layer["w"] + layer["b"])
    return jnp.mean((h * model["scale"] - 0.5) ** 2)


def data(step: int) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(100 + step), (16, 3))


@jax.jit
def train_step(tree, model, x):
    return O.update(tree, model, jax.grad(loss)(model, x))



def assert_trees_close(a, b, **tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


optax = pytest.importorskip("optax")

PEERS = [
    (O.Adam(0.01), lambda: optax.adam(0.01)),
    (O.Adam(0.02, (0.8, 0.99), 1e-6), lambda: optax.adam(0.02, b1=0.8, b2=0.99, eps=1e-6)),
    (O.NAdam(0.01), lambda: optax.nadam(0.01)),
    (O.Lion(0.003), lambda: optax.lion(0.003, weight_decay=0.0)),
    (O.Momentum(0.05, 0.9), lambda: optax.sgd(0.05, momentum=0.9)),
    (O.Nesterov(0.05, 0.9), lambda: optax.sgd(0.05, momentum=0.9, nesterov=True)),
    (O.Descent(0.1), lambda: optax.sgd(0.1)),
    (O.AdamW(0.01, lambd=0.1), lambda: optax.adamw(0.01, weight_decay=0.1)),
]


@pytest.mark.parametrize("rule, peer", PEERS, ids=[repr(r) for r, _ in PEERS])
def test_agrees_with_optax_under_jit(rule, peer):
    opt = peer()

    @jax.jit
    def optax_step(state, params, x):
        updates, state = opt.update(jax.grad(loss)(params, x), state, params)
        return state, optax.apply_updates(params, updates)

    model = params = make_model()
    tree, state = O.setup(rule, model), opt.init(params)
    for step in range(20):
        tree, model = train_step(tree, model, data(step))
        state, params = optax_step(state, params, data(step))
    assert_trees_close(model, params, rtol=1e-5, atol=1e-5)
    assert not np.allclose(model["scale"], make_model()["scale"])


def test_adjust_does_not_retrace():
    traces = 0

    @jax.jit
    def step(tree, model, x):
        nonlocal traces
        traces += 1
        return O.update(tree, model, jax.grad(loss)(model, x))

    model = make_model()
    tree = O.setup(O.OptimiserChain(O.ClipNorm(5.0), O.AdamW(0.01, lambd=0.01)), model)
    for i in range(3):
        tree, model = step(tree, model, data(i))
    tree = O.adjust(tree, 0.003)
    tree = O.adjust_(tree, beta=(0.8, 0.95), lambd=0.02, omega=2.0)
    _, model_jit = step(tree, model, data(3))
    assert traces == 1
    # the new values are really used: compare with the same step run eagerly
    _, model_eager = O.update(tree, model, jax.grad(loss)(model, data(3)))
    assert_trees_close(model_jit, model_eager, rtol=1e-5, atol=1e-6)
    # changing a static field (a bool) does re-trace: it is part of the structure
    tree = O.adjust(tree, couple=False)
    step(tree, model, data(4))
    assert traces == 2


def test_adjust_inside_the_jitted_step():
    """A schedule inside the step: adjust of a traced learning rate neither re-traces nor
    leaves the tree anything but what an eager adjust and update give."""
    f, traces = counted(
        lambda tree, model, x, lr: O.update(O.adjust(tree, lr), model, jax.grad(loss)(model, x)))
    step = jax.jit(f)
    model = eager_model = make_model()
    tree = eager = O.setup(O.Adam(0.01), model)
    for i, lr in enumerate([0.01, 0.005, 0.002]):
        tree, model = step(tree, model, data(i), lr)
        eager, eager_model = O.update(O.adjust(eager, lr), eager_model,
                                      jax.grad(loss)(eager_model, data(i)))
    assert len(traces) == 1
    assert tree["scale"].rule == O.Adam(0.002)
    assert_trees_close(model, eager_model, rtol=1e-5, atol=1e-6)


@rules_param(ALL_RULES)
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_every_rule_under_jit_matches_numpy(rule, dtype):
    """Complex too: every rule treats a complex parameter alike in every library."""
    rng = np.random.default_rng(0)
    w = normal(rng, (3, 4), dtype)
    gs = [normal(rng, (3, 4), dtype) for _ in range(5)]
    step = jax.jit(O.update)
    mn, mj = {"w": w.copy()}, {"w": jnp.asarray(w)}
    tn, tj = O.setup(fitting(rule), mn), O.setup(fitting(rule), mj)
    for g in gs:
        tn, mn = O.update_(tn, mn, {"w": g})
        tj, mj = step(tj, mj, {"w": jnp.asarray(g)})
    np.testing.assert_allclose(np.asarray(mj["w"]), mn["w"], rtol=1e-4, atol=2e-5)


@rules_param(ALL_RULES)
def test_every_rule_in_a_group_under_jit_matches_numpy(rule):
    """Arrays of two shapes step as one group under jit (one record of numbers, the state
    numbers that depend on no array stepped once for all): every rule's parameters and
    state numbers equal NumPy's, each Leaf stepped alone."""
    rng = np.random.default_rng(1)
    shapes = {"w": (3, 4), "b": (5,)}
    model = {k: normal(rng, s, np.float32) for k, s in shapes.items()}
    grads = [{k: normal(rng, s, np.float32) * (1 + 3 * i) for k, s in shapes.items()}
             for i in range(4)]
    step = jax.jit(O.update)
    mn, mj = {k: v.copy() for k, v in model.items()}, jax.tree.map(jnp.asarray, model)
    tn, tj = O.setup(fitting(rule), mn), O.setup(fitting(rule), mj)
    for g in grads:
        tn, mn = O.update_(tn, mn, g)
        tj, mj = step(tj, mj, jax.tree.map(jnp.asarray, g))
    for k in shapes:
        np.testing.assert_allclose(np.asarray(mj[k]), mn[k], rtol=1e-4, atol=2e-5)
        numbers = [[float(np.asarray(v)) for v in jax.tree.leaves(t[k].state) if np.ndim(v) == 0]
                   for t in (tn, tj)]
        np.testing.assert_allclose(numbers[1], numbers[0], rtol=1e-5)


def test_a_groups_steps_compute_what_reads_no_array_once():
    """Under jit, Adam over 20 arrays of two shapes computes its bias corrections once for
    the group (``b^t`` twice), not per array or per shape, and passes its numbers to the
    arrays' steps behind one barrier; the steps equal NumPy's."""
    rng = np.random.default_rng(2)
    model = [normal(rng, (3,) if i % 2 else (2, 2), np.float32) for i in range(20)]
    grads = [normal(rng, x.shape, np.float32) for x in model]
    tree = O.setup(O.Adam(0.1), [jnp.asarray(x) for x in model])
    jaxpr = jax.make_jaxpr(O.update)(tree, [jnp.asarray(x) for x in model],
                                     [jnp.asarray(g) for g in grads])
    names = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert names.count("pow") == 2
    assert names.count("optimization_barrier") == 1
    tn = O.setup(O.Adam(0.1), model)
    tn, mn = O.update_(tn, [x.copy() for x in model], grads)
    _, mj = jax.jit(O.update)(tree, [jnp.asarray(x) for x in model],
                              [jnp.asarray(g) for g in grads])
    for a, b in zip(mj, mn):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=2e-5)


@rules_param(ALL_RULES)
def test_every_rule_in_a_group_eagerly_matches_numpy(rule):
    """Not jitted, Leafs of two shapes that step as one group (a rule that waits, such as
    AccumGrad, or one that skips, as traced and as stepped) equal NumPy's."""
    rng = np.random.default_rng(3)
    shapes = {"a": (3, 2), "b": (4, 2), "c": (3, 2)}
    model = {k: normal(rng, s, np.float32) for k, s in shapes.items()}
    grads = {k: normal(rng, s, np.float32) for k, s in shapes.items()}
    mn, mj = {k: v.copy() for k, v in model.items()}, jax.tree.map(jnp.asarray, model)
    tn, tj = O.setup(fitting(rule), mn), O.setup(fitting(rule), mj)
    for _ in range(3):
        tn, mn = O.update(tn, mn, grads)
        tj, mj = O.update(tj, mj, jax.tree.map(jnp.asarray, grads))
    for k in shapes:
        np.testing.assert_allclose(np.asarray(mj[k]), mn[k], rtol=1e-4, atol=2e-5)


def test_a_rule_whose_new_state_holds_a_constant_steps_under_jit():
    """A rule may put a Python number in its new state (a counter reset to 0): the group's
    traced step passes it through."""

    @dataclasses.dataclass(frozen=True)
    class Reset(O.Rule):
        eta: float = 0.1

        def init(self, x):
            return (jnp.zeros_like(x), 0.0)

        def apply(self, state, x, dx):
            return (state[0] + dx, 0.0), self.eta * dx

    model = {"a": jnp.ones(3), "b": jnp.ones(4)}
    tree, model = jax.jit(O.update)(O.setup(Reset(), model), model,
                                    {"a": jnp.ones(3), "b": jnp.ones(4)})
    np.testing.assert_allclose(np.asarray(model["b"]), 0.9, rtol=1e-6)
    assert float(tree["a"].state[1]) == 0.0
    np.testing.assert_array_equal(np.asarray(tree["a"].state[0]), 1.0)


def test_accumgrad_chain_under_jit_waits():
    """Under jit AccumGrad cannot return None: the chain keeps the next rule's state."""
    x = {"w": jnp.ones(3)}
    tree = O.setup(O.OptimiserChain(O.AccumGrad(3), O.Adam(0.1)), x)
    step = jax.jit(O.update)
    for i in range(2):
        tree, y = step(tree, x, {"w": jnp.full(3, float(i))})
        np.testing.assert_array_equal(y["w"], x["w"])
    adam_state = tree["w"].state[1]
    assert not np.asarray(adam_state[0]).any()
    assert float(adam_state[2]) == 0.0  # no step taken
    tree, y = step(tree, x, {"w": jnp.full(3, 5.0)})
    np.testing.assert_allclose(np.asarray(y["w"]), 0.9, rtol=1e-6)


def test_update_in_place_is_out_of_place():
    model = make_model()
    tree = O.setup(O.Adam(0.1), model)
    leaf = tree["layers"][0]["w"]
    before = leaf.state
    grads = jax.grad(loss)(model, data(0))
    tree2, new = O.update_(tree, model, grads)
    assert tree2 is tree and tree["layers"][0]["w"] is leaf and leaf.state is not before
    assert new is not model
    np.testing.assert_array_equal(model["layers"][0]["w"], make_model()["layers"][0]["w"])
    assert not np.allclose(new["layers"][0]["w"], model["layers"][0]["w"])
    # and under jit
    tree, new2 = jax.jit(O.update_)(tree, new, grads)
    assert isinstance(tree["layers"][0]["w"], O.Leaf)


def test_the_jax_backend_is_extended_from_above_once_loaded():
    """``registry.extend``: the module that registers Leafs and rules as pytrees
    (``fast/jaxtree.py``) is imported with the JAX backend, which it leaves as it is; the
    registry gives it (``registry.extension``)."""
    from optimisers.backends import registry
    from optimisers.fast import jaxtree

    assert registry.extension("jax") is jaxtree
    assert not hasattr(registry.ops("jax"), "fuse")
    registry.extend("jax", "optimisers.fast.jaxtree")  # loaded already: imported (again)
    assert registry.extension("jax") is jaxtree


def test_rules_are_pytrees_once_jax_is_imported():
    """With JAX imported first, a rule flattens before any JAX array reached optimisers;
    imported the other way round, from the first JAX array it sees."""
    code = ("import jax, optimisers as O; print(len(jax.tree.leaves(O.Adam(0.1))))", "4")
    late = ("import optimisers as O, jax, jax.numpy as jnp; print(len(jax.tree.leaves("
            "O.Adam(0.1))), end=' '); O.setup(O.Adam(), jnp.ones(1)); "
            "print(len(jax.tree.leaves(O.Adam(0.1))))", "1 4")
    for src, want in (code, late):
        out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                             check=True).stdout
        assert out.strip() == want


def test_pytree_layout():
    backends.ops("jax")  # the rules are pytrees (whichever test ran first)
    leaves, treedef = jax.tree.flatten(O.AdamW(0.1, (0.8, 0.9), 0.01))
    np.testing.assert_allclose(leaves, [0.1, 0.8, 0.9, 0.01, 1e-8])
    assert all(v.weak_type for v in leaves)  # numbers become weakly typed arrays
    back = jax.tree.unflatten(treedef, [0.1, 0.8, 0.9, 0.01, 1e-8])
    assert back == O.AdamW(0.1, (0.8, 0.9), 0.01) and back.couple is True
    assert jax.tree.leaves(O.ClipNorm(2.0, p=1.0, throw=False)) == [2.0]  # p is static
    assert jax.tree.leaves(O.AccumGrad(4)) == []
    chain = O.MixedPrecision(O.OptimiserChain(O.Descent(0.3), O.Momentum()), np.float32)
    np.testing.assert_allclose(jax.tree.leaves(chain), [0.3, 0.01, 0.9])
    assert float(jax.tree.map(lambda v: v * 2, chain).rule.rules[0].eta) == pytest.approx(0.6)
    state = O.setup(O.RAdam(), {"w": jnp.ones(2)})["w"].state
    assert [(a.shape, a.dtype) for a in jax.tree.leaves(O.Leaf(O.Descent(), state))] == [
        ((), jnp.float32), ((), jnp.float32), ((), jnp.int32), ((2,), jnp.float32),
        ((2,), jnp.float32), ((), jnp.float32)
    ]  # eta and 1 - eta, the clock; m, v and the step count (see test_a_group_reads_one_record)
    frozen = O.Leaf(O.Descent(0.1), None, frozen=True)
    assert jax.tree.structure(frozen) != jax.tree.structure(O.Leaf(O.Descent(0.1), None))
    assert jax.tree.unflatten(*reversed(jax.tree.flatten(frozen))).frozen


@pytest.mark.parametrize("rule", [O.Adam(), O.OptimiserChain(O.ClipGrad(1.0), O.RAdam()),
                                  O.MixedPrecision(O.AdamW(), np.float32)], ids=repr)
def test_setup_makes_numbers_arrays_once(rule):
    """A JAX tree from setup has its flat form made already, each Leaf its own arrays:
    flattening it (what every jitted call does) makes no new array, and a jitted step may
    donate the whole tree, which it could not if two Leafs shared a buffer."""
    dt = jnp.bfloat16  # MixedPrecision(float32) then keeps a copy, not the array itself
    model = {"a": jnp.ones(3, dt), "b": jnp.ones(3, dt), "c": [jnp.ones(2, dt)]}
    tree = O.setup(rule, model)
    leaves = jax.tree.leaves(tree)
    assert all(isinstance(v, jax.Array) for v in leaves)
    assert all(a is b for a, b in zip(leaves, jax.tree.leaves(tree), strict=True))
    assert len({id(v) for v in leaves}) == len(leaves)  # nothing shared between Leafs
    assert tree["a"].rule == rule and all(
        v.weak_type for v in jax.tree.leaves(tree["a"].rule))
    fresh = O.setup(rule, model)
    step = jax.jit(lambda t, m, g: O.update(t, m, g), donate_argnums=(0, 1))
    grads = jax.tree.map(jnp.ones_like, model)
    tree, new = step(fresh, jax.tree.map(jnp.copy, model), grads)
    _, want = jax.jit(O.update)(O.setup(rule, model), model, grads)
    assert_trees_close(new, want, rtol=0, atol=0)


@pytest.mark.parametrize("rule", [O.Adam(0.1), O.Adafactor()], ids=repr)
def test_a_tree_whose_leafs_fall_into_several_groups_may_be_donated(rule):
    """One rule's Leafs in several groups (one frozen apart, or Adafactor's states of 1-D and
    2-D parameters) share no buffer: a jitted step donating the tree runs, as before and after
    a jitted step, and equals the step that donates nothing."""
    def run(donate):
        model = {"a": jnp.ones(30), "b": jnp.ones((4, 5)), "c": jnp.ones(4)}
        grads = jax.tree.map(lambda x: jnp.full(x.shape, 0.3), model)
        tree = O.setup(rule, model)
        step = jax.jit(O.update, donate_argnums=(0, 1) if donate else ())
        for i in range(4):
            if i in (0, 2):  # (at setup, then after a jitted step)
                (O.freeze_ if i == 0 else O.thaw_)(tree["a"])
            tree, model = step(tree, model, grads)
        return model

    assert_trees_close(run(True), run(False), rtol=0, atol=0)


def test_a_group_reads_one_record():
    """The root of a JAX tree from setup flattens into one record per group of Leafs (one
    rule by value, one clock, frozen alike): the rule's numbers, then the complement 1 - b
    of each, the clock, the numbers in the states (one for all: Adam's step count), then
    each member's state arrays. A Leaf flattens alone as a group of one;
    a Leaf frozen (or adjusted) apart falls into a group of its own."""
    model = {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}
    tree = O.setup(O.Adam(0.01), model)
    flat = jax.tree.leaves(tree)
    rule = [0.01, 0.9, 0.999, 1e-8]
    np.testing.assert_allclose(flat[:8], rule + [1 - v for v in rule], rtol=1e-6)
    assert all(v.weak_type for v in flat[:8]) and flat[8].dtype == jnp.int32
    assert [a.shape for a in flat[9:]] == [(), (2, 3), (2, 3), (3,), (3,)]
    eta, one_minus, clock = jax.tree.leaves(O.setup(O.Descent(0.5), model)["w"])
    assert float(eta) == float(one_minus) == 0.5 and int(clock) == 0
    O.freeze_(tree["b"])
    assert len(jax.tree.leaves(tree)) == 2 * (9 + 3)  # (a group of one each)
    back = jax.tree.unflatten(*reversed(jax.tree.flatten(tree)))
    assert type(back) is type(tree) and back["b"].frozen and not back["w"].frozen
    chain = O.setup(O.OptimiserChain(O.ClipGrad(2.0), O.Momentum(0.1, 0.8)), model)
    nones = jax.tree.map(lambda a: None, chain)  # anything jax.tree.map puts there
    assert nones["w"].rule.rules[1].rho is None


def test_jit_output_is_taken_back_as_it_is():
    """The tree that a jitted step returns, passed back in, is not traced again and makes
    no new array when flattened; its Leafs read back their numbers (the rule equal to the
    one given); a state written between steps is taken."""
    f, traces = counted(O.update)
    step = jax.jit(f)
    model, grads = {"w": jnp.ones(3)}, {"w": jnp.full(3, 0.5)}
    tree = O.setup(O.Adam(0.1), model)
    for _ in range(3):
        tree, model = step(tree, model, grads)
    assert len(traces) == 1  # setup's tree and jit's own flatten alike
    leaf = tree["w"]
    again = jax.tree.leaves(tree)
    assert all(a is b for a, b in zip(again, jax.tree.leaves(tree), strict=True))
    assert leaf.rule == O.Adam(0.1) and leaf.state[2] == 3.0

    tree, model = step(tree, model, grads)
    leaf = tree["w"]
    leaf.state = (jnp.zeros(3), jnp.zeros(3), 0.0)  # a restart of the moments
    assert float(leaf.rule.eta) == pytest.approx(0.1)
    assert float(jax.tree.leaves(tree)[9]) == 0.0
    copied = copy.deepcopy(step(tree, model, grads)[0]["w"])
    assert float(copied.rule.beta[1]) == pytest.approx(0.999)
    assert len(traces) == 1


def test_jax_roots_keep_their_type(tmp_path):
    """JAX's trees keep their root's class, from setup, a jitted call, an eager update,
    adjust, reinit and load alike: jit compares the trees' node types, and a plain dict
    where the root was would trace the step again. Their Leafs are Leafs."""
    model, grads = {"w": jnp.ones(3)}, {"w": jnp.full(3, 0.5)}
    f, traces = counted(O.update)
    step = jax.jit(f)
    tree = O.setup(O.Adam(0.1), model)
    trees = [tree, step(tree, model, grads)[0], O.update(tree, model, grads)[0],
             O.adjust(tree, 0.2), O.reinit(tree, model)]
    O.save(tmp_path / "opt.ckpt", tree)
    trees.append(O.load(tmp_path / "opt.ckpt", like=tree))
    assert [type(t) for t in trees] == [type(tree)] * len(trees)
    assert all(isinstance(t["w"], O.Leaf) for t in trees)
    for t in trees:
        step(t, model, grads)
    assert len(traces) == 1
    hand = {"w": O.Leaf(O.Adam(0.1), O.Adam(0.1).init(model["w"]))}
    assert isinstance(jax.tree.map(lambda v: v, hand)["w"], O.Leaf)
    assert type(copy.deepcopy(tree)) is type(tree)


def test_vmapped_trees_read_one_number_per_model():
    """A tree batched by ``jax.vmap`` (an ensemble of models) packs each Leaf's numbers
    with the batch in front: each number reads back as one value per model, outside
    ``jit`` and inside it, and the batched steps are each model's own."""
    models = {"w": jnp.stack([jnp.ones(3), 2 * jnp.ones(3)])}
    grads = {"w": jnp.stack([jnp.full(3, 0.5), jnp.full(3, -1.0)])}
    trees = jax.vmap(lambda m: O.setup(O.Adam(0.1), m))(models)
    trees, models = jax.jit(jax.vmap(O.update))(trees, models, grads)
    leaf = trees["w"]
    np.testing.assert_allclose(leaf.rule.eta, [0.1, 0.1])
    np.testing.assert_array_equal(leaf.state[2], [1.0, 1.0])
    np.testing.assert_allclose(jax.jit(lambda t: t["w"].rule.beta[0])(trees), [0.9, 0.9])
    for i, x in enumerate([jnp.ones(3), 2 * jnp.ones(3)]):
        _, one = O.update(O.setup(O.Adam(0.1), {"w": x}), {"w": x}, {"w": grads["w"][i]})
        np.testing.assert_allclose(models["w"][i], one["w"], rtol=1e-6)


def test_packed_numbers_under_x64_and_between_eager_steps():
    """Under x64 the numbers pack as float64 and read back exactly; an eager update
    between jitted ones (which unpacks, then packs again) changes nothing that jit sees."""
    f, traces = counted(O.update)
    with jax.enable_x64(True):
        step = jax.jit(f)
        model, grads = {"w": jnp.ones(3, jnp.float64)}, {"w": jnp.full(3, 0.5, jnp.float64)}
        tree = O.setup(O.Adam(0.1), model)
        numbers = jax.tree.leaves(tree)[0]
        assert numbers.dtype == jnp.float64 and numbers.weak_type
        tree, model = step(tree, model, grads)
        tree, model = O.update(tree, model, grads)  # eager
        tree, model = step(tree, model, grads)
        assert len(traces) == 1
        assert tree["w"].rule == O.Adam(0.1)
        assert tree["w"].state[2] == 3.0


@pytest.mark.parametrize("rule", [O.Adam(0.1), O.AdaBelief(0.1)], ids=repr)
def test_packed_form_follows_numpy_updates(rule):
    """A NumPy tree that JAX has flattened flattens with the new counters after update_
    writes them, fused or not."""
    model = {k: np.ones(4, np.float32) for k in "abc"}
    tree = O.setup(rule, model)
    before = [v for v in jax.tree.leaves(tree["a"]) if np.ndim(v) == 0][-1]
    for _ in range(2):
        O.update_(tree, model, {k: np.ones(4, np.float32) for k in "abc"})
    after = [v for v in jax.tree.leaves(tree["a"]) if np.ndim(v) == 0][-1]
    assert float(before) == 0.0 and float(after) == 2.0


def test_rule_defined_later_is_a_pytree():
    @dataclasses.dataclass(frozen=True)
    class Scaled(O.Rule):
        eta: float = 0.5
        flip: bool = False

        def apply(self, state, x, dx):
            (eta,) = O.backends.of(x).hyper(x, self.eta)
            return state, (-eta if self.flip else eta) * dx

    assert jax.tree.leaves(Scaled(0.25)) == [0.25]
    model = {"w": jnp.ones(2)}
    tree = O.setup(Scaled(), model)
    _, new = jax.jit(O.update)(tree, model, {"w": jnp.ones(2)})
    np.testing.assert_allclose(new["w"], 0.5)


def test_frozen_leaf_skipped_under_jit():
    model = {"a": jnp.ones(2), "b": jnp.ones(2)}
    tree = O.freeze_(O.setup(O.Descent(0.5), model), "a")
    tree, new = jax.jit(O.update)(tree, model, {"a": jnp.ones(2), "b": jnp.ones(2)})
    np.testing.assert_array_equal(new["a"], 1.0)
    np.testing.assert_array_equal(new["b"], 0.5)
    assert tree["a"].frozen and not tree["b"].frozen


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rule", [O.Adam(0.01), O.AdamW(0.01, lambd=0.1), O.RMSProp(0.01),
                                  O.Lion(0.01), O.OptimiserChain(O.ClipNorm(1.0), O.NAdam(0.01)),
                                  O.MixedPrecision(O.Adam(0.001), np.float32)], ids=repr)
def test_low_precision_keeps_dtype_under_jit(dtype, rule):
    dt = jnp.dtype(getattr(jnp, dtype))
    model = {"w": jnp.ones((2, 3), dt)}
    tree = O.setup(rule, model)
    step = jax.jit(O.update)
    for _ in range(3):
        tree, model = step(tree, model, {"w": jnp.ones((2, 3), jnp.float32)})
        assert model["w"].dtype == dt
    assert (model["w"] < 1).all()
    if isinstance(rule, O.MixedPrecision):
        assert tree["w"].state[0].dtype == jnp.float32
    else:
        assert all(a.dtype == dt for a in jax.tree.leaves(tree["w"].state)
                   if getattr(a, "ndim", 0))  # the arrays; counters read back as numbers
    tree = O.adjust(tree, 0.02)
    _, model = step(tree, model, {"w": jnp.ones((2, 3), dt)})
    assert model["w"].dtype == dt


def test_clipnorm_under_jit_cannot_throw_but_eager_does():
    model = {"w": jnp.ones(2)}
    tree = O.setup(O.ClipNorm(1.0), model)
    bad = {"w": jnp.array([jnp.inf, 0.0])}
    with pytest.raises(FloatingPointError, match="norm"):
        O.update(tree, model, bad)
    _, new = jax.jit(O.update)(tree, model, bad)  # traced: the norm is unknown until run
    assert not np.isfinite(np.asarray(new["w"])).all()


def test_grad_structure_errors_name_the_path():
    model = make_model()
    tree = O.setup(O.Adam(), model)
    grads = jax.grad(loss)(model, data(0))
    grads["layers"][1]["w"] = jnp.ones((2, 8))
    with pytest.raises(ValueError, match=r"KeyPath\('layers', 1, 'w'\).*shape"):
        jax.jit(O.update)(tree, model, grads)


def test_complex_parameters_descend():
    target = jnp.array([1 + 2j, -1j], jnp.complex64)
    model = [jnp.zeros(2, jnp.complex64)]
    tree = O.setup(O.Adam(0.1), model)
    step = jax.jit(O.update)
    for _ in range(100):
        tree, model = step(tree, model, [jnp.conj(jax.grad(
            lambda w: jnp.sum(jnp.abs(w - target) ** 2) / 2)(model[0]))])
    assert jnp.abs(model[0] - target).max() < 0.05


eqx = pytest.importorskip("equinox")


def test_equinox_module_tree_protocol():
    mlp = eqx.nn.MLP(3, 2, 8, 1, key=jax.random.PRNGKey(0))
    kids = O.children(mlp)
    assert "layers" in kids and isinstance(kids["layers"], tuple)
    new_layers = tuple(O.rebuild(lin, {"weight": lin.weight * 0}) for lin in mlp.layers)
    new = O.rebuild(mlp, {"layers": new_layers})
    assert type(new) is type(mlp) and new is not mlp
    assert not new.layers[0].weight.any() and mlp.layers[0].weight.any()
    tree = O.setup(O.Adam(), mlp)
    assert isinstance(tree["layers"][0]["weight"], O.Leaf)
    assert tree["activation"] is None and tree["in_size"] is None


def test_equinox_batchnorm_trains_only_its_weight_and_bias():
    """An equinox BatchNorm built directly keeps its running statistics' first values in
    a StateIndex: by name, they are not trained, as torch's buffers are not."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # newer equinox asks for mode=; the default is kept
        bn = eqx.nn.BatchNorm(4, axis_name="batch")
    tree = O.setup(O.AdamW(0.1, lambd=0.1), bn)
    assert [str(kp) for kp, _ in O.state.leaves(tree)] == ["weight", "bias"]
    assert O.trainable(bn.ema_state_index) == ()


def test_equinox_training_filter_jit():
    key = jax.random.PRNGKey(0)
    mlp = eqx.nn.MLP(3, 1, 16, 2, key=key)
    x = jax.random.normal(key, (32, 3))
    y = jnp.sin(x.sum(1, keepdims=True))

    def mse(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    traces = 0

    @eqx.filter_jit
    def step(tree, m):
        nonlocal traces
        traces += 1
        return O.update(tree, m, eqx.filter_grad(mse)(m))

    tree = O.setup(O.Adam(0.01), mlp)
    start, m = mse(mlp), mlp
    for i in range(50):
        tree, m = step(tree, m)
        if i == 25:
            tree = O.adjust(tree, 0.005)
    assert type(m) is type(mlp) and mse(m) < start / 2
    assert traces == 1  # numbers in the tree are data, not static, under filter_jit too
    assert mlp.layers[0].weight is not m.layers[0].weight


def test_equinox_linear_jax_grad_and_jit():
    lin = eqx.nn.Linear(3, 2, key=jax.random.PRNGKey(1))
    x = jnp.ones((4, 3))
    grads = jax.grad(lambda m: jnp.sum(jax.vmap(m)(x) ** 2))(lin)
    assert type(grads) is type(lin)  # what jax.grad returns: the model's own class
    tree = O.setup(O.Descent(0.1), lin)
    _, new = jax.jit(O.update)(tree, lin, grads)
    np.testing.assert_allclose(new.weight, lin.weight - 0.1 * grads.weight, rtol=1e-6)
    assert new.in_features == 3


def test_tree_after_jit_prints_numbers():
    """Under jit the hyper-parameters travel as data (packed in one array); read back,
    the Leaf and summary show them as the numbers they are, and tracers as they are."""
    model = {"w": jnp.ones(2)}
    tree = O.setup(O.OptimiserChain(O.ClipGrad(0.5), O.AdamW(0.01)), model)
    tree, model = jax.jit(O.update)(tree, model, {"w": jnp.ones(2)})
    assert tree["w"].rule.rules[1] == O.AdamW(0.01)
    text = "OptimiserChain(ClipGrad(delta=0.5), AdamW(eta=0.01, beta=(0.9, 0.999)"
    assert repr(tree["w"]).startswith("Leaf(" + text)
    assert text in " ".join(O.summary(tree).split())  # (a wide rule is wrapped there)

    seen = []
    jax.jit(lambda t: seen.append(repr(t["w"])) or 0)(tree)
    assert "Tracer" in seen[0]


def test_summary_follows_the_model_order_after_jit():
    """jax.jit returns dicts with sorted keys; summary with the model lists the Leafs in
    the order of the model's own fields."""
    from collections import namedtuple

    Layer = namedtuple("Layer", ["w", "b"])
    Net = namedtuple("Net", ["enc", "dec"])
    model = Net(Layer(jnp.ones(2), jnp.ones(1)), Layer(jnp.ones(3), jnp.ones(1)))
    tree = dict(O.setup(O.Adam(), model))  # a plain dict's keys come back sorted (setup's
    tree, model = jax.jit(O.update)(tree, model, jax.tree.map(jnp.ones_like, model))
    assert list(tree) == ["dec", "enc"] and list(tree["enc"]) == ["b", "w"]  # root keeps them)
    rows = [line.split()[0] for line in O.summary(tree, model).splitlines()[1:-1]]
    assert rows == ["enc.w", "enc.b", "dec.w", "dec.b"]
    rows = [line.split()[0] for line in O.summary(tree).splitlines()[1:-1]]
    assert rows == ["dec.b", "dec.w", "enc.b", "enc.w"]  # without the model: the tree's


def test_adam_under_jit_tracks_optax_for_300_steps():
    """Adam's 1 - beta is computed from the Python float, as optax does, also under jit
    (the pack carries each number's complement). With 1 - float32(0.999), 1.3e-5 off
    0.001 relatively, the weights were 7.6e-6 of their scale from optax's after 300 steps
    on this task, and 3 of them more than rtol 1e-5 away."""
    optax = pytest.importorskip("optax")
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    x, y = jnp.asarray(digits.data / 16.0, jnp.float32), jnp.asarray(digits.target)
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w1": jax.random.normal(k1, (64, 32)) * 0.1, "b1": jnp.zeros(32),
              "w2": jax.random.normal(k2, (32, 10)) * 0.1, "b2": jnp.zeros(10)}

    def loss(p):
        z = jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return -jnp.mean(jax.nn.log_softmax(z)[jnp.arange(len(y)), y])

    tx = optax.adam(1e-3)

    @jax.jit
    def theirs(p, s):
        u, s = tx.update(jax.grad(loss)(p), s, p)
        return optax.apply_updates(p, u), s

    f, traces = counted(lambda t, p: O.update(t, p, jax.grad(loss)(p)))
    ours = jax.jit(f)
    p, s, q, tree = params, tx.init(params), params, O.setup(O.Adam(1e-3), params)
    for _ in range(300):
        p, s = theirs(p, s)
        tree, q = ours(tree, q)
    assert len(traces) == 1
    for k in params:
        np.testing.assert_allclose(q[k], p[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_adam_is_the_same_float32_numbers_in_numpy_torch_and_jax():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x0 = rng.normal(size=64).astype(np.float32)
    grads = [rng.normal(size=64).astype(np.float32) for _ in range(5)]
    results = {}
    for lib, wrap in [("numpy", np.asarray), ("torch", torch.tensor), ("jax", jnp.asarray)]:
        model = {"w": wrap(x0.copy())}
        tree = O.setup(O.Adam(0.01, (0.9, 0.999)), model)
        for g in grads:
            tree, model = O.update(tree, model, {"w": wrap(g)})
        results[lib] = [np.asarray(a) for a in (model["w"], *tree["w"].state[:2])]
    for lib in ("torch", "jax"):  # the moments too: v took 1 - float32(0.999) in NumPy
        for a, b in zip(results[lib], results["numpy"]):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("rule", [O.EMA(O.Adam(0.1), 0.9), O.ScheduleFreeAdamW(0.1),
                                  O.MixedPrecision(O.Adam(0.1))], ids=rule_id)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_state_made_from_the_parameter_may_be_donated_with_it(rule, dtype):
    """EMA's average and Schedule-Free's point start as the parameter: in buffers of their
    own, so that ``jit`` may donate the model and the tree together."""
    model = {"w": jnp.ones((4, 3), dtype), "b": jnp.zeros(3, dtype)}
    eager = {"w": jnp.ones((4, 3), dtype), "b": jnp.zeros(3, dtype)}
    tree, eager_tree = O.setup(rule, model), O.setup(rule, eager)
    step = jax.jit(O.update, donate_argnums=(0, 1))
    grads = {"w": jnp.ones((4, 3), dtype), "b": jnp.ones(3, dtype)}
    for _ in range(3):
        tree, model = step(tree, model, grads)
        eager_tree, eager = O.update(eager_tree, eager, grads)
    assert_trees_close(model, eager, rtol=1e-2 if dtype == jnp.bfloat16 else 1e-4)


def test_a_jitted_steps_leafs_make_their_states_when_read():
    """The Leafs that a jitted step returns hold no state of their own until it is read (a
    training loop passing the tree back makes one object per Leaf and step, not three);
    read, the state is the step's, and the tree still flattens into the arrays it was
    built from."""
    model = [jnp.full(3, float(i)) for i in range(4)]
    step = jax.jit(O.update)
    tree, model = step(O.setup(O.Adam(0.1), model), model, [jnp.ones(3)] * 4)
    before = jax.tree.leaves(tree)

    def held(leaf):  # (m, v, t): the only 3-tuple a Leaf would hold
        return [r for r in gc.get_referents(leaf) if type(r) is tuple and len(r) == 3]

    assert not any(held(leaf) for leaf in tree)
    np.testing.assert_allclose(tree[2].state[0], 0.1, rtol=1e-6)
    assert held(tree[2]) and all(r is tree[2].state for r in held(tree[2]))
    assert not held(tree[1])
    assert all(a is b for a, b in zip(before, jax.tree.leaves(tree)))


def test_a_jitted_steps_tree_flattens_as_built_until_it_changes():
    """The tree a jitted step returns flattens into the very arrays it was built from (a
    training loop's next step makes no record anew), until a Leaf or a container of it
    changes: a freeze, a new state, a Leaf put in another's place."""
    model = {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}
    step = jax.jit(O.update)
    tree, model = step(O.setup(O.Adam(0.01), model), model, {k: v for k, v in model.items()})
    first, again = jax.tree.leaves(tree), jax.tree.leaves(tree)
    assert all(a is b for a, b in zip(first, again)) and len(first) == len(again)
    O.freeze_(tree["b"])
    assert len(jax.tree.leaves(tree)) == 2 * (9 + 3)
    tree, model = step(tree, model, {k: v for k, v in model.items()})
    tree["w"].state = (tree["w"].state[0] + 1, *tree["w"].state[1:])
    np.testing.assert_array_equal(jax.tree.leaves(tree["w"].state)[0],
                                  [v for v in jax.tree.leaves(tree) if v.shape == (2, 3)][0])
    tree, model = step(tree, model, {k: v for k, v in model.items()})
    tree["w"] = O.Leaf(O.Descent(0.5), None)
    assert [float(v) for v in jax.tree.leaves(tree["w"])[:2]] == [0.5, 0.5]
    assert len(jax.tree.leaves(tree)) == 3 + (9 + 3)


@rules_param(ALL_RULES)
def test_every_rule_steps_jitted_and_donated_over_arrays_of_two_kinds(rule):
    """A matrix and a vector, whose Leafs of one rule may fall in two groups (Adafactor's
    factored and plain states): the jitted, donated step runs and follows NumPy's, and
    runs again after an adjust (each group flattens arrays of its own: JAX refuses one
    buffer donated twice, as it did before)."""
    _donated_steps_follow_numpy(fitting(rule), {"w": (3, 4), "v": (5,)})


def test_quantised_blocks_and_small_arrays_step_jitted_and_donated():
    """Quantised's blocks for a large array and plain state for a small one: two groups of
    one rule, jitted and donated."""
    _donated_steps_follow_numpy(O.Quantised(O.Adam(0.01)), {"w": (64, 80), "v": (5,)})


def _donated_steps_follow_numpy(rule, shapes: dict) -> None:
    rng = np.random.default_rng(9)
    model = {k: normal(rng, s, np.float32) for k, s in shapes.items()}
    grads = {k: normal(rng, s, np.float32) for k, s in shapes.items()}
    mn = {k: v.copy() for k, v in model.items()}
    tn = O.setup(rule, mn)
    mj = jax.tree.map(jnp.asarray, model)
    tj = O.setup(rule, mj)
    step = jax.jit(O.update, donate_argnums=(0, 1))
    for _ in range(3):
        tn, mn = O.update_(tn, mn, grads)
        tj, mj = step(tj, mj, jax.tree.map(jnp.asarray, grads))
    for k in model:
        np.testing.assert_allclose(np.asarray(mj[k]), mn[k], rtol=1e-4, atol=2e-5)
    tj = O.adjust(tj, eta=0.01) if "eta=" in repr(rule) else tj
    tj, mj = step(tj, mj, jax.tree.map(jnp.asarray, grads))
    assert all(bool(jnp.isfinite(v).all()) for v in jax.tree.leaves(mj))
