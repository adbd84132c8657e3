"""Compiled loops for NumPy groups, when numba is installed (``optimisers[fast]``).

Only what NumPy cannot do in one call: writing one flat step into many separate
parameter arrays. The loop reads each parameter's address, computed once per group,
so a step over 2,000 small arrays is one call instead of 2,000.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

_AVAILABLE = importlib.util.find_spec("numba") is not None
_KERNELS: dict[Any, Any] = {}


def available() -> bool:
    """Whether numba is installed."""
    return _AVAILABLE


def _kernel(dtype: np.dtype) -> Any:
    if dtype in _KERNELS:
        return _KERNELS[dtype]
    import numba
    from numba import types
    from numba.extending import intrinsic

    nbtype = numba.from_dtype(dtype)
    pointer = types.CPointer(nbtype)

    @intrinsic
    def as_pointer(typingctx, address):  # an address (intp) read as a typed pointer
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(pointer))
        return pointer(types.intp), codegen

    @numba.njit(nogil=True)
    def scatter_sub(addresses, sizes, d):
        start = 0
        for j in range(addresses.size):
            n = sizes[j]
            x = numba.carray(as_pointer(addresses[j]), (n,))
            for i in range(n):
                x[i] -= d[start + i]
            start += n

    _KERNELS[dtype] = scatter_sub
    return scatter_sub


def scatter_sub(xs: list) -> Any:
    """A function ``f(d)`` doing ``x -= segment of d`` for all ``xs`` in one compiled loop,
    or ``None`` when that is not possible (no numba, or arrays not all C-contiguous,
    aligned, writable float32 or float64 arrays of one dtype)."""
    if not _AVAILABLE or not xs:
        return None
    dtype = xs[0].dtype
    if dtype not in (np.float32, np.float64) or not dtype.isnative or not all(
            x.dtype == dtype and x.flags.c_contiguous and x.flags.aligned
            and x.flags.writeable for x in xs):
        return None
    kernel = _kernel(dtype)
    addresses = np.array([x.__array_interface__["data"][0] for x in xs], dtype=np.intp)
    sizes = np.array([x.size for x in xs], dtype=np.intp)
    keep = list(xs)  # the addresses stay valid while these arrays live

    def run(d: np.ndarray) -> None:
        if d.dtype != dtype or not d.flags.c_contiguous:
            d = np.ascontiguousarray(d, dtype=dtype)
        kernel(addresses, sizes, d)
        run.keep = keep

    return run
