"""``torch.nn.Module`` as a node of the tree protocol, and the wrappers that stay out of sight.

A module's children are its parameters, buffers and submodules; it trains its parameters
that have ``requires_grad`` and its submodules. A wrapper (``torch.compile``'s
``OptimizedModule``, ``DistributedDataParallel``, ``DataParallel``) is transparent: its
children, and so its paths, are the wrapped module's own.
"""

from __future__ import annotations

import copy as _copy
import functools
import operator
import sys
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn


@functools.cache
def _inner_name(cls: type) -> str | None:
    """The attribute under which a module class holds the module it wraps (None: no wrapper)."""
    frames = sys.modules.get("torch._dynamo.eval_frame")  # loaded once torch.compile ran
    compiled = getattr(frames, "OptimizedModule", None)
    if compiled is not None and issubclass(cls, compiled):
        return "_orig_mod"
    if issubclass(cls, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return "module"
    return None


def unwrapped(m: nn.Module) -> nn.Module:
    """unwrapped(m) -> the module ``m`` wraps, through any number of wrappers, or ``m``."""
    name = _inner_name(type(m))
    while name is not None:
        m = m._modules[name]
        name = _inner_name(type(m))
    return m


def wrapper_name(x: Any) -> str | None:
    """wrapper_name(x) -> the attribute a wrapper holds its module under (out of key paths)."""
    return _inner_name(type(x)) if isinstance(x, nn.Module) else None


def module_children(m: nn.Module) -> dict:
    """module_children(m) -> ``m``'s parameters, buffers and submodules (a wrapper's module's)."""
    m = unwrapped(m)
    return {**m._parameters, **m._buffers, **m._modules}


def child_getter(m: nn.Module) -> Callable[[nn.Module, str], Any]:
    """child_getter(m) -> ``get(module, key)`` for modules of ``m``'s class, building no dict."""
    return _child if _inner_name(type(m)) is None else _wrapped_child


def _child(m: nn.Module, k: str) -> Any:
    for found in (m._modules, m._buffers, m._parameters):  # the precedence of children
        if k in found:
            return found[k]
    raise KeyError(k)


def _parameters_at(m: nn.Module, keys: tuple) -> Callable[[], tuple] | None:
    """A read of ``_child`` at two or more ``keys`` at once, where all are ``m``'s parameters."""
    params = m._parameters
    if len(keys) < 2 or not all(k in params and k not in m._modules and k not in m._buffers
                                for k in keys):
        return None
    get = operator.itemgetter(*keys)
    return lambda: get(params)


_child.many = _parameters_at  # type: ignore[attr-defined]


def _wrapped_child(m: nn.Module, k: str) -> Any:
    return _child(unwrapped(m), k)


def module_trainable(m: nn.Module) -> tuple:
    """module_trainable(m) -> the parameters that have ``requires_grad``, and the submodules."""
    m = unwrapped(m)
    return (*(k for k, v in m._parameters.items() if v is not None and v.requires_grad),
            *m._modules)


def rebuild_module(m: nn.Module, new_children: Mapping) -> nn.Module:
    """rebuild_module(m, new_children) -> a new module like ``m`` with some parameters,
    buffers or submodules replaced.

    ``m`` is never mutated. A plain tensor becomes an ``nn.Parameter`` with the old
    one's ``requires_grad``, unless it is a differentiable result (kept, so gradients
    flow). A wrapper is rebuilt around the rebuilt module (a compiled one stays compiled).

    Raises:
        TypeError: for a ``DistributedDataParallel`` or a ``fully_shard``-ed module, which
            hold the old parameters: step those in place with ``update_``.
    """
    name = _inner_name(type(m))
    if name is None:
        if _sharded(m):
            raise TypeError(
                f"cannot make a new {type(m).__name__} with new parameters: fully_shard's "
                f"state holds the old ones. Step it in place with update_(tree, model)")
        return _rebuilt(m, new_children)
    if isinstance(m, nn.parallel.DistributedDataParallel):
        raise TypeError(
            "cannot make a new DistributedDataParallel with new parameters: its gradient "
            "reducer holds the old ones. Step it in place with update_(tree, ddp_model), "
            "or rebuild the module it wraps (ddp_model.module) and wrap that again")
    inner = rebuild_module(m._modules[name], new_children)
    if name == "_orig_mod":  # torch.compile's wrapper: compile the new module alike
        return type(m)(inner, m.dynamo_ctx)
    return _rebuilt(m, {name: inner})


def _sharded(m: nn.Module) -> bool:
    """Whether ``fully_shard`` (FSDP2) made ``m`` a part of a sharded model."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # loaded before any module is sharded
    return fsdp is not None and isinstance(m, fsdp.FSDPModule)


def _rebuilt(m: nn.Module, new_children: Mapping) -> nn.Module:
    y = _copy.copy(m)
    for name, value in vars(y).items():
        if name.startswith("_") and isinstance(value, (dict, set)):
            y.__dict__[name] = _copy.copy(value)
    for k, v in new_children.items():
        if k in y._parameters:
            y._parameters[k] = _as_parameter(v, y._parameters[k])
        elif k in y._buffers:
            y._buffers[k] = v
        else:
            y._modules[k] = v
    return y


# id(tensor) -> (weakref to it, weakref to its Parameter): a tied tensor gets one Parameter
_WRAPPED: dict[int, tuple[weakref.ref, weakref.ref]] = {}


def _as_parameter(v: Any, old: Any) -> Any:
    if not isinstance(v, torch.Tensor) or isinstance(v, nn.Parameter):
        return v
    if v.requires_grad and not v.is_leaf:
        return v  # a function of other tensors: wrapping would cut the autograd graph
    hit = _WRAPPED.get(id(v))
    if hit is not None and hit[0]() is v and hit[1]() is not None:
        return hit[1]()
    grad = old.requires_grad if isinstance(old, torch.Tensor) else v.requires_grad
    p = nn.Parameter(v.detach(), requires_grad=grad)
    key = id(v)
    _WRAPPED[key] = (weakref.ref(v, lambda _: _WRAPPED.pop(key, None)), weakref.ref(p))
    return p


@functools.cache  # once: again, it would change nothing
def register_nodes() -> None:
    """register_nodes(): ``nn.Module`` (and subclasses) as a node of the tree protocol."""
    from optimisers.tree import Node, register_node

    register_node(nn.Module, Node(
        children=module_children, rebuild=rebuild_module, getter=child_getter,
        trainable=lambda m, kids: module_trainable(m), wrapper=wrapper_name))


def hasmodule(model: Any) -> bool:
    """hasmodule(model) -> whether ``model`` holds an ``nn.Module`` or a tensor needing grad."""
    from optimisers.tree import children

    seen: set[int] = set()

    def go(x: Any) -> bool:
        if isinstance(x, nn.Module) or isinstance(x, torch.Tensor) and x.requires_grad:
            return True
        if id(x) in seen:
            return False
        seen.add(id(x))
        return any(go(c) for c in children(x).values())

    return go(model)


def module_grads(model: Any) -> Any:
    """module_grads(model) -> the ``.grad``s ``update_(tree, model)`` reads, in ``dict``s by
    child name; a tied parameter's (summed by autograd) at its first path only."""
    from optimisers.tree import children, trainable

    seen: set[int] = set()

    def go(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) in seen or not x.is_leaf:
                return None
            seen.add(id(x))
            return x.grad
        kids = children(x)
        if not kids:
            return None
        train = set(trainable(x))
        return {k: go(v) if k in train else None for k, v in kids.items()}

    return go(model)
