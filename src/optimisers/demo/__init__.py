"""``optimisers demo``: the whole library at work on one small training run.

A small MLP with a BatchNorm layer and a tied weight learns to tell two interleaved
spirals apart (gradients by hand in NumPy, or by ``torch.autograd`` or ``jax.grad``),
showing one line for each feature: trainable children declared by name, a tied weight,
``freeze_``/``thaw_``, ``adjust_``, weight decay off for biases with ``where=``,
``AccumGrad``, a checkpoint resumed bit for bit, ``summary``. Then the same network is
trained with several rules, and a table printed.
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
