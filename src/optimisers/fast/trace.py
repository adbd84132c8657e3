"""The one code generator: an elementwise rule's ``apply``, run once on symbols.

A fused kernel needs two programs: per step, the scalars the rule computes from its
hyper-parameters and its state's counters (``eta``, ``1 - b1^t``, the next ``t``);
per element, what it computes from the parameter, the gradient and the state arrays.
Rather than writing them again for each kernel, :func:`trace` runs the rule's own
``apply`` once on symbols: its numbers become :class:`Num` (a scalar known only when
a step runs) and its arrays :class:`Elem` (one element, as a kernel's loop sees it),
and the arithmetic they meet writes those two programs down. :func:`stepper` turns
the scalar program into Python for the NumPy and torch paths; the XLA custom
call renders it into its kernel (``fast/xla.py``). So a rule's maths is written once, in
``apply``, and any elementwise rule, a user's too, gets the compiled paths.

Symbols go through the backend interface like arrays do: ``backends.of(elem)`` is this
module, whose functions (``hyper``, ``assign``, ``sqrt``, ...) record instead of
computing. Whatever ``apply`` does that cannot be recorded (a Python ``if`` on a run-time
value, a function this module lacks, a new array) makes :func:`trace` return ``None``,
and that rule takes the fused path that runs ``apply`` itself.

The element program is lines of Python (the numba kernel's loop body, which
``fast/ufuncs.py`` also translates into NumPy calls): temporaries ``t0 = K0 * s0[i]``, over
the parameter ``xi``, the gradient ``g``, the state arrays ``s0[i]``, ``s1[i]`` ... and
constants ``K0``, ``K1`` ...; then the parameter's store ``x[i] = ...`` and the states'.
Scalar sources name the rule's numbers ``R0`` ..., their complements ``1 - R0`` as
``Q0`` ..., the state's scalars ``S0`` ..., a cast to the array's scalar type
``CAST(...)`` and a number ``NUM(...)``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from optimisers.backends import common, registry
from optimisers.fast.fused import ARRAY, Node
from optimisers.rules import NewValue, Rule, call

__all__ = ["Num", "Elem", "Program", "trace", "numbers", "scalars_of", "stepper",
           "filled", "step_scalars", "shape_of"]


class Untraceable(TypeError):
    """``apply`` did something :func:`trace` cannot write down."""


class Num:
    """A scalar known only when a step runs (a rule's number, a state's counter), or
    arithmetic on such scalars and numbers: ``src`` is its source.

    Example:
        >>> (Num("R0") * 2 + 1).src
        '((R0 * NUM(2)) + NUM(1))'
    """

    __slots__ = ("src",)
    __array_ufunc__ = None  # NumPy scalars defer to these operators

    def __init__(self, src: str) -> None:
        self.src = src

    def _op(self, op: str, a: Any, b: Any) -> Any:
        if isinstance(a, Elem) or isinstance(b, Elem):
            return NotImplemented
        return Num(f"({_num(a).src} {op} {_num(b).src})")

    def __add__(self, o: Any) -> Any: return self._op("+", self, o)
    def __radd__(self, o: Any) -> Any: return self._op("+", o, self)
    def __sub__(self, o: Any) -> Any: return self._op("-", self, o)
    def __rsub__(self, o: Any) -> Any: return self._op("-", o, self)
    def __mul__(self, o: Any) -> Any: return self._op("*", self, o)
    def __rmul__(self, o: Any) -> Any: return self._op("*", o, self)
    def __truediv__(self, o: Any) -> Any: return self._op("/", self, o)
    def __rtruediv__(self, o: Any) -> Any: return self._op("/", o, self)
    def __pow__(self, o: Any) -> Any: return self._op("**", self, o)
    def __rpow__(self, o: Any) -> Any: return self._op("**", o, self)
    def __neg__(self) -> Num: return Num(f"(-{self.src})")
    def __eq__(self, o: Any) -> Any: return self._op("==", self, o)  # type: ignore[override]
    def __ne__(self, o: Any) -> Any: return self._op("!=", self, o)  # type: ignore[override]
    def __lt__(self, o: Any) -> Any: return self._op("<", self, o)
    def __le__(self, o: Any) -> Any: return self._op("<=", self, o)
    def __gt__(self, o: Any) -> Any: return self._op(">", self, o)
    def __ge__(self, o: Any) -> Any: return self._op(">=", self, o)

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise Untraceable("a Python branch on a value known only when a step runs")

    __float__ = __int__ = __index__ = __bool__


def _num(v: Any) -> Num:
    if isinstance(v, Num):
        return v
    if type(v) in (bool, int, float) and math.isfinite(v):  # Python's own numbers only:
        return Num(f"NUM({v!r})")  # a NumPy scalar's type would decide the result's dtype
    raise Untraceable(f"a {type(v).__name__} in scalar arithmetic")


class _Tape:
    """What one :func:`trace` records: element operations and the constants they read."""

    __slots__ = ("ops", "consts", "read_x")

    def __init__(self) -> None:
        self.ops: list[tuple[str, tuple]] = []  # (format, operands): operand ints are ops
        self.consts: dict[str, int] = {}  # scalar source -> its K number
        self.read_x = False

    def operand(self, v: Any) -> Any:
        if isinstance(v, Elem):
            if v.ref == "xi":
                self.read_x = True
            return v.ref
        src = _num(v).src
        return f"K{self.consts.setdefault(src, len(self.consts))}"

    def op(self, fmt: str, *args: Any) -> Elem:
        self.ops.append((fmt, tuple(self.operand(a) for a in args)))
        return Elem(self, len(self.ops) - 1)


class Elem:
    """One element of an array, as a kernel's loop sees it: ``ref`` is a name (``xi``,
    ``g``, ``s0[i]``) or the number of the operation that computes it.

    Example:
        >>> tape = _Tape()
        >>> (Elem(tape, "g") * 2).ref, tape.ops
        (0, [('{0} * {1}', ('g', 'K0'))])
    """

    __slots__ = ("tape", "ref")
    __array_ufunc__ = None

    def __init__(self, tape: _Tape, ref: Any) -> None:
        self.tape, self.ref = tape, ref

    def _bin(self, op: str, a: Any, b: Any) -> Elem:
        return self.tape.op(f"{{0}} {op} {{1}}", a, b)

    def __add__(self, o: Any) -> Elem: return self._bin("+", self, o)
    def __radd__(self, o: Any) -> Elem: return self._bin("+", o, self)
    def __sub__(self, o: Any) -> Elem: return self._bin("-", self, o)
    def __rsub__(self, o: Any) -> Elem: return self._bin("-", o, self)
    def __mul__(self, o: Any) -> Elem: return self._bin("*", self, o)
    def __rmul__(self, o: Any) -> Elem: return self._bin("*", o, self)
    def __truediv__(self, o: Any) -> Elem: return self._bin("/", self, o)
    def __rtruediv__(self, o: Any) -> Elem: return self._bin("/", o, self)
    def __neg__(self) -> Elem: return self.tape.op("-{0}", self)
    def __gt__(self, o: Any) -> Elem: return self._bin(">", self, o)
    def __lt__(self, o: Any) -> Elem: return self._bin("<", self, o)
    def __ge__(self, o: Any) -> Elem: return self._bin(">=", self, o)
    def __le__(self, o: Any) -> Elem: return self._bin("<=", self, o)
    def __eq__(self, o: Any) -> Elem: return self._bin("==", self, o)  # type: ignore[override]
    def __ne__(self, o: Any) -> Elem: return self._bin("!=", self, o)  # type: ignore[override]

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise Untraceable("a Python branch on an array's values")


# ------------------------------------------------- the backend functions, on symbols

def dtype_name(x: Elem) -> str:
    """Real: kernels serve float32 and float64 arrays only."""
    return "real floating"


def hyper(x: Elem, *values: Any) -> tuple:
    """Hyper-parameters cast to the array's scalar type (``CAST``: NumPy's dtype, torch's
    Python float, as each backend's own ``hyper`` casts)."""
    return tuple(Num(f"CAST({_num(v).src})") for v in values)


