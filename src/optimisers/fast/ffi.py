"""XLA's FFI as the custom calls of ``fast/xla.py`` read it, and the check, once per process,
that this process's XLA passes it so.

JAX's documented FFI for compiled code is the C API of ``xla/ffi/api/c_api.h`` (shipped
with jaxlib, in ``jax.ffi.include_dir()``): ``jax.ffi`` registers a handler's address and
lowers calls to it, and its typed C++ wrappers (``xla/ffi/api/ffi.h``) need a C++
compiler. Nothing at the Python level decodes a call for a handler, and a numba ``cfunc``
includes no header: the handlers read XLA's structures (the call frame, its argument and
result lists, the buffers, the metadata extension) at the word offsets of :data:`WORDS`,
taken from that header. On a JAX whose structures differ those reads would go wrong
silently, so they are trusted only where this process has shown them right:

- The header's own rule: every structure starts with its ``struct_size``, and the API's
  major version changes with any incompatible change. :data:`TESTED` names the sizes,
  codes and version the handlers were tested with, in one place.
- :func:`differences` runs, once per process and before any handler is registered, a
  probe: a tiny handler called by ``jax.jit`` on the CPU with a float32 (2, 3) array and
  a 0-d float64. It reads the call frame at :data:`WORDS`, and writes what it found (the
  structures' sizes and counts, the stage, the API version, each buffer's type, rank,
  dimensions and data) into its result, an array Python filled; Python compares that with
  :data:`TESTED` and with what it passed. The probe follows a pointer only out of a
  structure whose size it has checked, and writes only into a result buffer it has
  checked; where it cannot, the result stays as Python filled it, and that differs too.
- XLA asks each handler, when it is registered, which API version it implements (the
  metadata extension). :func:`declared`, which the probe and every handler call, answers
  only where the call frame and the metadata structures have the tested sizes; elsewhere
  it leaves the version unset and XLA refuses the registration: an error, not a guess.

Any difference, or any failure of the probe, turns the custom calls off for the process,
with one ``RuntimeWarning`` naming it: the plain path runs, with the same results.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import Any, NamedTuple

import numpy as np

from optimisers.fast import jit, kernels


class Layout(NamedTuple):
    """XLA's FFI structures as the handlers read them (``xla/ffi/api/c_api.h``): each
    one's ``struct_size``, the enumeration codes compared, and the API's major version."""

    frame: int          # XLA_FFI_CallFrame
    args: int           # XLA_FFI_Args
    rets: int           # XLA_FFI_Rets
    buffer: int         # XLA_FFI_Buffer
    extension: int      # XLA_FFI_Metadata_Extension
    metadata: int       # XLA_FFI_Metadata
    version: int        # XLA_FFI_Api_Version
    execute: int        # XLA_FFI_ExecutionStage_EXECUTE
    metadata_type: int  # XLA_FFI_Extension_Metadata
    f32: int            # XLA_FFI_DataType_F32
    f64: int            # XLA_FFI_DataType_F64
    major: int          # XLA_FFI_API_MAJOR


TESTED = Layout(frame=168, args=40, rets=40, buffer=48, extension=32, metadata=36,
                version=24, execute=3, metadata_type=1, f32=11, f64=12, major=0)
"""The layout the handlers were tested with: jax and jaxlib 0.10.2, XLA FFI API 0.3.
The API's minor version is read but not compared: by the header's rules a minor change
only adds fields, and a structure the handlers read that grew has a new size."""

TESTED_ON = "jax 0.10.2, XLA FFI API 0.3"

DECLARED = (0, 1)
"""The API version the handlers declare to XLA: the oldest that XLA accepts, whose
structures are the ones read here."""

WORDS = dict(  # where the handlers read, in 8-byte words (a 64-bit little-endian platform)
    FRAME_EXT=1, FRAME_API=2, FRAME_STAGE=4, FRAME_ARGS=5, FRAME_RETS=10,  # call frame
    LIST_COUNT=2, LIST_ITEMS=4,                       # XLA_FFI_Args, XLA_FFI_Rets
    BUF_DTYPE=2, BUF_DATA=3, BUF_RANK=4, BUF_DIMS=5,  # XLA_FFI_Buffer
    EXT_TYPE=1, EXT_METADATA=3,                       # XLA_FFI_Metadata_Extension
    META_VERSION=1, META_TRAITS=4,                    # XLA_FFI_Metadata
    API_VERSION=2, VERSION_NUMBERS=2,  # XLA_FFI_Api; XLA_FFI_Api_Version (two int32)
)

_DECLARED = '''
def declared(frame):  # whether XLA asks for the metadata (answered if the layout is tested)
    f = numba.carray(i64(frame), (2,))
    if f[FRAME_EXT] == 0:
        return False
    ext = numba.carray(i64(f[FRAME_EXT]), (EXTENSION // 8,))
    if f[0] == FRAME and ext[0] == EXTENSION and (ext[EXT_TYPE] & 0xffffffff) == METADATA:
        meta = numba.carray(i64(ext[EXT_METADATA]), (META_VERSION + 1,))
        if meta[0] == METADATA_SIZE and meta[META_VERSION] == VERSION:
            words = numba.carray(i32(ext[EXT_METADATA]), (2 * META_TRAITS + 1,))
            words[2 * (META_VERSION + VERSION_NUMBERS)] = DECLARED_MAJOR
            words[2 * (META_VERSION + VERSION_NUMBERS) + 1] = DECLARED_MINOR
            words[2 * META_TRAITS] = 0
    return True
'''

# The probe's record: what it read, in this order (float32, each an exact small number)
FIELDS = ("call frame struct_size", "stage", "args struct_size", "args count",
          "rets struct_size", "rets count", "API major version", "API minor version",
          "array buffer struct_size", "array dtype", "array rank", "array dims[0]",
          "array dims[1]", *(f"array data[{i}]" for i in range(6)),
          "0-d buffer struct_size", "0-d dtype", "0-d rank", "0-d data")

_PROBE = '''
def probe(frame):
    if declared(frame):
        return 0
    f = numba.carray(i64(frame), (FRAME // 8,))
    if f[0] != FRAME or (f[FRAME_STAGE] & 0xffffffff) != EXECUTE:
        return 0
    if f[FRAME_RETS] != RETS or f[FRAME_RETS + LIST_COUNT] != 1:
        return 0
    out = numba.carray(i64(numba.carray(i64(f[FRAME_RETS + LIST_ITEMS]), (1,))[0]),
                       (BUFFER // 8,))
    if (out[0] != BUFFER or (out[BUF_DTYPE] & 0xffffffff) != F32 or out[BUF_RANK] != 1
            or numba.carray(i64(out[BUF_DIMS]), (1,))[0] != RECORD):
        return 0  # nowhere known to write: the record stays as Python filled it
    r = numba.carray(f32(out[BUF_DATA]), (RECORD,))
    r[0], r[1] = f[0], f[FRAME_STAGE] & 0xffffffff
    r[2], r[3] = f[FRAME_ARGS], f[FRAME_ARGS + LIST_COUNT]
    r[4], r[5] = f[FRAME_RETS], f[FRAME_RETS + LIST_COUNT]
    if f[FRAME_API] != 0:
        api = numba.carray(i64(f[FRAME_API]), (API_VERSION + 1,))
        if api[0] >= 8 * (API_VERSION + 3) and api[API_VERSION] == VERSION:
            v = numba.carray(i32(f[FRAME_API]), (2 * (API_VERSION + 3),))
            r[6] = v[2 * (API_VERSION + VERSION_NUMBERS)]
            r[7] = v[2 * (API_VERSION + VERSION_NUMBERS) + 1]
    if f[FRAME_ARGS] == ARGS and f[FRAME_ARGS + LIST_COUNT] >= 2:
        items = numba.carray(i64(f[FRAME_ARGS + LIST_ITEMS]), (2,))
        read(items[0], r, 8, 2, 6)
        read(items[1], r, 19, 0, 1)
    return 0


def read(address, r, at, rank, n):  # a buffer's size, dtype, rank, dims and data, into r
    b = numba.carray(i64(address), (BUFFER // 8,))
    r[at] = b[0]
    if b[0] != BUFFER:
        return
    code = b[BUF_DTYPE] & 0xffffffff
    r[at + 1], r[at + 2] = code, b[BUF_RANK]
    if b[BUF_RANK] != rank:
        return
    dims = numba.carray(i64(b[BUF_DIMS]), (rank,))
    size = 1
    for d in range(rank):
        r[at + 3 + d] = dims[d]
        size *= dims[d]
    if size != n:
        return
    if code == F32:
        x = numba.carray(f32(b[BUF_DATA]), (n,))
        for i in range(n):
            r[at + 3 + rank + i] = x[i]
    elif code == F64:
        y = numba.carray(f64(b[BUF_DATA]), (n,))
        for i in range(n):
            r[at + 3 + rank + i] = y[i]
'''

_NAME = "optimisers_ffi_probe"
_ARRAY = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5
_SCALAR = 2.25
_HANDLERS: list = []  # the probe stays alive while XLA may call it
_LOCK = threading.Lock()


def kernel_globals() -> dict:
    """kernel_globals() -> dict: the names a handler's source reads XLA's structures with.

    :data:`WORDS`, the sizes and codes of :data:`TESTED` (``FRAME``, ``ARGS``, ``RETS``,
    ``BUFFER``, ``EXECUTE``, ``F32``, ``F64``...), and ``declared(frame)``, compiled: whether
    XLA asks for the handler's metadata (then answered where the layout is the tested one).

    >>> names = kernel_globals()
    >>> names["BUF_DATA"], names["FRAME"] == TESTED.frame
    (3, True)
    """
    return dict(_constants(), declared=_declared(_constants_key()))


def _constants() -> dict:
    t = TESTED
    return dict(WORDS, FRAME=t.frame, ARGS=t.args, RETS=t.rets, BUFFER=t.buffer,
                EXTENSION=t.extension, METADATA_SIZE=t.metadata, VERSION=t.version,
                EXECUTE=t.execute, METADATA=t.metadata_type, F32=t.f32, F64=t.f64,
                DECLARED_MAJOR=DECLARED[0], DECLARED_MINOR=DECLARED[1])


def _constants_key() -> tuple:
    return tuple(sorted(_constants().items()))


def _pointers() -> dict:
    return {name: kernels._pointer(t) for name, t in (
        ("i64", np.int64), ("i32", np.int32), ("f32", np.float32), ("f64", np.float64))}


@functools.cache
def _declared(key: tuple) -> Any:
    import numba

    return jit.compiled(_DECLARED, "declared", dict(_pointers(), numba=numba, **dict(key)),
                         nogil=True)


def differences() -> tuple[str, ...]:
    """differences() -> tuple[str, ...]: how XLA's FFI in this process differs from the
    layout the custom calls were tested with (:data:`TESTED`); empty where it does not.

    Runs the probe once per process (later calls return the first answer) on the CPU.
    Where anything differs or the probe fails, warns once (``RuntimeWarning``) that the
    plain path runs. Call it only where numba and ``jax.ffi`` are there.

    >>> differences()
    ()
    """
    with _LOCK:
        return _verdict()


@functools.cache
def _verdict() -> tuple[str, ...]:
    import jax

    try:
        found = _compare(_probe())
    except Exception as err:  # noqa: BLE001 (an optional fast path: never fatal)
        found = (f"the probe failed: {err!r}",)
    if found:
        warnings.warn(f"optimisers: XLA's FFI in this JAX ({jax.__version__}) is not the "
                      f"layout the custom calls were tested with ({TESTED_ON}): "
                      f"{'; '.join(found)}. The plain path runs.", RuntimeWarning,
                      stacklevel=2)
    return found


def _probe() -> np.ndarray:
    """The probe's record, from one call through ``jax.jit`` on the CPU."""
    import jax
    import numba

    jax.devices("cpu")  # the backend started: a registration XLA refuses raises here
    namespace = dict(_pointers(), numba=numba, np=np, RECORD=len(FIELDS), **kernel_globals())
    namespace["read"] = jit.compiled(_PROBE, "read", namespace, nogil=True)
    handler = jit.compiled(_PROBE, "probe", namespace, cfunc="intp(intp)", nogil=True)
    _HANDLERS.append(handler)
    jax.ffi.register_ffi_target(_NAME, jax.ffi.pycapsule(handler.address), platform="cpu")
    record = np.full(len(FIELDS), -1, np.float32)

    def call(array, scalar, record):
        result = jax.ShapeDtypeStruct(record.shape, record.dtype)
        return jax.ffi.ffi_call(_NAME, result, input_output_aliases={2: 0})(
            array, scalar, record)

    args = (_ARRAY, np.float64(_SCALAR), record)
    cpu = jax.local_devices(backend="cpu")[0]  # (of this process, under jax.distributed)
    with jax.enable_x64(True), jax.default_device(cpu):  # compiled and run now, in a trace too
        return np.asarray(jax.jit(call).lower(*args).compile()(*args))


def _expected() -> tuple:
    t = TESTED
    return (t.frame, t.execute, t.args, 3, t.rets, 1, t.major, None, t.buffer, t.f32,
            2, *_ARRAY.shape, *_ARRAY.ravel(), t.buffer, t.f64, 0, _SCALAR)


def _compare(record: np.ndarray) -> tuple[str, ...]:
    """What the record shows different from what was expected (``None``: not compared)."""
    if np.all(record == -1):
        return ("the probe read nothing: the call frame, its stage or its result buffer "
                "is not the tested one",)
    return tuple(f"{name} {_shown(got)} (tested {_shown(want)})"
                 for name, got, want in zip(FIELDS, record.tolist(), _expected(), strict=True)
                 if want is not None and got != want)


def _shown(value: float) -> str:
    return "unread" if value == -1 else f"{value:g}"


def _after_fork_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
