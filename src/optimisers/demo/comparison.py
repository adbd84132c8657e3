"""The demo's comparison: the same network trained with several rules, a table and a figure."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from optimisers import (
    Adam,
    AdamW,
    Descent,
    Lion,
    Momentum,
    Nesterov,
    setup,
)
from optimisers.demo.model import (
    MLP,
    make_model,
)
from optimisers.demo.training import Progress, Task, evaluate, train

COMPARED = [Descent(0.2), Momentum(0.02, 0.9), Nesterov(0.02, 0.9), Adam(0.005),
            AdamW(0.005, lambd=0.01), Lion(0.001)]




# ----------------------------------------------------------------------------- comparison


def compare(task: Task, steps: int, out: Callable[[str], None]) -> dict[str, tuple]:
    """Train a fresh copy of the network with each rule; print the table; return each
    rule's loss curve (the loss on all training points, every 1% of the run)."""
    rows, curves = [], {}
    every = max(1, steps // 100)
    for rule in COMPARED:
        name = type(rule).__name__
        model = make_model(task.bk, task.init)
        at: list[int] = []
        losses: list[float] = []

        def record(i: int, tree: Any, model: MLP, bar: Progress, at: list = at,
                   losses: list = losses) -> None:
            if i % every == 0:
                at.append(i)
                losses.append(evaluate(task, model)[0])

        t0 = time.perf_counter()
        _, model = train(task, setup(rule, model), model, 0, steps, name, record)
        seconds = time.perf_counter() - t0
        result = evaluate(task, model)
        curves[name] = (at + [steps], losses + [result[0]])
        rows.append((repr(rule), *result, seconds))
    width = max(len(r[0]) for r in rows)
    out(f"{'rule':<{width}}  final loss  train acc  test acc  time")
    for rule, loss, acc, test, seconds in rows:
        out(f"{rule:<{width}}  {loss:>10.4f}  {acc:>9.1%}  {test:>8.1%}  {seconds:4.1f} s")
    return curves


def plot(path: str, curves: dict[str, tuple], title: str, lr: tuple | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, (steps, losses) in curves.items():
        ax.plot(steps, losses, label=name, lw=1.6)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss on all training points")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if lr is not None:  # (steps, values): a learning rate, on its own axis at the right
        right = ax.twinx()
        right.plot(*lr, color="grey", ls="--", lw=1.2)
        right.set_ylabel("the tour's learning rate (dashed)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
