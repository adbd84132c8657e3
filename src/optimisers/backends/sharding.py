"""JAX arrays over a mesh: what keeps a step's arrays placed as their parameters."""

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
    """The devices of all processes (fixed once JAX's backend has started)."""
    return jax.device_count()


def beside(state: Any, values: list) -> list:
    """beside(state, values) -> ``values`` (a Leaf's flat form) that are on one device placed
    replicated over the mesh ``state`` is sharded over, so that a jitted step gets them as
    it gives them back and does not compile again."""
    if _devices() == 1:
        return values
    for v in jax.tree.leaves(state):
        s = getattr(v, "sharding", None)
        if isinstance(s, NamedSharding) and len(s.device_set) > 1:
            mesh = s.mesh if not s.mesh.empty else jax.sharding.Mesh(  # (GSPMD's: no mesh)
                np.array(sorted(s.device_set, key=lambda d: d.id)), ("d",))
            where = NamedSharding(mesh, PartitionSpec())
            return [jax.device_put(a, where) if len(getattr(a, "sharding", s).device_set) == 1
                    else a for a in values]
    return values


def follow(x: Any, g: Any) -> Any:
    """follow(x, g) -> the traced gradient ``g`` resharded as its parameter ``x``, so that
    every array a step makes is sharded as the parameter (not as the gradient)."""
    if _devices() == 1:
        return g
    if explicit(x):  # shardings in the types: JAX's own reshard
        want = jax.typeof(x).sharding
        return g if jax.typeof(g).sharding == want else jax.sharding.reshard(g, want.spec)
    return _follower(len(x.shape))(x, g)


def explicit(x: Any) -> bool:
    """explicit(x) -> whether the traced ``x`` is sharded over ``Explicit`` mesh axes."""
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
