"""Compiled loops for NumPy groups, and for JAX groups under ``jax.jit`` (through an XLA
custom call, ``fast/xla.py``), when numba is installed (``optimisers[fast]``).

Only what NumPy cannot do in one call: writing one flat step into many separate
parameter arrays. The loop reads each parameter's address, computed once per group,
so a step over 2,000 small arrays is one call instead of 2,000.
"""

from __future__ import annotations

import functools
import importlib.util
import operator
import re
from typing import Any

import numpy as np

from optimisers.fast import jit, trace

_AVAILABLE = importlib.util.find_spec("numba") is not None
_KERNELS: dict[Any, Any] = {}
_POINTERS: dict[Any, Any] = {}
_STATE = re.compile(r"\bs(\d+)\[i\]")


def available() -> bool:
    """Whether numba is installed."""
    return _AVAILABLE


_SCATTER_SUB = """
def scatter_sub(addresses, sizes, d):
    start = 0
    for j in range(addresses.size):
        n = sizes[j]
        x = numba.carray(as_pointer(addresses[j]), (n,))
        for i in range(n):
            x[i] -= d[start + i]
        start += n
"""


def _kernel(dtype: np.dtype) -> Any:
    if dtype not in _KERNELS:
        import numba

        _KERNELS[dtype] = jit.compiled(
            _SCATTER_SUB, "scatter_sub", {"numba": numba, "as_pointer": _pointer(dtype)},
            nogil=True, error_model="numpy")
    return _KERNELS[dtype]


def scatter_sub(xs: list) -> Any:
    """A function ``f(d)`` doing ``x -= segment of d`` for all ``xs`` in one compiled loop,
    or ``None`` when that is not possible (no numba, or arrays not all C-contiguous,
    aligned, writable float32 or float64 arrays of one dtype). ``f`` raises
    ``ValueError`` for a ``d`` whose length is not the arrays' total size."""
    if not _AVAILABLE or not xs or not _writable(xs, xs[0].dtype):
        return None
    dtype = xs[0].dtype
    kernel = _kernel(dtype)
    addresses = np.array([x.__array_interface__["data"][0] for x in xs], dtype=np.intp)
    sizes = np.array([x.size for x in xs], dtype=np.intp)
    total = int(sizes.sum())
    keep = list(xs)  # the addresses stay valid while these arrays live

    def run(d: np.ndarray) -> None:
        if d.dtype != dtype or not d.flags.c_contiguous:
            d = np.ascontiguousarray(d, dtype=dtype)
        if d.size != total:
            raise ValueError(f"a step of {d.size} elements for a group of arrays of "
                             f"{total} in all; step each array with its own gradient")
        kernel(addresses, sizes, d)
        run.keep = keep

    return run


def _writable(arrays: list, dtype: np.dtype) -> bool:
    """Whether a kernel may read and write ``arrays`` as ``dtype`` at their addresses:
    NumPy arrays (not scalars, whose address is a temporary), all of that native
    float32 or float64 dtype, C-contiguous, aligned and writable."""
    return dtype in (np.float32, np.float64) and dtype.isnative and all(
        isinstance(a, np.ndarray) and a.dtype == dtype and a.flags.c_contiguous
        and a.flags.aligned and a.flags.writeable for a in arrays)


# ---------------------------------------------------------------- one-pass group kernels
#
# For the rules whose ``apply`` the code generator can follow (``fast/trace.py``), one
# compiled loop reads each element's parameter, gradient and state once and writes them
# once: the memory traffic of the update, nothing more. The loop's body is the rule's
# element program, the same operations in the array's dtype as ``apply`` runs, so the
# results are bit for bit those of the plain path (tests check).

_ONEPASS: dict[tuple, Any] = {}


