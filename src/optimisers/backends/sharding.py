"""JAX arrays over a mesh: what keeps a step's arrays placed as their parameters.

Under ``jax.jit`` XLA places each array a step makes by what it is made from; a gradient
sharded otherwise than its parameter (the gradient of a replicated bias beside a sharded
matrix) would give the new state and parameter the gradient's placement. :func:`follow`
reshards a gradient to its parameter first. A Leaf's numbers and clock, tiny, are placed
replicated over the mesh its state is sharded on (:func:`beside`), so that a jitted step
gets them as it gives them back and does not compile again.
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

__all__ = ["beside", "explicit", "follow"]


@functools.cache
def _devices() -> int:
    """The devices of all processes (fixed once JAX's backend has started, as it has when
    a step is traced)."""
    return jax.device_count()


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
    keep it.

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
