"""Compiled loops for NumPy groups, and for JAX groups under ``jax.jit`` (through an XLA
custom call, ``_xla.py``), when numba is installed (``optimisers[fast]``).

Only what NumPy cannot do in one call: writing one flat step into many separate
parameter arrays. The loop reads each parameter's address, computed once per group,
so a step over 2,000 small arrays is one call instead of 2,000.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import operator
import re
from typing import Any

import numpy as np

from optimisers.backends import _jit

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

        _KERNELS[dtype] = _jit.compiled(
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
# For the commonest rules, one compiled loop reads each element's parameter, gradient
# and state once and writes them once: the memory traffic of the update, nothing more.
# Each rule below mirrors its ``apply`` in rules.py operation for operation, in the
# array's dtype, so the results are bit for bit those of the plain path (tests check).
# A rule's snippet maps (rule, its state signature, dtype) to source lines that turn the
# scalar ``g`` into the rule's step, the constants those lines read, and the number of
# state arrays it uses; a chain concatenates its rules' snippets.

def _descent(r, sig, f, s, c):
    return [f"g = {c(f(r.eta))} * g"]


def _momentum(r, sig, f, s, c):
    k = s()
    return [f"v = {c(f(r.rho))} * s{k}[i] + {c(f(r.eta))} * g", f"s{k}[i] = v", "g = v"]


def _nesterov(r, sig, f, s, c):
    k = s()
    eta, rho = f(r.eta), f(r.rho)
    return [f"v = s{k}[i]", f"d = {c(-(rho * rho))} * v + {c((1 + rho) * eta)} * g",
            f"s{k}[i] = {c(rho)} * v - {c(eta)} * g", "g = d"]


def _moments(r, f, s, c):
    k, j = s(), s()
    b1, b2 = f(r.beta[0]), f(r.beta[1])
    c1, c2 = f(1 - r.beta[0]), f(1 - r.beta[1])  # before the cast, as the rules do
    return k, j, [f"m = {c(b1)} * s{k}[i] + {c(c1)} * g",
                  f"v = {c(b2)} * s{j}[i] + {c(c2)} * (g * g)",
                  f"s{k}[i] = m", f"s{j}[i] = v"]


def _eps(r, f):
    e = r.epsilon
    return f(max(e, 1e-7) if getattr(f(0), "dtype", None) == np.float16 and e else e)


def _adam(r, sig, f, s, c):
    bt = sig[2]
    k, j, lines = _moments(r, f, s, c)
    return lines + [f"g = {c(f(r.eta))} * m / {c(f(1 - bt[0]))} / "
                    f"(np.sqrt(v / {c(f(1 - bt[1]))}) + {c(_eps(r, f))})"]


def _adamw(r, sig, f, s, c):
    bt = sig[2]
    k, j, lines = _moments(r, f, s, c)
    lines.append(f"a = m / {c(f(1 - bt[0]))} / (np.sqrt(v / {c(f(1 - bt[1]))}) + "
                 f"{c(_eps(r, f))})")
    eta, lambd = c(f(r.eta)), c(f(r.lambd))
    lines.append(f"g = {eta} * (a + {lambd} * xi)" if r.couple else
                 f"g = {eta} * a + {lambd} * xi")
    return lines


def _rmsprop(r, sig, f, s, c):
    k = s()
    rho, rest = f(r.rho), f(1 - r.rho)
    lines = [f"q = {c(rho)} * s{k}[i] + {c(rest)} * (g * g)", f"s{k}[i] = q"]
    if sig[1] is None:
        return lines + [f"g = {c(f(r.eta))} * g / (np.sqrt(q) + {c(_eps(r, f))})"]
    j = s()
    return lines + [f"l = {c(rho)} * s{j}[i] + {c(rest)} * g", f"s{j}[i] = l",
                    f"g = {c(f(r.eta))} * g / (np.sqrt(q - l * l) + {c(_eps(r, f))})"]


def _lion(r, sig, f, s, c):
    k = s()
    b1, b2, c1, c2 = f(r.beta[0]), f(r.beta[1]), f(1 - r.beta[0]), f(1 - r.beta[1])
    return [f"m = s{k}[i]", f"d = {c(f(r.eta))} * np.sign({c(b1)} * m + {c(c1)} * g)",
            f"s{k}[i] = {c(b2)} * m + {c(c2)} * g", "g = d"]


def _weightdecay(r, sig, f, s, c):
    return [f"g = g + {c(f(r.lambd))} * xi"]


def _signdecay(r, sig, f, s, c):
    return [f"g = g + {c(f(r.lambd))} * np.sign(xi)"]


def _clipgrad(r, sig, f, s, c):
    delta = f(r.delta)
    return [f"g = np.minimum(np.maximum(g, {c(-delta)}), {c(delta)})"]


def _chain(r, sig, f, s, c):
    lines = []
    for rule, sub in zip(r.rules, sig):
        lines += SNIPPETS[type(rule).__name__](rule, sub, f, s, c)
    return lines


SNIPPETS = {"Descent": _descent, "Momentum": _momentum, "Nesterov": _nesterov,
            "Adam": _adam, "AdamW": _adamw, "RMSProp": _rmsprop, "Lion": _lion,
            "WeightDecay": _weightdecay, "SignDecay": _signdecay, "ClipGrad": _clipgrad,
            "OptimiserChain": _chain}


def _supported(rule: Any) -> bool:
    name = type(rule).__name__
    if name == "OptimiserChain":
        return all(_supported(r) for r in rule.rules)
    return name in SNIPPETS and type(rule).__module__.startswith("optimisers.rules.")


_ONEPASS: dict[tuple, Any] = {}


def _compile(source_lines: list, nstate: int, parallel: bool, prelude: tuple = ()) -> str:
    """The source of a one-pass kernel over pieces of arrays: piece ``j`` has ``sizes[j]``
    elements at addresses ``xa[j]`` (parameter), ``ga[j]`` (gradient) and ``sa*[j]``
    (states), and reads its constants from row ``rows[j]`` of ``C`` (one row for a
    NumPy group; a row of raw hyper-parameters per Leaf for a JAX group, turned into
    constants by the ``prelude`` lines). Pieces run in parallel (``prange``) when
    ``parallel``, holding the process-wide mutex (``_jit.mutex_calls``) where there is
    one."""
    states = "".join(f", sa{k}" for k in range(nstate))
    views = "".join(f"\n        s{k} = numba.carray(as_pointer(sa{k}[j]), (n,))"
                    for k in range(nstate))
    pre = "".join(f"\n        {line}" for line in prelude)
    body = "\n".join("            " + line for line in source_lines)
    loop = "numba.prange" if parallel else "range"
    held = parallel and _jit.MUTEX
    lock, unlock = ("\n    lock()", "\n    unlock()") if held else ("", "")
    src = f'''
def kernel(xa, ga, sizes, rows, C{states}):{lock}
    for j in {loop}(sizes.size):
        n = sizes[j]
        c = C[rows[j]]{pre}
        x = numba.carray(as_pointer(xa[j]), (n,))
        gv = numba.carray(as_pointer(ga[j]), (n,)){views}
        for i in range(n):
            xi = x[i]
            g = gv[i]
{body}
            x[i] = xi - g{unlock}
'''
    return src


def build(lines: list, nstate: int, parallel: bool, dtype: Any, prelude: tuple = ()) -> Any:
    """The compiled kernel of :func:`_compile` (made once per source, and loaded from the
    disk cache where an earlier process compiled it: ``_jit.compiled``). ``ValueError``
    where ``lines`` read other state arrays than the ``nstate`` it is given."""
    if states_read(lines) != nstate:
        raise ValueError(f"a kernel given {nstate} state arrays for a rule reading "
                         f"{states_read(lines)}")
    key = (tuple(lines), tuple(prelude), nstate, parallel, np.dtype(dtype))
    if key not in _ONEPASS:
        import numba

        namespace = {"numba": numba, "np": np, "as_pointer": _pointer(dtype)}
        if parallel and _jit.MUTEX:
            namespace["lock"], namespace["unlock"] = _jit.mutex_calls()
        source = _compile(lines, nstate, parallel, prelude)
        _ONEPASS[key] = _jit.compiled(source, "kernel", namespace, nogil=True,
                                      error_model="numpy", parallel=parallel)
    return _ONEPASS[key]


def states_read(lines: list) -> int:
    """How many state arrays snippet ``lines`` read or write (``s0`` to ``s{n-1}``, each
    used): a kernel must be given exactly these."""
    used = {int(k) for k in _STATE.findall("\n".join(lines))}
    return len(used) if used == set(range(len(used))) else -1


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
    with it, and so does the XLA handler (``_xla``), at run time."""
    return _jit.compiled(_CUT, "cut", {"np": np}, nogil=True)


