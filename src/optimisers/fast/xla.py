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
slot's ``n`` arrays, then each Leaf's numbers; its results the ``n`` new parameters, the new
state arrays, and each Leaf's new numbers. The kernel reads the operands and writes the
results: where the jitted function's caller donates an operand, its result is the
operand's memory (in place); where the caller keeps it, fresh memory (``_primitive``'s
lowering tells them apart), so that XLA copies nothing first. Under ``jax.jit`` a Leaf's
numbers travel as one array, its pack (``backends/jax.py``), and its clock: where every raw
scalar of the rule came from that pack, the call takes the pack and the clock whole, writes
the new counters into the pack and counts the clock, and the Leaf keeps the pack the call
returns (``repack``): no number is an XLA operation of its own, and a Leaf costs XLA no
kernel. Elsewhere (a schedule in a field, a counter not in the pack) the call takes the
raw scalars one by one (the rule's numbers, their complements ``1 - b`` as the pack
carries them, then the state's counters) and gives the counters back so.
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

LARGE = 1
"""Arrays of at least this many elements take the custom call, smaller ones the plain
path: every array. (Before the call took each Leaf's pack whole it paid only from 2**15
elements: slicing a Leaf's numbers out of its pack cost XLA a kernel each; see
benchmarks/README.md.)"""

PARALLEL = False
"""Whether a custom call's kernel runs on all cores (numba's ``prange``): no, each call
runs on the XLA thread that makes it. numba's OpenMP threads spin after a parallel kernel
while XLA's own threads need the cores: steps ran 1.2-17 times slower (benchmarks/README.md)."""

CALL = 8
"""Leafs per custom call at most: a group of more is stepped by several calls. XLA's
compile time grows faster than linearly with one call's operands (benchmarks/README.md)."""

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
    streams = np.empty((2 + 2 * NSTATE, npieces), np.intp)  # operands, then results
    for k in range(1 + NSTATE):
        for q in range(npieces):
            j = rows[q]
            base = numba.carray(i64(args[(k + 1 if k else 0) * n + j]),
                                (BUFFER // 8,))[BUF_DATA]
            streams[k, q] = base + offset[q] * ITEMSIZE
            base = numba.carray(i64(rets[k * n + j]), (BUFFER // 8,))[BUF_DATA]
            streams[1 + NSTATE + k, q] = base + offset[q] * ITEMSIZE
    ga = np.empty(npieces, np.intp)
    for q in range(npieces):
        ga[q] = (numba.carray(i64(args[n + rows[q]]), (BUFFER // 8,))[BUF_DATA]
                 + offset[q] * ITEMSIZE)
    P = np.empty((n, max(NRAW, 1)), np.float64)
    first = (2 + NSTATE) * n
    for j in range(n):
{read}
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
def get(buffer, i):  # element i of a float32 or float64 operand, as float64
    b = numba.carray(i64(buffer), (BUFFER // 8,))
    if (b[BUF_DTYPE] & 0xffffffff) == F32:
        return np.float64(numba.carray(f32(b[BUF_DATA]), (i + 1,))[i])
    return numba.carray(f64(b[BUF_DATA]), (i + 1,))[i]


def put(buffer, i, value):  # element i of a float32 or float64 result
    b = numba.carray(i64(buffer), (BUFFER // 8,))
    if (b[BUF_DTYPE] & 0xffffffff) == F32:
        numba.carray(f32(b[BUF_DATA]), (i + 1,))[i] = np.float32(value)
    else:
        numba.carray(f64(b[BUF_DATA]), (i + 1,))[i] = value


def copy(buffer, result):  # a float32 or float64 operand into its result, unless aliased
    b = numba.carray(i64(buffer), (BUFFER // 8,))
    r = numba.carray(i64(result), (BUFFER // 8,))
    if b[BUF_DATA] == r[BUF_DATA]:
        return
    dims = numba.carray(i64(b[BUF_DIMS]), (b[BUF_RANK],))
    n = 1
    for d in dims:
        n *= d
    if (b[BUF_DTYPE] & 0xffffffff) == F32:
        numba.carray(f32(r[BUF_DATA]), (n,))[:] = numba.carray(f32(b[BUF_DATA]), (n,))
    else:
        numba.carray(f64(r[BUF_DATA]), (n,))[:] = numba.carray(f64(b[BUF_DATA]), (n,))


def tick32(buffer, result):  # a 0-d int32 clock, one more
    b = numba.carray(i64(buffer), (BUFFER // 8,))
    r = numba.carray(i64(result), (BUFFER // 8,))
    numba.carray(i32(r[BUF_DATA]), (1,))[0] = numba.carray(i32(b[BUF_DATA]), (1,))[0] + 1


def tick64(buffer, result):  # a 0-d int64 clock, one more
    b = numba.carray(i64(buffer), (BUFFER // 8,))
    r = numba.carray(i64(result), (BUFFER // 8,))
    numba.carray(i64(r[BUF_DATA]), (1,))[0] = numba.carray(i64(b[BUF_DATA]), (1,))[0] + 1
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
    made = {name: jit.compiled(_SCALARS, name, scope, nogil=True)
            for name in ("get", "put", "copy", "tick32", "tick64")}
    return dict(pointers, numba=numba, np=np, cut=kernels.cutter(), **made, **layout)


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


def _blocks(program: Any, where: Any) -> tuple[str, str]:
    """The handler's lines reading a Leaf's raw scalars into ``P[j]``, and those writing its
    new counters: each a 0-d operand and result (``where`` is ``None``), or, where the
    call takes each Leaf's pack and clock (``where``: their places in the pack, then
    those of the counters written, then the clock's dtype), read and written at their
    places, and the clock counted."""
    news = program.news
    raws = "".join(f"        {line}\n" for line in _raws(program, np.float64, "P[j, {}]"))
    if where is None:
        read = ("        for q in range(NRAW):\n"
                "            P[j, q] = get(args[first + j * NRAW + q], 0)\n")
        return read, raws + "".join(f"        put(rets[out + j * {len(news)} + {t}], 0, "
                                    f"{_render(e, np.float64)})\n" for t, e in enumerate(news))
    places, writes, clock = where
    read = "".join(f"        P[j, {q}] = get(args[first + j], {at})\n"
                   for q, at in enumerate(places))
    copied = "        copy(args[first + j], rets[out + j])\n"  # unless in place
    return read, raws + copied + "".join(
        f"        put(rets[out + j], {at}, {_render(e, np.float64)})\n"
        for at, e in zip(writes, news)) + (
        f"        tick{8 * np.dtype(clock).itemsize}(args[first + n + j], rets[out + n + j])\n")


def _target(key: tuple, program: Any, dtype: Any, where: Any) -> str | None:
    """The name of the FFI target for one kind of group (registered once)."""
    if key in _TARGETS:
        return _TARGETS[key]
    import jax

    parallel = PARALLEL and jit.MUTEX and not jit.SERIAL  # in parallel it holds the mutex
    nstate, news = program.nstate, program.news
    prelude = _raws(program, dtype, "c[{}]") + [
        f"K{k} = {_render(c, dtype)}" for k, c in enumerate(program.consts)]
    kernel = kernels.build(program.lines, nstate, parallel, dtype, tuple(prelude), out=True)
    read, body = _blocks(program, where)
    source = _HANDLER.replace("{advance}", body.rstrip("\n") or "        pass").replace(
        "{read}", read.rstrip("\n")).replace(
        "{states}", "".join(f", streams[{k}]" for k in range(1, 2 + 2 * nstate)))
    namespace = dict(_helpers(), kernel=kernel,
                     NOUT=1 + nstate + (len(news) if where is None else 2), NSTATE=nstate,
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
            and all(hasattr(api, n) for n in ("ffi_lowering", "register_ffi_target",
                                                "pycapsule"))
            and not ffi.differences())


def _jit_traced(v: Any) -> bool:
    return type(v).__name__ == "DynamicJaxprTracer"


class _Member:
    """One Leaf's operands: its state's arrays, its raw scalars, its rule and state
    signature (the state's arrays marked ``ARRAY``), and ``found``: where its raw scalars
    sit in its pack, ``(pack, places, spec)``, when the call takes the pack whole."""

    __slots__ = ("entry", "g", "arrays", "raws", "rule", "sig", "found")

    def __init__(self, entry: Any, g: Any, arrays: list, raws: list, sig: Any, rule: Any,
                 found: Any = None) -> None:
        self.entry, self.g, self.arrays, self.raws = entry, g, arrays, raws
        self.rule, self.sig, self.found = rule, sig, found


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


def _packed(e: Any, rule: Any, sig: Any, raws: list) -> tuple | None:
    """``(pack, places, spec)`` where the call may take the Leaf's pack and clock whole:
    every raw scalar came from the one pack the jitted call took (``places``: where),
    the rule holds no schedule and counts every step on the clock, an integer. Else
    ``None``: the raw scalars are the call's operands one by one."""
    from optimisers.backends.jax import origin

    clock = e.leaf.clock
    if not raws or rule is not e.leaf.rule or not _jit_traced(clock) or (
            clock.shape != () or np.dtype(clock.dtype) not in (np.int32, np.int64)):
        return None
    found = [origin(r) for r in raws]
    if any(f is None or f[0] is not found[0][0] for f in found):
        return None
    try:
        if rule.stepped(sig) is not True:
            return None
    except Exception:  # noqa: BLE001 (a rule reading its state's arrays: not this way)
        return None
    return found[0][0], tuple(f[1] for f in found), found[0][2]


def _member(e: Any, dtype: Any) -> tuple[tuple, _Member] | None:
    """The group key and operands of one entry, or ``None`` (the plain path takes it)."""
    import jax
    import jax.numpy as jnp

    from optimisers.fast import partition

    x, g, rule = e.x, e.grads[0], at(e.leaf.rule, e.leaf.clock)
    if g is None or tuple(g.shape) != tuple(x.shape) or partition.explicit(x):
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
    found = _packed(e, rule, sig, raws)
    try:
        key = (trace.shape_of(rule), trace.shape_of(sig), np.dtype(dtype),
               None if found is None else (found[1], found[2], np.dtype(e.leaf.clock.dtype)))
    except TypeError:
        return None
    return key, _Member(e, g, arrays, raws, sig, rule, found)


def fuse(entries: list) -> tuple[list, list]:
    """Step the entries that can run as custom calls, a call per group of like Leafs,
    and advance their Leafs.

    Returns the entries left for the plain path, and ``(leaf, x)`` for each entry
    stepped: its new parameter."""
    import jax

    if not _usable() or jax.default_backend() != "cpu":
        return entries, []
    groups: dict[tuple, list] = {}
    rest = []
    for e in entries:
        x = e.x
        dtype = np.dtype(x.dtype)
        found = _member(e, dtype) if (  # (a 0-d x: its state's counters would look
            _jit_traced(x) and x.size >= LARGE and x.ndim  # like arrays of it)
            and dtype in (np.float32, np.float64)) else None
        if found is None:
            rest.append(e)
        else:
            groups.setdefault(found[0], []).append(found[1])
    done: list = []
    for key, members in groups.items():
        for i in range(0, len(members), CALL):
            part = members[i:i + CALL]
            stepped = _call(key, part)
            if stepped is None:
                rest.extend(m.entry for m in part)
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


def _places(program: Any, member: _Member) -> tuple | None:
    """Where the handler reads a Leaf's raw scalars in its pack, in the program's order
    (``R*``, ``Q*``, ``S*``; a complement sits ``spec.n`` after its number), and where it
    writes the new counters; ``None`` where a complement is not in the pack."""
    _, places, spec = member.found
    nrule = program.nrule
    qs = [places[k] for k in _complements(program)]
    if any(q >= spec.rule_n for q in qs):
        return None
    return (*places[:nrule], *(spec.n + q for q in qs), *places[nrule:]), places[nrule:]


def _call(key: tuple, members: list) -> list | None:
    """One custom call stepping ``members`` (one kind of group); ``None`` where the
    rule has no program (``fast/trace.py``)."""
    program = _program(members[0])
    dtype = key[2]
    if program is None:
        return None
    where = None
    if members[0].found is not None:
        places = _places(program, members[0])
        if places is None:
            return None
        where = (*places, key[3][2])
    try:
        name = _target((*key, program.nscalar), program, dtype, where)
    except Exception as err:  # noqa: BLE001 (an optional fast path: never fatal)
        _TARGETS[(*key, program.nscalar)] = None
        warnings.warn(f"optimisers: no XLA custom call for {type(members[0].rule).__name__}"
                      f" ({err!r}); the plain path runs", RuntimeWarning, stacklevel=2)
        return None
    if name is None:
        return None
    return (_whole if where else _one_by_one)(name, program, members, where)


def _arrays(members: list, nstate: int) -> tuple[list, list, list, list]:
    """The call's parameters, gradients and state arrays (slot by slot), as operands
    and as results."""
    import jax

    xs = [m.entry.x for m in members]
    slots = [a for k in range(nstate) for a in (m.arrays[k] for m in members)]
    results = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (*xs, *slots)]
    return [*xs, *(m.g for m in members), *slots], results, xs, slots


def _aliases(n: int, nstate: int, more: int) -> dict:
    """Parameters, state arrays and ``more`` operands per Leaf after them: in place."""
    alias = {i: i for i in range(n)}
    alias.update({(2 + k) * n + i: (1 + k) * n + i for k in range(nstate + more)
                  for i in range(n)})
    return alias


@functools.cache
def _primitive() -> Any:
    """The custom call as a JAX primitive of its own: where its lowering finds an operand
    that the jitted function takes and does not donate, its result is fresh memory (the
    kernel reads the operand and writes there); else the operand's, in place. (XLA would
    copy a kept operand first, an operation per array.)"""
    import jax
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    call = Primitive("optimisers_onepass")
    call.multiple_results = True
    call.def_abstract_eval(lambda *operands, name, results, aliases: results)

    def lowering(ctx: Any, *operands: Any, name: str, results: tuple, aliases: tuple) -> Any:
        kept = {i: r for i, r in aliases if not _kept(operands[i])}
        return jax.ffi.ffi_lowering(name, operand_output_aliases=kept)(ctx, *operands)

    mlir.register_lowering(call, lowering, platform="cpu", cacheable=False)
    return call


def _kept(value: Any) -> bool:
    """Whether an operand in MLIR is an argument of the jitted function (``main``) that
    the caller does not donate (no ``tf.aliasing_output`` nor ``jax.buffer_donor``)."""
    from jax.interpreters.mlir import ir

    arg = value.maybe_downcast() if hasattr(value, "maybe_downcast") else value
    if not isinstance(arg, ir.BlockArgument):
        return False
    owner = arg.owner.owner.operation
    if owner.name != "func.func" or ir.StringAttr(owner.attributes["sym_name"]).value != "main":
        return False
    try:
        attrs = ir.DictAttr(ir.ArrayAttr(owner.attributes["arg_attrs"])[arg.arg_number])
    except (KeyError, IndexError, ValueError):
        return True
    return not any(k in attrs for k in ("tf.aliasing_output", "jax.buffer_donor"))


def _called(name: str, results: list, aliases: dict, operands: list) -> list:
    """The custom call ``name`` on ``operands``, giving ``results`` (shape structures),
    each result in place of its operand (``aliases``) unless the operand is kept."""
    import jax

    avals = tuple(jax.core.ShapedArray(r.shape, r.dtype, weak_type=getattr(r, "weak_type", False))
                  for r in results)
    return _primitive().bind(*operands, name=name, results=avals,
                             aliases=tuple(sorted(aliases.items())))


def _one_by_one(name: str, program: Any, members: list, where: Any) -> list:
    """The call taking each Leaf's raw scalars as 0-d operands, its counters as 0-d
    results; the Leafs advanced as the plain path advances them."""
    import jax
    import jax.numpy as jnp

    from optimisers.backends.jax import complement
    from optimisers.fast import partition

    n, nstate, nrule = len(members), program.nstate, program.nrule
    qs = _complements(program)
    raws = [[jnp.asarray(r) for r in (*m.raws[:nrule], *(complement(m.raws[k]) for k in qs),
                                         *m.raws[nrule:])] for m in members]
    first = nrule + len(qs)
    operands, results, _, _ = _arrays(members, nstate)
    operands += [r for row in raws for r in row]
    results += [jax.ShapeDtypeStruct((), c.dtype, weak_type=c.weak_type)  # as the old
                for row in raws for c in row[first:]]                      # counters
    out = partition.call(_called, name, results, _aliases(n, nstate, 0), operands, n,
                         nstate)
    done, per = [], program.nscalar
    for j, m in enumerate(members):
        arrays = iter([out[(1 + k) * n + j] for k in range(nstate)])
        at_ = (1 + nstate) * n + j * per
        m.entry.leaf.advance(trace.filled(program.sig, out[at_:at_ + per], arrays))
        done.append((m.entry.leaf, out[j]))
    return done


def _whole(name: str, program: Any, members: list, where: Any) -> list:
    """The call taking each Leaf's pack and clock whole, and giving them back (in place
    where donated) with the new counters written and the clock counted: the Leaf keeps
    the pack (``repack``), so no number of it is an operation of its own under jit."""
    import jax

    from optimisers.backends import jax as backend
    from optimisers.fast import partition

    n, nstate = len(members), program.nstate
    operands, results, _, _ = _arrays(members, nstate)
    packs = [m.found[0] for m in members]
    clocks = [m.entry.leaf.clock for m in members]
    operands += [*packs, *clocks]
    results += [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
                for a in (*packs, *clocks)]
    out = partition.call(_called, name, results, _aliases(n, nstate, 2), operands, n,
                         nstate)
    done, olds = [], program.nrule
    for j, m in enumerate(members):
        arrays = [out[(1 + k) * n + j] for k in range(nstate)]
        pack, clock = out[(1 + nstate) * n + j], out[(2 + nstate) * n + j]
        leaf = m.entry.leaf
        if not backend.repack(leaf, pack, trace.filled(program.sig, m.raws[olds:],
                                                        iter(arrays)), clock):
            news = [pack[at_] for at_ in where[1]]  # the counters, read back
            leaf.state = trace.filled(program.sig, news, iter(arrays))
            leaf.clock = clock
        done.append((leaf, out[j]))
    return done
