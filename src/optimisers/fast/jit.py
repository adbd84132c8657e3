"""How the generated numba kernels (``fast/kernels.py``, ``fast/xla.py``) are compiled and run in a
process: cached on disk, kept one at a time on the thread pool, and usable after ``fork``.

Disk cache. numba caches only functions defined in a real source file, and these kernels
are generated source. :func:`compiled` writes each source once to a file named by a hash
of everything the compiled code depends on (the source, the values of the globals it
reads, the compile options, the numba version) in :func:`cache_dir`, and compiles from
there with numba's ``cache=True``: only the first process after an install (or after a
change of any of those) compiles; the next ones load the machine code. Globals are
frozen into compiled code, so a kernel reads nothing of one process's memory layout:
the mutex below is found by symbol name when the code is loaded.

The mutex. numba's thread pool must not be entered by two threads at once, and a kernel
may be called from an XLA thread, where no Python lock can be taken: parallel kernels
hold one process-wide pthread mutex while they run (:func:`mutex_calls`).

Fork. A child inherits the mutex in the state the parent's threads left it, and a child
of a process that ran GNU OpenMP is killed by its first parallel region. So ``fork``
waits for a running kernel to finish (the child's arrays then hold whole steps), the
child starts with the mutex unlocked, and where the parent's threading layer cannot
survive ``fork`` (GNU OpenMP, numba's default where TBB is missing) the child runs the
serial kernels (:data:`SERIAL`). The threading layer stays the user's or numba's choice:
numba's fork-safe ``workqueue`` layer must not be entered by two threads at once, which
code outside this library may do.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import sys
import tempfile
import threading
import types
from typing import Any, NamedTuple

import numpy as np

ENV = "OPTIMISERS_CACHE_DIR"
"""The environment variable naming the kernel cache directory (empty: no disk cache)."""

SERIAL = False
"""Whether parallel kernels must run serially here: true in a child forked from a process
whose threading layer does not survive ``fork``."""

LOCK = threading.Lock()
"""Held around a parallel kernel where there is no pthread mutex (:data:`MUTEX` false)."""

_SYMBOLS = ("optimisers_mutex", "optimisers_mutex_lock", "optimisers_mutex_unlock")
_TAGS: dict[int, tuple[Any, str]] = {}


def cache_dir() -> str | None:
    """cache_dir() -> str | None: the directory where compiled kernels are kept.

    ``$OPTIMISERS_CACHE_DIR`` where it is set (set it empty for no disk cache), else
    ``optimisers`` in the user's cache directory (``$XDG_CACHE_HOME``, or ``~/.cache``).
    ``None`` where that directory cannot be made or written: kernels are then compiled
    in every process. Whoever can write there can change the code that runs (as with
    numba's own cache): a directory made here is private to the user.

    >>> folder = cache_dir()
    >>> folder is None or os.path.isdir(folder)
    True
    """
    path = os.environ.get(ENV)
    if path is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "optimisers")
    if not path:
        return None
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK) else None


def tag(value: Any, key: str) -> Any:
    """tag(value, key) -> value: name a kernel global for :func:`compiled`'s hash.

    A global of a kernel is frozen into its compiled code, so the hash of a cached kernel
    must tell its globals apart: numbers, strings, dtypes and modules describe themselves;
    any other object (a numba intrinsic, a compiled function) needs a tag naming what it
    does, the same in every process. :func:`compiled` tags what it returns.

    >>> f = tag(len, "builtin len")
    >>> _describe("f", f)
    'builtin len'
    """
    _TAGS[id(value)] = (value, key)
    return value


def _describe(name: str, value: Any) -> str:
    if id(value) in _TAGS:
        return _TAGS[id(value)][1]
    if isinstance(value, types.ModuleType):
        return value.__name__
    if value is None or isinstance(value, (bool, int, float, str, np.dtype)):
        return repr(value)
    raise TypeError(f"the kernel global {name!r} ({type(value).__name__}) describes nothing "
                    f"stable across processes; give it a key with tag(value, key)")


def compiled(source: str, name: str, namespace: dict, cfunc: str | None = None,
             **options: Any) -> Any:
    """compiled(source, name, namespace, cfunc=None, **options) -> dispatcher: the function
    ``name`` that ``source`` defines, reading its globals from ``namespace``, compiled by
    ``numba.njit(**options)`` (or ``numba.cfunc(cfunc, **options)``), cached on disk.

    The source is written to a file in :func:`cache_dir` named by a hash of the source,
    the globals (see :func:`tag`), the options and the numba version, and compiled from
    there with numba's ``cache=True``. Without a cache directory it compiles in memory.
    The result is tagged with its hash, so that kernels calling it hash it too.

    >>> import numpy as np
    >>> double = compiled("def double(x):\\n    return 2 * x\\n", "double", {}, nogil=True)
    >>> double(np.float64(1.5))
    3.0
    """
    import numba

    described = [f"{key}={_describe(key, value)}" for key, value in sorted(namespace.items())]
    text = "\n".join([source, *described, repr(sorted(options.items())), repr(cfunc),
                      numba.__version__, __name__])  # numba re-imports the kernel's module
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    path = _written(source, digest)
    scope = dict(namespace, __name__=__name__)  # numba rebuilds a cached kernel's module
    exec(compile(source, path or f"<optimisers kernel {digest}>", "exec"), scope)  # noqa: S102
    function = scope[name]
    scope.update(namespace)  # the given globals, over other functions the source defines
    cache = path is not None
    if options.get("parallel"):  # a cached caller of this kernel (``xla``'s handler)
        numba.get_num_threads()  # is loaded without it: it needs the thread pool started
    out = (numba.cfunc(cfunc, cache=cache, **options)(function) if cfunc
           else numba.njit(cache=cache, **options)(function))
    return tag(out, digest)


def _written(source: str, digest: str) -> str | None:
    """The path of a file holding ``source`` in the cache directory (written once, whole,
    by an atomic rename), or ``None`` where there is none."""
    folder = cache_dir()
    if folder is None:
        return None
    path = os.path.join(folder, f"kernel_{digest}.py")
    if os.path.exists(path):
        return path
    handle, scratch = tempfile.mkstemp(dir=folder, prefix=".kernel_", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(source)
        os.replace(scratch, path)
    except OSError:
        return None
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    return path


# ------------------------------------------------------------------------------ the mutex

class _Pthread(NamedTuple):
    """An initialised pthread mutex and the libc functions on it."""

    memory: Any
    init: Any
    lock: Any
    unlock: Any


def _pthread() -> _Pthread | None:
    """The process-wide mutex; ``None`` where there is no pthread library."""
    try:
        libc = ctypes.CDLL(None)
        init, lock, unlock = (libc.pthread_mutex_init, libc.pthread_mutex_lock,
                              libc.pthread_mutex_unlock)
    except (OSError, AttributeError, TypeError):
        return None
    init.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    for f in (lock, unlock):
        f.argtypes = [ctypes.c_void_p]
    for f in (init, lock, unlock):
        f.restype = ctypes.c_int
    memory = ctypes.create_string_buffer(128)  # pthread_mutex_t: 40 bytes on Linux, 64 macOS
    if init(memory, None) != 0:
        return None
    return _Pthread(memory, init, lock, unlock)


_PTHREAD = _pthread()
MUTEX = _PTHREAD is not None
"""Whether parallel kernels hold the process-wide pthread mutex (else :data:`LOCK`)."""


@functools.cache
def mutex_calls() -> tuple[Any, Any]:
    """mutex_calls() -> (lock, unlock): numba intrinsics, called without arguments in a
    kernel, that lock and unlock the process-wide mutex. Compiled code names the mutex and
    the libc functions by symbol (registered here with LLVM in each process), so that a
    kernel loaded from the disk cache finds this process's mutex.

    >>> lock, unlock = mutex_calls()
    >>> source = "def held(a):\\n    lock()\\n    a[0] += 1\\n    unlock()\\n"
    >>> held = compiled(source, "held", {"lock": lock, "unlock": unlock})
    >>> a = np.zeros(1)
    >>> held(a); held(a); float(a[0])
    2.0
    """
    import llvmlite.binding as llvm
    from llvmlite import ir
    from numba import types as nb
    from numba.core import cgutils
    from numba.extending import intrinsic

    mutex = _PTHREAD
    for symbol, address in zip(_SYMBOLS, (ctypes.addressof(mutex.memory), *(
            ctypes.cast(f, ctypes.c_void_p).value for f in (mutex.lock, mutex.unlock)))):
        llvm.add_symbol(symbol, address)

    def calling(symbol: str) -> Any:
        @intrinsic
        def call(typingctx):
            def codegen(context, builder, signature, args):
                byte = ir.IntType(8).as_pointer()
                function = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir.IntType(32), [byte]), symbol)
                mutex = builder.module.globals.get(_SYMBOLS[0])
                if mutex is None:
                    mutex = ir.GlobalVariable(builder.module, ir.IntType(8), _SYMBOLS[0])
                    mutex.linkage = "external"
                builder.call(function, [builder.bitcast(mutex, byte)])
                return context.get_dummy_value()
            return nb.none(), codegen
        return tag(call, f"call {symbol}")

    return calling(_SYMBOLS[1]), calling(_SYMBOLS[2])


# ------------------------------------------------------------------------------- fork

def _forksafe_threads() -> bool:
    """Whether this process's numba thread pool, if started, works in a forked child:
    TBB, workqueue and Intel OpenMP do; GNU OpenMP kills the child's first parallel region.
    """
    numba = sys.modules.get("numba")
    if numba is None:
        return True
    try:
        layer = numba.threading_layer()
    except ValueError:  # no pool started: the child starts its own
        return True
    omp = sys.modules.get("numba.np.ufunc.omppool")
    return layer != "omp" or getattr(omp, "openmp_vendor", "GNU") != "GNU"


def _before_fork() -> None:
    if _PTHREAD is not None:  # wait for a running kernel: the child sees whole steps
        _PTHREAD.lock(_PTHREAD.memory)


def _after_fork_in_parent() -> None:
    if _PTHREAD is not None:
        _PTHREAD.unlock(_PTHREAD.memory)


def _after_fork_in_child() -> None:
    global SERIAL, LOCK
    LOCK = threading.Lock()
    if _PTHREAD is not None:
        ctypes.memset(_PTHREAD.memory, 0, ctypes.sizeof(_PTHREAD.memory))
        _PTHREAD.init(_PTHREAD.memory, None)
    SERIAL = SERIAL or not _forksafe_threads()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