class _Pieces:
    """How a group's arrays are cut into a kernel's pieces: whole arrays, or (in
    parallel) ``PIECE`` elements each. ``owner[p]`` is the array of piece ``p``,
    ``offset[p]`` its first element there, ``starts`` and ``sizes`` its place in the
    flat gradient and its length."""

    def __init__(self, sizes: list, parallel: bool) -> None:
        # the same function, run by Python: compiling it costs ~0.4 s, once per process
        table = cutter().py_func(np.asarray(sizes, np.intp), PIECE if parallel else 0)
        self.owner, self.offset, self.starts, self.sizes = table

    def addresses(self, arrays: list) -> np.ndarray:
        """The address of each piece within ``arrays`` (one per array, in order)."""
        base = np.array([a.__array_interface__["data"][0] for a in arrays], dtype=np.intp)
        return base[self.owner] + self.offset * arrays[0].itemsize


def onepass(rule: Any, sig: Any, xs: list, arrays: list, cache: dict,
            scalars: Any = None) -> Any:
    """A function ``step(grads, sig)`` running the whole group's update in one compiled
    pass, or ``None`` where that is not possible (no numba, an unsupported rule, dtype
    or layout, or state arrays that do not fit their parameters: see :func:`fits`);
    then the caller takes the vectorised NumPy path.

    The kernel reads each gradient at its address. Many small gradients are first
    concatenated (one call, where reading 2,000 addresses costs more), unless they are
    the very arrays of the last step, as in a loop that writes each step's gradients
    into the same buffers: their addresses are then known already. ``scalars`` casts
    hyper-parameters before constants are computed from them (see :func:`_lines`)."""
    if "onepass" in cache:
        return cache["onepass"]
    cache["onepass"] = None
    if not _AVAILABLE or not _supported(rule) or not xs:
        return None
    dtype = xs[0].dtype
    lines = _lines(rule, sig, dtype, [])
    if not fits(xs, arrays, dtype, states_read(lines)):
        return None
    cache["onepass"] = _OnePass(rule, xs, arrays, lines, scalars)
    return cache["onepass"]


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

    def __init__(self, rule: Any, xs: list, arrays: list, lines: list, scalars: Any) -> None:
        self.rule, self.dtype, self.scalars = rule, xs[0].dtype, scalars
        self.nstate = states_read(lines)
        self.lines, self.sizes = lines, [x.size for x in xs]
        # many small arrays: concatenating the gradients (one call) beats reading addresses
        self.flat_g = len(xs) > 64 and sum(self.sizes) < 16384 * len(xs)
        self.parallel = sum(self.sizes) >= PARALLEL_FROM and not _jit.SERIAL
        self.kernel = build(lines, self.nstate, self.parallel, self.dtype)
        self.pieces = pieces = _Pieces(self.sizes, self.parallel)
        self.rows = np.zeros(pieces.sizes.size, dtype=np.intp)  # every piece: the one row
        self.xa = pieces.addresses(xs)
        self.sa = [pieces.addresses([member[k] for member in arrays])
                   for k in range(self.nstate)]
        self.flat_offsets = pieces.starts * xs[0].itemsize
        self.last: list = [None, None]  # the last step's gradient arrays; own addresses
        self.keep: tuple = (xs, arrays)  # the addresses stay valid while these live

    def __call__(self, grads: list, sig: Any) -> None:
        consts: list = []
        _lines(self.rule, sig, self.dtype, consts, self.scalars)
        c = np.array([consts], dtype=self.dtype)
        ga, keep, own = self._gradients(grads)
        kernel = self.kernel
        if self.parallel and _jit.SERIAL:  # made before a fork; the child's pool is unusable
            kernel = build(self.lines, self.nstate, False, self.dtype)
        if self.parallel and not _jit.MUTEX:  # else the kernel holds the mutex itself
            with _jit.LOCK:
                kernel(self.xa, ga, self.pieces.sizes, self.rows, c, *self.sa)
        else:
            kernel(self.xa, ga, self.pieces.sizes, self.rows, c, *self.sa)
        self.last[:] = grads, own
        self.keep = (*self.keep[:2], keep)

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