def iscomplex(x: Any) -> bool:
    """False: kernels serve float32 and float64 arrays only."""
    return False


ishalf = iscomplex  # (no float16 either: the epsilon floor of common.eps never applies)


_RULE_NUMBER = re.compile(r"R(\d+)")


def complement(v: Any) -> Num:
    """``1 - v``: for a rule's own number, the complement that the step is given (``Q``:
    computed from the Python float, or packed beside a traced one), as the backends'
    ``complement`` has it; else written out."""
    v = _num(v)
    found = _RULE_NUMBER.fullmatch(v.src)
    return Num(f"Q{found.group(1)}") if found else Num(f"(NUM(1) - {v.src})")


def assign(dst: Elem, value: Any) -> Elem:
    """``dst`` now holds ``value`` (as an in-place write leaves a NumPy state array)."""
    if not isinstance(dst, Elem):
        raise Untraceable("a write into something other than a state array")
    dst.ref = _elem(dst.tape, value).ref
    return dst


def _unary(name: str) -> Any:
    def f(a: Any) -> Elem:
        if not isinstance(a, Elem):
            raise Untraceable(f"{name} of a scalar")
        return a.tape.op(f"np.{name}({{0}})", a)
    f.__name__ = name
    return f


sqrt, sign, abs = _unary("sqrt"), _unary("sign"), _unary("abs")  # noqa: A001