def _compile(source_lines: list, nstate: int, parallel: bool, prelude: tuple = (),
             out: bool = False) -> str:
    """The source of a one-pass kernel over pieces of arrays: piece ``j`` has ``sizes[j]``
    elements at addresses ``xa[j]`` (parameter), ``ga[j]`` (gradient) and ``sa*[j]``
    (states), and reads its constants from row ``rows[j]`` of ``C`` (one row for a
    NumPy group; a row of raw hyper-parameters per Leaf for a JAX group, turned into
    constants by the ``prelude`` lines). Pieces run in parallel (``prange``) when
    ``parallel``, holding the process-wide mutex (``jit.mutex_calls``) where there is
    one. With ``out`` the kernel reads the parameter and states at those addresses and
    writes their new values at others (``xo``, ``so*``: the same or fresh memory)."""
    states = "".join(f", sa{k}" for k in range(nstate))
    views = "".join(f"\n        s{k} = numba.carray(as_pointer(sa{k}[j]), (n,))"
                    for k in range(nstate))
    loops = _loop(source_lines, 8)
    if out:  # in place where every result is its operand's memory: LLVM vectorises
        states += ", xo" + "".join(f", so{k}" for k in range(nstate))  # only then
        views += "".join(f"\n        o{k} = numba.carray(as_pointer(so{k}[j]), (n,))"
                         for k in range(nstate))
        views += "\n        xw = numba.carray(as_pointer(xo[j]), (n,))"
        same = " and ".join(["xa[j] == xo[j]", *(f"sa{k}[j] == so{k}[j]" for k in range(nstate))])
        loops = (f"        if {same}:\n{_loop(source_lines, 12)}\n        else:\n"
                 f"{_loop(_written_to(source_lines, nstate), 12)}")
    pre = "".join(f"\n        {line}" for line in prelude)
    loop = "numba.prange" if parallel else "range"
    held = parallel and jit.MUTEX
    lock, unlock = ("\n    lock()", "\n    unlock()") if held else ("", "")
    src = f'''
def kernel(xa, ga, sizes, rows, C{states}):{lock}
    for j in {loop}(sizes.size):
        n = sizes[j]
        c = C[rows[j]]{pre}
        x = numba.carray(as_pointer(xa[j]), (n,))
        gv = numba.carray(as_pointer(ga[j]), (n,)){views}
{loops}{unlock}
'''
    return src


def _loop(lines: tuple, indent: int) -> str:
    """The loop over a piece's elements running the element program ``lines``."""
    pad = " " * indent
    return "\n".join([f"{pad}for i in range(n):", f"{pad}    xi = x[i]", f"{pad}    g = gv[i]",
                      *(f"{pad}    {line}" for line in lines)])


def _written_to(lines: tuple, nstate: int) -> list:
    """The element program storing into ``xw`` and ``o*`` (the new values' memory) where
    it stored into ``x`` and ``s*``, and copying there each array it does not store."""
    stores = {"x[i]": "xw[i]", **{f"s{k}[i]": f"o{k}[i]" for k in range(nstate)}}
    written = []
    for line in lines:
        target, _, value = line.partition(" = ")
        written.append(f"{stores[target]} = {value}" if target in stores else line)
    stored = {line.partition(" = ")[0] for line in lines}
    return written + [f"{new} = {'xi' if old == 'x[i]' else old}"
                      for old, new in stores.items() if old not in stored]


def build(lines: list, nstate: int, parallel: bool, dtype: Any, prelude: tuple = (),
          out: bool = False) -> Any:
    """The compiled kernel of :func:`_compile` (made once per source, and loaded from the
    disk cache where an earlier process compiled it: ``jit.compiled``). ``ValueError``
    where ``lines`` read a state array beyond the ``nstate`` it is given."""
    used = max(map(int, _STATE.findall("\n".join(lines))), default=-1) + 1
    if used > nstate:
        raise ValueError(f"a kernel given {nstate} state arrays for a rule reading {used}")
    key = (tuple(lines), tuple(prelude), nstate, parallel, np.dtype(dtype), out)
    if key not in _ONEPASS:
        import numba

        namespace = {"numba": numba, "np": np, "as_pointer": _pointer(dtype)}
        if parallel and jit.MUTEX:
            namespace["lock"], namespace["unlock"] = jit.mutex_calls()
        source = _compile(lines, nstate, parallel, prelude, out)
        _ONEPASS[key] = jit.compiled(source, "kernel", namespace, nogil=True,
                                      error_model="numpy", parallel=parallel)
    return _ONEPASS[key]


PARALLEL_FROM = 1 << 18
"""Groups of at least this many elements run their one-pass kernel on all cores, split
into pieces of ``PIECE`` elements; smaller ones on one (starting threads costs more)."""
PIECE = 1 << 18


