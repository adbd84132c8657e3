"""What a step did to each Leaf, keyed by path: ``update(..., stats=True)``'s record. Every
value is an array of the parameter's library (under ``jit``, part of the output), read on
the host only by whoever prints or plots it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from optimisers import backends
from optimisers.backends.common import mapstate
from optimisers.rules import Rule
from optimisers.schedules import Schedule, counted

__all__ = ["LeafStats", "plot_ratios"]


class LeafStats(NamedTuple):
    """LeafStats(grad_norm, update_norm, param_norm, ratio, nonfinite, state_rms, hyper):
    one Leaf's step, as ``update(tree, model, grads, stats=True)`` gives it.

    Norms are 2-norms (float32 at least), 0-d arrays of the parameter's library; ``ratio``
    is ``update_norm / param_norm`` against the parameter before the step (``inf`` for a
    zero parameter that moved, 0 for one that did not); ``nonfinite`` counts the
    gradient's NaNs and infinities (in the norm's dtype; ``0``, a number, where all the
    step's gradients are finite, which one host read a step finds out, none under
    ``jit``); ``state_rms`` maps each floating state array of at least one dimension (by
    its ``state_dict`` name, ``"state.0"``; :class:`~optimisers.Quantised`'s: its blocks'
    scales) to its root mean square after the step; ``hyper`` maps each scheduled
    hyper-parameter (``"eta"``, in a chain ``"rules.2.eta"``) to its value at this step.

    Example:
        >>> from optimisers import Descent, setup, update
        >>> model = {"w": np.array([3.0, 4.0])}
        >>> _, _, stats = update(setup(Descent(0.1), model), model, {"w": np.ones(2)},
        ...                      stats=True)
        >>> s = stats["w"]
        >>> [round(float(v), 4) for v in s[:5]], s.state_rms, s.hyper
        ([1.4142, 0.1414, 5.0, 0.0283, 0.0], {}, {})
    """

    grad_norm: Any
    update_norm: Any
    param_norm: Any
    ratio: Any
    nonfinite: Any
    state_rms: dict
    hyper: dict


class _Before(NamedTuple):
    """What a Leaf's record needs from before its step."""

    old: Any  # the parameter before the step (a copy where the step writes into it)
    grad_norm: Any
    nonfinite: Any
    hyper: dict


def before(entries: list, inplace: bool) -> list[_Before]:
    """Per entry, what its record reads before the step: non-finite gradients are counted
    only where the sum of all the gradients' norms (one read a library and device) is not
    finite."""
    names = [str(e.paths[0]) for e in entries]
    if len(set(names)) < len(names):  # (before any write)
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"stats=True: two Leafs have the path {twice[0]!r} (a key of the "
                         f"model holds a dot, or 1 and '1'); their records would collide")
    norms = [_norm(e.grads[0]) for e in entries]
    keys = [(backends.library(e.x), getattr(backends.of(n), "device", _nowhere)(n))
            for e, n in zip(entries, norms)]  # (norms on two devices do not add up)
    sums: dict = {}
    for key, n in zip(keys, norms):
        sums[key] = sums[key] + n if key in sums else n
    finite = {k: backends.ops(k[0]).isfinite(n) for k, n in sums.items()}  # (traced: None)
    out = []
    for e, n, key in zip(entries, norms, keys):
        x, g = e.x, e.grads[0]
        xp = backends.of(x)
        known = finite[key]
        bad = 0 if known else xp.count_nonzero(~(xp.abs(g) < math.inf), n)  # (NaN too)
        out.append(_Before(xp.copy(x) if inplace and xp.maywrite(x) else x, n, bad,
                           scheduled(e.leaf.rule, counted(e.leaf.clock))))
    return out


def _nowhere(a: Any) -> None:
    """The device of an array whose backend names none."""


def after(entries: list, seen: list[_Before], new: dict) -> dict[str, LeafStats]:
    """Each entry's record, by its first path, given what :func:`before` saw and the new
    parameters made out of place (``new`` by ``id(leaf)``)."""
    out = {}
    for e, b in zip(entries, seen):
        xp = backends.of(e.x)
        step = _norm(xp.subtract(b.old, new.get(id(e.leaf), e.x), False))
        param = _norm(b.old)
        ratio = xp.where(param == 0, xp.where(step > 0, float("inf"), step),
                         step / xp.maximum(param, _TINY))  # (a NaN parameter: NaN)
        out[str(e.paths[0])] = LeafStats(b.grad_norm, step, param, ratio, b.nonfinite,
                                         rms(e.leaf.state), b.hyper)
    return out