def _tape_of(*args: Any) -> _Tape:
    for a in args:
        if isinstance(a, Elem):
            return a.tape
    raise Untraceable("an array function of scalars only")


def maximum(a: Any, b: Any) -> Elem:
    return _tape_of(a, b).op("np.maximum({0}, {1})", a, b)


def minimum(a: Any, b: Any) -> Elem:
    return _tape_of(a, b).op("np.minimum({0}, {1})", a, b)


def clamp(g: Any, lo: Any, hi: Any) -> Elem:
    return minimum(maximum(g, lo), hi)


def where(cond: Any, a: Any, b: Any) -> Elem:
    return _tape_of(cond, a, b).op("{1} if {0} else {2}", cond, a, b)


_SELF = sys.modules[__name__]
abs2 = functools.partial(common.abs2, _SELF)  # written once for every backend: common.py
clip = functools.partial(common.clip, _SELF)
eps = functools.partial(common.eps, _SELF)

registry.register_type(Elem, "symbols", _SELF)


# ------------------------------------------------------------------ tracing a rule

class Program(NamedTuple):
    """An elementwise rule's step, written down by :func:`trace`.

    ``lines``: the element program (temporaries, then ``x[i] = ...`` where the rule
    steps, then ``s{k}[i] = ...`` for each state array it writes). ``consts``: the
    sources of ``K0``, ``K1`` ...; ``news``: the sources of the state's new scalars, put
    in place of ``NEW`` marks in ``sig`` (the state's signature after the step: arrays
    marked ``ARRAY``, other parts as they are; see :func:`stepper`). ``nrule``,
    ``nscalar``: how many numbers the rule has (``R*``, ``Q*``) and the state has
    (``S*``); ``nstate``: its arrays. ``reads_x``: whether the step reads the
    parameter. ``paths``: where in the signature each of the state's scalars ``S*`` sits
    (tuple indices)."""

    lines: tuple
    consts: tuple
    news: tuple
    sig: Any
    nrule: int
    nscalar: int
    nstate: int
    reads_x: bool
    paths: tuple


class _New:
    """Where a state's new scalar goes in :attr:`Program.sig`: ``news[k]``."""

    __slots__ = ("k",)

    def __init__(self, k: int) -> None:
        self.k = k


_TRACES: dict[tuple, Program | None] = {}


