"""PyTorch tensors: the NumPy backend's function set (``protocol.Backend``, ``Grouping``),
``nn.Module`` nodes (``_torchnn.py``) and :func:`untraced` for ``torch.compile``.
Hyper-parameters stay Python floats, weakly typed: ``eta * m`` keeps ``m``'s dtype.
"""

from __future__ import annotations

import functools
import math
import operator
import sys
from collections.abc import Callable
from operator import add  # noqa: F401
from typing import Any

import numpy as np
import torch
from torch import abs, clamp, conj, nn, real, rsqrt, sqrt, where  # noqa: F401
from torch import div as divide  # noqa: F401
from torch import mul as multiply  # noqa: F401
from torch import sgn as sign  # noqa: F401 (x/|x| for complex x, as NumPy 2 and JAX)
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from optimisers.backends import common, registry
from optimisers.backends._torchnn import (  # noqa: F401 (protocol.Carrying)
    hasmodule,
    module_grads,
    register_nodes,
    unwrapped,
)
from optimisers.backends.packs import PAD, Packs

Array = torch.Tensor

CONCATENATES = True  # fused.Group steps groups over concatenations (protocol.Grouping)
FUSES_ITSELF = False
ASYNC = True  # reading a result on the host (float) waits for the device: keep it there

_REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32,
         torch.complex128: torch.float64}

# protocol functions that are PyTorch's own
iscomplex = torch.is_complex
complex_from = torch.complex
flatcat = _flatten_dense_tensors  # only read: it may be a view
size = torch.Tensor.numel
device = operator.attrgetter("device")
_SHAPE = operator.attrgetter("shape")
transpose = functools.partial(torch.transpose, dim0=-2, dim1=-1)
mean = functools.partial(torch.mean, keepdim=True)
to_bfloat16 = operator.methodcaller("to", torch.bfloat16)


def stochastic_bfloat16(x: Array, t: Any) -> Array:
    g = torch.Generator(device=x.device).manual_seed(int(t))
    r = torch.randint(0, 1 << 16, x.shape, generator=g, device=x.device, dtype=torch.int32)
    u = x.float().view(torch.int32)
    r ^= ((u * -1640531535) >> 16) & 0xFFFF  # (0x9E3779B1; r uniform: so is r ^ it)
    bits = (u + r) & -65536  # (0xFFFF0000)
    return torch.where(x.isnan(), x, bits.view(torch.float32)).to(torch.bfloat16)


def quantise(a: Array, block: int, code: tuple) -> tuple:
    flat = a.detach().reshape(-1).float()
    blocks = torch.nn.functional.pad(flat, (0, -flat.numel() % block)).view(-1, block)
    scale = blocks.abs().amax(dim=1)
    norm = blocks / torch.where(scale == 0, 1.0, scale)[:, None]
    values, mids, table = _coding(code, a.device)
    near = table.index_select(0, ((norm.view(torch.int32) >> 16) & 0xFFFF).view(-1))
    near += norm.view(-1) > mids.index_select(0, near)  # (index_select: int32 indices)
    return near.to(torch.uint8).view(norm.shape), scale


def dequantise(codes: Array, scale: Array, code: tuple, shape: tuple, dtype: Any) -> Array:
    values = _coding(code, codes.device)[0].index_select(0, codes.view(-1).int())
    values = values.view(codes.shape) * scale[:, None]
    return values.view(-1)[:math.prod(shape)].view(shape).to(todtype(dtype))


@functools.cache
def _coding(code: tuple, device: Any) -> tuple:
    """:func:`common.coding` as tensors on ``device``."""
    return tuple(torch.from_numpy(a).to(device) for a in common.coding(code))


def isfloating(x: Array) -> bool:
    return x.is_floating_point() or x.is_complex()


def ishalf(x: Array) -> bool:
    return x.dtype in (torch.float16, torch.complex32)


def maywrite(x: Array) -> bool:
    return True


def hyper(x: Array, *values: Any) -> tuple:
    """Python floats (weakly typed: arithmetic stays in ``x``'s dtype); a tensor on ``x``'s
    device and real dtype."""
    return tuple(_on(x, v) if isinstance(v, torch.Tensor) else float(v) for v in values)


