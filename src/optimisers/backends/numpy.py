"""NumPy arrays: the reference backend (``protocol.Backend``, as every backend), which also
steps fused groups over concatenations (``protocol.Grouping``)."""

from __future__ import annotations

import collections
import functools
import itertools
import math
import operator
import sys
from typing import Any

import numpy as np
from numpy import abs, cos, minimum, sign, where  # noqa: F401
from numpy import clip as clamp  # noqa: F401

from optimisers.backends import common
from optimisers.backends.packs import PAD, Packs

Array = np.ndarray

CONCATENATES = True  # fused.Group steps groups over concatenations (protocol.Grouping)
FUSES_ITSELF = False

# protocol functions that are NumPy's own
iscomplex = np.iscomplexobj
maywrite = operator.attrgetter("flags.writeable")
copy = operator.methodcaller("copy")
shape, size, nbytes = map(operator.attrgetter, ("shape", "size", "nbytes"))
amax = functools.partial(np.max, initial=0)
amin = functools.partial(np.min, initial=np.inf)
transpose = functools.partial(np.swapaxes, axis1=-1, axis2=-2)
mean = functools.partial(np.mean, keepdims=True)
flatcat = functools.partial(np.concatenate, axis=None)


def isfloating(x: Array) -> bool:
    return x.dtype.kind in "fc" or x.dtype.name == "bfloat16"  # (ml_dtypes': kind "V")


def ishalf(x: Array) -> bool:
    return x.dtype == np.float16


def hyper(x: Array, *values: float) -> tuple:
    """Hyper-parameters as scalars of ``x``'s real dtype, so arithmetic stays in that dtype."""
    return tuple(map(x.real.dtype.type if x.dtype.kind == "c" else x.dtype.type, values))


def like(y: Array, x: Array) -> Array:
    return y  # only PyTorch marks parameters


def complement(v: Any) -> Any:
    return 1 - v  # before any cast: in float64 for a Python number, as optax computes it


def zeros_like(x: Array, real_: bool = False) -> Array:
    # np.zeros, not np.zeros_like: large zeros come from calloc, untouched until written
    return np.zeros(x.shape, x.real.dtype if real_ else x.dtype)


def full_like(x: Array, value: float, real_: bool = False) -> Array:
    return np.full_like(x.real if real_ else x, value)


def complex_from(re: Array, im: Array) -> Array:
    return re + 1j * im


def lerp(a: Array, b: Array, w: Any, inplace: bool = False) -> Array:
    if inplace and a.flags.writeable:
        step = np.subtract(b, a)
        step *= w
        a += step
        return a
    return a + w * (b - a)


def scaled_sum(a: Any, x: Array, b: Any, y: Array) -> Array:
    out = a * x
    out += b * np.asarray(y, out.dtype)
    return out


def _out(out: Any) -> Array | None:
    """``out`` where it is an array (not a NumPy scalar)."""
    return out if isinstance(out, np.ndarray) else None


def _into(f: Any) -> Any:
    """NumPy's ufunc ``f``, writing into ``out`` where that is an array."""
    return lambda *args, out=None: f(*args, out=_out(out))


sqrt, maximum, divide, multiply = map(_into, (np.sqrt, np.maximum, np.divide, np.multiply))


def rsqrt(x: Array, out: Array | None = None) -> Array:
    s = np.sqrt(x, out=_out(out))
    return np.reciprocal(s, out=_out(s))


def allfinite(g: Array) -> Array:
    return np.isfinite(g).all()


def count_nonzero(g: Array, like: Array) -> Array:
    return np.count_nonzero(g).astype(like.dtype)


# --- matrices (protocol.Backend: transpose, matmul, matmul_add, vector_norm, ...) ---------


def _wide(x: Array) -> Array:
    """``x`` in float32 at least: what products accumulate in."""
    return x.astype(np.promote_types(x.dtype, np.float32), copy=False)


def matmul(a: Array, b: Array) -> Array:
    return np.matmul(_wide(a), _wide(b)).astype(np.result_type(a, b), copy=False)


def matmul_add(c: Array, a: Array, b: Array, beta: Any, alpha: Any) -> Array:
    w = _wide(c)
    beta, alpha = hyper(w, beta, alpha)
    return (beta * w + alpha * np.matmul(_wide(a), _wide(b))).astype(c.dtype, copy=False)


