"""PyTorch's sharded tensors (``DTensor``, FSDP2's parameters): the torch backend's
functions, state placed as its parameter, fused groups stepped on the local shards only;
nothing gathered but for a rule that asks for whole arrays (:func:`gathered`) and :func:`host`.
"""

from __future__ import annotations

import functools
import itertools
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

from optimisers.backends import common
from optimisers.backends import torch as _torch
from optimisers.backends.packs import Packs
from optimisers.backends.torch import CONCATENATES, FUSES_ITSELF, copy  # noqa: F401
from optimisers.rules import NewValue

Array = DTensor


def __getattr__(name: str) -> Any:
    """Every other function of the protocol is the torch backend's, on ``DTensor``s."""
    return getattr(_torch, name)


def local(t: Any) -> Any:
    """local(t) -> this process's part of the ``DTensor`` ``t`` (its memory), or a plain ``t``."""
    if not isinstance(t, DTensor):
        return t
    with torch.no_grad():
        return t.to_local()


def dressed(shard: torch.Tensor, like: DTensor) -> DTensor:
    """dressed(shard, like) -> a ``DTensor`` holding ``shard`` (no copy, no communication)
    as this process's part of an array placed as ``like`` is.

    Example:
        >>> import torch.distributed as dist
        >>> from torch.distributed.tensor import init_device_mesh
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> w = distribute_tensor(torch.ones(2, 3), init_device_mesh("cpu", (1,)))
        >>> d = dressed(torch.zeros(2, 3), w)
        >>> type(d).__name__, d.placements == w.placements, local(d).sum().item()
        ('DTensor', True, 0.0)
        >>> dist.destroy_process_group()
    """
    with torch.no_grad():
        return DTensor.from_local(shard, like.device_mesh, like.placements, run_check=False,
                                  shape=like.shape, stride=like.stride())


def hyper(x: Array, *values: Any) -> tuple:
    """Hyper-parameters as Python floats; a tensor one replicated over ``x``'s mesh."""
    return tuple(_replicated(v, x) if isinstance(v, torch.Tensor) else float(v)
                 for v in values)


def _replicated(v: torch.Tensor, x: Array) -> DTensor:
    if isinstance(v, DTensor):
        return v
    (v,) = _torch.hyper(local(x), v)
    return distribute_tensor(v, x.device_mesh, [Replicate()] * x.device_mesh.ndim,
                             src_data_rank=None)


def cast(x: Any, like: Array) -> Array:
    """``x`` (a ``DTensor``, or a value all processes hold) as ``like``'s dtype and placements."""
    if isinstance(x, DTensor):
        return x if x.dtype == like.dtype else x.to(like.dtype)
    whole = _torch.cast(x, local(like))
    return distribute_tensor(whole, like.device_mesh, like.placements, src_data_rank=None)


def like(y: Any, x: Array) -> Array:
    """``y`` (a ``DTensor``, or this process's shard of one) made a parameter like ``x``."""
    return _torch.like(y if isinstance(y, DTensor) else dressed(y, x), x)


# ``out`` ignored: sharding propagation refuses some
sqrt, rsqrt, divide, multiply, maximum = map(common.ignoring_out, (
    torch.sqrt, torch.rsqrt, torch.div, torch.mul, _torch.maximum))


def allfinite(g: Array) -> Array:
    """Whether every element is finite, over all shards: ``0 * g`` is NaN where ``g`` is not."""
    return norm(0 * g, 1.0) == 0


def _extreme(a: Array, op: str) -> Any:
    """The largest or smallest element, replicated: each shard reduced alone (DTensor's own
    reduction fails on a process holding none of ``a``)."""
    reduce = getattr(_torch, "a" + op)
    if not a.numel():
        return reduce(a)
    mesh = a.device_mesh
    part = DTensor.from_local(reduce(local(a)), mesh, [Partial(op)] * mesh.ndim, run_check=False)
    return part.redistribute(mesh, [Replicate()] * mesh.ndim)


amax, amin = functools.partial(_extreme, op="max"), functools.partial(_extreme, op="min")


# written once over the primitives (common.py)
_SELF = sys.modules[__name__]
abs2 = functools.partial(common.abs2, _SELF)
clip = functools.partial(common.clip, _SELF)
norm = functools.partial(common.norm, _SELF)
eps = functools.partial(common.eps, _SELF)


# assign, subtract, lerp, scaled_sum: the torch backend's, what is written into ``x`` placed
# as ``x`` first (sharding propagation may replicate a step; writing into a shard refuses it)


