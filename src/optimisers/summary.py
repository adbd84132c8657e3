"""A state tree you can read: one line per Leaf."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from optimisers import backends
from optimisers.display import shown
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, leaves
from optimisers.telemetry import LeafStats, table
from optimisers.tree import children
from optimisers.walk import fleaves

__all__ = ["summary"]


def _arrays(x: Any) -> list:
    return [a for a in fleaves(x, exclude=lambda v: backends.library(v) is not None
                               or not children(v)) if backends.library(a) is not None]


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _paired(tree: Any, x: Any, kp: KeyPath = KeyPath()) -> Iterator[tuple[KeyPath, Leaf, Any]]:
    """Every ``(KeyPath, Leaf, array)`` beside the model, in its order (``jit`` sorts dicts)."""
    if isinstance(tree, Leaf):
        yield kp, tree, x
    elif isinstance(tree, (dict, tuple, list)):
        kids = children(x)
        keys = [k for k in kids if k in tree] if isinstance(tree, dict) else range(len(tree))
        for k in keys:
            yield from _paired(tree[k], kids[k], kp + (k,))
    elif tree is not None:
        yield from ((p, leaf, None) for p, leaf in leaves(tree, kp))  # raises: not a tree


WIDTH = 100
"""The columns a :func:`summary` keeps to (wider, its rules are written out under it)."""


def summary(tree: Any, model: Any = None, stats: Mapping | None = None) -> str:
    """summary(tree, model=None, stats=None) -> str: one line per Leaf, then totals.

    Each line gives the Leaf's paths (joined by ``=``), its rule, the parameter count
    (without ``model``, read off the largest state array, ``?`` for none), the bytes of
    its state, and ``frozen``. Where rules would make the table wider than :data:`WIDTH`,
    each line names its rule by a number, written out in full under the totals. With the
    ``stats`` of a step (``update(..., stats=True)``; ``summary(tree, stats)`` reads them
    in ``model``'s place), a second table gives each Leaf's norms, ratio, non-finite
    gradients, state RMS and scheduled values (read on the host here).

    Args:
        tree: a state tree from :func:`~optimisers.setup`.
        model: the model, for parameter counts and the model's order of paths.
        stats: what ``update(..., stats=True)`` returned.

    Returns:
        The text.

    Example:
        >>> from optimisers import Adam, AccumGrad, OptimiserChain, setup, freeze_, adjust_
        >>> w = np.zeros((3, 2), np.float32)
        >>> model = {"enc": {"w": w, "bias": np.zeros(2, np.float32)}, "dec": {"w": w}}
        >>> tree = freeze_(setup(Adam(), model), "enc.bias")
        >>> print(summary(tree, model))
        path            rule                                               params  state  frozen
        enc.w = dec.w   Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-08)       6   48 B
        enc.bias        Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-08)       2   16 B  frozen
        2 Leafs, 8 parameters, 64 B of state, 1 frozen
        >>> tree = adjust_(setup(OptimiserChain(AccumGrad(4), Adam()), model), where="*.bias",
        ...                epsilon=1e-6)
        >>> print(summary(tree, model))
        path            rule                params  state  frozen
        enc.w = dec.w   [1] OptimiserChain       6   72 B
        enc.bias        [2] OptimiserChain       2   24 B
        2 Leafs, 8 parameters, 96 B of state
        [1] OptimiserChain(AccumGrad(n=4), Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-08))
        [2] OptimiserChain(AccumGrad(n=4), Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-06))
        >>> from optimisers import Cosine, update_
        >>> model = {"w": np.array([3.0, 4.0]), "b": np.zeros(2)}
        >>> tree = setup(Adam(Cosine(0.1, 0.0, 10)), model)
        >>> grads = {"w": np.array([1.0, np.nan]), "b": np.ones(2)}
        >>> tree, model, stats = update_(tree, model, grads, stats=True)
        >>> print(summary(tree, stats))
        path   rule      params  state  frozen
        w      [1] Adam       2   32 B
        b      [1] Adam       2   32 B
        2 Leafs, 4 parameters, 64 B of state
        [1] Adam(eta=Cosine(start=0.1, end=0.0, steps=10), beta=(0.9, 0.999), epsilon=1e-08)
        <BLANKLINE>
        path  grad  update  param  ratio  nonfinite  state rms, schedules
        w      nan     nan      5    nan          1  0=nan 1=nan eta=0.1
        b     1.41   0.141      0    inf          0  0=0.1 1=0.001 eta=0.1
    """
    if stats is None and isinstance(model, Mapping) and all(  # ({}: a step of no Leaf)
            isinstance(v, LeafStats) for v in model.values()):
        model, stats = None, model
    found: dict[int, tuple[Leaf, list[KeyPath], Any]] = {}
    walk = (((kp, leaf, None) for kp, leaf in leaves(tree)) if model is None
            else _paired(tree, model))
    for kp, leaf, x in walk:
        found.setdefault(id(leaf), (leaf, [], x))[1].append(kp)
    rows, total_n, total_b, frozen = [], 0, 0, 0
    for leaf, paths, x in found.values():
        states = _arrays(leaf.state)
        nbytes = sum(backends.of(a).nbytes(a) for a in states)
        n = (backends.of(x).size(x) if model is not None
             else max((backends.of(a).size(a) for a in states), default=None))
        total_n += n or 0
        total_b += nbytes
        frozen += leaf.frozen
        rows.append((" = ".join(str(p) or "(root)" for p in paths), shown(leaf.rule),
                     "?" if n is None else str(n), _bytes(nbytes),
                     "frozen" if leaf.frozen else ""))
    lines, legend = _table(rows), []
    if max(map(len, lines)) > WIDTH:  # name each rule in the table, write it out below
        numbers: dict[str, int] = {}
        for r in rows:
            numbers.setdefault(r[1], len(numbers) + 1)
        lines = _table([(r[0], f"[{numbers[r[1]]}] {r[1].partition('(')[0]}", *r[2:])
                        for r in rows])
        legend = [line for text, k in numbers.items() for line in _wrapped(f"[{k}] {text}")]
    lines.append(f"{len(rows)} Leafs, {total_n} parameters, {_bytes(total_b)} of state"
                 f"{f', {frozen} frozen' if frozen else ''}")
    return "\n".join(lines + legend + ([""] + table(stats) if stats else []))


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """The header and one line per row, each column as wide as its widest cell."""
    head = ("path", "rule", "params", "state", "frozen")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    return ["".join([r[0].ljust(widths[0] + 3), r[1].ljust(widths[1]), r[2].rjust(widths[2] + 2),
                     r[3].rjust(widths[3] + 2), "  " + r[4]]).rstrip() for r in [head, *rows]]


def _wrapped(text: str) -> list[str]:
    """A rule's ``repr`` broken after its least nested commas that fit in :data:`WIDTH`."""
    breaks, depth = [], 0  # (where the next line starts, how deep in brackets)
    for i, c in enumerate(text):
        depth += (c in "([{") - (c in ")]}")
        if c == "," and text[i + 1: i + 2] == " ":
            breaks.append((i + 2, depth))
    indent = text.find("(") + 1 if 0 < text.find("(") < WIDTH // 2 else 4
    lines, start = [], 0
    while len(text) - start > (room := WIDTH - (indent if lines else 0)):
        later = [(i, d) for i, d in breaks if i > start]
        if not later:
            break
        fitting = [(d, -i) for i, d in later if i - 1 - start <= room]
        end = -min(fitting)[1] if fitting else later[0][0]
        lines.append(text[start:end - 1])
        start = end
    lines.append(text[start:])
    return [lines[0], *(" " * indent + line for line in lines[1:])]
