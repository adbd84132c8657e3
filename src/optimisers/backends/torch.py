"""PyTorch tensors: the same function set as the NumPy backend, plus ``nn.Module`` nodes.

Hyper-parameters stay Python floats: PyTorch treats a Python scalar as weakly typed, so
``eta * m`` keeps ``m``'s dtype (float16 and bfloat16 included). In-place writes run
under ``torch.no_grad()``, so a parameter that requires grad may be updated.
"""

from __future__ import annotations

import copy as _copy
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import conj, nn, real, sqrt  # noqa: F401

Array = torch.Tensor

_REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32,
         torch.complex128: torch.float64}


def isfloating(x: Array) -> bool:
    return x.is_floating_point() or x.is_complex()


def maywrite(x: Array) -> bool:
    return True


def hyper(x: Array, *values: Any) -> tuple:
    """Hyper-parameters as Python floats (weakly typed: arithmetic stays in ``x``'s dtype);
    a tensor value is moved to ``x``'s device and real dtype."""
    return tuple(_scalar(x, v) for v in values)


def _scalar(x: Array, v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.to(device=x.device, dtype=_REAL.get(x.dtype, x.dtype))
    return float(v)


def eps(x: Array, e: float) -> Any:
    """An epsilon for ``x``; float16 floors a non-zero one at 1e-7."""
    (e,) = hyper(x, max(e, 1e-7) if e and x.dtype in (torch.float16, torch.complex32) else e)
    return e


def zeros_like(x: Array, real_: bool = False) -> Array:
    return torch.zeros_like(x.real if real_ and x.is_complex() else x, requires_grad=False)


def full_like(x: Array, value: float, real_: bool = False) -> Array:
    return torch.full_like(x.real if real_ and x.is_complex() else x, float(value),
                           requires_grad=False)


def abs2(g: Array) -> Array:
    """|g|^2, real for complex ``g``."""
    return (g * g.conj()).real if g.is_complex() else g * g


def sign(x: Array) -> Array:
    """The sign; ``x/|x|`` (0 at 0) for complex ``x``, as NumPy 2 and JAX have it."""
    return torch.sgn(x)


def abs(x: Array) -> Array:  # noqa: A001
    return torch.abs(x)


def maximum(a: Any, b: Any) -> Array:
    if not isinstance(b, torch.Tensor):
        return torch.clamp(a, min=b)
    if not isinstance(a, torch.Tensor):
        return torch.clamp(b, min=a)
    return torch.maximum(a, b)


def minimum(a: Any, b: Any) -> Array:
    if not isinstance(b, torch.Tensor):
        return torch.clamp(a, max=b)
    if not isinstance(a, torch.Tensor):
        return torch.clamp(b, max=a)
    return torch.minimum(a, b)


def where(cond: Array, a: Any, b: Any) -> Array:
    return torch.where(cond, a, b)


def clip(g: Array, lo: Any, hi: Any) -> Array:
    return torch.clamp(g, lo, hi)


def norm(g: Array, p: float) -> Array:
    a = g.abs()
    if p == 0:
        return torch.count_nonzero(g).to(a.dtype)
    if p == np.inf:
        return a.max() if a.numel() else a.new_zeros(())
    if p == -np.inf:
        return a.min() if a.numel() else a.new_full((), np.inf)
    (p,) = hyper(a, p)
    return (a**p).sum() ** (1 / p)


def isfinite(n: Any) -> bool | None:
    """Whether a scalar is finite."""
    return bool(torch.isfinite(torch.as_tensor(n)))


def cast(x: Any, like: Array) -> Array:
    """``x`` (a tensor, NumPy array or number) as a tensor of ``like``'s dtype and device;
    no copy when it already is one."""
    return torch.as_tensor(x, dtype=like.dtype, device=like.device)


def astype(x: Array, dtype: Any) -> Array:
    return x.detach().to(todtype(dtype), copy=True)


def todtype(dtype: Any) -> torch.dtype:
    """A torch dtype from a PyTorch, NumPy or JAX dtype, or a name (``"bfloat16"``)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError as err:
            raise TypeError(f"cannot read {dtype!r} as a dtype") from err
    got = getattr(torch, name, None)
    if not isinstance(got, torch.dtype):
        raise TypeError(f"PyTorch has no dtype {name!r}")
    return got


def copy(x: Array) -> Array:
    return x.detach().clone()


def assign(dst: Array, value: Any) -> Array:
    """Write ``value`` into ``dst`` in place (tensors may always be written)."""
    with torch.no_grad():
        dst.copy_(value if isinstance(value, torch.Tensor) else torch.as_tensor(value))
    return dst


def subtract(x: Array, d: Any, inplace: bool) -> Array:
    """``x - d``, written into ``x`` when ``inplace``; else a new tensor of ``x``'s dtype
    (an ``nn.Parameter`` stays one, with the same ``requires_grad``)."""
    with torch.no_grad():
        if inplace:
            return x.sub_(d)
        y = (x - d).to(x.dtype)
    if isinstance(x, nn.Parameter):
        return nn.Parameter(y, requires_grad=x.requires_grad)
    return y


def add(a: Array, b: Array) -> Array:
    return a + b


def shape(x: Array) -> tuple:
    return tuple(x.shape)


def dtype_name(x: Array) -> str:
    return str(x.dtype).removeprefix("torch.")


def isnumber(g: Array) -> bool:
    """Whether ``g`` holds numbers (bool, integer, floating or complex)."""
    return True


def size(x: Array) -> int:
    return int(x.numel())


def nbytes(x: Array) -> int:
    return int(x.numel() * x.element_size())


def concat(arrays: list, like: list) -> Array:
    """One flat vector of ``arrays``, in their common (promoted) dtype; differentiable."""
    if not arrays:
        return torch.zeros(0)
    dtype = like[0].dtype
    for a in like[1:]:
        dtype = torch.promote_types(dtype, a.dtype)
    return torch.cat([a.reshape(-1).to(dtype) for a in arrays])


def unflat(v: Array, start: int, stop: int, like: Array) -> Array:
    """``v[start:stop]`` as a new tensor of ``like``'s shape, dtype and device;
    differentiable (a copy, never a view that a later in-place update would write through)."""
    seg = v[start:stop].reshape(like.shape)
    if seg.is_complex() and not like.is_complex():
        seg = seg.real
    return seg.to(dtype=like.dtype, device=like.device, copy=True)


# --- nn.Module as a node of the tree protocol ----------------------------------------------


def rebuild_module(m: nn.Module, new_children: Mapping) -> nn.Module:
    """A new module like ``m`` with some parameters, buffers or submodules replaced.

    ``m`` is never mutated: the copy gets its own ``_parameters``, ``_buffers``,
    ``_modules`` (and hook) dicts. A new parameter value that is a plain tensor is wrapped
    as ``nn.Parameter`` with the old one's ``requires_grad``, unless it is the differentiable
    result of a computation (then it is kept as it is, so gradients flow through it).
    """
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


# id(tensor) -> (weakref to it, weakref to its Parameter): one tensor placed in several
# modules (a tie, as fmap and re(v) place it) becomes one Parameter, so the tie survives.
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


def hasmodule(model: Any) -> bool:
    """Whether ``model`` is, or holds, an ``nn.Module`` or a tensor that requires grad:
    a PyTorch model whose gradients ``update_`` may read from ``.grad``."""
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
    """The gradient tree that ``update_(tree, model)`` uses when no gradient is given.

    Mirrors the model with ``dict``s keyed by child names, holding each trainable
    tensor's ``.grad``. Autograd has already summed the gradient of a tied parameter over
    its uses, so it is given once, at the first trainable path in walk order, and
    ``None`` at the others: the state tree's gathering, which sums what arrives at a
    shared Leaf, then counts it once.
    """
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
