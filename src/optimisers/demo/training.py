"""The demo's training run: the task, the training loop with its progress line,
evaluation, and saving and loading the model."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimisers import (
    fleaves,
    fmap_with_path,
    isnumeric,
    select,
)
from optimisers.demo.backends import Backend
from optimisers.demo.model import (
    MLP,
    MOMENTUM,
    init_arrays,
    logistic_loss,
    spirals,
)

BATCH = 64


# ----------------------------------------------------------------------------- progress


class Progress:
    """A progress bar: tqdm when it is installed and stdout is a terminal, else a plain
    text line half-way and at the end. Lines printed meanwhile go through :meth:`write`."""

    def __init__(self, label: str, start: int, stop: int) -> None:
        self.label, self.stop, self.bar = label, stop, None
        self.marks = {(start + stop) // 2, stop}
        if sys.stdout.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            width = shutil.get_terminal_size().columns  # 80 where the size is unknown
            self.bar = tqdm(total=stop - start, desc=f"{label:>10}", file=sys.stdout,
                            ncols=min(width, 120), unit="step")

    def step(self, i: int, loss: float) -> None:
        """Step ``i`` (counting from 1) is done, with this training loss."""
        if self.bar is not None:
            self.bar.update(1)
            if i % 20 == 0 or i == self.stop:
                self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        elif i in self.marks:
            print(f"  {self.label:>10}  step {i:>5}/{self.stop}  loss {loss:.4f}", flush=True)

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------- training


@dataclass
class Task:
    """What every run shares: the backend, the data, the initial weights, and the
    minibatch of each step (fixed in advance, so a resumed run sees the same ones)."""

    bk: Backend
    points: np.ndarray
    labels: np.ndarray
    test_points: np.ndarray
    test_labels: np.ndarray
    batches: np.ndarray
    init: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        self.x, self.x_test = self.bk.array(self.points), self.bk.array(self.test_points)


def make_task(bk: Backend, steps: int, seed: int, n: int = 512) -> Task:
    x, s = spirals(n, seed)
    xt, st = spirals(n, seed + 10_000)
    batches = np.random.default_rng([seed, 1]).integers(0, n, (steps, BATCH))
    return Task(bk, x, s, xt, st, batches, init_arrays(seed))


def train(task: Task, tree: Any, model: MLP, start: int, stop: int, label: str,
          hook: Callable | None = None) -> tuple[Any, MLP]:
    """Steps ``start`` to ``stop``; ``hook(i, tree, model, bar)`` runs before step ``i``."""
    bk = task.bk
    with Progress(label, start, stop) as bar:
        for i in range(start, stop):
            if hook is not None:
                hook(i, tree, model, bar)
            idx = task.batches[i]
            tree, model, loss, (mean, var) = bk.step(
                tree, model, bk.array(task.points[idx]), bk.array(task.labels[idx]))
            bn = model.norm  # the running statistics follow the forward pass's batches
            bn.mu = (1 - MOMENTUM) * bn.mu + MOMENTUM * mean
            bn.var = (1 - MOMENTUM) * bn.var + MOMENTUM * var
            bar.step(i + 1, loss)
    return tree, model


def evaluate(task: Task, model: MLP) -> tuple[float, float, float]:
    """Loss and accuracy on the training points, accuracy on the test points."""
    z = task.bk.logits(model, task.x).astype(np.float64)
    zt = task.bk.logits(model, task.x_test)
    return (float(logistic_loss(z, task.labels, np)), float(np.mean(z * task.labels > 0)),
            float(np.mean(zt * task.test_labels > 0)))


# ----------------------------------------------------------------------------- the tour


def arrays_of(bk: Backend, tree: Any, model: MLP) -> list[np.ndarray]:
    """Every array of the model and of the optimiser state, as NumPy, in walk order."""
    out = [bk.numpy(a) for a in fleaves(model) if isnumeric(a)]
    for leaf in select(tree):
        out += [bk.numpy(a) for a in fleaves(leaf.state) if isnumeric(a)]
    return out


def save_model(path: str, bk: Backend, model: MLP) -> None:
    """The model's arrays into an ``.npz``, keyed by path (a tied array once)."""
    found: dict[str, np.ndarray] = {}
    fmap_with_path(lambda kp, a: found.setdefault(str(kp), bk.numpy(a)) if isnumeric(a)
                   else a, model)
    np.savez(path, **found)


def load_model(path: str, bk: Backend, like: MLP) -> MLP:
    """``like`` with its arrays read back from :func:`save_model`'s file, ties kept."""
    with np.load(path, allow_pickle=False) as f:
        return bk.prepare(fmap_with_path(
            lambda kp, a: bk.array(f[str(kp)]) if isnumeric(a) else a, like))


def identical(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape
                                    and x.tobytes() == y.tobytes() for x, y in zip(a, b))
