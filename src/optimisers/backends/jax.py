"""JAX arrays (``protocol.Backend``), never written in place; hyper-parameters are 0-d arrays
of the array's real dtype, so that a traced one never promotes a float16 or bfloat16 step.

This package's own types as pytrees, and ``fuse``, live in ``fast/jaxtree.py``, imported
once this module is (``registry.extend``). No concatenating group functions, on purpose:
splitting a concatenation costs XLA a kernel per distinct slice, so compile time
(benchmarks/README.md).
"""

from __future__ import annotations

import functools
import math
import sys
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.numpy import abs, cos, minimum, sign, where  # noqa: F401

from optimisers.backends import common, sharding
from optimisers.backends import numpy as _numpy

Array = jax.Array

CONCATENATES = False  # see above: no concatenating group functions
FUSES_ITSELF = True  # fuse (protocol.Fusing)


def _real(dtype: Any) -> Any:
    return jnp.finfo(dtype).dtype if jnp.issubdtype(dtype, jnp.inexact) else dtype


def isfloating(x: Array) -> bool:
    return bool(jnp.issubdtype(x.dtype, jnp.inexact))


def ishalf(x: Array) -> bool:
    return _real(x.dtype) == jnp.float16


def maywrite(x: Array) -> bool:
    return False


# protocol functions that are JAX's own; ``out`` ignored: an immutable array is never written
iscomplex = jnp.iscomplexobj
clamp = jnp.clip
complex_from = jax.lax.complex
amax = functools.partial(jnp.max, initial=0)
amin = functools.partial(jnp.min, initial=np.inf)
transpose = functools.partial(jnp.swapaxes, axis1=-1, axis2=-2)
mean = functools.partial(jnp.mean, keepdims=True)
sqrt, rsqrt, maximum, divide, multiply = map(common.ignoring_out, (
    jnp.sqrt, jax.lax.rsqrt, jnp.maximum, jnp.divide, jnp.multiply))
# as NumPy's: shapes and sizes, dtype names, host copies, parameters unmarked
shape, size, nbytes = _numpy.shape, _numpy.size, _numpy.nbytes
dtype_name, dtype_name_of, host = _numpy.dtype_name, _numpy.dtype_name_of, _numpy.host
gradtype, like = _numpy.gradtype, _numpy.like  # (only PyTorch marks parameters)


def hyper(x: Array, *values: Any) -> tuple:
    """Hyper-parameters as 0-d arrays of ``x``'s real dtype (traced values too)."""
    dt = _real(x.dtype)
    return tuple(jnp.asarray(v, dt) for v in values)


_TRACED: dict[int, tuple] = {}  # id(v): (v weakly, its complement)


def remember(v: Any, c: Any) -> None:
    """remember(v, c): ``c`` is the precise ``1 - v`` of the traced number ``v``, while it lives.

    Example:
        >>> v = jnp.asarray(0.999); remember(v, 0.001); complement(v)
        0.001
    """
    key = id(v)
    _TRACED[key] = (weakref.ref(v, lambda _, t=_TRACED: t.pop(key, None)), c)


def complement(v: Any) -> Any:
    """``1 - v``: in float64 for a Python number; a traced one's remembered complement."""
    if type(v) is float:
        return 1.0 - v
    kept = _TRACED.get(id(v))
    return kept[1] if kept is not None and kept[0]() is v and kept[1] is not None else 1 - v


def zeros_like(x: Array, real_: bool = False) -> Array:
    return jnp.zeros_like(x, _real(x.dtype) if real_ else x.dtype)


def full_like(x: Array, value: Any, real_: bool = False) -> Array:
    return jnp.full_like(x, value, _real(x.dtype) if real_ else x.dtype)


def lerp(a: Array, b: Array, w: Any, inplace: bool = False) -> Array:
    return a + w * (b - a)


def scaled_sum(a: Any, x: Array, b: Any, y: Array) -> Array:
    return a * x + b * y.astype(x.dtype)


def allfinite(g: Array) -> Array:
    return jnp.isfinite(g).all()


def count_nonzero(g: Array, like: Array) -> Array:
    return jnp.count_nonzero(g).astype(like.dtype)


