"""One-pass group steps in pure NumPy, for groups of large arrays when numba is absent.

A rule's element program (``fast/trace.py``: one line per scalar operation of the
rule's ``apply``) is translated once into a short function of NumPy ufunc calls writing
into preallocated buffers (``out=``). It runs over cache-sized pieces of the group's arrays,
on all cores (NumPy lets go of the GIL inside each call): the same operations in the
same dtype as the plain path, so the same bits, without the plain path's temporaries,
and with each piece read from memory once.
"""

from __future__ import annotations

import ast
import concurrent.futures
import os
from typing import Any

import numpy as np

from optimisers.fast import kernels, trace

PIECE = 1 << 18
"""Elements per piece: one piece per thread at a time, its buffers in cache."""

LARGE = 1 << 14
"""Groups whose arrays average fewer elements take the concatenating path instead."""

THREADS = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1, 8)
"""Threads stepping pieces (see :func:`parallel`)."""

_POOL: list = []
if hasattr(os, "register_at_fork"):  # a forked child has none of the pool's threads
    os.register_at_fork(after_in_child=_POOL.clear)
_BINARY = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply", ast.Div: "true_divide"}
_CALLS = ("sqrt", "sign", "minimum", "maximum", "abs")
_PROGRAMS: dict[tuple, Any] = {}