_CUT = """
def cut(sizes, step):
    n = 0
    for size in sizes:
        n += max(1, (size + step - 1) // step) if step else 1
    table = np.empty((4, n), np.intp)
    p = start = 0
    for j in range(sizes.size):
        width = step if step else max(sizes[j], 1)
        lo = 0
        while True:
            table[0, p], table[1, p], table[2, p] = j, lo, start + lo
            table[3, p] = min(width, sizes[j] - lo)
            p += 1
            lo += width
            if lo >= sizes[j]:
                break
        start += sizes[j]
    return table
"""


@functools.cache
def cutter() -> Any:
    """``cut(sizes, step)``, compiled: arrays of ``sizes`` elements cut into a kernel's
    pieces of ``step`` elements (``step`` 0: each array whole, one piece even when empty).
    Returns a ``(4, pieces)`` table: each piece's array, its first element there, its
    first element in the arrays' concatenation, and its length. :class:`_Pieces` cuts
    with it, and so does the XLA handler (``xla``), at run time."""
    return jit.compiled(_CUT, "cut", {"np": np}, nogil=True)


class _Pieces:
    """How a group's arrays are cut into a kernel's pieces: whole arrays, or (in
    parallel) ``PIECE`` elements each. ``owner[p]`` is the array of piece ``p``,
    ``offset[p]`` its first element there, ``starts`` and ``sizes`` its place in the
    flat gradient and its length."""

    def __init__(self, sizes: list, parallel: bool) -> None:
        # the same function, run by Python: compiling it would cost more, once per process
        table = cutter().py_func(np.asarray(sizes, np.intp), PIECE if parallel else 0)
        self.owner, self.offset, self.starts, self.sizes = table

    def addresses(self, arrays: list) -> np.ndarray:
        """The address of each piece within ``arrays`` (one per array, in order)."""
        base = np.array([a.__array_interface__["data"][0] for a in arrays], dtype=np.intp)
        return base[self.owner] + self.offset * arrays[0].itemsize


def onepass(rule: Any, sig: Any, xs: list, arrays: list, scalars: Any = None) -> Any:
    """A function ``step(grads, sig, rule) -> sig after`` running the whole group's update
    in one compiled pass (given a rule of ``rule``'s structure: its numbers may change),
    or ``None`` where that is not possible (no numba, a rule whose
    ``apply`` the code generator cannot follow, a dtype or layout the kernel cannot
    take, or state arrays that do not fit their parameters: see :func:`fits`); then the
    caller takes the vectorised NumPy path.

    The kernel reads each gradient at its address. Many small gradients are first
    concatenated (one call, where reading 2,000 addresses costs more), unless they are
    the very arrays of the last step, as in a loop that writes each step's gradients
    into the same buffers: their addresses are then known already. ``scalars`` is the
    scalar type hyper-parameters are cast to before constants are computed from them:
    by default the array's dtype, as the NumPy backend's ``hyper`` does; ``float`` for
    PyTorch, whose ``hyper`` keeps Python floats."""
    if not _AVAILABLE or not xs:
        return None
    program = trace.trace(rule, sig)
    dtype = xs[0].dtype
    if program is None or not fits(xs, arrays, dtype, program.nstate):
        return None
    cast = np.dtype(dtype).type if scalars is None else scalars
    return _OnePass(rule, program, xs, arrays, cast)


def constants(program: Any) -> tuple:
    """The kernel's prelude naming a step's constants: ``K0 = c[0]`` ..."""
    return tuple(f"K{k} = c[{k}]" for k in range(len(program.consts)))


def fits(xs: list, arrays: list, dtype: Any, nstate: int) -> bool:
    """Whether a kernel reading ``nstate`` state arrays may run on parameters ``xs`` with
    states ``arrays`` (one list per parameter) at their addresses: every array is one the
    kernel may write as ``dtype`` (:func:`_writable`), each parameter has exactly
    ``nstate`` state arrays, and each of those has its parameter's size. A kernel indexes
    every array by its parameter's size, so nothing else may reach it."""
    return (nstate >= 0 and len(arrays) == len(xs)
            and all(len(member) == nstate for member in arrays)
            and _writable([*xs, *(a for member in arrays for a in member)], np.dtype(dtype))
            and all(a.size == x.size for x, member in zip(xs, arrays) for a in member))


_SIZE = operator.attrgetter("size")