# --- matrices (protocol.Backend: transpose, matmul, matmul_add, vector_norm, ...) ---------


def _wide(dtype: Any) -> Any:
    """``dtype``, or float32 where it is less precise: what products accumulate in."""
    return jnp.promote_types(dtype, jnp.float32)


def matmul(a: Array, b: Array) -> Array:
    dt = jnp.result_type(a, b)
    return jnp.matmul(a, b, preferred_element_type=_wide(dt)).astype(dt)


def matmul_add(c: Array, a: Array, b: Array, beta: Any, alpha: Any) -> Array:
    wide = _wide(c.dtype)
    ab = jnp.matmul(a, b, preferred_element_type=wide)
    beta, alpha = jnp.asarray(beta, _real(wide)), jnp.asarray(alpha, _real(wide))
    return (beta * c.astype(wide) + alpha * ab).astype(c.dtype)


def vector_norm(x: Array, axes: tuple) -> Array:
    y = x.astype(_wide(x.dtype))
    return jnp.sqrt(jnp.sum(abs2(y), axis=axes, keepdims=True)).astype(_real(x.dtype))


def to_bfloat16(x: Array) -> Array:
    """to_bfloat16(x) -> ``x`` rounded to bfloat16 by ``reduce_precision``, which ``jit``
    keeps (a plain cast may be carried in float32, unrounded).

    Example:
        >>> to_bfloat16(jnp.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8]))
        Array([1, 1.01562], dtype=bfloat16)
    """
    wide = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    rounded = jax.lax.reduce_precision(x.astype(wide), exponent_bits=8, mantissa_bits=7)
    return rounded.astype(jnp.bfloat16)


def stochastic_bfloat16(x: Array, t: Any) -> Array:
    key = jax.random.fold_in(jax.random.key(0), jnp.asarray(t, jnp.uint32))
    u = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    r = (jax.random.bits(key, x.shape, jnp.uint32) ^ (u * jnp.uint32(0x9E3779B1))) >> 16
    bits = u + r
    rounded = jax.lax.bitcast_convert_type(bits & jnp.uint32(0xFFFF0000), jnp.float32)
    return jnp.where(jnp.isnan(x), x, rounded).astype(jnp.bfloat16)


def quantise(a: Array, block: int, code: tuple) -> tuple:
    flat = a.astype(jnp.float32).reshape(-1)
    blocks = jnp.pad(flat, (0, -flat.size % block)).reshape(-1, block)
    scale = jnp.abs(blocks).max(axis=1)
    norm = blocks / jnp.where(scale == 0, 1, scale)[:, None]
    c = common.coding(code)
    near = jnp.asarray(c.table)[jax.lax.bitcast_convert_type(norm, jnp.uint32) >> 16]
    near = near + (norm > jnp.asarray(c.mids)[near])
    return near.astype(jnp.uint8), scale


def dequantise(codes: Array, scale: Array, code: tuple, shape: tuple, dtype: Any) -> Array:
    values = jnp.asarray(common.coding(code).code)[codes] * scale[:, None]
    return values.reshape(-1)[:math.prod(shape)].reshape(shape).astype(todtype(dtype))


def apart(trees: list) -> list:
    """``trees`` with a copy of each concrete array met before in them: ``jax.jit`` cannot
    donate one buffer twice (one rule's numbers in several groups of Leafs, fast/jaxtree)."""
    seen: set[int] = set()

    def own(v: Any) -> Any:
        met = isinstance(v, jax.Array) and not isinstance(v, jax.core.Tracer) and id(v) in seen
        seen.add(id(v))
        return jnp.array(v, copy=True) if met else v

    ids = [id(v) for v in jax.tree.leaves(trees)]
    return trees if len(set(ids)) == len(ids) else [jax.tree.map(own, t) for t in trees]


def machine_epsilon(x: Array) -> float:
    return float(jnp.finfo(_real(x.dtype)).eps)


# written once over the primitives above, for every backend (common.py)
_SELF = sys.modules[__name__]
abs2 = functools.partial(common.abs2, _SELF)
clip = functools.partial(common.clip, _SELF)
norm = functools.partial(common.norm, _SELF)
eps = functools.partial(common.eps, _SELF)


