"""JAX groups under ``jax.jit`` on the CPU: one XLA custom call per group of like Leafs.

XLA on the CPU runs a compiled kernel per array it writes, a few microseconds each,
and compiles each one: per-array work, not arithmetic, is what a step over 2,000 small
arrays costs. Here a group's whole step is one custom call (XLA's FFI) into a numba
kernel, the one-pass kernel of ``fast/kernels.py`` that the NumPy backend runs: it reads every
parameter, gradient and state array by address, writes their new values, and computes
each Leaf's constants from that Leaf's own hyper-parameters and counters, which the call
takes as run-time values. So ``adjust`` still never re-compiles, the state tree is what
the plain path makes (per-Leaf arrays and counters), and the results are the plain
path's (same operations in the same dtype; tests compare).

It applies where the code generator follows the rule's ``apply`` (``fast/trace.py``),
the arrays are float32 or float64, JAX runs on the CPU (and passes XLA's FFI structures
as tested: ``fast/ffi.py``), and the step is being traced by ``jax.jit`` alone (not
differentiated or batched: the custom call has no derivative). Anywhere else the plain
path runs, as it does without numba.

The call's operands are the ``n`` parameters, the ``n`` gradients, each state array
slot's ``n`` arrays, then each Leaf's raw scalars (the rule's numbers, their complements
``1 - b`` as the Leaf's pack carries them, then the state's counters); its results the
``n`` new parameters, the new state arrays, and each Leaf's new counters. Only large
arrays take this path (see :data:`LARGE`), updated in place where the caller donates
them (``input_output_aliases``; else XLA copies them first).
"""

from __future__ import annotations

import functools
import itertools
import warnings
from typing import Any

import numpy as np

from optimisers.fast import ffi, jit, kernels, trace
from optimisers.fast.fused import ARRAY
from optimisers.schedules import at

LARGE = 1 << 15
"""Arrays of at least this many elements take the custom call; smaller ones the plain
path. The call costs XLA about as much per operand as a small array's compiled kernel,
and each aliased result adds to the compile time, so it pays only for large arrays.
The crossover is measured in benchmarks/README.md. Large results are aliased to their
operands, since a fresh buffer of this size would be paged in again at every step."""

_TARGETS: dict[tuple, str | None] = {}  # None: a kernel that could not be built
_HANDLERS: list = []  # the compiled handlers stay alive while XLA may call them
_NAMES = itertools.count()

# XLA's FFI structures are read at the word offsets of ffi.WORDS (BUF_DATA, BUF_RANK,
# BUF_DIMS ...), trusted once ffi.differences() has found this process's XLA passing
# them as tested: _usable() is false before, and no handler is registered.
_HANDLER = '''
def run(args, rets):
    n = rets.size // NOUT
    sizes = np.empty(n, np.intp)
    for j in range(n):
        b = numba.carray(i64(args[j]), (BUFFER // 8,))
        dims = numba.carray(i64(b[BUF_DIMS]), (b[BUF_RANK],))
        s = 1
        for d in dims:
            s *= d
        sizes[j] = s
    table = cut(sizes, PIECE if PARALLEL else 0)
    rows, offset, psize = table[0], table[1], table[3]
    npieces = rows.size
    streams = np.empty((1 + NSTATE, npieces), np.intp)  # results: aliased to operands
    for k in range(1 + NSTATE):
        for q in range(npieces):
            j = rows[q]
            base = numba.carray(i64(rets[k * n + j]), (BUFFER // 8,))[BUF_DATA]
            streams[k, q] = base + offset[q] * ITEMSIZE
    ga = np.empty(npieces, np.intp)
    for q in range(npieces):
        ga[q] = (numba.carray(i64(args[n + rows[q]]), (BUFFER // 8,))[BUF_DATA]
                 + offset[q] * ITEMSIZE)
    P = np.empty((n, max(NRAW, 1)), np.float64)
    first = (2 + NSTATE) * n
    for j in range(n):
        for q in range(NRAW):
            P[j, q] = get(args[first + j * NRAW + q])
    kernel(streams[0], ga, psize, rows, P{states})
    out = (1 + NSTATE) * n
    for j in range(n):
{advance}
        pass


def handler(frame):
    if declared(frame):  # XLA asks for the handler's metadata: the FFI API version
        return 0
    f = numba.carray(i64(frame), (FRAME // 8,))
    if (f[FRAME_STAGE] & 0xffffffff) != EXECUTE:
        return 0
    run(numba.carray(i64(f[FRAME_ARGS + LIST_ITEMS]), (f[FRAME_ARGS + LIST_COUNT],)),
        numba.carray(i64(f[FRAME_RETS + LIST_ITEMS]), (f[FRAME_RETS + LIST_COUNT],)))
    return 0
'''