def vector_norm(x: Array, axes: tuple) -> Array:
    norm2 = abs2(_wide(x)).sum(axis=axes, keepdims=True)
    return np.sqrt(norm2).astype(x.real.dtype, copy=False)


def to_bfloat16(x: Array) -> Array:
    """to_bfloat16(x) -> ``x`` rounded to bfloat16 (to nearest, ties to even), as float32;
    float64 rounded directly, never twice."""
    wide = x.dtype == np.float64
    f = x if wide else x.astype(np.float32, copy=False)
    u = f.view(np.uint64 if wide else np.uint32)
    cut = 45 if wide else 16  # the bits below bfloat16's 7 stored ones
    half = (1 << (cut - 1)) - 1
    rounded = ((u + half + ((u >> cut) & 1)) >> cut << cut).view(f.dtype)
    return np.where(np.isnan(f), f, rounded).astype(np.float32, copy=False)


def stochastic_bfloat16(x: Array, t: Any) -> Array:
    r = np.random.default_rng(int(t)).integers(0, 1 << 16, x.shape, dtype=np.uint32)
    u = np.asarray(x, np.float32).view(np.uint32)
    r ^= (u * np.uint32(0x9E3779B1)) >> 16  # (r uniform: so is r ^ anything of x)
    bits = (u + r) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), x, bits.view(np.float32)).astype(todtype("bfloat16"))


def quantise(a: Array, block: int, code: tuple) -> tuple:
    flat = np.asarray(a, np.float32).reshape(-1)
    blocks = np.pad(flat, (0, -flat.size % block)).reshape(-1, block)
    scale = np.abs(blocks).max(axis=1)
    norm = blocks / np.where(scale == 0, 1, scale)[:, None]
    c = common.coding(code)
    near = c.table[norm.view(np.uint32) >> 16]
    near += norm > c.mids[near]
    return near.astype(np.uint8), scale


def dequantise(codes: Array, scale: Array, code: tuple, shape: tuple, dtype: Any) -> Array:
    values = common.coding(code).code[codes] * scale[:, None]
    return values.reshape(-1)[:math.prod(shape)].reshape(shape).astype(todtype(dtype))


def machine_epsilon(x: Array) -> float:
    return float(np.finfo(x.dtype).eps)


def abs2(g: Array) -> Array:
    return (g * g.conj()).real if g.dtype.kind == "c" else g * g


def eps(x: Array, e: Any) -> Any:
    """``e`` as a hyper-parameter of ``x``, floored for a float16 ``x`` (``common.floored``)."""
    return hyper(x, common.floored(_SELF, e) if x.dtype == np.float16 else e)[0]


# written once over the primitives above, for every backend (common.py)
_SELF = sys.modules[__name__]
clip = functools.partial(common.clip, _SELF)
norm = functools.partial(common.norm, _SELF)


def isfinite(n: Any) -> bool | None:
    return bool(np.isfinite(n))


def cast(x: Array, like: Array) -> Array:
    return np.asarray(x).astype(like.dtype, copy=False)


def astype(x: Array, dtype: Any) -> Array:
    dt = todtype(dtype)
    return x.astype(np.result_type(dt, np.complex64) if x.dtype.kind == "c" else dt, copy=True)


def todtype(dtype: Any) -> Any:
    try:
        return np.dtype(dtype)
    except TypeError:  # torch.float32 and the like; bfloat16 from ml_dtypes (JAX's)
        name = str(dtype).removeprefix("torch.")
        if name != "bfloat16":
            return np.dtype(name)
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError("NumPy arrays of bfloat16 need the ml_dtypes package "
                            "(pip install ml_dtypes; JAX installs it)") from None
        return np.dtype(ml_dtypes.bfloat16)


def assign(dst: Array, value: Any) -> Array:
    if dst.flags.writeable:
        np.copyto(dst, value, casting="unsafe")
        return dst
    return np.asarray(value).astype(dst.dtype, copy=False)


def subtract(x: Array, d: Any, inplace: bool) -> Array:
    if inplace and x.flags.writeable:
        np.subtract(x, d, out=x, casting="unsafe")
        return x
    return np.asarray(np.subtract(x, d), dtype=x.dtype)  # 0-d stays an array


def add(a: Array, b: Array) -> Array:
    return np.asarray(a + b)  # 0-d arrays add up to a NumPy scalar: keep an array