def _on(x: Array, v: torch.Tensor) -> torch.Tensor:
    """``v`` on ``x``'s device and real dtype; a ``DTensor``'s whole value for a plain ``x``
    (a clip factor found over sharded gradients, for their local shards)."""
    if hasattr(v, "full_tensor") and not hasattr(x, "full_tensor"):
        v = v.full_tensor()
    return v.to(device=x.device, dtype=_REAL.get(x.dtype, x.dtype))


def zeros_like(x: Array, real_: bool = False) -> Array:
    return torch.zeros_like(x.real if real_ and x.is_complex() else x, requires_grad=False)


def full_like(x: Array, value: float | complex, real_: bool = False) -> Array:
    value = value if isinstance(value, complex) else float(value)
    return torch.full_like(x.real if real_ and x.is_complex() else x, value,
                           requires_grad=False)


def complement(v: Any) -> Any:
    return 1 - v  # before any cast: in float64 for a Python number, as optax computes it


def maximum(a: Any, b: Any, out: Array | None = None) -> Array:
    if not isinstance(b, torch.Tensor):
        return torch.clamp(a, min=b, out=out)
    if not isinstance(a, torch.Tensor):
        return torch.clamp(b, min=a, out=out)
    return torch.maximum(a, b, out=out)


def minimum(a: Any, b: Any) -> Array:
    if not isinstance(b, torch.Tensor):
        return torch.clamp(a, max=b)
    if not isinstance(a, torch.Tensor):
        return torch.clamp(b, max=a)
    return torch.minimum(a, b)


def lerp(a: Array, b: Array, w: Any, inplace: bool = False) -> Array:
    return a.lerp_(b, w) if inplace else torch.lerp(a, b, w)


def scaled_sum(a: Any, x: Array, b: Any, y: Array) -> Array:
    """``x*a + b*y`` as ``torch.optim.Muon`` adds it (``alpha=b``): one new tensor."""
    out = torch.mul(x, a)
    if isinstance(b, torch.Tensor):
        return out.add_(y.to(out.dtype) * b)
    return out.add_(y, alpha=b)


def amax(a: Array) -> Array:
    return a.max() if a.numel() else a.new_zeros(())


def amin(a: Array) -> Array:
    return a.min() if a.numel() else a.new_full((), np.inf)


def allfinite(g: Array) -> Array:
    return torch.isfinite(g).all()


def count_nonzero(g: Array, like: Array) -> Array:
    return torch.count_nonzero(g).to(like.dtype)


# --- matrices (protocol.Backend: transpose, matmul, matmul_add, vector_norm, ...) ---------


def _as_stack(t: Array) -> Array:
    """A matrix, or a stack of them of any depth, as a stack ``(n, rows, cols)``."""
    return t.reshape(math.prod(t.shape[:-2]), *t.shape[-2:])  # (-1: ambiguous if empty)


def matmul(a: Array, b: Array) -> Array:
    """``torch.bmm``, a single matrix as a stack of one."""
    out = torch.bmm(_as_stack(a), _as_stack(b))
    return out.reshape(*a.shape[:-2], *out.shape[-2:])


def matmul_add(c: Array, a: Array, b: Array, beta: Any, alpha: Any) -> Array:
    """``torch.baddbmm``, a single matrix as a stack of one (as a stack gets it, bit for bit)."""
    out = torch.baddbmm(*map(_as_stack, (c, a, b)), beta=float(beta), alpha=float(alpha))
    return out.reshape(*a.shape[:-2], *out.shape[-2:])


def vector_norm(x: Array, axes: tuple) -> Array:
    return torch.linalg.vector_norm(x, 2, dim=axes, keepdim=True)


def machine_epsilon(x: Array) -> float:
    return float(torch.finfo(_REAL.get(x.dtype, x.dtype)).eps)


def abs2(g: Array) -> Array:
    """``|g|^2``, real for a complex ``g`` (``g * conj(g)``'s real part)."""
    return (g * g.conj()).real if g.is_complex() else g * g


