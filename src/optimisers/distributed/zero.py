"""ZeRO-1 (as ``ZeroRedundancyOptimizer``) for parameters every process holds whole: each
array's state lives on its *owner* only (:func:`owners`), which steps it and broadcasts
the new parameter. A process's tree is an ordinary one with ``None`` where another owns."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from optimisers import state as _state
from optimisers.destructure import trainables
from optimisers.keypath import KeyPath
from optimisers.reduce import places
from optimisers.rules import Rule

__all__ = ["owners", "setup", "update_", "broadcast_"]


def owners(arrays: list, world: int) -> list[int]:
    """owners(arrays, world) -> the process that owns each array: the largest array first,
    each to the process that owns the fewest elements so far (the lowest rank on a tie).

    Example:
        >>> owners([torch.zeros(6), torch.zeros(5), torch.zeros(2), torch.zeros(4)], 2)
        [0, 1, 0, 1]
    """
    sizes = [int(x.numel()) for x in arrays]
    load, owner = [0] * world, [0] * len(arrays)
    for i in sorted(range(len(arrays)), key=lambda i: -sizes[i]):
        owner[i] = rank = min(range(world), key=lambda r: (load[r], r))
        load[rank] += sizes[i]
    return owner


def setup(rule: Any, model: Any, shard: Any = None) -> Any:
    """setup(rule, model, shard=group) -> tree: this process's part of a ZeRO-1 state tree.

    Like :func:`optimisers.setup`, but a Leaf only where this process owns the array
    (:func:`owners`). Step it with :func:`update_`, on every process of the group.

    Args:
        rule: what :func:`optimisers.setup` takes (a rule, a mapping, a function).
        model: a model whose parameters every process holds whole.
        shard: the process group, or ``None`` for the default one.

    Raises:
        ValueError: for parameters sharded already (``DTensor``s: use
            :func:`optimisers.setup`), and for a tree-level rule (``ClipGlobalNorm``).

    Example:
        >>> import torch.distributed as dist
        >>> from optimisers import Adam
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> tree = setup(Adam(), [torch.zeros(3), torch.zeros(2)])  # one process owns all
        >>> [leaf.state[0].shape for leaf in tree]
        [torch.Size([3]), torch.Size([2])]
        >>> dist.destroy_process_group()
    """
    arrays = trainables(model)
    if any(hasattr(x, "placements") for x in arrays):
        raise ValueError("the model's parameters are sharded already (DTensors, as "
                         "fully_shard makes them): optimisers.setup(rule, model) shards their "
                         "state alike; ZeRO-1 is for parameters every process holds whole")
    rank, world = dist.get_rank(shard), dist.get_world_size(shard)
    mine = {id(x) for x, r in zip(arrays, owners(arrays, world)) if r == rank}
    choose = _state.chooser(rule)

    def pick(kp: KeyPath, x: Any) -> Rule | None:
        r = choose(kp, x)
        if r is not None and places(r):
            raise ValueError(
                f"the rule at {str(kp)!r} holds the tree-level rule {places(r)[0][1]!r}: under "
                f"ZeRO-1 each process steps only the Leafs it owns, so its reduction would "
                f"see only those; use it with optimisers.setup (DDP or FSDP2), or clip "
                f"before the step (torch.nn.utils.clip_grad_norm_)")
        return r if id(x) in mine else None

    with warnings.catch_warnings():
        if arrays:  # others own them all: no warning that this process trains none
            warnings.filterwarnings("ignore", "setup found no trainable parameter")
        return _state.setup(pick, model)


def update_(tree: Any, model: Any, *grads: Any, shard: Any = None) -> tuple[Any, Any]:
    """update_(tree, model, grads=None, shard=group) -> (tree, model): one ZeRO-1 step.

    :func:`optimisers.update_` on this process's tree, then :func:`broadcast_`. A
    collective: call it on every process of the group.

    Example:
        >>> import torch.distributed as dist
        >>> from optimisers import Descent
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> model = [torch.ones(2)]
        >>> tree = setup(Descent(0.5), model)
        >>> update_(tree, model, [torch.ones(2)])[1]
        [tensor([0.5000, 0.5000])]
        >>> dist.destroy_process_group()
    """
    tree, model = _state.update_(tree, model, *grads)
    broadcast_(model, shard)
    return tree, model


def broadcast_(model: Any, shard: Any = None) -> Any:
    """broadcast_(model, shard=group) -> model: each trainable array sent from its owner
    to every process, in place, one broadcast per owner and dtype.

    Example:
        >>> import torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> broadcast_([torch.ones(2)])
        [tensor([1., 1.])]
        >>> dist.destroy_process_group()
    """
    arrays = trainables(model)
    rank, world = dist.get_rank(shard), dist.get_world_size(shard)
    buckets: dict[tuple, list] = {}
    for x, r in zip(arrays, owners(arrays, world)):
        buckets.setdefault((r, x.dtype, x.device), []).append(x)
    with torch.no_grad():
        for (r, dtype, device), xs in sorted(buckets.items(), key=lambda kv: (kv[0][0], str(
                kv[0][1]), str(kv[0][2]))):
            flat = (_flatten_dense_tensors(xs) if r == rank else
                    torch.empty(sum(x.numel() for x in xs), dtype=dtype, device=device))
            dist.broadcast(flat, src=dist.get_global_rank(shard or dist.group.WORLD, r),
                           group=shard)
            if r != rank:
                torch._foreach_copy_(xs, list(_unflatten_dense_tensors(flat, xs)))
    return model