def parallel(fn: Any, items: list) -> list:
    """``[fn(part) for part in parts]``: ``items`` cut into one contiguous part per thread,
    the parts run at once (one part, here, when there are few items)."""
    if THREADS < 2 or len(items) < 2 * THREADS:
        return [fn(items)]
    if not _POOL:
        _POOL.append(concurrent.futures.ThreadPoolExecutor(THREADS, "optimisers"))
    cut = -(-len(items) // THREADS)
    runs = [_POOL[0].submit(fn, items[i:i + cut]) for i in range(0, len(items), cut)]
    return [run.result() for run in runs]


class _Translation:
    """Element program lines as NumPy calls over slots ``s[k]``: ``s[0]`` the parameter,
    ``s[1]`` the gradient, ``s[2 ...]`` the states, then scratch buffers; ``c[k]`` the
    rule's constants (``K{k}`` in the lines). Scratch buffers are reused as soon as no
    name holds them, and a value
    that is only computed to be stored is computed straight into its state."""

    def __init__(self, lines: list, nstate: int) -> None:
        self.first = 2 + nstate  # the first scratch slot
        self.nslots = self.first
        self.free: list[int] = []
        self.steps: list[list] = []  # [function name, operands, out]
        self.names: dict[str, Any] = {"xi": 0, "g": 1}
        for line in lines:
            (target,), value = _parse(line)
            if isinstance(target, ast.Subscript):  # s{k}[i] = ... or x[i] = ...
                name = target.value.id
                self._store(0 if name == "x" else 2 + int(name[1:]), self._eval(value))
                continue
            slot = self._eval(value)
            if 2 <= slot < self.first:  # a name for a state's old value: a copy of it,
                slot = self._op("copyto", [slot])  # as the state may be written next
            old = self.names.get(target.id)
            self.names[target.id] = slot
            self._release(old)

    def source(self) -> str:
        body = []
        for fn, operands, out in self.steps:
            args = ", ".join(f"c[{a[1]}]" if type(a) is tuple else f"s[{a}]"
                             for a in operands)
            body.append(f"    copyto(s[{out}], {args})" if fn == "copyto"
                        else f"    {fn}({args}, out=s[{out}])")
        return "def piece(s, c):\n" + "\n".join(body) + "\n"

    def _release(self, slot: Any) -> None:
        if (type(slot) is int and slot >= self.first and slot not in self.free
                and slot not in self.names.values()):
            self.free.append(slot)

    def _op(self, fn: str, operands: list) -> int:
        for a in operands:  # an operand's buffer may take the result (elementwise)
            self._release(a)
        if self.free:
            out = self.free.pop()
        else:
            out, self.nslots = self.nslots, self.nslots + 1
        self.steps.append([fn, operands, out])
        return out

    def _eval(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Name):  # a constant K{k}, or a name
            return ("c", int(node.id[1:])) if node.id[0] == "K" else self.names[node.id]
        if isinstance(node, ast.Subscript):  # s{k}[i]
            return 2 + int(node.value.id[1:])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return self._op("negative", [self._eval(node.operand)])
        if isinstance(node, ast.BinOp):
            return self._op(_BINARY[type(node.op)],
                            [self._eval(node.left), self._eval(node.right)])
        if isinstance(node, ast.Call) and node.func.attr in _CALLS:
            return self._op(node.func.attr, [self._eval(a) for a in node.args])
        raise ValueError(f"no NumPy translation for {ast.unparse(node)}")

    def _store(self, slot: int, src: Any) -> None:
        """``s[slot] = s[src]``: by making the step that computed ``src`` write into
        ``slot`` when nothing after that step reads ``slot``; else by a copy."""
        made = next((i for i in range(len(self.steps) - 1, -1, -1)
                     if self.steps[i][2] == src), None) if type(src) is int else None
        if (made is not None and src >= self.first
                and all(slot not in step[1] for step in self.steps[made + 1:])):
            self.steps[made][2] = slot
            for step in self.steps[made + 1:]:  # read since: held by a name till now
                step[1] = [slot if a == src else a for a in step[1]]
            for name, held in self.names.items():
                if held == src:
                    self.names[name] = slot
            self._release(src)
            return
        self.steps.append(["copyto", [src], slot])


def _parse(line: str) -> tuple[list, ast.expr]:
    node = ast.parse(line).body[0]
    assert isinstance(node, ast.Assign)
    return node.targets, node.value


def _program(lines: tuple, nstate: int) -> tuple[Any, int] | None:
    """``(piece, nscratch)``: the NumPy function of a rule's element program, compiled
    once per distinct lines; ``None`` for lines with no NumPy translation here."""
    key = (tuple(lines), nstate)
    if key not in _PROGRAMS:
        try:
            t = _Translation(lines, nstate)
        except (ValueError, KeyError, AttributeError):
            _PROGRAMS[key] = None
            return None
        namespace = {name: getattr(np, name) for name in (
            *_BINARY.values(), *_CALLS, "negative", "copyto")}
        exec(compile(t.source(), "<optimisers NumPy program>", "exec"), namespace)
        _PROGRAMS[key] = (namespace["piece"], t.nslots - t.first)
    return _PROGRAMS[key]


def onepass(rule: Any, sig: Any, xs: list, arrays: list) -> Any:
    """A function ``step(grads, sig) -> sig after`` stepping a group of large arrays piece
    by piece in place, or ``None`` (a rule whose ``apply`` the code generator cannot
    follow, a dtype or layout not served, state arrays that do not fit their
    parameters, or mostly small arrays, which the concatenating path serves better).
    ``step`` raises ``ValueError``, before writing anything, for a gradient whose size is
    not its parameter's."""
    program = trace.trace(rule, sig) if xs else None
    if program is None:
        return None
    dtype = xs[0].dtype
    if (sum(x.size for x in xs) < LARGE * len(xs)
            or not kernels.fits(xs, arrays, dtype, program.nstate)):
        return None
    made = _program(program.lines, program.nstate)
    if made is None:
        return None
    return _Steps(rule, program, xs, arrays, *made)


class _Steps:
    """A group's piecewise NumPy step (:func:`onepass`)."""

    kind = "ufuncs"

    def __init__(self, rule: Any, program: Any, xs: list, arrays: list, piece: Any,
                 nscratch: int) -> None:
        self.rule, self.numbers = rule, trace.numbers(rule)
        self.scalars = trace.stepper(program, xs[0].dtype.type)
        self.dtype, self.piece, self.nscratch = xs[0].dtype, piece, nscratch
        self.flat = [[a.reshape(-1) for a in (x, *member)] for x, member in zip(xs, arrays)]

    def __call__(self, grads: list, sig: Any, rule: Any) -> Any:
        dtype = self.dtype
        if rule is not self.rule:  # a schedule's new values
            self.rule, self.numbers = rule, trace.numbers(rule)
        consts, after = self.scalars(self.numbers, sig)
        c = list(np.array(consts, dtype=dtype))
        if len(grads) != len(self.flat):
            raise ValueError(f"{len(grads)} gradients for a group of {len(self.flat)} "
                             f"parameters")
        work = []
        for arrays_, g in zip(self.flat, grads):
            g = np.ascontiguousarray(g, dtype=dtype).reshape(-1)
            n = g.size
            if n != arrays_[0].size:
                raise ValueError(f"a gradient of {n} elements for a parameter of "
                                 f"{arrays_[0].size}; give each parameter a gradient of "
                                 f"its own shape")
            work += [(arrays_, g, lo, min(lo + PIECE, n), c) for lo in range(0, n, PIECE)]
        parallel(self._run, work)
        return after

    def _run(self, work: list) -> None:
        scratch = [np.empty(PIECE, self.dtype) for _ in range(self.nscratch)]
        for (x, *states), g, lo, hi, c in work:
            n = hi - lo
            self.piece([x[lo:hi], g[lo:hi], *(s[lo:hi] for s in states),
                        *(b[:n] for b in scratch)], c)
