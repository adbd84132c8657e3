"""The demo's array libraries: NumPy with the hand-written backward pass, PyTorch with
``torch.autograd``, JAX with ``jax.grad``."""

from __future__ import annotations

from typing import Any

import numpy as np

from optimisers import (
    trainables,
    update,
    update_,
)
from optimisers.demo.model import (
    MLP,
    BatchNorm,
    Dense,
    forward,
    logistic_loss,
    numpy_grads,
)


class Backend:
    """NumPy, with the hand-written backward pass; also the base of the others."""

    name = "numpy"
    how = "hand-written forward and backward passes"
    xp: Any = np

    def array(self, a: np.ndarray) -> Any:
        return np.array(a, np.float32)

    def numpy(self, a: Any) -> np.ndarray:
        return np.asarray(a)

    def prepare(self, model: MLP) -> MLP:
        return model

    def step(self, tree: Any, model: MLP, x: Any, s: Any) -> tuple[Any, MLP, float, tuple]:
        """One training step: ``(tree, model, loss, batch statistics)``."""
        loss, grads, stats = numpy_grads(model, x, s)
        tree, model = update_(tree, model, grads)
        return tree, model, loss, stats

    def logits(self, model: MLP, x: Any) -> np.ndarray:
        return self.numpy(forward(model, x, self.xp, train=False)[0])

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class TorchBackend(Backend):
    """PyTorch: gradients by ``torch.autograd``, updates in place."""

    name = "torch"
    how = "gradients by torch.autograd"

    def __init__(self) -> None:
        import torch

        self.xp = self.torch = torch
        self.threads = torch.get_num_threads()
        self.params: tuple[Any, list] = (None, [])

    def array(self, a: np.ndarray) -> Any:
        return self.torch.tensor(a, dtype=self.torch.float32)

    def numpy(self, a: Any) -> np.ndarray:
        return a.detach().cpu().numpy()

    def prepare(self, model: MLP) -> MLP:
        for p in trainables(model):
            p.requires_grad_()
        return model

    def step(self, tree: Any, model: MLP, x: Any, s: Any) -> tuple[Any, MLP, float, tuple]:
        if self.params[0] is not model:  # update_ writes in place: the same tensors
            self.params = (model, trainables(model, path=True))
        for _, p in self.params[1]:
            p.grad = None
        z, (mean, var) = forward(model, x, self.torch, train=True)
        loss = logistic_loss(z, s, self.torch)
        loss.backward()
        # Autograd has summed the tied weight's gradient over its two uses: give it once,
        # at its first path (block1.weight); a key left out means "no gradient here".
        grads: dict = {}
        for kp, p in self.params[1]:
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

    name = "jax"
    how = "gradients by jax.grad, each step under jax.jit"

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


def _register_pytrees(jax: Any) -> None:
    """Make the demo's classes JAX pytrees, once, so that jax.grad returns an MLP."""
    if getattr(_register_pytrees, "done", False):
        return
    for cls, names in ((Dense, ("weight", "bias")), (MLP, tuple(MLP.__dataclass_fields__)),
                       (BatchNorm, ("beta", "gamma", "mu", "var"))):
        jax.tree_util.register_pytree_node(
            cls, lambda x, names=names: (tuple(getattr(x, n) for n in names), None),
            lambda _, kids, cls=cls: cls(*kids))
    _register_pytrees.done = True


BACKENDS: dict[str, tuple[type[Backend], str]] = {
    "numpy": (Backend, "NumPy"), "torch": (TorchBackend, "PyTorch"), "jax": (JaxBackend, "JAX")}
