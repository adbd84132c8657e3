"""``optimisers demo``: the whole library at work on one small training run.

A small MLP with a BatchNorm layer and a tied weight learns to tell two interleaved
spirals apart. The NumPy backend writes its backward pass by hand; ``--backend torch`` and
``--backend jax`` take the gradients from ``torch.autograd`` and ``jax.grad`` instead.
On the way it shows, one printed line each: trainable children declared by name, a tied
weight, ``freeze_`` / ``thaw_``, ``adjust_`` of the learning rate, weight decay switched off
for biases with ``where=``, ``AccumGrad``, a checkpoint resumed bit for bit, and
``summary``. Then it trains the same network with several rules and prints a table.
"""

from optimisers.demo.cli import add_arguments, run
from optimisers.demo.model import (
           HIDDEN,
           Backend,
           forward,
           init_arrays,
           logistic_loss,
           make_model,
           numpy_grads,
           spirals,
)

__all__ = ["HIDDEN", "Backend", "add_arguments", "forward", "init_arrays", "logistic_loss",
           "make_model", "numpy_grads", "run", "spirals"]
