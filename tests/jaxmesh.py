"""The workers of test_jax_mesh.py, each run as ``python tests/jaxmesh.py <worker> [args]``
in a process of its own: JAX reads ``XLA_FLAGS`` (8 virtual CPU devices here, 2 per process
for ``jax.distributed``) once, when it starts. A worker asserts, and exits non-zero on
failure with its traceback on standard error."""

from __future__ import annotations

import os
import sys

DEVICES = int(os.environ.get("JAXMESH_DEVICES", "8"))
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import optimisers as O  # noqa: E402

SPECS = {  # large and small arrays, sharded on both axes, one, or none
    "big": ((512, 1024), P("data", "model")),
    "wide": ((256, 512), P("model", None)),
    "tall": ((1024, 128), P(None, "data")),
    "whole": ((512, 256), P()),
    "bias": ((1024,), P("model")),
    "small": ((4, 4), P()),
    "tiny": ((8,), P("data")),
}

RULES = {
    "adamw": lambda: O.AdamW(1e-2, lambd=0.1),
    "clip_adamw": lambda: O.OptimiserChain(O.ClipGlobalNorm(1.0), O.AdamW(1e-2, lambd=0.1)),
    "lion": lambda: O.Lion(1e-3, (0.9, 0.99)),
    "muon": lambda: {"big": O.Muon(1e-2), "wide": O.Muon(1e-2), "*": O.AdamW(1e-2)},
    "lowprecision": lambda: {"big": O.LowPrecision(O.AdamW(1e-2, lambd=0.1)),
                             "*": O.AdamW(1e-2, lambd=0.1)},
}


def mesh() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def host_model(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(shape).astype(np.float32) for k, (shape, _) in SPECS.items()}


def placed(values: dict, m: Mesh | None) -> dict:
    """The arrays sharded as SPECS says over ``m``, or all on the first device."""
    return {k: jax.device_put(v, NamedSharding(m, SPECS[k][1]) if m else jax.devices()[0])
            for k, v in values.items()}


def state_arrays(leaf) -> list:
    return [a for a in jax.tree.leaves(leaf.state) if getattr(a, "ndim", 0)]


def check_placed(tree, model: dict, m: Mesh, when: str) -> None:
    """Every parameter, and each state array shaped as its parameter, sharded as SPECS."""
    for k, x in model.items():
        want = NamedSharding(m, SPECS[k][1])
        assert x.sharding.is_equivalent_to(want, x.ndim), (when, k, x.sharding)
        for a in state_arrays(tree[k]):
            if a.shape == x.shape:
                assert a.sharding.is_equivalent_to(want, a.ndim), (when, k, a.sharding)


def train(rule, m: Mesh | None, steps: int = 3, check: bool = True):
    """``steps`` jitted, donated updates; each step's gradients differ."""
    values = host_model()
    model = placed(values, m)
    tree = O.setup(rule, model)
    if m is not None and check:
        check_placed(tree, model, m, "after setup")
    step = jax.jit(lambda t, x, g: O.update(t, x, g), donate_argnums=(0, 1))
    for s in range(steps):
        grads = placed({k: np.sin(v * (s + 1)) * (s + 1) for k, v in values.items()}, m)
        tree, model = step(tree, model, grads)
        if m is not None and check:
            check_placed(tree, model, m, f"after step {s + 1}")
    return tree, model, step, grads


def close(a, b, rtol: float = 1e-6, atol: float = 1e-7) -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def mesh_rule(name: str) -> None:
    """A model over the 4x2 mesh trained as one device trains it: same results, every
    parameter and state array keeping its sharding, no array gathered for the step."""
    m = mesh()
    tree, model, step, grads = train(RULES[name](), m)
    compiled = step._cache_size()  # 2 where XLA wrote a spec anew: P("model", None) as
    assert compiled <= 2, "a step on the mesh compiled again"  # P("model"), one sharding
    hlo = step.lower(tree, model, grads).compile().as_text()
    if name != "muon":  # (XLA shards Muon's matrix products as it chooses)
        assert "all-gather" not in hlo, "a sharded array was gathered for the step"
    one_tree, one_model, _, _ = train(RULES[name](), None)
    for k in model:
        if name == "muon" and k in ("big", "wide"):  # bfloat16 products summed otherwise
            a, b = np.asarray(model[k]), np.asarray(one_model[k])
            assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b), k
            continue
        close(model[k], one_model[k])
        for a, b in zip(state_arrays(tree[k]), state_arrays(one_tree[k])):
            close(a, b)
    # the Leafs' numbers and clocks live on the mesh: an adjust does not compile again
    tree, model = step(O.adjust(tree, 3e-3), model, grads)
    assert step._cache_size() == compiled, "an adjust compiled the step again on the mesh"
    print("ok")