def eps(x: Array, e: Any) -> Any:
    """``e`` as a hyper-parameter of ``x``, floored for a float16 ``x`` (``common.floored``)."""
    if ishalf(x):
        e = common.floored(_SELF, e)
    (e,) = hyper(x, e)
    return e


# written once over the primitives above, for every backend (common.py)
_SELF = sys.modules[__name__]
clip = functools.partial(common.clip, _SELF)
norm = functools.partial(common.norm, _SELF)


def total_norm(arrays: list, p: float) -> Array | None:
    """The ``p``-norm of all ``arrays``, a 0-d tensor on their device; ``None`` unless dense
    float32 or float64 tensors of one dtype and device."""
    a0 = arrays[0]
    if a0.dtype not in (torch.float32, torch.float64) or not all(
            type(a) is torch.Tensor and a.dtype == a0.dtype and a.device == a0.device
            and a.layout == torch.strided for a in arrays):
        return None
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(arrays, p)), p)


def isfinite(n: Any) -> bool | None:
    return bool(torch.isfinite(torch.as_tensor(n)))


def cast(x: Any, like: Array) -> Array:
    return torch.as_tensor(x, dtype=like.dtype, device=like.device)


def astype(x: Array, dtype: Any) -> Array:
    dt = todtype(dtype)
    if x.is_complex():
        dt = torch.promote_types(dt, torch.complex64)
    return x.detach().to(dt, copy=True)


def todtype(dtype: Any) -> torch.dtype:
    """A torch dtype from a PyTorch, NumPy or JAX dtype, or a name (``"bfloat16"``)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = dtype.removeprefix("torch.") if isinstance(dtype, str) else np.dtype(dtype).name
    got = getattr(torch, name, None)
    if not isinstance(got, torch.dtype):
        raise TypeError(f"PyTorch has no dtype {name!r}")
    return got


def copy(x: Array) -> Array:
    return x.detach().clone()


def assign(dst: Array, value: Any) -> Array:
    with torch.no_grad():
        dst.copy_(value if isinstance(value, torch.Tensor) else torch.as_tensor(value))
    return dst


def subtract(x: Array, d: Any, inplace: bool) -> Array:
    with torch.no_grad():
        if inplace:
            return x.sub_(d)
        return like((x - d).to(x.dtype), x)


def like(y: Array, x: Array) -> Array:
    """``y`` made a parameter as ``x`` is (``nn.Parameter``, ``requires_grad``)."""
    if isinstance(x, nn.Parameter):
        return nn.Parameter(y, requires_grad=x.requires_grad)
    return y.requires_grad_() if x.requires_grad else y


def gradtype(x: Array) -> type:
    return torch.Tensor if isinstance(x, nn.Parameter) else type(x)


def shape(x: Array) -> tuple:
    return tuple(x.shape)


def dtype_name(x: Array) -> str:
    return str(x.dtype).removeprefix("torch.")


def isnumber(g: Array) -> bool:
    return True


def nbytes(x: Array) -> int:
    return int(x.numel() * x.element_size())


def concat(arrays: list, like: list) -> Array:
    if not arrays:
        return torch.zeros(0)
    dtype = like[0].dtype
    for a in like[1:]:
        dtype = torch.promote_types(dtype, a.dtype)
    return torch.cat([a.reshape(-1).to(dtype) for a in arrays])


def split(v: Array, stops: list, like: list) -> list:
    """Views of one new copy of ``v`` (never of ``v``); differentiable."""
    sizes = [b - a for a, b in zip([0, *stops[:-1]], stops)]
    out = []
    for seg, x in zip(torch.split(v.clone(), sizes), like):
        seg = seg.view(x.shape)
        if seg.is_complex() and not x.is_complex():
            seg = seg.real.contiguous()  # not a strided view of every other number
        out.append(seg if seg.dtype == x.dtype and seg.device == x.device
                   else seg.to(dtype=x.dtype, device=x.device, copy=True))
    return out


# --- fused groups (fast/fused.py) ---------------------------------------------------------------

_PACKS = Packs(lambda a: a._base, lambda b, lo, n: b.narrow(0, lo, n),
               lambda b: b.data_ptr())


def footprints(xs: list) -> tuple:
    """Each tensor's address, shape and strides."""
    return (list(map(torch.Tensor.data_ptr, xs)), list(map(_SHAPE, xs)),
            list(map(torch.Tensor.stride, xs)))