_SCALARS = """
def get(buffer):  # a 0-d float32 or float64 operand, as float64
    b = numba.carray(i64(buffer), (BUFFER // 8,))
    if (b[BUF_DTYPE] & 0xffffffff) == F32:
        return np.float64(numba.carray(f32(b[BUF_DATA]), (1,))[0])
    return numba.carray(f64(b[BUF_DATA]), (1,))[0]


def put(buffer, value):  # a 0-d float32 or float64 result
    b = numba.carray(i64(buffer), (BUFFER // 8,))
    if (b[BUF_DTYPE] & 0xffffffff) == F32:
        numba.carray(f32(b[BUF_DATA]), (1,))[0] = np.float32(value)
    else:
        numba.carray(f64(b[BUF_DATA]), (1,))[0] = value
"""


@functools.cache
def _helpers() -> dict:
    """The names the handler's source uses, made once (loaded from the disk cache where
    an earlier process compiled them, as the kernels are: ``jit.compiled``)."""
    import numba

    pointers = {name: kernels._pointer(t) for name, t in (
        ("i64", np.int64), ("i32", np.int32), ("f32", np.float32), ("f64", np.float64))}
    layout = ffi.kernel_globals()  # the names XLA's structures are read with
    scope = dict(pointers, numba=numba, np=np, **layout)
    get, put = (jit.compiled(_SCALARS, name, scope, nogil=True) for name in ("get", "put"))
    return dict(pointers, numba=numba, np=np, get=get, put=put, cut=kernels.cutter(),
                **layout)


def _complements(program: Any) -> list:
    """Which of the rule's numbers the program reads the complement ``1 - b`` of (``Q*``):
    only these are operands of the call."""
    used = " ".join((*program.consts, *program.news))
    return [k for k in range(program.nrule) if f"Q{k}" in used]


def _raws(program: Any, dtype: Any, source: str) -> list:
    """Lines naming a Leaf's raw scalars as the program's sources do: the rule's numbers
    ``R*``, their complements ``Q*``, the state's scalars ``S*``, each read from
    ``source`` (a format of its column) as ``dtype``."""
    nrule, t = program.nrule, np.dtype(dtype).name
    names = [*(f"R{k}" for k in range(nrule)), *(f"Q{k}" for k in _complements(program)),
             *(f"S{k}" for k in range(program.nscalar))]
    return [f"{name} = np.{t}({source.format(q)})" for q, name in enumerate(names)]


def _render(src: str, dtype: Any) -> str:
    """A scalar source computing in ``dtype`` (its raw values must be locals of it)."""
    t = f"np.{np.dtype(dtype).name}("
    return src.replace("CAST(", t).replace("NUM(", t)