def eager() -> None:
    """update outside jit, and update_, on the sharded model: shardings kept, results equal."""
    m = mesh()
    values = host_model()
    model = placed(values, m)
    tree = O.setup(O.AdamW(1e-2), model)
    one = O.setup(O.AdamW(1e-2), placed(values, None))
    grads = {k: np.cos(v) for k, v in values.items()}
    tree, model = O.update(tree, model, placed(grads, m))
    one, one_model = O.update(one, placed(values, None), placed(grads, None))
    check_placed(tree, model, m, "after an update outside jit")
    for k in model:
        close(model[k], one_model[k])
    print("ok")


def clip() -> None:
    """ClipGlobalNorm over sharded arrays under jit: the norm of the whole arrays."""
    m = mesh()
    values = host_model()
    grads = {k: np.cos(3 * v) * 10 for k, v in values.items()}
    norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
    assert norm > 10
    rule = O.OptimiserChain(O.ClipGlobalNorm(2.0), O.Descent(1.0))
    model = placed(values, m)
    step = jax.jit(lambda t, x, g: O.update(t, x, g), donate_argnums=(0, 1))
    tree, model = step(O.setup(rule, model), model, placed(grads, m))
    check_placed(tree, model, m, "after a clipped step")
    for k, v in values.items():
        close(model[k], v - grads[k] * (2.0 / norm), rtol=1e-5, atol=1e-6)
    print("ok")


def checkpoints(folder: str) -> None:
    """save/load of a sharded tree (load places the arrays as ``like``'s), and orbax's
    PyTreeCheckpointer saving the state dict with the model, restored onto new shardings."""
    m = mesh()
    tree, model, step, grads = train(O.AdamW(1e-2), m, steps=2, check=False)
    path = os.path.join(folder, "opt.ckpt")
    O.save(path, tree)
    other = {k: (shape, P(*reversed(spec)) if spec else spec) for k, (shape, spec) in
             SPECS.items()}
    like_model = {k: jax.device_put(jnp.zeros(shape), NamedSharding(m, spec))
                  for k, (shape, spec) in other.items()}
    back = O.load(path, like=O.setup(O.AdamW(), like_model))
    for k in model:
        for a, b, c in zip(state_arrays(back[k]), state_arrays(tree[k]),
                           state_arrays(O.setup(O.AdamW(), like_model)[k])):
            assert a.sharding.is_equivalent_to(c.sharding, a.ndim), (k, a.sharding)
            close(a, b, rtol=0, atol=0)
    orbax(folder, tree, model, step, grads, like_model)
    print("ok")


def orbax(folder: str, tree, model, step, grads, like_model) -> None:
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        print("orbax is not installed", file=sys.stderr)
        return
    path = os.path.join(folder, "orbax")
    ocp.PyTreeCheckpointer().save(path, {"model": model, "optim": O.state_dict(tree)})
    new_tree = O.setup(O.AdamW(), like_model)
    target = {"model": like_model, "optim": O.state_dict(new_tree)}
    restored = ocp.PyTreeCheckpointer().restore(
        path, item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target))
    new_tree = O.load_state_dict(new_tree, restored["optim"])
    new_model = restored["model"]
    assert new_tree["big"].rule == tree["big"].rule
    for k in model:
        assert new_model[k].sharding.is_equivalent_to(like_model[k].sharding, model[k].ndim)
    tree, model = step(tree, model, grads)
    new_tree, new_model = jax.jit(lambda t, x, g: O.update(t, x, g))(
        new_tree, new_model, {k: jax.device_put(g, like_model[k].sharding)
                              for k, g in grads.items()})
    for k in model:
        close(new_model[k], model[k])