def _lines(rule: Any, sig: Any, dtype: Any, consts: list, scalars: Any = None) -> list:
    """The snippet lines of ``rule``; its constants appended to ``consts`` in order.
    Constants are computed from hyper-parameters cast by ``scalars``: by default the
    array's dtype, as the NumPy backend's ``hyper`` does; ``float`` for PyTorch, whose
    ``hyper`` keeps Python floats."""
    cast = np.dtype(dtype).type if scalars is None else scalars

    def const(value: Any) -> str:
        consts.append(value)
        return f"c[{len(consts) - 1}]"

    return _snippet(rule, sig, cast, const)


def _snippet(rule: Any, sig: Any, cast: Any, const: Any) -> list:
    """The lines of ``rule``'s snippet: hyper-parameters cast by ``cast``, constants named
    by ``const``, state arrays numbered from 0."""
    return SNIPPETS[type(rule).__name__](rule, sig, cast, itertools.count().__next__, const)



# ------------------------------------------- run-time hyper-parameters (JAX groups, _xla.py)
#
# Under ``jax.jit`` a Leaf's hyper-parameters and counters are values known only when the
# compiled program runs, one set per Leaf. The same snippets then take rules whose fields
# are :class:`Sym` objects: their arithmetic writes source instead of computing, so each
# constant becomes a line that the kernel runs once per piece, in the array's dtype,
# from that Leaf's raw values (``P0``, ``P1``, ...).