def isfinite(n: Any) -> bool | None:
    return None if isinstance(n, jax.core.Tracer) else bool(jnp.isfinite(n))


def device(x: Array) -> Any:
    """Where ``x`` lives: its sharding (``None`` traced)."""
    return None if isinstance(x, jax.core.Tracer) else x.sharding


def cast(x: Any, like: Array) -> Array:
    """``x`` as a JAX array of ``like``'s dtype; traced, sharded as ``like`` (``follow``)."""
    out = jnp.asarray(x, dtype=like.dtype)
    if type(like).__name__ == "DynamicJaxprTracer" and like.ndim and out.shape == like.shape:
        return sharding.follow(like, out)
    return out


def astype(x: Array, dtype: Any) -> Array:
    dt = todtype(dtype)
    if jnp.iscomplexobj(x):
        dt = jnp.promote_types(dt, jnp.complex64)
    return jnp.asarray(x, dtype=dt)


def todtype(dtype: Any) -> np.dtype:
    """A JAX (NumPy) dtype from a JAX, NumPy or PyTorch dtype, or a name (``"bfloat16"``)."""
    if isinstance(dtype, str) or type(dtype).__module__.startswith("torch"):
        name = str(dtype).removeprefix("torch.")
        return np.dtype(getattr(jnp, name)) if hasattr(jnp, name) else np.dtype(name)
    return np.dtype(dtype)


def copy(x: Array) -> Array:
    """A new buffer: a state made from the parameter (``EMA``'s) must not share the one
    ``jit`` may donate."""
    return jnp.array(x, copy=True)


def copier() -> Any:
    return _same  # immutable arrays need no copy


def _same(x: Array) -> Array:
    return x


def assign(dst: Array, value: Any) -> Array:
    return jnp.asarray(value, dtype=dst.dtype)


def subtract(x: Array, d: Any, inplace: bool) -> Array:
    return jnp.asarray(x - d, dtype=x.dtype)


def add(a: Array, b: Array) -> Array:
    return a + b


def isnumber(g: Array) -> bool:
    return bool(jnp.issubdtype(g.dtype, jnp.number) or g.dtype == jnp.bool_)


def concat(arrays: list, like: list) -> Array:
    if not arrays:
        return jnp.zeros(0)
    dtype = jnp.result_type(*like)
    # a ravel or cast only where needed: each is an operation to dispatch
    return jnp.concatenate([a if a.ndim == 1 and a.dtype == dtype else
                            jnp.ravel(a).astype(dtype) for a in arrays], dtype=dtype)


def split(v: Array, stops: list, like: list) -> list:
    """One ``split``, and a reshape or cast only where needed (each is an operation)."""
    out = []
    for seg, x in zip(jnp.split(v, stops[:-1]), like):
        if seg.shape != x.shape:
            seg = jnp.reshape(seg, x.shape)
        if jnp.iscomplexobj(seg) and not jnp.iscomplexobj(x):
            seg = seg.real
        out.append(seg if seg.dtype == x.dtype else seg.astype(x.dtype))
    return out


def from_host(arr: np.ndarray, ref: Array, bits: bool, weak: bool = False) -> Array:
    """from_host(arr, ref, bits, weak) -> the host values ``arr`` as a JAX array placed as
    ``ref`` is (its sharding); with ``bits``, ``arr`` holds the bits of ``ref``'s dtype;
    ``weak``, a 0-d value weakly typed, as ``jnp.asarray(0.9)`` and ``jit`` make them.

    Example:
        >>> from_host(np.array(0.5, np.float32), jnp.zeros(()), bits=False, weak=True).weak_type
        True
    """
    out = arr.view(ref.dtype) if bits else arr
    if weak and out.shape == ():
        value = jnp.asarray(out.item())
        out = value if value.dtype == out.dtype else out
    if out.ndim < ref.ndim:  # a number beside a sharded array: replicated over its mesh
        return sharding.beside(ref, [jnp.asarray(out)])[0]
    return jax.device_put(out, ref.sharding)
