"""The demo's network (an MLP with a BatchNorm layer and a tied weight), its data, and the
array libraries that train it: NumPy by a hand-written backward pass, PyTorch, JAX."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from optimisers import functor, trainables, update, update_

HIDDEN = 32
MOMENTUM = 0.1  # of the BatchNorm running statistics
EPS = 1e-5


@dataclass
class Dense:
    """A fully connected layer, ``x @ weight + bias``; all its fields are trainable."""

    weight: Any
    bias: Any


@functor(trainable=("beta", "gamma"))
class BatchNorm:
    """Batch normalisation: ``beta`` and ``gamma`` trainable; ``mu`` and ``var`` follow the
    forward pass."""

    def __init__(self, beta: Any, gamma: Any, mu: Any, var: Any) -> None:
        self.beta, self.gamma, self.mu, self.var = beta, gamma, mu, var


@dataclass
class MLP:
    """The network: encoder, BatchNorm, two residual blocks sharing one weight, head."""

    encoder: Dense
    norm: BatchNorm
    block1: Dense
    block2: Dense
    head: Dense


def spirals(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points of two interleaved spirals (1.5 turns each): inputs ``(n, 2)`` and
    labels ``+1`` / ``-1``, both float32, the same for the same ``seed``."""
    rng = np.random.default_rng([seed, n])
    t = np.sqrt(rng.uniform(0.02, 1.0, n)) * 3 * np.pi
    label = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    angle = t + np.where(label > 0, 0.0, np.pi)
    r = t / (3 * np.pi)
    x = np.stack([r * np.cos(angle), r * np.sin(angle)], 1) + rng.normal(0, 0.03, (n, 2))
    return x.astype(np.float32), label.astype(np.float32)


def init_arrays(seed: int) -> dict[str, np.ndarray]:
    """The network's initial arrays, drawn once in NumPy so every backend starts alike."""
    rng = np.random.default_rng(seed)
    h, f32 = HIDDEN, np.float32
    return {
        "w1": rng.normal(0, 1, (2, h)).astype(f32), "b1": np.zeros(h, f32),
        "beta": np.zeros(h, f32), "gamma": np.ones(h, f32),
        "mu": np.zeros(h, f32), "var": np.ones(h, f32),
        "w": rng.normal(0, 1 / math.sqrt(h), (h, h)).astype(f32),
        "c1": np.zeros(h, f32), "c2": np.zeros(h, f32),
        "v": rng.normal(0, 1 / math.sqrt(h), (h, 1)).astype(f32), "c": np.zeros(1, f32),
    }


def make_model(bk: Backend, a: dict[str, np.ndarray]) -> MLP:
    """The model, ``block1`` and ``block2`` tied (with JAX, ``block2.weight`` is ``None``
    and the forward pass reuses ``block1``'s)."""
    w = bk.array(a["w"])
    return bk.prepare(MLP(
        encoder=Dense(bk.array(a["w1"]), bk.array(a["b1"])),
        norm=BatchNorm(*(bk.array(a[k]) for k in ("beta", "gamma", "mu", "var"))),
        block1=Dense(w, bk.array(a["c1"])),
        block2=Dense(None if bk.name == "jax" else w, bk.array(a["c2"])),
        head=Dense(bk.array(a["v"]), bk.array(a["c"]))))


def forward(m: MLP, x: Any, xp: Any, train: bool) -> tuple[Any, tuple]:
    """The logits and the batch statistics, for any array library ``xp``."""
    a = x @ m.encoder.weight + m.encoder.bias
    if train:
        mean = xp.mean(a, 0)
        var = xp.mean((a - mean) ** 2, 0)
    else:
        mean, var = m.norm.mu, m.norm.var
    h = xp.tanh((a - mean) / xp.sqrt(var + EPS) * m.norm.gamma + m.norm.beta)
    w2 = m.block1.weight if m.block2.weight is None else m.block2.weight
    h = h + xp.tanh(h @ m.block1.weight + m.block1.bias)
    h = h + xp.tanh(h @ w2 + m.block2.bias)
    return (h @ m.head.weight + m.head.bias)[:, 0], (mean, var)


def logistic_loss(z: Any, s: Any, xp: Any) -> Any:
    """Mean of ``log(1 + exp(-s*z))`` for labels ``s = ±1``, written never to overflow."""
    t = -s * z
    return xp.mean((t + xp.abs(t)) / 2 + xp.log1p(xp.exp(-xp.abs(t))))


def numpy_grads(m: MLP, x: np.ndarray, s: np.ndarray) -> tuple[float, dict, tuple]:
    """Loss, gradients (dicts by child name, one per path of the tie) and batch statistics
    by a hand-written backward pass."""
    n = len(s)
    a = x @ m.encoder.weight + m.encoder.bias
    mean = a.mean(0)
    d = a - mean
    var = (d * d).mean(0)
    inv = 1 / np.sqrt(var + EPS)
    xn = d * inv
    h1 = np.tanh(xn * m.norm.gamma + m.norm.beta)
    t2 = np.tanh(h1 @ m.block1.weight + m.block1.bias)
    h2 = h1 + t2
    t3 = np.tanh(h2 @ m.block2.weight + m.block2.bias)
    h3 = h2 + t3
    z = (h3 @ m.head.weight + m.head.bias)[:, 0]
    dz = (-s / (1 + np.exp(s * z)) / n)[:, None]  # d loss / d z
    head = {"weight": h3.T @ dz, "bias": dz.sum(0)}
    dh3 = dz @ m.head.weight.T
    du3 = dh3 * (1 - t3 * t3)
    block2 = {"weight": h2.T @ du3, "bias": du3.sum(0)}
    dh2 = dh3 + du3 @ m.block2.weight.T
    du2 = dh2 * (1 - t2 * t2)
    block1 = {"weight": h1.T @ du2, "bias": du2.sum(0)}
    dy = (dh2 + du2 @ m.block1.weight.T) * (1 - h1 * h1)
    norm = {"beta": dy.sum(0), "gamma": (dy * xn).sum(0)}
    dxn = dy * m.norm.gamma
    da = inv / n * (n * dxn - dxn.sum(0) - xn * (dxn * xn).sum(0))
    encoder = {"weight": x.T @ da, "bias": da.sum(0)}
    grads = {"encoder": encoder, "norm": norm, "block1": block1, "block2": block2,
             "head": head}
    return float(logistic_loss(z, s, np)), grads, (mean, var)