def _target(key: tuple, program: Any, dtype: Any) -> str | None:
    """The name of the FFI target for one kind of group (registered once)."""
    if key in _TARGETS:
        return _TARGETS[key]
    import jax

    parallel = jit.MUTEX and not jit.SERIAL  # in parallel it holds the mutex
    nstate, news = program.nstate, program.news
    prelude = _raws(program, dtype, "c[{}]") + [
        f"K{k} = {_render(c, dtype)}" for k, c in enumerate(program.consts)]
    kernel = kernels.build(program.lines, nstate, parallel, dtype, tuple(prelude))
    body = "".join(f"        {line}\n" for line in _raws(program, np.float64, "P[j, {}]"))
    body += "".join(f"        put(rets[out + j * {len(news)} + {t}], "
                    f"{_render(e, np.float64)})\n" for t, e in enumerate(news))
    source = _HANDLER.replace("{advance}", body.rstrip("\n") or "        pass").replace(
        "{states}", "".join(f", streams[{k + 1}]" for k in range(nstate)))
    namespace = dict(_helpers(), kernel=kernel, NOUT=1 + nstate + len(news),
                     NSTATE=nstate,
                     NRAW=program.nrule + len(_complements(program)) + program.nscalar,
                     PIECE=kernels.PIECE, PARALLEL=parallel,
                     ITEMSIZE=np.dtype(dtype).itemsize)
    namespace["run"] = jit.compiled(source, "run", namespace, nogil=True,
                                     error_model="numpy")
    handler = jit.compiled(source, "handler", namespace, cfunc="intp(intp)", nogil=True)
    name = f"optimisers_onepass_{next(_NAMES)}"
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler.address), platform="cpu")
    _HANDLERS.append(handler)
    _TARGETS[key] = name
    return name


@functools.cache
def _usable() -> bool:
    """Whether numba is installed, JAX runs on the CPU and has the FFI (``jax.ffi``, JAX
    0.5 on), and XLA passes its structures as the handlers read them: checked by a probe
    once per process (``ffi.differences``; where they differ, one warning)."""
    import jax

    api = getattr(jax, "ffi", None)
    return (kernels.available() and jax.default_backend() == "cpu"
            and all(hasattr(api, n) for n in ("ffi_call", "register_ffi_target", "pycapsule"))
            and not ffi.differences())


def _jit_traced(v: Any) -> bool:
    return type(v).__name__ == "DynamicJaxprTracer"


class _Member:
    """One Leaf's operands: its state's arrays, its raw scalars, and its rule and state
    signature (the state's arrays marked ``ARRAY``)."""

    __slots__ = ("entry", "g", "arrays", "raws", "rule", "sig")

    def __init__(self, entry: Any, g: Any, arrays: list, raws: list, sig: Any, rule: Any
                 ) -> None:
        self.entry, self.g, self.arrays, self.raws = entry, g, arrays, raws
        self.rule, self.sig = rule, sig


def _signature(state: Any, x: Any, dtype: Any, arrays: list) -> Any:
    """The state with its arrays (those shaped as ``x``, of its dtype) collected into
    ``arrays`` and marked ``ARRAY``; counters and other parts as they are."""
    if isinstance(state, tuple):
        return tuple(_signature(s, x, dtype, arrays) for s in state)
    if hasattr(state, "shape") and tuple(state.shape) == tuple(x.shape) and (
            state.dtype == dtype):
        arrays.append(state)
        return ARRAY
    return state


def _member(e: Any, dtype: Any) -> tuple[tuple, _Member] | None:
    """The group key and operands of one entry, or ``None`` (the plain path takes it)."""
    import jax
    import jax.numpy as jnp

    x, g, rule = e.x, e.grads[0], at(e.leaf.rule, e.leaf.clock)
    if g is None or tuple(g.shape) != tuple(x.shape):
        return None
    arrays: list = []
    sig = _signature(e.leaf.state, x, dtype, arrays)
    numbers = trace.numbers(rule)
    raws = [*numbers, *trace.scalars_of(sig)]
    if not all(np.ndim(r) == 0 and jnp.result_type(r) in (jnp.float32, jnp.float64)
               for r in raws):
        return None
    if any(isinstance(v, jax.core.Tracer) and not _jit_traced(v) for v in (g, *arrays, *raws)):
        return None
    if g.dtype != dtype:
        g = g.astype(dtype)
    try:
        key = (trace.shape_of(rule), trace.shape_of(sig), np.dtype(dtype))
    except TypeError:
        return None
    return key, _Member(e, g, arrays, raws, sig, rule)