def distributed(rank: str, port: str) -> None:
    """One of two ``jax.distributed`` processes (2 CPU devices each, gloo collectives): a
    data-parallel step over a mesh of both processes' devices, its batch split across
    them, one matrix sharded too; the results equal one device's on the whole batch."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=int(rank),
                               initialization_timeout=60)
    assert jax.process_count() == 2 and jax.device_count() == 4
    m = Mesh(np.array(jax.devices()), ("data",))
    rng = np.random.default_rng(0)
    host = {"w1": rng.standard_normal((32, 256)).astype(np.float32) / 6,
            "b1": np.zeros(256, np.float32),
            "w2": rng.standard_normal((256, 1)).astype(np.float32) / 16}
    specs = {"w1": P(), "b1": P(), "w2": P("data", None)}
    x = rng.standard_normal((64, 32)).astype(np.float32)
    y = np.sin(x.sum(1, keepdims=True))

    def glob(v, spec):  # a global array: each process gives its devices' parts
        where = NamedSharding(m, spec)
        return jax.make_array_from_callback(v.shape, where, lambda index: v[index])

    def loss(params, x, y):
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    def step(tree, params, x, y):
        return O.update(tree, params, jax.grad(loss)(params, x, y))

    from jax.experimental import multihost_utils

    for rule in (O.AdamW(1e-2, lambd=0.1),  # the custom call; the plain path:
                 O.OptimiserChain(O.ClipGlobalNorm(1.0), O.AdamW(1e-2, lambd=0.1))):
        params = {k: glob(v, specs[k]) for k, v in host.items()}
        tree = O.setup(rule, params)
        xs, ys = glob(x, P("data")), glob(y, P("data"))
        many = jax.jit(lambda t, p, x, y: step(t, p, x, y), donate_argnums=(0, 1))
        one_params = {k: jax.device_put(v, jax.local_devices()[0]) for k, v in host.items()}
        one_tree, one = O.setup(rule, one_params), jax.jit(lambda *a: step(*a))
        for _ in range(4):
            tree, params = many(tree, params, xs, ys)
            one_tree, one_params = one(one_tree, one_params, x, y)
        for k, v in params.items():
            want = NamedSharding(m, specs[k])
            assert v.sharding.is_equivalent_to(want, v.ndim), (k, v.sharding)
            for a in state_arrays(tree[k]):
                assert a.sharding.is_equivalent_to(want, a.ndim), (k, a.sharding)
            whole = multihost_utils.process_allgather(v, tiled=True)
            close(whole, one_params[k], rtol=1e-5, atol=1e-6)
    jax.distributed.shutdown()
    print("ok")


def explicit() -> None:
    """A mesh of Explicit axes (shardings in the types, ``jax.set_mesh``): the plain path,
    shardings kept, results one device's."""
    from jax.sharding import AxisType

    m = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    for name in ("adamw", "clip_adamw"):
        with jax.set_mesh(m):
            tree, model, _, _ = train(RULES[name](), m)
        one_tree, one_model, _, _ = train(RULES[name](), None)
        for k in model:
            close(model[k], one_model[k])
    print("ok")


def stats_devices() -> None:
    """update(..., stats=True) outside jit on arrays of several devices: a mesh's and two
    single devices' (their gradients' norms do not add up across devices)."""
    devices = jax.devices()
    model = {"a": jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh(), P("data"))),
             "b": jax.device_put(jnp.ones(4), devices[1]),
             "c": jax.device_put(jnp.ones(3), devices[2])}
    grads = {k: jax.device_put(jnp.full(v.shape, 0.5), v.sharding) for k, v in model.items()}
    grads["c"] = jax.device_put(jnp.array([0.5, jnp.nan, 0.5]), devices[2])
    _, _, stats = O.update(O.setup(O.Adam(0.1), model), model, grads, stats=True)
    assert [float(stats[k].nonfinite) for k in "abc"] == [0, 0, 1]
    close(np.array([float(stats[k].grad_norm) for k in "ab"]), np.array([8 ** 0.5, 1.0]))
    print("ok")


WORKERS = {"explicit": explicit, "distributed": distributed, "mesh_rule": mesh_rule,
           "eager": eager, "clip": clip, "checkpoints": checkpoints,
           "stats_devices": stats_devices}

if __name__ == "__main__":
    WORKERS[sys.argv[1]](*sys.argv[2:])
