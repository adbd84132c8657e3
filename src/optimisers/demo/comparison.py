"""The demo's comparison: the same network trained with several rules, a table and a figure."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from optimisers import Adam, AdamW, Descent, Lion, Momentum, Muon, Nesterov, plot_ratios, setup
from optimisers.demo.model import Task, evaluate, make_model, train

#: The compared rules; the last, a mapping for ``setup``, gives the hidden matrix to ``Muon``.
COMPARED = [Descent(0.2), Momentum(0.02, 0.9), Nesterov(0.02, 0.9), Adam(0.005),
            AdamW(0.005, lambd=0.01), Lion(0.001),
            {"block*.weight": Muon(0.02, lambd=0.01), "*": AdamW(0.005, lambd=0.01)}]


def name(rule: Any) -> str:
    """A compared entry's short name: its rule's class, or the mapping's, ``Muon+AdamW``."""
    return "+".join(dict.fromkeys(type(r).__name__ for r in (
        rule.values() if isinstance(rule, dict) else [rule])))


def compare(task: Task, steps: int, out: Callable[[str], None], history: list | None = None
            ) -> dict[str, tuple]:
    """Train a fresh copy of the network with each rule; print the table; return each
    rule's loss curve (the loss on all training points, every 1% of the run); ``history``
    gets the AdamW run's ``(step, stats)`` of 50 steps (``update(..., stats=True)``)."""
    rows, curves = [], {}
    for rule in COMPARED:
        curve: dict[int, float] = {}

        def record(i: int, tree: Any, model: Any, say: Any, curve: dict = curve) -> None:
            if i % max(1, steps // 100) == 0:
                curve[i] = evaluate(task, model)[0]

        t0, model = time.perf_counter(), make_model(task.bk, task.init)
        _, model = train(task, setup(rule, model), model, 0, steps, name(rule), record,
                         history if name(rule) == "AdamW" else None)
        seconds, result = time.perf_counter() - t0, evaluate(task, model)
        curves[name(rule)] = (list(curve) + [steps], list(curve.values()) + [result[0]])
        rows.append((name(rule) if isinstance(rule, dict) else repr(rule), *result, seconds))
    width = max(len(r[0]) for r in rows)
    out(f"{'rule':<{width}}  final loss  train acc  test acc  time")
    for rule, loss, acc, test, seconds in rows:
        out(f"{rule:<{width}}  {loss:>10.4f}  {acc:>9.1%}  {test:>8.1%}  {seconds:4.1f} s")
    for rule in (r for r in COMPARED if isinstance(r, dict)):  # a mapping, in full
        out(f"{name(rule)}: setup(mapping, model) with the mapping")
        out("\n".join(f"  {k!r} -> {r!r}" for k, r in rule.items()))
    return curves


def plot(path: str, curves: dict[str, tuple], title: str, lr: tuple, history: list) -> None:
    """Write the loss curves, and the learning rate ``lr`` on a right axis, to ``path``,
    beside each layer's update/parameter ratio over the AdamW run (``history``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ratios) = plt.subplots(1, 2, figsize=(14, 4.4), dpi=120,
                                     gridspec_kw={"wspace": 0.4})
    plot_ratios(history, ax=ratios)
    ratios.set_title("AdamW: each layer's |update| / |parameter|")
    for label, (steps, losses) in curves.items():
        ax.plot(steps, losses, label=label, lw=1.6)
    ax.set(yscale="log", xlabel="step", ylabel="loss on all training points", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    right = ax.twinx()
    right.plot(*lr, color="grey", ls="--", lw=1.2)
    right.set_ylabel("the tour's learning rate (dashed)")
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
