"""``optimisers demo``: the whole library at work on one small training run.

A small MLP with a BatchNorm layer and a tied weight learns to tell two interleaved
spirals apart. The NumPy backend writes its backward pass by hand; ``--backend torch`` and
``--backend jax`` take the gradients from ``torch.autograd`` and ``jax.grad`` instead.
On the way it shows, one printed line each: trainable children declared by name, a tied
weight, ``freeze_`` / ``thaw_``, ``adjust_`` of the learning rate, weight decay switched off
for biases with ``where=``, ``AccumGrad``, a checkpoint resumed bit for bit, and
``summary``. Then it trains the same network with several rules and prints a table.
"""

from optimisers.demo.backends import BACKENDS, Backend
from optimisers.demo.cli import add_arguments, main, make_parser, run
from optimisers.demo.comparison import COMPARED, compare, plot
from optimisers.demo.feature_tour import TOUR_RULE, Tour, tour
from optimisers.demo.model import (
    HIDDEN,
    MLP,
    MOMENTUM,
    forward,
    init_arrays,
    logistic_loss,
    make_model,
    numpy_grads,
    spirals,
)
from optimisers.demo.training import BATCH, Progress, Task, evaluate, make_task, train

__all__ = ["BACKENDS", "BATCH", "COMPARED", "HIDDEN", "MLP", "MOMENTUM", "TOUR_RULE", "Backend",
           "Progress", "Task", "Tour", "add_arguments", "compare", "evaluate", "forward",
           "init_arrays", "logistic_loss", "main", "make_model", "make_parser", "make_task",
           "numpy_grads", "plot", "run", "spirals", "tour", "train"]
