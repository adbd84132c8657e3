"""The demo's data, its network (an MLP with a BatchNorm layer and a tied weight), its
training loop, and the array libraries that train it: NumPy by a hand-written backward
pass, PyTorch, JAX."""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from optimisers import functor, trainables, update, update_

HIDDEN, MOMENTUM, EPS, BATCH = 32, 0.1, 1e-5, 64  # MOMENTUM: of the running statistics


@dataclass
class Dense:  # x @ weight + bias
    weight: Any
    bias: Any


@functor(trainable=("beta", "gamma"))
@dataclass
class BatchNorm:
    """``beta`` and ``gamma`` trained; ``mu`` and ``var`` follow the forward pass."""

    beta: Any
    gamma: Any
    mu: Any
    var: Any


@dataclass
class MLP:  # two residual blocks, sharing one weight, between the BatchNorm and the head
    encoder: Dense
    norm: BatchNorm
    block1: Dense
    block2: Dense
    head: Dense


def spirals(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points of two interleaved spirals: inputs ``(n, 2)``, labels ``±1``, float32."""
    rng = np.random.default_rng([seed, n])
    t = np.sqrt(rng.uniform(0.02, 1.0, n)) * 3 * np.pi
    label = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    angle, r = t + np.where(label > 0, 0.0, np.pi), t / (3 * np.pi)
    x = np.stack([r * np.cos(angle), r * np.sin(angle)], 1) + rng.normal(0, 0.03, (n, 2))
    return x.astype(np.float32), label.astype(np.float32)


def init_arrays(seed: int) -> dict[str, np.ndarray]:
    """The initial arrays, drawn in NumPy so that every backend starts alike."""
    rng, h, z = np.random.default_rng(seed), HIDDEN, np.zeros(HIDDEN, np.float32)
    w1, w, v = (rng.normal(0, s, shape).astype(np.float32) for s, shape in
                ((1, (2, h)), (1 / math.sqrt(h), (h, h)), (1 / math.sqrt(h), (h, 1))))
    return {"w1": w1, "b1": z, "beta": z, "gamma": z + 1, "mu": z, "var": z + 1, "w": w,
            "c1": z, "c2": z, "v": v, "c": np.zeros(1, np.float32)}


def make_model(bk: Backend, a: dict[str, np.ndarray]) -> MLP:
    """The model, ``block1`` and ``block2`` tied (with JAX, ``block2.weight`` is ``None``
    and the forward pass reuses ``block1``'s)."""
    p = {k: bk.array(v) for k, v in a.items()}
    for k in p.keys() - {"mu", "var"} if bk.name == "torch" else ():
        p[k].requires_grad_()  # autograd for the trainable arrays
    return MLP(Dense(p["w1"], p["b1"]), BatchNorm(p["beta"], p["gamma"], p["mu"], p["var"]),
               Dense(p["w"], p["c1"]), Dense(None if bk.name == "jax" else p["w"], p["c2"]),
               Dense(p["v"], p["c"]))


def forward(m: MLP, x: Any, xp: Any, train: bool) -> tuple[Any, tuple]:
    """The logits and the batch statistics, for any array library ``xp``."""
    a = x @ m.encoder.weight + m.encoder.bias
    mean = xp.mean(a, 0) if train else m.norm.mu
    var = xp.mean((a - mean) ** 2, 0) if train else m.norm.var
    h = xp.tanh((a - mean) / xp.sqrt(var + EPS) * m.norm.gamma + m.norm.beta)
    h = h + xp.tanh(h @ m.block1.weight + m.block1.bias)
    w2 = m.block1.weight if m.block2.weight is None else m.block2.weight
    h = h + xp.tanh(h @ w2 + m.block2.bias)
    return (h @ m.head.weight + m.head.bias)[:, 0], (mean, var)


def logistic_loss(z: Any, s: Any, xp: Any) -> Any:
    """Mean of ``log(1 + exp(-s*z))`` for labels ``s = ±1``, written never to overflow."""
    t = -s * z
    return xp.mean((t + xp.abs(t)) / 2 + xp.log1p(xp.exp(-xp.abs(t))))


def numpy_grads(m: MLP, x: np.ndarray, s: np.ndarray) -> tuple[float, dict, tuple]:
    """Loss, gradients (dicts by child name, one per path of the tie) and batch statistics
    by a hand-written backward pass."""
    n, a = len(s), x @ m.encoder.weight + m.encoder.bias
    mean, var = a.mean(0), a.var(0)
    inv = 1 / np.sqrt(var + EPS)
    xn = (a - mean) * inv
    h1 = np.tanh(xn * m.norm.gamma + m.norm.beta)
    t2 = np.tanh(h1 @ m.block1.weight + m.block1.bias)
    t3 = np.tanh((h1 + t2) @ m.block2.weight + m.block2.bias)
    z = ((h1 + t2 + t3) @ m.head.weight + m.head.bias)[:, 0]
    dz = (-s / (1 + np.exp(s * z)) / n)[:, None]  # d loss / d z
    dh3 = dz @ m.head.weight.T
    du3 = dh3 * (1 - t3 * t3)
    dh2 = dh3 + du3 @ m.block2.weight.T
    du2 = dh2 * (1 - t2 * t2)
    dy = (dh2 + du2 @ m.block1.weight.T) * (1 - h1 * h1)
    dxn = dy * m.norm.gamma
    da = inv / n * (n * dxn - dxn.sum(0) - xn * (dxn * xn).sum(0))
    grads = {"encoder": (x, da), "block1": (h1, du2), "block2": (h1 + t2, du3),
             "head": (h1 + t2 + t3, dz)}
    grads = {k: {"weight": i.T @ d, "bias": d.sum(0)} for k, (i, d) in grads.items()}
    grads["norm"] = {"beta": dy.sum(0), "gamma": (dy * xn).sum(0)}
    return float(logistic_loss(z, s, np)), grads, (mean, var)


class Task(NamedTuple):
    """What every run shares: backend, data, initial weights, and each step's minibatch."""

    bk: Backend
    points: np.ndarray
    labels: np.ndarray
    test_points: np.ndarray
    test_labels: np.ndarray
    batches: np.ndarray
    init: dict[str, np.ndarray]


def make_task(bk: Backend, steps: int, seed: int, n: int = 512) -> Task:
    batches = np.random.default_rng([seed, 1]).integers(0, n, (steps, BATCH))
    return Task(bk, *spirals(n, seed), *spirals(n, seed + 10_000), batches, init_arrays(seed))


def train(task: Task, tree: Any, model: MLP, start: int, stop: int, label: str,
          hook: Callable | None = None, history: list | None = None) -> tuple[Any, MLP]:
    """Steps ``start`` to ``stop``; ``hook(i, tree, model, say)`` runs before step ``i``;
    ``history`` gets ``(i, stats)`` of 50 of the steps (``update(..., stats=True)``).
    Progress: a tqdm bar on a terminal (when installed), else a line half-way and at the end."""
    bar, bk = None, task.bk
    if sys.stdout.isatty():
        with contextlib.suppress(ImportError):
            from tqdm import tqdm

            bar = tqdm(total=stop - start, desc=f"{label:>10}", file=sys.stdout, unit="step")
    say = functools.partial(print, flush=True) if bar is None else functools.partial(
        bar.write, file=sys.stdout)
    with bar or contextlib.nullcontext():
        for i in range(start, stop):
            if hook is not None:
                hook(i, tree, model, say)
            idx, record = task.batches[i], history is not None and i % max(
                1, (stop - start) // 50) == 0
            tree, model, loss, (mean, var), stats = bk.step(
                tree, model, bk.array(task.points[idx]), bk.array(task.labels[idx]), record)
            if record:
                history.append((i, stats))
            model.norm.mu = (1 - MOMENTUM) * model.norm.mu + MOMENTUM * mean
            model.norm.var = (1 - MOMENTUM) * model.norm.var + MOMENTUM * var
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            elif i + 1 in ((start + stop) // 2, stop):
                say(f"  {label:>10}  step {i + 1:>5}/{stop}  loss {loss:.4f}")
    return tree, model


def evaluate(task: Task, model: MLP) -> tuple[float, float, float]:
    """Loss and accuracy on the training points, accuracy on the test points."""
    z, zt = (task.bk.logits(model, task.bk.array(x)) for x in (task.points, task.test_points))
    z = z.astype(np.float64)
    return (float(logistic_loss(z, task.labels, np)), float(np.mean(z * task.labels > 0)),
            float(np.mean(zt * task.test_labels > 0)))


class Backend:
    """The array library that trains the network: NumPy by the hand-written backward pass,
    PyTorch by ``torch.autograd`` (on one thread), JAX by ``jax.grad`` under ``jax.jit``."""

    KINDS = {"numpy": ("NumPy", "hand-written forward and backward passes"),
             "torch": ("PyTorch", "gradients by torch.autograd"),
             "jax": ("JAX", "gradients by jax.grad, each step under jax.jit")}

    def __init__(self, name: str = "numpy") -> None:
        self.name, self.how, self.xp, self.threads = name, self.KINDS[name][1], np, 0
        if name == "torch":
            import torch

            self.xp, self.threads = torch, torch.get_num_threads()
            torch.set_num_threads(1)  # arrays this small: threads cost more than they save
        if name == "jax":
            import jax

            self.xp, self.jitted = jax.numpy, jax.jit(functools.partial(_jax_step, jax),
                                                      static_argnames="stats")
            for cls in (Dense, BatchNorm, MLP):  # jax.grad then returns an MLP
                with contextlib.suppress(ValueError):  # registered by an earlier Backend
                    jax.tree_util.register_dataclass(cls, list(cls.__dataclass_fields__), [])

    def array(self, a: np.ndarray) -> Any:
        """A float32 copy of ``a`` in the backend's library (every run starts from the same)."""
        return (self.xp.tensor if self.name == "torch" else self.xp.array)(a, dtype=self.xp.float32)

    def numpy(self, a: Any) -> np.ndarray:
        return np.asarray(a.detach() if self.name == "torch" else a)

    def step(self, tree: Any, model: MLP, x: Any, s: Any, stats: bool = False) -> tuple:
        """One training step: ``(tree, model, loss, batch statistics, the step's stats)``
        (``None`` unless ``stats``: ``update(..., stats=True)``'s)."""
        if self.name == "numpy":
            loss, grads, batch = numpy_grads(model, x, s)
            return _stats(update_(tree, model, grads, stats=stats), loss, batch)
        if self.name == "jax":
            tree, model, loss, batch, record = self.jitted(tree, model, x, s, stats=stats)
            return tree, model, float(loss), batch, record
        for p in trainables(model):  # the tie once
            p.grad = None
        z, (mean, var) = forward(model, x, self.xp, train=True)
        (loss := logistic_loss(z, s, self.xp)).backward()  # the tie's gradient summed
        return _stats(update_(tree, model, stats=stats), float(loss.detach()),
                      (mean.detach(), var.detach()))

    def logits(self, model: MLP, x: Any) -> np.ndarray:
        return self.numpy(forward(model, x, self.xp, train=False)[0])

    def close(self) -> None:
        """Give back what the backend changed (torch's threads)."""
        if self.threads:
            self.xp.set_num_threads(self.threads)


def _stats(stepped: tuple, loss: Any, batch: tuple) -> tuple:
    """``(tree, model, loss, batch, stats or None)`` from what ``update`` returned."""
    return *stepped[:2], loss, batch, (stepped[2] if len(stepped) > 2 else None)


def _jax_step(jax: Any, tree: Any, model: MLP, x: Any, s: Any, stats: bool = False) -> tuple:
    def loss(model: MLP) -> tuple[Any, tuple]:
        z, batch = forward(model, x, jax.numpy, train=True)
        return logistic_loss(z, s, jax.numpy), batch

    (value, batch), grads = jax.value_and_grad(loss, has_aux=True)(model)
    return _stats(update(tree, model, grads, stats=stats), value, batch)  # grads: an MLP