def rms(state: Any) -> dict:
    """rms(state) -> ``{name: root mean square}`` of each floating array of ``state``
    with elements, named as :func:`~optimisers.state_dict` names them.

    Example:
        >>> rms((np.array([3.0, 4.0]), np.zeros(2), 7.0))
        {'state.0': np.float64(3.5355...), 'state.1': np.float64(0.0)}
    """
    found: dict = {}

    def note(a: Any, name: str) -> None:
        if _is_state(a):
            found[name] = _norm(a) / backends.of(a).size(a) ** 0.5

    mapstate(note, state, "state")
    return found


_TINY = 1e-30  # (a zero parameter: no division by zero, its ratio from ``where``)


def _is_state(a: Any) -> bool:
    """Whether a state item is an array of floating numbers with elements (not a count)."""
    lib = backends.library(a)
    return (lib is not None and len(a.shape) > 0 and backends.ops(lib).isfloating(a)
            and backends.ops(lib).size(a) > 0)


def _norm(a: Any) -> Any:
    """The 2-norm of all of ``a``, a 0-d array, in float32 at least."""
    xp = backends.of(a)
    if xp.dtype_name(a) in ("float16", "bfloat16"):
        a = xp.astype(a, "float32")
    return xp.vector_norm(a, tuple(range(len(a.shape)))).reshape(())


def scheduled(rule: Any, t: Any, name: str = "") -> dict:
    """scheduled(rule, t) -> ``{field name: value at step t}`` of each schedule in ``rule``
    (nested rules' fields named by their path, ``"rules.2.eta"``).

    Example:
        >>> from optimisers import Adam, ClipGlobalNorm, Cosine, OptimiserChain
        >>> scheduled(OptimiserChain(ClipGlobalNorm(), Adam(Cosine(1.0, 0.0, 10))), 5)
        {'rules.1.eta': 0.5}
    """
    if isinstance(rule, Schedule):
        return {name: rule(t)}
    if isinstance(rule, tuple):
        return {k: v for i, r in enumerate(rule) for k, v in scheduled(r, t, f"{name}.{i}").items()}
    if not isinstance(rule, Rule) or not dataclasses.is_dataclass(rule):
        return {}
    return {k: v for f in dataclasses.fields(rule)
            for k, v in scheduled(getattr(rule, f.name), t, f"{name}.{f.name}".lstrip(".")).items()}


def table(stats: Mapping[str, LeafStats]) -> list[str]:
    """The lines :func:`~optimisers.summary` prints for ``stats``: one per Leaf."""
    rows = [(path, *(f"{float(v):.3g}" for v in s[:4]), str(int(s.nonfinite)),
             " ".join(f"{k.removeprefix('state.')}={float(v):.3g}"
                      for k, v in (*s.state_rms.items(), *s.hyper.items())))
            for path, s in stats.items()]
    head = ("path", "grad", "update", "param", "ratio", "nonfinite", "state rms, schedules")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(6)]
    return ["  ".join([r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:6], widths[1:])),
                       r[6]]).rstrip() for r in [head, *rows]]


def plot_ratios(history: list, path: str | None = None, ax: Any = None) -> Any:
    """plot_ratios(history, path=None, ax=None) -> the axes: each Leaf's update/parameter
    ratio over the steps, one line per path, on a log scale (needs matplotlib).

    Args:
        history: ``(step, stats)`` pairs, ``stats`` as ``update(..., stats=True)`` gave it.
        path: where to save the figure (a ``.png``); ``None`` saves nothing.
        ax: the matplotlib axes to draw on; ``None`` makes a figure.

    Returns:
        The axes drawn on.

    Example:
        >>> from optimisers import Adam, setup, update_
        >>> model = {"w": np.ones(3)}
        >>> tree, history = setup(Adam(0.1), model), []
        >>> for i in range(3):
        ...     history.append((i, update_(tree, model, {"w": np.ones(3)}, stats=True)[2]))
        >>> ax = plot_ratios(history)
        >>> [line.get_label() for line in ax.get_lines()], ax.get_yscale()
        (['w'], 'log')
    """
    if ax is None:  # (a Figure of its own: pyplot and the user's backend untouched)
        from matplotlib.figure import Figure

        ax = Figure(figsize=(7, 4.2), dpi=120).subplots()
    paths = list(dict.fromkeys(p for _, stats in history for p in stats))
    for p in paths:
        points = [(i, float(s[p].ratio)) for i, s in history if p in s]
        ax.plot(*zip(*points), label=p, lw=1.2)
    ax.set(yscale="log", xlabel="step", ylabel="|update| / |parameter|")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    if path is not None:
        ax.figure.savefig(path, bbox_inches="tight")
    return ax