class Backend:
    """NumPy, with the hand-written backward pass; also the base of the others."""

    name, how, xp = "numpy", "hand-written forward and backward passes", np

    def array(self, a: np.ndarray) -> Any:
        return np.array(a, np.float32)

    def numpy(self, a: Any) -> np.ndarray:
        return np.asarray(a)

    def prepare(self, model: MLP) -> MLP:
        return model

    def step(self, tree: Any, model: MLP, x: Any, s: Any) -> tuple[Any, MLP, float, tuple]:
        """One training step: ``(tree, model, loss, batch statistics)``."""
        loss, grads, stats = numpy_grads(model, x, s)
        return *update_(tree, model, grads), loss, stats

    def logits(self, model: MLP, x: Any) -> np.ndarray:
        return self.numpy(forward(model, x, self.xp, train=False)[0])

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class TorchBackend(Backend):
    """PyTorch: gradients by ``torch.autograd``, updates in place."""

    name, how = "torch", "gradients by torch.autograd"

    def __init__(self) -> None:
        import torch

        self.xp = self.torch = torch
        self.threads = torch.get_num_threads()

    def array(self, a: np.ndarray) -> Any:
        return self.torch.tensor(a, dtype=self.torch.float32)

    def numpy(self, a: Any) -> np.ndarray:
        return a.detach().cpu().numpy()

    def prepare(self, model: MLP) -> MLP:
        for p in trainables(model):
            p.requires_grad_()
        return model

    def step(self, tree: Any, model: MLP, x: Any, s: Any) -> tuple[Any, MLP, float, tuple]:
        params = trainables(model, path=True)
        for _, p in params:
            p.grad = None
        z, (mean, var) = forward(model, x, self.torch, train=True)
        loss = logistic_loss(z, s, self.torch)
        loss.backward()
        # autograd summed the tie's gradient: give it once, at block1.weight
        grads: dict = {}
        for kp, p in params:
            grads.setdefault(kp[0], {})[kp[1]] = p.grad
        tree, model = update_(tree, model, grads)
        return tree, model, float(loss.detach()), (mean.detach(), var.detach())

    def logits(self, model: MLP, x: Any) -> np.ndarray:
        with self.torch.no_grad():
            return super().logits(model, x)

    def __enter__(self) -> Backend:
        self.torch.set_num_threads(1)  # arrays this small: threads cost more than they save
        return self

    def __exit__(self, *exc: Any) -> None:
        self.torch.set_num_threads(self.threads)


class JaxBackend(Backend):
    """JAX: gradients by ``jax.grad``; the pure ``update``; the whole step under ``jax.jit``."""

    name, how = "jax", "gradients by jax.grad, each step under jax.jit"

    def __init__(self) -> None:
        import jax
        import jax.numpy as jnp

        self.xp = jnp
        _register_pytrees(jax)

        def loss(model: MLP, x: Any, s: Any) -> tuple[Any, tuple]:
            z, stats = forward(model, x, jnp, train=True)
            return logistic_loss(z, s, jnp), stats

        def step(tree: Any, model: MLP, x: Any, s: Any) -> tuple:
            (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(model, x, s)
            tree, model = update(tree, model, grads)  # grads: an MLP, as jax.grad gives
            return tree, model, value, stats

        self._step = jax.jit(step)
        self._logits = jax.jit(lambda m, x: forward(m, x, jnp, train=False)[0])

    def array(self, a: np.ndarray) -> Any:
        return self.xp.asarray(a, dtype=self.xp.float32)

    def step(self, tree: Any, model: MLP, x: Any, s: Any) -> tuple[Any, MLP, float, tuple]:
        tree, model, loss, stats = self._step(tree, model, x, s)
        return tree, model, float(loss), stats

    def logits(self, model: MLP, x: Any) -> np.ndarray:
        return self.numpy(self._logits(model, x))


@functools.cache
def _register_pytrees(jax: Any) -> None:
    """Make the demo's classes JAX pytrees, once (jax.grad then returns an MLP)."""
    for cls, names in ((Dense, ("weight", "bias")), (MLP, tuple(MLP.__dataclass_fields__)),
                       (BatchNorm, ("beta", "gamma", "mu", "var"))):
        jax.tree_util.register_pytree_node(
            cls, lambda x, names=names: (tuple(getattr(x, n) for n in names), None),
            lambda _, kids, cls=cls: cls(*kids))


BACKENDS: dict[str, tuple[type[Backend], str]] = {
    "numpy": (Backend, "NumPy"), "torch": (TorchBackend, "PyTorch"), "jax": (JaxBackend, "JAX")}