class Sym:
    """A scalar known only at run time: ``P3``, or arithmetic on such scalars and numbers.
    ``src`` is its source, with numbers written ``NUM(...)`` for :func:`render`."""

    __slots__ = ("src", "dtype")

    def __init__(self, src: str, dtype: Any) -> None:
        self.src, self.dtype = src, dtype

    def _op(self, op: str, a: Any, b: Any) -> Sym:
        return Sym(f"({_sym(a, self.dtype).src} {op} {_sym(b, self.dtype).src})", self.dtype)

    def __add__(self, o: Any) -> Sym: return self._op("+", self, o)
    def __radd__(self, o: Any) -> Sym: return self._op("+", o, self)
    def __sub__(self, o: Any) -> Sym: return self._op("-", self, o)
    def __rsub__(self, o: Any) -> Sym: return self._op("-", o, self)
    def __mul__(self, o: Any) -> Sym: return self._op("*", self, o)
    def __rmul__(self, o: Any) -> Sym: return self._op("*", o, self)
    def __truediv__(self, o: Any) -> Sym: return self._op("/", self, o)
    def __rtruediv__(self, o: Any) -> Sym: return self._op("/", o, self)
    def __neg__(self) -> Sym: return Sym(f"(-{self.src})", self.dtype)

    def __bool__(self) -> bool:
        raise TypeError("a hyper-parameter known only at run time has no truth value")


def _sym(v: Any, dtype: Any) -> Sym:
    """``v`` as a :class:`Sym`: itself, or a number written ``NUM(...)``."""
    return v if isinstance(v, Sym) else Sym(f"NUM({float(v)!r})", dtype)


def render(sym: Any, dtype: Any) -> str:
    """The source of ``sym`` computing in ``dtype`` (its raw values ``P*`` must be locals
    of that dtype)."""
    return sym.src.replace("NUM(", f"np.{np.dtype(dtype).name}(")


def symbolic(rule: Any, sig: Any, dtype: Any) -> tuple[list, list]:
    """``(prelude, lines)`` of a kernel for a rule whose fields (and ``sig``'s scalars) are
    :class:`Sym`: the prelude computes each constant from the raw values in ``dtype``."""
    prelude: list = []

    def const(value: Any) -> str:
        prelude.append(f"K{len(prelude)} = {render(value, dtype)}")
        return f"K{len(prelude) - 1}"

    return prelude, _snippet(rule, sig, lambda v: _sym(v, dtype), const)


def _bias_advance(rule: Any, sig: Any) -> Any:
    from optimisers.rules.adaptive import bias_powers

    return (sig[0], sig[1], bias_powers(sig[2], rule.beta))


ADVANCES = {"Adam": _bias_advance, "AdamW": _bias_advance}
"""How each snippet rule with non-array state moves it in a step: as its ``apply`` does
(Adam's bias corrections, by the rule module's own ``bias_powers``)."""


def advance(rule: Any, sig: Any) -> Any:
    """The state signature after one step (arrays marked as in ``sig``): only the
    non-array parts change, as the rule's own ``apply`` changes them. ``KeyError`` when
    a rule has non-array state and no entry in :data:`ADVANCES`."""
    name = type(rule).__name__
    if name == "OptimiserChain":
        return tuple(advance(r, s) for r, s in zip(rule.rules, sig))
    if name in ADVANCES:
        return ADVANCES[name](rule, sig)
    if any(isinstance(s, Sym) for s in _flat(sig)):
        raise KeyError(f"no one-pass step for the non-array state of {name}")
    return sig


def _flat(sig: Any) -> list:
    return [e for s in sig for e in _flat(s)] if isinstance(sig, tuple) else [sig]


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

        _POINTERS[dtype] = _jit.tag(as_pointer, f"pointer to {dtype.str}")
    return _POINTERS[dtype]