def trace(rule: Rule, sig: Any) -> Program | None:
    """The :class:`Program` of one step of ``rule`` over a state of signature ``sig``
    (see ``fused.signature``: its arrays marked ``ARRAY``), or ``None`` where ``apply``
    cannot be followed on symbols. Made once per kind of rule and signature: the
    values of numbers do not matter, only where they are.

    Example:
        >>> from optimisers import Descent
        >>> trace(Descent(0.1), None).lines
        ('t0 = K0 * g', 't0 = xi - t0', 'x[i] = t0')
    """
    try:
        key = (shape_of(rule), shape_of(sig))
        found = _TRACES.get(key, False)
    except TypeError:  # an unhashable part: no program
        return None
    if found is False:
        try:
            found = _trace(rule, sig)
        except Exception:  # noqa: BLE001 (any failure on symbols: the plain fused path)
            found = None
        _TRACES[key] = found
    return found


def _trace(rule: Rule, sig: Any) -> Program:
    tape = _Tape()
    counts = [0, 0, 0]  # rule numbers, state scalars, state arrays
    sym_rule = _symbolic(rule, lambda: Num(f"R{_bump(counts, 0)}"))
    state = _symbols(sig, lambda: Num(f"S{_bump(counts, 1)}"),
                     lambda: Elem(tape, f"s{_bump(counts, 2)}[i]"))
    loads = [f"s{k}[i]" for k in range(counts[2])]
    new, d = call(sym_rule, state, Elem(tape, "xi"), (Elem(tape, "g"),))
    arrays: list = []
    news: list = []
    after = _outputs(new, arrays, news)
    if len(arrays) != counts[2]:
        raise Untraceable("a state whose arrays are not those it was given")
    stores = [(f"s{k}[i]", a) for k, (a, old) in enumerate(zip(arrays, loads))
              if a.ref != old]
    if any(isinstance(a.ref, str) and a.ref.startswith("s") for _, a in stores):
        raise Untraceable("a state array given another's values")
    reads_x = tape.read_x
    if isinstance(d, NewValue):
        stores.insert(0, ("x[i]", _elem(tape, d.value)))
    elif d is not None:
        stores.insert(0, ("x[i]", tape.op("xi - {0}", _elem(tape, d))))
    lines = _render(tape.ops, stores)
    consts = tuple(sorted(tape.consts, key=tape.consts.__getitem__))
    return Program(lines, consts, tuple(n.src for n in news), after,
                   counts[0], counts[1], counts[2], reads_x, tuple(_paths(sig, ())))


def _bump(counts: list, k: int) -> int:
    counts[k] += 1
    return counts[k] - 1


def _elem(tape: _Tape, v: Any) -> Elem:
    return v if isinstance(v, Elem) else tape.op("{0} + {1}", 0.0, v)


def _render(ops: list, stores: list) -> tuple:
    """The element program's lines: each operation that an output needs, in order, its
    temporary named ``t*`` and the name reused once nothing reads it any more; each
    store as early as it may be, once its value is made and its array's old value read
    for the last time (a store into ``x[i]`` ends the reads of ``xi``)."""
    needed, last = _liveness(ops, stores)
    after: dict[int, list] = {}
    placed: dict[str, int] = {}
    for target, a in sorted(stores, key=lambda s: s[0] == "x[i]"):  # x's store last
        old = "xi" if target == "x[i]" else target
        readers = [n for n in needed if old in ops[n][1]]
        if target == "x[i]":  # a state given the old parameter reads it too
            readers += [placed[t] for t, b in stores if b.ref == "xi" and t in placed]
        at = placed[target] = max([a.ref if isinstance(a.ref, int) else -1, *readers])
        after.setdefault(at, []).append((target, a.ref))
    names: dict[int, str] = {}
    free: list[str] = []
    lines = [f"{t} = {ref}" for t, ref in after.get(-1, [])]
    for n, (fmt, args) in enumerate(ops):
        if n not in needed:
            continue
        shown = [names[a] if isinstance(a, int) else a for a in args]
        for a in args:
            if isinstance(a, int) and last.get(a) == n and names[a] not in free:
                free.append(names[a])
        names[n] = free.pop() if free else f"t{len(set(names.values()))}"
        lines.append(f"{names[n]} = {fmt.format(*shown)}")
        lines += [f"{t} = {names[ref] if isinstance(ref, int) else ref}"
                  for t, ref in after.get(n, [])]
    return tuple(lines)


