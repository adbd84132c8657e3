"""The custom calls of ``fast/xla.py`` on sharded arrays: a partitioning rule for XLA.

XLA knows nothing of what a custom call computes, so it gives a call on sharded operands
the whole arrays (it gathers them) and its results come back replicated: the state and
the parameters lose their sharding, and each device steps a whole copy. The kernels are
elementwise, so each device can step its own shards instead. :func:`call` says so with
``jax.experimental.custom_partitioning``: every array operand and result is placed as its
Leaf's parameter (a gradient placed otherwise is resharded to it first), the Leafs' packs,
clocks and numbers, all tiny, are replicated, and the call runs on the local shards, its
results aliased to its operands as before. With one device (or no sharded operand) XLA
inlines the call as it is.

The call's layout is ``xla.py``'s: operands the ``n`` parameters, the ``n`` gradients and
each state slot's ``n`` arrays (``shaped`` operands in all; operand ``i`` belongs to Leaf
``i % n``), then the tiny ones; results the parameters and the state arrays (Leaf
``r % n``), then the tiny ones.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax.experimental.custom_partitioning import (
    ArrayMapping,
    SdyShardingRule,
    custom_partitioning,
)
from jax.sharding import AxisType, NamedSharding, PartitionSpec

__all__ = ["beside", "call", "follow"]


def call(caller: Any, name: str, results: list, aliases: dict, operands: list, n: int,
         nstate: int) -> Any:
    """call(caller, name, results, aliases, operands, n, nstate) -> the results of the
    FFI call ``name`` on ``operands``, made by ``caller(name, results, aliases, operands)``
    (``xla.py``'s), partitioned as the module says where there is more than one device:
    then ``caller`` gets each device's local operands and results.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from optimisers import AdamW, setup, update
        >>> from optimisers.fast import kernels
        >>> model = {"w": jnp.ones((4, 4))}
        >>> step = jax.jit(update)  # a custom call, through this function, where numba is
        >>> text = step.lower(setup(AdamW(), model), model, model).as_text()
        >>> "optimisers_onepass" in text or not kernels.available()
        True
    """
    alias = tuple(sorted(aliases.items()))
    results = tuple(jax.ShapeDtypeStruct(r.shape, r.dtype, weak_type=r.weak_type)
                    for r in results)
    if _devices() == 1:
        return _body(caller, name, results, alias, *operands)
    ranks = tuple(len(o.shape) for o in operands)
    return _partitioned(caller, name, results, alias, n, (2 + nstate) * n, ranks)(*operands)


@functools.cache
def _devices() -> int:
    """The devices of all processes (fixed once JAX's backend has started, as it has when
    a step is traced)."""
    return jax.device_count()


def _body(caller: Any, name: str, results: tuple, alias: tuple, *operands: Any) -> Any:
    """The FFI call itself, on operands whole or local: each result shaped as the operand
    it is aliased to."""
    source = {r: i for i, r in alias}
    local = [jax.ShapeDtypeStruct(operands[source[r]].shape if r in source else s.shape,
                                  s.dtype, weak_type=s.weak_type)
             for r, s in enumerate(results)]
    return tuple(caller(name, local, dict(alias), list(operands)))


@functools.cache
def _partitioned(caller: Any, name: str, results: tuple, alias: tuple, n: int, shaped: int,
                 ranks: tuple) -> Any:
    """The call as a ``custom_partitioning`` function of its operands (one per kind)."""
    def body(*operands: Any) -> Any:  # (behind a barrier: not taken for kept arguments
        operands = jax.lax.optimization_barrier(operands)  # of the jitted function, by
        return _body(caller, name, results, alias, *operands)  # which xla.py writes afresh)

    fn = custom_partitioning(body)
    layout = (n, shaped, ranks, tuple(len(r.shape) for r in results), alias)
    fn.def_partition(
        partition=functools.partial(_partition, layout, body),
        infer_sharding_from_operands=functools.partial(_infer, layout),
        sharding_rule=_rule(layout))
    return fn


def beside(state: Any, values: list) -> list:
    """beside(state, values) -> ``values`` (a Leaf's flat form: its numbers and clock, and
    its state's arrays), each that is on one device placed replicated over the mesh that an
    array of ``state`` is sharded over; as they are with one device, or no sharded state.
    A jitted step then gets them as it gives them back: made on one device, they would
    make the step after the first, and each ``adjust``, compile again.

    Example:
        >>> import jax.numpy as jnp
        >>> values = [jnp.ones(3), jnp.int32(0)]
        >>> beside((jnp.zeros(3),), values) == values  # (one device: as they are)
        True
    """
    if _devices() == 1:
        return values
    for v in jax.tree.leaves(state):
        s = getattr(v, "sharding", None)
        if isinstance(s, NamedSharding) and len(s.device_set) > 1:
            where = _replicated(s.mesh, s)
            return [jax.device_put(a, where) if len(getattr(a, "sharding", s).device_set) == 1
                    else a for a in values]
    return values


def _replicated(mesh: Any, like: Any) -> Any:
    if mesh.empty:  # shardings without a mesh (GSPMD's): make the mesh of one's devices
        devices = sorted(like.device_set, key=lambda d: d.id)
        mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    return NamedSharding(mesh, PartitionSpec())


def _placements(layout: tuple, mesh: Any, args: tuple) -> tuple[list, list]:
    """Each operand's and result's sharding: the parameter's for arrays, else replicated."""
    n, shaped, ranks, result_ranks, _ = layout
    first = shaped - n  # the results' arrays: parameters and states
    replicated = _replicated(mesh, args[0].sharding)
    ins = tuple(args[i % n].sharding if i < shaped else replicated for i in range(len(ranks)))
    outs = tuple(args[r % n].sharding if r < first else replicated
                 for r in range(len(result_ranks)))
    return ins, outs


def _partition(layout: tuple, body: Any, mesh: Any, args: tuple, result_shape: Any) -> tuple:
    ins, outs = _placements(layout, mesh, args)
    return mesh, body, outs, ins


def _infer(layout: tuple, mesh: Any, args: tuple, result_shape: Any) -> list:
    return _placements(layout, mesh, args)[1]


def _rule(layout: tuple) -> SdyShardingRule:
    """Shardy's rule: an array's dimensions are its Leaf's parameter's factors; every
    dimension of a tiny operand is a factor of its own, which must be replicated."""
    n, shaped, ranks, result_ranks, alias = layout
    first = shaped - n
    tiny: list = []

    def dims(prefix: str, rank: int, small: bool) -> ArrayMapping:
        names = [f"{prefix}d{d}" for d in range(rank)]
        if small:
            tiny.extend(names)
        return ArrayMapping(*names)

    operands = tuple(dims(f"x{i % n}" if i < shaped else f"t{i}", r, i >= shaped)
                     for i, r in enumerate(ranks))
    source = {r: i for i, r in alias}
    results = tuple(dims(f"x{r % n}" if r < first else f"t{source.get(r, f'r{r}')}", rank,
                         r >= first) for r, rank in enumerate(result_ranks))
    return SdyShardingRule(operands, results,
                           need_replication_factors=tuple(dict.fromkeys(tiny)))


def follow(x: Any, g: Any) -> Any:
    """follow(x, g) -> ``g`` placed as ``x`` is (under ``jax.jit``, ``x`` and ``g`` traced
    arrays of one shape): a gradient resharded to its parameter's sharding before a rule
    reads it, so that every array a step makes is sharded as the parameter (XLA would
    otherwise shard the results as the gradient, where that is sharded more: the
    gradient of a replicated bias next to a sharded matrix). Without sharding, ``g``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> x = jnp.ones(4)
        >>> jax.jit(follow)(x, 2 * x).tolist()
        [2.0, 2.0, 2.0, 2.0]
    """
    if _devices() == 1:
        return g
    if explicit(x):  # shardings in the types: JAX's own reshard
        want = jax.typeof(x).sharding
        return g if jax.typeof(g).sharding == want else jax.sharding.reshard(g, want.spec)
    return _follower(len(x.shape))(x, g)


def explicit(x: Any) -> bool:
    """explicit(x) -> whether ``x``, traced, is sharded over a mesh of ``Explicit`` axes
    (``jax.sharding.AxisType``): its sharding is in its type, and JAX's own operations
    keep it, where a custom call (which has no rule for types) would lose it. ``xla.py``
    leaves such arrays to the plain path.

    Example:
        >>> import jax.numpy as jnp
        >>> explicit(jnp.ones(2))
        False
    """
    mesh = jax.typeof(x).sharding.mesh
    return any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()))


@functools.cache
def _follower(rank: int) -> Any:
    def body(x: Any, g: Any) -> Any:
        return g

    fn = custom_partitioning(body)
    fn.def_partition(
        partition=lambda mesh, args, result: (mesh, body, args[0].sharding,
                                              (args[0].sharding, args[0].sharding)),
        infer_sharding_from_operands=lambda mesh, args, result: args[0].sharding,
        sharding_rule=SdyShardingRule(
            (ArrayMapping(*(f"x{d}" for d in range(rank))),
             ArrayMapping(*(f"g{d}" for d in range(rank)))),
            (ArrayMapping(*(f"x{d}" for d in range(rank))),)))
    return fn