def packed(parts: tuple) -> list:
    return pack_into(parts, _PACKS, list)


def pack_into(parts: tuple, packs: Packs, dress: Callable[[list], list]) -> list:
    """pack_into(parts, packs, dress) -> :func:`packed`'s views, ``dress``-ed, in ``packs``."""
    x0 = parts[0]
    n = sum(p.numel() for p in parts)
    buf = torch.empty(n + PAD // x0.element_size(), dtype=x0.dtype, device=x0.device)
    lo = packs.start(buf, x0.element_size())
    views = list(_unflatten_dense_tensors(buf.narrow(0, lo, n), parts))
    torch._foreach_copy_(views, [p.detach() for p in parts])
    return packs.add(buf, lo, n, dress(views))


def joined(parts: tuple) -> tuple[Array, bool]:
    buf = _PACKS.whole(parts)
    return (buf, True) if buf is not None else (flatcat(list(parts)), False)


def scatter(flat: Array, parts: tuple) -> None:
    torch._foreach_copy_(list(parts), list(_unflatten_dense_tensors(flat, parts)))


def subtractor(xs: list) -> Any:
    return lambda d: torch._foreach_sub_(xs, _unflatten_dense_tensors(d, xs))


def split_like(d: Array, xs: list) -> list:
    out = list(torch._foreach_sub(xs, _unflatten_dense_tensors(d, xs)))
    for i, (x, y) in enumerate(zip(xs, out)):
        if y.dtype != x.dtype:
            y = out[i] = y.to(x.dtype)
        if x.requires_grad or isinstance(x, nn.Parameter):
            out[i] = like(y, x)
    return out


def flat(x: Array, g: Array, arrays: list) -> tuple | None:
    """``None`` off the CPU (see ``Group._chunked``)."""
    n = x.numel()
    if x.device.type != "cpu" or not all(
            a.layout == torch.strided and a.is_contiguous() and a.numel() == n
            for a in (x, g, *arrays)):
        return None
    return x.view(-1), g.view(-1), [a.view(-1) for a in arrays]


def copier() -> Any:
    return _PACKS.copier(copy, packed)


# --- torch.compile ------------------------------------------------------------------------

_UNTRACED: dict[Callable, Callable] = {}


def untraced(fn: Callable) -> Callable:
    """untraced(fn) -> ``fn`` run eagerly when ``torch.compile`` traces a call to it (a graph
    break): how ``update`` and ``update_`` run inside a compiled step."""
    found = _UNTRACED.get(fn)
    if found is None:
        found = _UNTRACED[fn] = torch.compiler.disable(fn, recursive=True)
    return found


registry.COMPILERS.append((torch.compiler.is_compiling, untraced))

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def host(a: Array, at: str) -> tuple[np.ndarray, str]:
    """A dtype NumPy lacks (bfloat16, float8) as its bits; a TypeError for a sparse tensor."""
    t = a.detach()
    if t.layout is not torch.strided:
        raise TypeError(f"cannot save {at}: a {t.layout} tensor; make it dense")
    t = t.cpu().resolve_conj().resolve_neg().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    try:
        return t.numpy(), name
    except TypeError:  # a dtype NumPy lacks
        size = t.element_size()
        if size not in _BITS:
            raise TypeError(f"cannot save {at}: tensors of dtype {name}") from None
        return t.view(_BITS[size]).numpy().view(f"u{size}"), name


def from_host(arr: np.ndarray, ref: Array, bits: bool, weak: bool = False) -> Array:
    if not bits:
        return torch.from_numpy(arr).to(device=ref.device)
    signed = arr.view(f"i{arr.dtype.itemsize}")  # torch's views of unsigned ints are few
    return torch.from_numpy(signed).view(ref.dtype).to(device=ref.device)


def dtype_name_of(v: Any) -> str:
    return str(v).removeprefix("torch.")


def cos(x: Any) -> Any:
    """Of a Python number (a schedule's step count), a Python float."""
    return torch.cos(x) if isinstance(x, torch.Tensor) else math.cos(x)