def _liveness(ops: list, stores: list) -> tuple[set, dict]:
    """``(needed, last)``: the operations an output depends on, and for each the last
    operation that reads it (outputs live to the end)."""
    live = {a.ref for _, a in stores if isinstance(a.ref, int)}
    needed: set[int] = set()
    last: dict[int, int] = dict.fromkeys(live, len(ops))
    for n in range(len(ops) - 1, -1, -1):
        if n in live or n in needed:
            needed.add(n)
            for a in ops[n][1]:
                if isinstance(a, int):
                    needed.add(a)
                    last.setdefault(a, n)
    return needed, last


def shape_of(v: Any) -> Any:
    """What of a rule or signature a program depends on: its types and its parts that
    are not numbers (``TypeError`` for a part that cannot be told apart so).

    Example:
        >>> from optimisers import Adam
        >>> shape_of(Adam()) == shape_of(Adam(0.1, (0.5, 0.5)))
        True
    """
    if isinstance(v, Rule):
        fields = dataclasses.fields(v)
        if set(getattr(v, "__dict__", ())) - {f.name for f in fields}:
            raise TypeError(f"{type(v).__name__} keeps values beside its fields: no program")
        return (type(v), *(shape_of(getattr(v, f.name)) for f in fields))
    if isinstance(v, tuple):
        return (type(v), *map(shape_of, v))
    if _isnumber(v):
        return Num
    if v is ARRAY or v is None or isinstance(v, (str, bool)):
        return v
    raise TypeError(f"no program for a state holding a {type(v).__name__}")


def _isnumber(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float, np.integer, np.floating)):
        return True
    return registry.library(v) is not None and v.ndim == 0


def _symbolic(rule: Rule, fresh: Any) -> Rule:
    """A copy of ``rule`` with each number a fresh symbol (not checked: no
    ``__post_init__``)."""
    made = object.__new__(type(rule))  # (its fields are all it holds: see shape_of)
    for f in dataclasses.fields(rule):
        object.__setattr__(made, f.name, _symbols(getattr(rule, f.name), fresh, None))
    return made


def _symbols(v: Any, number: Any, array: Any) -> Any:
    if isinstance(v, Rule):
        return _symbolic(v, number)
    if isinstance(v, tuple):
        return tuple(_symbols(e, number, array) for e in v)
    if v is ARRAY:
        return array()
    return number() if _isnumber(v) else v


def _paths(v: Any, at: tuple) -> Iterator[tuple]:
    """The index paths of a signature's scalars, in the order :func:`scalars_of` reads
    them."""
    if isinstance(v, tuple):
        for i, e in enumerate(v):
            yield from _paths(e, (*at, i))
    elif v is not ARRAY and _isnumber(v):
        yield at


def _outputs(v: Any, arrays: list, news: list) -> Any:
    """The signature of a new state, its arrays and scalars collected."""
    if isinstance(v, Elem):
        arrays.append(v)
        return ARRAY
    if isinstance(v, tuple):
        n = len(arrays)
        parts = tuple(_outputs(e, arrays, news) for e in v)
        return Node(parts) if len(arrays) > n else parts
    if isinstance(v, Num):
        news.append(v)
        return _New(len(news) - 1)
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    raise Untraceable(f"a {type(v).__name__} in the new state")


# ------------------------------------------------------------- running the programs

def numbers(rule: Rule) -> list:
    """The rule's numbers in the order :func:`trace` names them ``R0``, ``R1`` ...

    Example:
        >>> from optimisers import Adam
        >>> numbers(Adam())
        [0.001, 0.9, 0.999, 1e-08]
    """
    out: list = []
    _collect(rule, out)
    return out


def scalars_of(sig: Any) -> list:
    """A signature's scalars in the order :func:`trace` names them ``S0``, ``S1`` ...

    Example:
        >>> scalars_of((ARRAY, ARRAY, (0.81, 0.998)))
        [0.81, 0.998]
    """
    out: list = []
    _collect(sig, out)
    return out


