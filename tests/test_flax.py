"""flax: nnx modules against nnx.Optimizer, FrozenDict and nnx.State, linen's variables."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from flax.core import FrozenDict  # noqa: E402

import optimisers as O  # noqa: E402
from optimisers import Adam, Descent, setup, update, update_  # noqa: E402


class Net(nnx.Module):
    """BatchNorm, Linear, tanh, then a list of one Linear: Params, BatchStats, nnx.List.
    (A Linear right before the BatchNorm would get a bias gradient that is nearly all
    rounding, which no two implementations of Adam agree on.)"""

    def __init__(self, rngs: nnx.Rngs):
        self.bn = nnx.BatchNorm(3, rngs=rngs)
        self.lin = nnx.Linear(3, 8, rngs=rngs)
        self.head = nnx.List([nnx.Linear(8, 2, rngs=rngs)])

    def __call__(self, x):
        return self.head[0](jax.nn.tanh(self.lin(self.bn(x))))


def loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


X = jax.random.normal(jax.random.key(1), (16, 3))
Y = jax.random.normal(jax.random.key(2), (16, 2))


def flat(model, kind=nnx.Variable) -> dict:
    return {path: np.asarray(v[...]) for path, v in nnx.to_flat_state(nnx.state(model, kind))}


def assert_same(got: dict, want: dict, rtol: float = 1e-6) -> None:
    """Every array of ``got`` equals ``want``'s to ``rtol`` of the array's largest entry."""
    assert got.keys() == want.keys()
    for path in want:
        scale = np.max(np.abs(want[path])) or 1.0
        np.testing.assert_allclose(got[path], want[path], rtol=0, atol=rtol * scale,
                                   err_msg=str(path))


# --- nnx modules --------------------------------------------------------------------------


def test_setup_trains_params_by_kind_and_never_batch_stats():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "setup found no trainable parameter" fails
        tree = setup(Adam(), Net(nnx.Rngs(0)))
    assert isinstance(tree["lin"]["kernel"]["value"], O.Leaf)
    assert isinstance(tree["head"][0]["bias"]["value"], O.Leaf)
    assert isinstance(tree["bn"]["scale"]["value"], O.Leaf)
    assert tree["bn"]["mean"] == {"value": None} and tree["bn"]["var"] == {"value": None}
    assert O.trainable(nnx.Param(jnp.ones(2))) == ("value",)
    assert O.trainable(nnx.BatchStat(jnp.ones(2))) == ()


def test_variable_kinds_and_bare_arrays():
    class LoRAParam(nnx.Param):
        pass

    class Counter(nnx.Variable):
        pass

    class Odd(nnx.Module):
        def __init__(self):
            self.a = LoRAParam(jnp.ones(2))
            self.seen = Counter(jnp.zeros(2))
            self.bare = nnx.data(jnp.ones(3))  # a bare array: nnx.grad leaves it alone
            self.n = 3

    tree = setup(Descent(), Odd())
    assert isinstance(tree["a"]["value"], O.Leaf)
    assert tree["seen"] == {"value": None} and tree["bare"] is None and "n" not in tree


def step_eager(model, tree):
    grads = nnx.grad(loss)(model, X, Y)  # an nnx.State of the Params
    tree, same = update_(tree, model, grads)
    assert same is model
    return tree


@nnx.jit
def step_jit(model, tree, x, y):
    tree, _ = update_(tree, model, nnx.grad(loss)(model, x, y))
    return tree


@nnx.jit
def reference_jit(model, opt, x, y):
    opt.update(model, nnx.grad(loss)(model, x, y))


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "nnx.jit"])
@pytest.mark.parametrize(("beta", "rtol"), [
    ((0.5, 0.75), 1e-6),  # beta^t exact in float32: only the order of operations differs
    ((0.9, 0.999), 1e-5),  # optax takes beta^t as a float32 power, we as a float32 product
], ids=str)
def test_update_inplace_matches_nnx_optimizer(jitted, beta, rtol):
    model, ref = Net(nnx.Rngs(0)), Net(nnx.Rngs(0))
    tree = setup(Adam(0.01, beta), model)
    opt = nnx.Optimizer(ref, optax.adam(0.01, *beta), wrt=nnx.Param)
    stats = flat(model, nnx.BatchStat)
    for _ in range(5):
        if jitted:
            tree = step_jit(model, tree, X, Y)
            reference_jit(ref, opt, X, Y)
        else:
            tree = step_eager(model, tree)
            opt.update(ref, nnx.grad(loss)(ref, X, Y))
    assert_same(flat(model), flat(ref), rtol)  # Params and BatchNorm statistics alike
    assert not np.allclose(flat(model, nnx.BatchStat)[("bn", "mean")], stats[("bn", "mean")])


def test_batch_stats_are_never_trained_even_with_a_gradient():
    model = Net(nnx.Rngs(0))
    tree = setup(Descent(0.5), model)
    grads = jax.tree.map(jnp.ones_like, nnx.state(model))  # BatchStats get "gradients" too
    before = flat(model)
    update_(tree, model, grads)
    after = flat(model)
    assert np.array_equal(after[("bn", "mean")], before[("bn", "mean")])
    assert np.array_equal(after[("bn", "var")], before[("bn", "var")])
    assert np.allclose(after[("lin", "bias")], before[("lin", "bias")] - 0.5)


def test_pure_update_leaves_the_module_alone():
    model = Net(nnx.Rngs(0))
    tree = setup(Adam(0.01), model)
    grads = nnx.grad(loss)(model, X, Y)  # (which updates the BatchNorm statistics)
    before = flat(model)
    new_tree, new = update(tree, model, grads)
    assert_same(flat(model), before, rtol=0)
    assert type(new) is Net and new is not model
    assert new.bn.mean is model.bn.mean  # unchanged parts are shared
    inplace = Net(nnx.Rngs(0))
    nnx.update(inplace, nnx.state(model))
    update_(setup(Adam(0.01), inplace), inplace, grads)
    assert_same(flat(new), flat(inplace), rtol=0)
    assert float(loss(new, X, Y)) < float(loss(model, X, Y))  # the new module runs
    assert new_tree["lin"]["kernel"]["value"] is not tree["lin"]["kernel"]["value"]


def test_a_shared_param_is_one_leaf_and_gets_one_step():
    class Tied(nnx.Module):
        def __init__(self, w):
            self.enc = nnx.Dict(w=w)
            self.dec = nnx.Dict(w=w)

    w = nnx.Param(jnp.ones(2))
    model = Tied(w)
    tree = setup(Descent(0.5), model)
    assert tree["enc"]["w"]["value"] is tree["dec"]["w"]["value"]
    grads = nnx.grad(lambda m: jnp.sum(m.enc["w"][...] * 2.0))(model)
    update_(tree, model, grads)
    assert model.dec["w"] is w and w[...].tolist() == [0.0, 0.0]


def test_gradient_state_with_a_key_the_model_lacks():
    model = Net(nnx.Rngs(0))
    tree = setup(Descent(), model)
    grads = nnx.grad(loss)(model, X, Y)
    grads["extra"] = {"w": nnx.Param(jnp.ones(2))}
    with pytest.raises(ValueError, match="has key 'extra', which the model lacks"):
        update_(tree, model, grads)


def test_numpy_arrays_in_variables_are_written_in_place_step_after_step():
    class Host(nnx.Module):
        def __init__(self):
            self.p = nnx.Param(np.ones(3))
            self.layers = nnx.List([nnx.Param(np.ones(2))])

    model = Host()
    p, q = model.p.get_value(), model.layers[0].get_value()
    tree = setup(Descent(0.5), model)
    grads = nnx.State({"p": nnx.Param(np.ones(3)), "layers": {0: nnx.Param(np.ones(2))}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "'.value' access is deprecated" from flax
        for _ in range(3):  # the second and third steps take the cached plan
            tree, same = update_(tree, model, grads)
    assert same is model and model.p.get_value() is p and model.layers[0].get_value() is q
    assert p.tolist() == [-0.5] * 3 and q.tolist() == [-0.5] * 2


# --- FrozenDict and nnx.State: mappings rebuilt by construction -----------------------------


def test_frozendict_updates():
    model = FrozenDict({"w": jnp.ones(2), "inner": FrozenDict({"b": jnp.zeros(1)})})
    tree = setup(Descent(0.5), model)
    grads = {"w": jnp.ones(2), "inner": {"b": jnp.ones(1)}}
    _, new = update(tree, model, grads)
    assert type(new) is FrozenDict and type(new["inner"]) is FrozenDict
    assert new["w"].tolist() == [0.5, 0.5] and new["inner"]["b"].tolist() == [-0.5]
    _, new = update_(tree, model, grads)
    assert new["w"].tolist() == [0.5, 0.5] and model["w"].tolist() == [1.0, 1.0]


def test_pure_update_leaves_an_nnx_state_alone():
    params = nnx.State({"w": jnp.ones(2), "sub": {"b": jnp.zeros(1)}})
    tree = setup(Descent(0.5), params)
    _, new = update(tree, params, {"w": jnp.ones(2), "sub": {"b": jnp.ones(1)}})
    assert params["w"].tolist() == [1.0, 1.0] and params["sub"]["b"].tolist() == [0.0]
    assert type(new) is nnx.State and new["w"].tolist() == [0.5, 0.5]
    assert new["sub"]["b"].tolist() == [-0.5]


def test_split_state_of_variables_with_merge():
    graphdef, params = nnx.split(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))

    def split_loss(params):
        return loss(nnx.merge(graphdef, params), X, Y)

    tree = setup(Adam(0.01), params)
    before = {k: np.asarray(v[...]) for k, v in nnx.to_flat_state(params)}
    _, new = update(tree, params, jax.grad(split_loss)(params))
    assert all(np.array_equal(v[...], before[k]) for k, v in nnx.to_flat_state(params))
    assert type(new) is nnx.State and float(split_loss(new)) < float(split_loss(params))


# --- linen ----------------------------------------------------------------------------------


def test_linen_variables_with_batch_stats_warn():
    import flax.linen as nn

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = True):
            return nn.BatchNorm(use_running_average=not train)(nn.Dense(4)(x))

    variables = CNN().init(jax.random.key(0), X)
    with pytest.warns(UserWarning, match=r"Pass variables\['params'\] instead"):
        setup(Adam(), variables)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tree = setup(Adam(), variables["params"])
    assert set(tree) == {"Dense_0", "BatchNorm_0"}


# --- imports --------------------------------------------------------------------------------


def test_flax_is_imported_only_by_its_user():
    code = ("import sys, numpy as np, optimisers as O\n"
            "t, m = O.update(O.setup(O.Adam(), {'w': np.ones(2)}), {'w': np.ones(2)},"
            " {'w': np.ones(2)})\n"
            "print(sorted(k for k in ('flax', 'jax', 'torch') if k in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