class _OnePass:
    """A group's one-pass step (:func:`onepass`): the kernel, the addresses of the
    group's parameters and states, and the last step's gradient arrays and addresses."""

    kind = "numba"

    def __init__(self, rule: Any, program: Any, xs: list, arrays: list, cast: Any) -> None:
        self.program, self.cast, self.dtype = program, cast, xs[0].dtype
        self.rule, self.numbers = rule, trace.numbers(rule)
        self.scalars = trace.stepper(program, cast)
        self.nstate, self.prelude = program.nstate, constants(program)
        self.lines, self.sizes = program.lines, [x.size for x in xs]
        # many small arrays: concatenating the gradients (one call) beats reading addresses
        self.flat_g = len(xs) > 64 and sum(self.sizes) < 16384 * len(xs)
        self.parallel = sum(self.sizes) >= PARALLEL_FROM and not jit.SERIAL
        self.kernel = build(self.lines, self.nstate, self.parallel, self.dtype, self.prelude)
        self.pieces = pieces = _Pieces(self.sizes, self.parallel)
        self.rows = np.zeros(pieces.sizes.size, dtype=np.intp)  # every piece: the one row
        self.xa = pieces.addresses(xs)
        self.sa = [pieces.addresses([member[k] for member in arrays])
                   for k in range(self.nstate)]
        self.flat_offsets = pieces.starts * xs[0].itemsize
        self.last: list = [None, None]  # the last step's gradient arrays; own addresses
        self.keep: tuple = (xs, arrays)  # the addresses stay valid while these live

    def __call__(self, grads: list, sig: Any, rule: Any) -> Any:
        if rule is not self.rule:  # a schedule's new values
            self.rule, self.numbers = rule, trace.numbers(rule)
        consts, after = self.scalars(self.numbers, sig)
        c = np.array([consts], dtype=self.dtype)
        ga, keep, own = self._gradients(grads)
        kernel = self.kernel
        if self.parallel and jit.SERIAL:  # made before a fork; the child's pool is unusable
            kernel = build(self.lines, self.nstate, False, self.dtype, self.prelude)
        if self.parallel and not jit.MUTEX:  # else the kernel holds the mutex itself
            with jit.LOCK:
                kernel(self.xa, ga, self.pieces.sizes, self.rows, c, *self.sa)
        else:
            kernel(self.xa, ga, self.pieces.sizes, self.rows, c, *self.sa)
        self.last[:] = grads, own
        self.keep = (*self.keep[:2], keep)
        return after

    def _gradients(self, grads: list) -> tuple:
        """``(addresses, arrays, own)``: each piece's gradient address, the arrays that
        hold that memory, and the addresses to reuse if the same arrays come next step.
        ``ValueError`` for a gradient whose size is not its parameter's."""
        seen, own = self.last  # the last step's gradient arrays, and their own addresses
        same = seen is not None and len(seen) == len(grads) and all(
            map(operator.is_, grads, seen))
        if same and own is not None:  # the same (checked, held) buffers as last step
            return own, grads, own
        if list(map(_SIZE, grads)) != self.sizes:
            raise ValueError(f"gradients of sizes {list(map(_SIZE, grads))} for parameters "
                             f"of sizes {self.sizes}; give each parameter a gradient of "
                             f"its own shape")
        dtype = self.dtype
        if self.flat_g and not same:
            keep = np.concatenate(grads, axis=None).astype(dtype, copy=False)
            return keep.__array_interface__["data"][0] + self.flat_offsets, keep, None
        if all(type(g) is np.ndarray and g.dtype == dtype and g.flags.c_contiguous
               for g in grads):
            own = self.pieces.addresses(grads)
            return own, grads, own
        # only an ndarray's own memory has a lasting address (not a NumPy scalar's)
        keep = [np.ascontiguousarray(g, dtype=dtype) for g in grads]
        return self.pieces.addresses(keep), keep, None


def _pointer(dtype: Any) -> Any:
    """A numba intrinsic reading an address (an ``intp``) as a pointer to ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype not in _POINTERS:
        import numba
        from numba import types
        from numba.extending import intrinsic

        pointer = types.CPointer(numba.from_dtype(dtype))

        @intrinsic
        def as_pointer(typingctx, address):
            def codegen(context, builder, signature, args):
                return builder.inttoptr(args[0], context.get_value_type(pointer))
            return pointer(types.intp), codegen

        _POINTERS[dtype] = jit.tag(as_pointer, f"pointer to {dtype.str}")
    return _POINTERS[dtype]
