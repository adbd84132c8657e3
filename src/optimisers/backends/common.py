"""What every backend computes alike, written once over its primitives: each function takes
the backend module first, and a backend binds them to itself (``abs2 =
functools.partial(common.abs2, <its module>)``), so rules call ``xp.abs2(g)``. NumPy and
PyTorch write ``abs2`` and ``eps`` themselves (each step calls them: a step stays in the
backend's file). :func:`mapstate` walks a state's items, for every backend alike."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from optimisers.backends.registry import istraced

__all__ = ["FLOAT16_EPS", "abs2", "clip", "norm", "eps", "mapstate", "Coding", "coding",
           "ignoring_out"]

FLOAT16_EPS = 1e-7
"""The smallest non-zero epsilon in float16 (Adam's 1e-8 would round to zero there)."""


def abs2(xp: Any, g: Any) -> Any:
    """abs2(xp, g) -> ``|g|^2``, real for a complex ``g`` (``g * conj(g)``'s real part)."""
    return (g * g.conj()).real if xp.iscomplex(g) else g * g


def clip(xp: Any, g: Any, lo: Any, hi: Any) -> Any:
    """clip(xp, g, lo, hi) -> ``g`` clamped to ``[lo, hi]``, complex parts each."""
    if xp.iscomplex(g):
        return xp.complex_from(xp.clamp(g.real, lo, hi), xp.clamp(g.imag, lo, hi))
    return xp.clamp(g, lo, hi)


def norm(xp: Any, g: Any, p: float) -> Any:
    """norm(xp, g, p) -> the ``p``-norm of all of ``g``, a 0-d array of its real dtype
    (``p = 0``: the number of non-zeros; ``inf``: the largest ``|g|``, 0 for none)."""
    a = xp.abs(g)
    if p == 0:
        return xp.count_nonzero(g, a)
    if p == math.inf:
        return xp.amax(a)
    if p == -math.inf:
        return xp.amin(a)
    (p,) = xp.hyper(a, p)
    return (a**p).sum() ** (1 / p)


def eps(xp: Any, x: Any, e: Any) -> Any:
    """eps(xp, x, e) -> ``e`` as a hyper-parameter of ``x``, floored at :data:`FLOAT16_EPS`
    for a float16 ``x``."""
    if xp.ishalf(x):
        e = floored(xp, e)
    (e,) = xp.hyper(x, e)
    return e


def floored(xp: Any, e: Any) -> Any:
    """floored(xp, e) -> a non-zero ``e`` at least :data:`FLOAT16_EPS` (by ``where`` when
    traced): a float16 array's epsilon.

    Example:
        >>> from optimisers.backends import numpy as xp
        >>> floored(xp, 1e-8), floored(xp, 0.0), floored(xp, 0.1)
        (1e-07, 0.0, 0.1)
    """
    if istraced(e):
        return xp.where(e != 0, xp.maximum(e, FLOAT16_EPS), e)
    return max(e, FLOAT16_EPS) if e else e


def mapstate(f: Callable[[Any, str], Any], x: Any, key: str = "") -> Any:
    """mapstate(f, x, key="") -> the state ``x`` rebuilt, ``f(item, its dotted key)`` for each item.

    Example:
        >>> mapstate(lambda v, k: f"{k}={v}", ([1, 2], {"m": 3}), "state")
        (['state.0.0=1', 'state.0.1=2'], {'m': 'state.1.m=3'})
    """
    if isinstance(x, dict):
        return {k: mapstate(f, v, f"{key}.{k}") for k, v in x.items()}
    if not isinstance(x, (tuple, list)):
        return f(x, key)
    items = [mapstate(f, v, f"{key}.{i}") for i, v in enumerate(x)]
    return type(x)._make(items) if hasattr(type(x), "_make") else type(x)(items)


class Coding(NamedTuple):
    """How a backend finds each number's nearest value of a sorted code by elementwise
    steps (no search): ``nearest = table[top 16 bits of x] + (x > mids[that])``."""

    code: np.ndarray  # the code's values, float32
    mids: np.ndarray  # the midpoints between neighbours, then inf (float32)
    table: np.ndarray  # per top 16 bits of a float32: the midpoints below all its values


@functools.cache
def coding(code: tuple) -> Coding:
    """coding(code) -> the :class:`Coding` of a sorted code whose neighbours lie further
    apart than one step of bfloat16 (so each 16-bit bucket of float32 holds one midpoint
    at most, checked).

    Example:
        >>> c = coding((-1.0, 0.0, 0.5, 1.0))
        >>> x = np.array([-0.7, 0.2, 0.3, 0.9], np.float32)
        >>> top = (x.view(np.uint32) >> 16).astype(np.int64)
        >>> (c.table[top] + (x > c.mids[c.table[top]])).tolist()
        [0, 1, 2, 3]
    """
    values = np.array(code, np.float32)
    mids = np.append((values[1:] + values[:-1]) / 2, np.float32(np.inf)).astype(np.float32)
    top = np.arange(1 << 16, dtype=np.uint32) << 16
    low = np.where(top < 1 << 31, top, top | 0xFFFF).view(np.float32)  # (each bucket's least)
    high = np.where(top < 1 << 31, top | 0xFFFF, top).view(np.float32)
    with np.errstate(invalid="ignore"):
        table = np.searchsorted(mids[:-1], low, "left")
        inside = np.searchsorted(mids[:-1], high, "left") - table
    if (inside[np.isfinite(low) & np.isfinite(high)] > 1).any():
        raise ValueError("coding: two values of the code lie within one bfloat16 step")
    return Coding(values, mids, np.minimum(table, len(values) - 1).astype(np.int32))


def ignoring_out(f: Callable) -> Callable:
    """ignoring_out(f) -> ``f`` taking and ignoring ``out`` (where no array is written into).

    Example:
        >>> ignoring_out(abs)(-2, out=None)
        2
    """
    return lambda *args, out=None: f(*args)
