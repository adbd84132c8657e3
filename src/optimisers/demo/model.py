"""The demo's network: an MLP with a BatchNorm layer and a tied weight, its data, and
its hand-written backward pass in NumPy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from optimisers import functor

if TYPE_CHECKING:
    from optimisers.demo.backends import Backend

HIDDEN = 32
MOMENTUM = 0.1  # of the BatchNorm running statistics
EPS = 1e-5


@dataclass
class Dense:
    """A fully connected layer, ``x @ weight + bias``. A dataclass: its fields are its
    children, and all of them are trainable (the default)."""

    weight: Any
    bias: Any


@functor(trainable=("beta", "gamma"))
class BatchNorm:
    """Batch normalisation. Only ``beta`` and ``gamma`` are trainable, declared by name
    above; the running statistics ``mu`` and ``var`` are children too, but no rule
    touches them: the forward pass keeps them up to date."""

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
    """The model. ``block1`` and ``block2`` hold the very same weight array: a tie. Not
    with JAX, whose immutable arrays are never tied by identity: there ``block2`` has no
    weight of its own and the forward pass reuses ``block1``'s."""
    w = bk.array(a["w"])
    return bk.prepare(MLP(
        encoder=Dense(bk.array(a["w1"]), bk.array(a["b1"])),
        norm=BatchNorm(*(bk.array(a[k]) for k in ("beta", "gamma", "mu", "var"))),
        block1=Dense(w, bk.array(a["c1"])),
        block2=Dense(None if bk.name == "jax" else w, bk.array(a["c2"])),
        head=Dense(bk.array(a["v"]), bk.array(a["c"]))))


def forward(m: MLP, x: Any, xp: Any, train: bool) -> tuple[Any, tuple]:
    """The network, written once for NumPy, PyTorch and JAX (``xp`` is the library):
    the logits, and the batch statistics that the running ones follow."""
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
    """Loss, gradients and batch statistics by a hand-written forward and backward pass.
    The gradients are dicts keyed by child names; the running statistics get none. The
    tied weight gets one gradient per path, and ``update`` adds them up."""
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