def _collect(v: Any, out: list) -> None:
    if isinstance(v, Rule):
        for f in dataclasses.fields(v):
            _collect(getattr(v, f.name), out)
    elif isinstance(v, tuple):
        for e in v:
            _collect(e, out)
    elif _isnumber(v):
        out.append(v)


def filled(sig: Any, news: Any, arrays: Any = None) -> Any:
    """:attr:`Program.sig` with its ``NEW`` marks replaced by the values ``news``; with
    ``arrays`` (an iterator), its ``ARRAY`` marks too, giving the state itself.

    Example:
        >>> filled((ARRAY, (_New(0), _New(1))), (0.5, 0.25), iter(["m"]))
        ('m', (0.5, 0.25))
    """
    if type(sig) is _New:
        return news[sig.k]
    if sig is ARRAY and arrays is not None:
        return next(arrays)
    if isinstance(sig, tuple):
        parts = (filled(s, news, arrays) for s in sig)
        return tuple(parts) if arrays is not None else type(sig)(parts)
    return sig


def step_scalars(program: Program, cast: Any, rule_numbers: list, sig: Any) -> tuple:
    """``(consts, sig after)``: a step's constants (``K0`` ...) and the state's signature
    after it, by :func:`stepper`.

    Example:
        >>> from optimisers import Adam
        >>> sig = (ARRAY, ARRAY, 1.0)
        >>> step_scalars(trace(Adam(), sig), float, numbers(Adam()), sig)[1][2]
        2.0
    """
    return stepper(program, cast)(rule_numbers, sig)


_STEPPERS: dict[tuple, Any] = {}


def stepper(program: Program, cast: Any) -> Any:
    """``f(R, sig) -> (consts, sig after)``: the scalar program of ``program`` as one
    Python function of the rule's numbers ``R`` (:func:`numbers`) and the state's
    signature before the step, ``CAST`` being ``cast`` (``np.float32`` for a NumPy group
    of float32 arrays, ``float`` for torch): what a fused step runs in Python, once per
    group.

    Example:
        >>> from optimisers import Adam
        >>> sig = (ARRAY, ARRAY, 1.0)
        >>> consts, after = stepper(trace(Adam(), sig), np.float32)(numbers(Adam()), sig)
        >>> after[2], consts[0]
        (2.0, np.float32(0.9))
    """
    key = (program, cast)
    if key not in _STEPPERS:
        statics: list = []
        every = " ".join((*program.consts, *program.news))
        body = [f"    R{k} = R[{k}]" for k in range(program.nrule)]
        body += [f"    Q{k} = 1 - R{k}" for k in range(program.nrule) if f"Q{k}" in every]
        body += [f"    S{k} = sig" + "".join(f"[{i}]" for i in path)
                 for k, path in enumerate(program.paths)]
        consts = "".join(f"{c}, " for c in program.consts)
        after = _literal(program.sig, program.news, statics)
        body.append(f"    return ({consts}), {after}")
        source = ("def step(R, sig):\n" + "\n".join(body) + "\n").replace("NUM(", "(")
        namespace = {"CAST": cast, "A": ARRAY, "N": Node, "V": statics}
        exec(compile(source, "<optimisers scalar program>", "exec"), namespace)  # noqa: S102
        _STEPPERS[key] = namespace["step"]
    return _STEPPERS[key]


def _literal(sig: Any, news: tuple, statics: list) -> str:
    """Source building ``sig`` with its ``NEW`` marks computed (see :func:`stepper`)."""
    if type(sig) is _New:
        return news[sig.k]
    if sig is ARRAY:
        return "A"
    if isinstance(sig, tuple):
        parts = "".join(_literal(s, news, statics) + ", " for s in sig)
        return f"N(({parts}))" if type(sig) is Node else f"({parts})"
    if sig is None or isinstance(sig, bool):
        return repr(sig)
    statics.append(sig)
    return f"V[{len(statics) - 1}]"