def assign(dst: Array, value: Any) -> Array:
    return _torch.assign(dst, _placed_as(value, dst))


def subtract(x: Array, d: Any, inplace: bool) -> Array:
    return _torch.subtract(x, _placed_as(d, x), inplace)


def lerp(a: Array, b: Array, w: Any, inplace: bool = False) -> Array:
    return _torch.lerp(a, _placed_as(b, a), w, inplace)


def scaled_sum(a: Any, x: Array, b: Any, y: Array) -> Array:
    return _torch.scaled_sum(a, x, _placed_as(b, x), _placed_as(y, x))


def _placed_as(v: Any, x: Array) -> Any:
    if isinstance(v, DTensor) and v.placements != x.placements and v.shape == x.shape:
        return v.redistribute(x.device_mesh, x.placements)
    return v


def gradtype(x: Array) -> type:
    return DTensor  # FSDP2 gives a DTensor's gradient as a DTensor


def size(x: Array) -> int:
    return int(x.numel())  # the whole array's (a rule's RMS divides by it)


def nbytes(x: Array) -> int:
    return _torch.nbytes(local(x))  # this process's: what the state costs each rank


# --- fused groups: the torch backend's, on the local shards ---------------------------------

_PACKS = Packs(lambda a: local(a)._base, lambda b, lo, n: b.narrow(0, lo, n),
               lambda b: b.data_ptr())


def device(x: Array) -> torch.device:
    return local(x).device


def _on_shards(f: Callable) -> Callable:
    return lambda xs: f(list(map(local, xs)))


footprints, flatcat, subtractor = map(_on_shards, (_torch.footprints, _torch.flatcat,
                                                   _torch.subtractor))


def packed(parts: tuple) -> list:
    """``DTensor``s placed as ``parts``, their local shards views of one new buffer."""
    return _torch.pack_into(tuple(map(local, parts)), _PACKS,
                            lambda views: list(map(dressed, views, parts)))


def joined(parts: tuple) -> tuple[torch.Tensor, bool]:
    buf = _PACKS.whole(parts)
    return (buf, True) if buf is not None else (flatcat(list(parts)), False)


def scatter(flat: torch.Tensor, parts: tuple) -> None:
    _torch.scatter(flat, tuple(map(local, parts)))


def split(v: torch.Tensor, stops: list, like: list) -> list:
    shards = list(map(local, like))  # (v's segments are the shards': stops are not used)
    return _torch.split(v, list(itertools.accumulate(s.numel() for s in shards)), shards)


def split_like(d: torch.Tensor, xs: list) -> list:
    return list(map(like, _torch.split_like(d, list(map(local, xs))), xs))


def flat(x: Array, g: Array, arrays: list) -> tuple | None:
    return _torch.flat(local(x), local(g), list(map(local, arrays)))


def copier() -> Callable[[Any], Any]:
    return _PACKS.copier(copy, packed)


# --- rules that need whole arrays (backends.on_whole) ----------------------------------------


def gathered(apply: Callable, state: Any, x: Array, *grads: Array) -> tuple[Any, Any]:
    """gathered(apply, state, x, *grads) -> ``apply`` on gathered arrays, each process keeping
    its part of the results, placed as ``x`` (another shape: replicated)."""
    def placed(v: Any) -> Any:
        if isinstance(v, NewValue):
            return type(v)(placed(v.value))
        if not isinstance(v, torch.Tensor) or isinstance(v, DTensor):
            return v
        mesh = x.device_mesh
        placements = x.placements if v.shape == x.shape else [Replicate()] * mesh.ndim
        return distribute_tensor(v, mesh, placements, src_data_rank=None)

    state, step = apply(common.mapstate(lambda v, _: _whole(v), state), _whole(x),
                        *map(_whole, grads))
    return common.mapstate(lambda v, _: placed(v), state), placed(step)


def _whole(v: Any) -> Any:
    return v.full_tensor() if isinstance(v, DTensor) else v


# --- checkpoints in the library's own file: whole arrays ------------------------------------


def host(a: Array, at: str) -> tuple[np.ndarray, str]:
    """host(a, at) -> the whole array on the host (a collective, as :func:`optimisers.save`)."""
    return _torch.host(a.full_tensor(), at)


def from_host(arr: np.ndarray, ref: Array, bits: bool, weak: bool = False) -> Array:
    """from_host(arr, ref, bits) -> the whole array ``arr`` as a ``DTensor`` placed as ``ref``."""
    whole = _torch.from_host(arr, local(ref), bits, weak)
    return distribute_tensor(whole, ref.device_mesh, ref.placements, src_data_rank=None)