def fuse(entries: list) -> tuple[list, list]:
    """Step the entries that can run as custom calls, a call per group of like Leafs.

    Returns the entries left for the plain path, and ``(leaf, state, x)`` for each
    entry stepped: its new state and parameter."""
    import jax

    if not _usable() or jax.default_backend() != "cpu":
        return entries, []
    groups: dict[tuple, list] = {}
    rest = []
    for e in entries:
        x = e.x
        dtype = np.dtype(x.dtype)
        found = _member(e, dtype) if (_jit_traced(x) and x.size >= LARGE
                                       and dtype in (np.float32, np.float64)) else None
        if found is None:
            rest.append(e)
        else:
            groups.setdefault(found[0], []).append(found[1])
    done: list = []
    for key, members in groups.items():
        stepped = _call(key, members)
        if stepped is None:
            rest.extend(m.entry for m in members)
        else:
            done.extend(stepped)
    return rest, done


def _program(member: _Member) -> Any:
    """The rule's program for this kind of group, or ``None`` (no program; a counter
    made or dropped, which the call's results could not hold)."""
    program = trace.trace(member.rule, member.sig)
    if program is None or len(program.news) != program.nscalar or (
            program.nstate != len(member.arrays)):
        return None
    return program


def _call(key: tuple, members: list) -> list | None:
    """One custom call stepping ``members`` (one kind of group); ``None`` where the
    rule has no program (``fast/trace.py``)."""
    import jax
    import jax.numpy as jnp

    from optimisers.backends.jax import complement

    program = _program(members[0])
    dtype = key[-1]
    if program is None:
        return None
    try:
        name = _target(key, program, dtype)
    except Exception as err:  # noqa: BLE001 (an optional fast path: never fatal)
        _TARGETS[key] = None
        warnings.warn(f"optimisers: no XLA custom call for {type(members[0].rule).__name__}"
                      f" ({err!r}); the plain path runs", RuntimeWarning, stacklevel=2)
        return None
    if name is None:
        return None
    n, nstate, nrule = len(members), program.nstate, program.nrule
    qs = _complements(program)
    xs = [m.entry.x for m in members]
    slots = [[m.arrays[k] for m in members] for k in range(nstate)]
    raws = [[jnp.asarray(r) for r in (*m.raws[:nrule], *(complement(m.raws[k]) for k in qs),
                                         *m.raws[nrule:])] for m in members]
    first = nrule + len(qs)
    operands = [*xs, *(m.g for m in members), *(a for slot in slots for a in slot),
                *(r for row in raws for r in row)]
    results = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in xs]
    results += [jax.ShapeDtypeStruct(a.shape, a.dtype) for slot in slots for a in slot]
    results += [jax.ShapeDtypeStruct((), c.dtype, weak_type=c.weak_type)  # as the old
                for row in raws for c in row[first:]]                      # counters
    alias = {i: i for i in range(n)}  # parameters and state arrays: in place
    alias.update({(2 + k) * n + i: (1 + k) * n + i for k in range(nstate) for i in range(n)})
    out = jax.ffi.ffi_call(name, results, input_output_aliases=alias)(*operands)
    done = []
    per = program.nscalar
    for j, m in enumerate(members):
        arrays = iter([out[(1 + k) * n + j] for k in range(nstate)])
        at = (1 + nstate) * n + j * per
        state = trace.filled(program.sig, out[at:at + per], arrays)
        done.append((m.entry.leaf, state, out[j]))
    return done
