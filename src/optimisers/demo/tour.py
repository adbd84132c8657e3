"""The demo's training loop, and the run that shows every feature, one checked line each."""

from __future__ import annotations

import copy
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import optimisers as opt
from optimisers.demo.model import (
    MLP,
    MOMENTUM,
    Backend,
    init_arrays,
    logistic_loss,
    make_model,
    spirals,
)
from optimisers.schedules import at

BATCH = 64

TOUR_RULE = opt.OptimiserChain(
    opt.AccumGrad(2), opt.ClipGlobalNorm(1.0),
    opt.AdamW(opt.Warmup(opt.Cosine(0.01, 0.001, 100), 10, 0.001), lambd=0.01))
"""The tour's rule: a step per two micro-batches, clipped, and AdamW warmed up then decayed."""


class Progress:
    """tqdm when installed and stdout is a terminal, else a line half-way and at the end."""

    def __init__(self, label: str, start: int, stop: int) -> None:
        self.label, self.stop, self.bar = label, stop, None
        self.marks = {(start + stop) // 2, stop}
        if sys.stdout.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            width = shutil.get_terminal_size().columns
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


@dataclass
class Task:
    """What every run shares: backend, data, initial weights, and each step's minibatch."""

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
    batches = np.random.default_rng([seed, 1]).integers(0, n, (steps, BATCH))
    return Task(bk, *spirals(n, seed), *spirals(n, seed + 10_000), batches, init_arrays(seed))


def train(task: Task, tree: Any, model: MLP, start: int, stop: int, label: str,
          hook: Callable | None = None) -> tuple[Any, MLP]:
    """Steps ``start`` to ``stop``; ``hook(i, tree, model, bar)`` runs before step ``i``."""
    bk, bar = task.bk, Progress(label, start, stop)
    try:
        for i in range(start, stop):
            if hook is not None:
                hook(i, tree, model, bar)
            idx = task.batches[i]
            tree, model, loss, (mean, var) = bk.step(
                tree, model, bk.array(task.points[idx]), bk.array(task.labels[idx]))
            bn = model.norm
            bn.mu = (1 - MOMENTUM) * bn.mu + MOMENTUM * mean
            bn.var = (1 - MOMENTUM) * bn.var + MOMENTUM * var
            bar.step(i + 1, loss)
    finally:
        if bar.bar is not None:
            bar.bar.close()
    return tree, model


def evaluate(task: Task, model: MLP) -> tuple[float, float, float]:
    """Loss and accuracy on the training points, accuracy on the test points."""
    z = task.bk.logits(model, task.x).astype(np.float64)
    zt = task.bk.logits(model, task.x_test)
    return (float(logistic_loss(z, task.labels, np)), float(np.mean(z * task.labels > 0)),
            float(np.mean(zt * task.test_labels > 0)))


def arrays_of(bk: Backend, tree: Any, model: MLP) -> list[np.ndarray]:
    """Every array of the model and of the optimiser state, as NumPy, in walk order."""
    states = [leaf.state for leaf in opt.select(tree)]
    return [bk.numpy(a) for a in opt.fleaves((model, states)) if opt.isnumeric(a)]


def identical(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape
                                    and x.tobytes() == y.tobytes() for x, y in zip(a, b))


class Tour:
    """The run that shows every feature: what happens at which step, and its lines."""

    def __init__(self, task: Task, steps: int, folder: str, out: Callable[[str], None]):
        self.task, self.steps, self.out, self.eta = task, steps, out, 0.003
        self.freeze_at, self.adjust_at, self.thaw_at = steps // 4, steps // 2, 3 * steps // 4
        self.save_at = self.adjust_at | 1  # odd: half-way through an AccumGrad(2) cycle
        self.ckpt, self.saved_model = os.path.join(folder, "state.ckpt"), None
        self.seen: dict[Any, Any] = {}

    def snap(self, model: MLP, *layers: str) -> list[np.ndarray]:
        bk = self.task.bk
        return [bk.numpy(a).copy() for n in layers for a in vars(getattr(model, n)).values()]

    def hook(self, i: int, tree: Any, model: MLP, bar: Progress, quiet: bool = False) -> None:
        say = (lambda line: None) if quiet else bar.write
        if i < 3:  # AccumGrad(2): the first micro-batch of each pair moves nothing
            self.seen[i] = self.snap(model, "head")
        if i == 2:
            same = identical(self.seen[0], self.seen[1])
            moved = not identical(self.seen[1], self.seen[2])
            say(f"AccumGrad(2): after micro-batch 1 the weights are unchanged ({same}); "
                f"after micro-batch 2 they took one step with the mean gradient ({moved})")
        if i == self.freeze_at:
            opt.freeze_(tree["encoder"])
            self.seen["encoder"] = self.snap(model, "encoder")
            say(f"freeze_: step {i}: freeze_(tree['encoder']) marks the encoder's Leafs "
                f"frozen; updates skip them")
        if i == self.adjust_at:
            leaf = tree["head"]["weight"]
            old = at(leaf.rule, leaf.clock).rules[2].eta
            opt.adjust_(tree, self.eta)
            say(f"adjust_: step {i}: adjust_(tree, {self.eta}) puts a number in place of "
                f"the schedule, at {old:.4g} after {leaf.clock} real steps, in every rule, "
                f"keeping the optimiser state")
        if i == self.save_at and not quiet:
            opt.save(self.ckpt, tree)
            self.saved_model = copy.deepcopy(model)  # ties kept
        if i == self.thaw_at:
            opt.thaw_(tree["encoder"])
            if not quiet:
                still = identical(self.seen["encoder"], self.snap(model, "encoder"))
                say(f"thaw_: step {i}: thaw_(tree['encoder']): the encoder trains again; it "
                    f"did not move while frozen for {i - self.freeze_at} steps: {still}")

    def resume(self, tree: Any, model: MLP) -> None:
        """Train again from the checkpoint, in fresh objects; compare with the run."""
        bk, m2 = self.task.bk, self.saved_model
        t2 = opt.load(self.ckpt, like=opt.setup(TOUR_RULE, m2))
        t2, m2 = train(self.task, t2, m2, self.save_at, self.steps, "resumed",
                       lambda i, *a: i > self.save_at and self.hook(i, *a, quiet=True))
        a, b = arrays_of(bk, tree, model), arrays_of(bk, t2, m2)
        self.out(f"checkpoint: save(path, tree) at step {self.save_at} (mid-accumulation, "
                 f"encoder frozen, eta {self.eta}; {os.path.getsize(self.ckpt)} bytes, no "
                 f"pickle), load(path, like=setup(rule, model)), {self.steps - self.save_at} "
                 f"more steps: {len(a)} arrays {'match' if identical(a, b) else 'MISMATCH'} "
                 f"the uninterrupted run bit for bit")


def tour(task: Task, steps: int, out: Callable[[str], None]) -> None:
    """Train once with :data:`TOUR_RULE`, printing a checked line per feature."""
    bk = task.bk
    model = make_model(bk, task.init)
    tree = opt.setup(TOUR_RULE, model)
    out(f"rule: {TOUR_RULE!r}")
    eta = TOUR_RULE.rules[2].eta
    out(f"schedule: eta = {eta!r} at each Leaf's clock (AccumGrad's real steps): "
        f"{eta(0):g} at 0, {eta(10):g} at 10, {eta(60):.4g} at 60; ClipGlobalNorm(1.0) "
        f"rescales all gradients of a step together")
    opt.adjust_(tree, where="*.bias", lambd=0.0)
    biases = [str(kp) for kp, _ in opt.trainables(model, path=True) if kp[-1] == "bias"]
    out(f"weight decay: adjust_(tree, where='*.bias', lambd=0.0) switches it off for "
        f"{', '.join(biases)}; the other Leafs keep lambd="
        f"{tree['head']['weight'].rule.rules[2].lambd}")
    mu0, var0 = (float(np.abs(bk.numpy(v)).mean()) for v in (model.norm.mu, model.norm.var))
    with tempfile.TemporaryDirectory(prefix="optimisers-demo-") as folder:
        t = Tour(task, steps, folder, out)
        tree, model = train(task, tree, model, 0, steps, "tour", t.hook)
        t.resume(tree, model)
    bn, nt = model.norm, tree["norm"]
    mu1, var1 = (float(np.abs(bk.numpy(v)).mean()) for v in (bn.mu, bn.var))
    out(f"BatchNorm: trainable(model.norm) = {opt.trainable(bn)}; the state tree has mu: "
        f"{nt['mu']}, var: {nt['var']}, so no rule trains them, yet the forward pass moved "
        f"them: mean |mu| {mu0:.3f} -> {mu1:.3f}, mean var {var0:.3f} -> {var1:.3f}")
    if bk.name == "jax":
        out("tied weight: JAX arrays are immutable, so optimisers never ties them by "
            "identity; here block2 reuses block1.weight in the forward pass, and jax.grad "
            "adds up both uses")
    else:
        shared = tree["block1"]["weight"] is tree["block2"]["weight"]
        tied = model.block1.weight is model.block2.weight
        out(f"tied weight: block1.weight is block2.weight, with one shared Leaf ({shared}) "
            f"that gets the sum of both paths' gradients; still one array after {steps} "
            f"steps: {tied}")
    out(f"destructure(model): {len(opt.destructure(model)[1])} trainable numbers in one vector "
        f"(the tied weight once, the running statistics not at all)")
    out("summary(tree, model):")
    out(opt.summary(tree, model))