gradtype = type  # the type of a gradient that needs no cast for a parameter x


def dtype_name(x: Array) -> str:
    return str(x.dtype)


def dtype_name_of(v: Any) -> str:
    return np.dtype(v).name


def isnumber(g: Array) -> bool:
    return g.dtype.kind in "biufc" or g.dtype.name == "bfloat16"


def concat(arrays: list, like: list) -> Array:
    dtype = np.result_type(*like) if like else np.float32
    return np.concatenate([np.ravel(a).astype(dtype, copy=False) for a in arrays] or
                          [np.zeros(0, dtype)])


def split(v: Array, stops: list, like: list) -> list:
    return [(seg if x.dtype.kind == "c" else seg.real).astype(x.dtype, copy=True)
            for seg, x in zip(_segments(v, like), like)]  # (stops: like's sizes, summed)


# ---------------------------------------------------------------- fused groups (fast/fused.py)

_PACKS = Packs(lambda a: a.base, lambda b, lo, n: b[lo:lo + n],
               lambda b: b.__array_interface__["data"][0])


def device(x: Array) -> str:
    return "cpu"


def footprints(xs: list) -> list:
    """What a group's views assume of each array's memory: its size (``resize`` changes it)."""
    return list(map(size, xs))


def packed(parts: tuple) -> list:
    dtype = parts[0].dtype
    n = sum(p.size for p in parts)
    buf = np.zeros(n + PAD // dtype.itemsize, dtype)
    lo = _PACKS.start(buf, dtype.itemsize)
    views = list(_segments(buf[lo:lo + n], parts))
    for v, p in zip(views, parts):
        if not (p.flags.c_contiguous and p.dtype.kind in "biufc"  # all bytes zero (not -0.0):
                and not p.reshape(-1).view(np.uint8).any()):  # the buffer has them already
            np.copyto(v, p)
    return _PACKS.add(buf, lo, n, views)


def joined(parts: tuple) -> tuple[Array, bool]:
    buf = _PACKS.whole(parts)
    return (buf, True) if buf is not None else (np.concatenate(parts, axis=None), False)


def scatter(flat: Array, parts: tuple) -> list | None:
    if all(p.flags.writeable for p in parts):
        collections.deque(map(np.copyto, parts, _segments(flat, parts)), 0)
        return None
    return [seg.astype(p.dtype, copy=True) for p, seg in zip(parts, _segments(flat, parts))]


def _segments(flat: Array, parts: Any) -> Any:
    start = 0
    for p in parts:
        yield flat[start:start + p.size].reshape(p.shape)
        start += p.size


def subtractor(xs: list) -> Any:
    views = [x.reshape(-1) if x.flags.c_contiguous else x for x in xs]
    stops = list(itertools.accumulate(map(size, views)))
    cuts = list(map(slice, [0, *stops[:-1]], stops))
    dtype = views[0].dtype if views else None
    flat = all(v.ndim == 1 and v.dtype == dtype for v in views)
    last: list = [None, None]  # the last d, and its segments (a group's kept steps: reused)

    def subtract(d: Array) -> None:
        if flat and d.dtype == dtype:
            if last[0] is not d:
                last[:] = d, list(map(d.__getitem__, cuts))
            collections.deque(map(np.subtract, views, last[1], views), 0)
            return
        for v, cut in zip(views, cuts):
            np.subtract(v, d[cut].reshape(v.shape), out=v, casting="unsafe")

    return subtract


def split_like(d: Array, xs: list) -> list:
    return [np.asarray(x - seg, dtype=x.dtype) for x, seg in zip(xs, _segments(d, xs))]


def copier() -> Any:
    return _PACKS.copier(lambda a: a.copy() if a.flags.writeable else a, packed)


def flat(x: Array, g: Array, arrays: list) -> tuple | None:
    if not all(a.flags.c_contiguous and a.flags.writeable and a.size == x.size
               for a in (x, *arrays)) or not g.flags.c_contiguous or g.size != x.size:
        return None
    return x.reshape(-1), g.reshape(-1), [a.reshape(-1) for a in arrays]


def host(a: Any, at: str) -> tuple[Array, str]:
    arr = np.asarray(a)
    return arr, arr.dtype.name


def from_host(arr: Array, ref: Any, bits: bool, weak: bool = False) -> Array:
    return arr.view(ref.dtype) if bits else arr

