"""The learning-rate range test: a short run whose rate grows exponentially, on a copy."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from optimisers.adjust import adjust
from optimisers.state import setup, update

__all__ = ["LRRange", "lr_find"]


class LRRange(NamedTuple):
    """LRRange(lrs, losses, smoothed, suggestion): the curve that :func:`lr_find` measured.

    ``losses[i]`` is the loss at step ``i``, on the model that the rates ``lrs[:i]`` made,
    and ``lrs[i]`` is the rate of the step taken from there (fastai's pairing).
    ``smoothed`` is their exponential average, bias-corrected, and ``suggestion`` the rate
    where ``smoothed`` falls fastest against ``log(lr)``.

    Example:
        >>> found = LRRange([0.01, 0.1, 1.0], [1.0, 0.5, 4.0], [1.0, 0.7, 1.5], 0.1)
        >>> found.suggestion, len(found.lrs)
        (0.1, 3)
    """

    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    suggestion: float

    def plot(self, path: str | None = None, ax: Any = None) -> Any:
        """plot(path=None, ax=None) -> the axes: the loss against the rate, on a log scale.

        Draws the losses and their smoothed curve and marks the suggestion (needs
        matplotlib: ``pip install "optimisers[plot]"``). The arguments are those of
        :func:`plot_ratios`.

        Args:
            path: where to save the figure (a ``.png``); ``None`` saves nothing.
            ax: the matplotlib axes to draw on; ``None`` makes a figure of its own,
                without pyplot (the caller's backend stays as it was).

        Returns:
            The axes drawn on.

        Example:
            >>> found = LRRange([0.01, 0.1, 1.0], [1.0, 0.5, 4.0], [1.0, 0.7, 1.5], 0.1)
            >>> found.plot().get_xscale(), found.plot().get_lines()[-1].get_xdata()
            ('log', [0.1, 0.1])
        """
        try:
            from matplotlib.figure import Figure
        except ImportError as err:
            err.add_note('LRRange.plot needs matplotlib: pip install "optimisers[plot]"')
            raise
        ax = Figure(figsize=(6, 4), dpi=120).subplots() if ax is None else ax
        ax.plot(self.lrs, self.losses, color="lightgrey", lw=1, label="loss")
        ax.plot(self.lrs, self.smoothed, lw=1.8, label="smoothed")
        ax.axvline(self.suggestion, color="red", ls="--", label=f"suggestion {self.suggestion:.2g}")
        ax.set(xscale="log", xlabel="learning rate", ylabel="loss", title="lr_find")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        if path is not None:
            ax.figure.savefig(path, bbox_inches="tight")
        return ax


def lr_find(rule: Any, model: Any, loss_and_grad: Callable[[Any, int], tuple[Any, Any]], *,
            start: float = 1e-7, end: float = 10.0, steps: int = 100, smooth: float = 0.98,
            diverge: float = 4.0) -> LRRange:
    """lr_find(rule, model, loss_and_grad) -> LRRange: the learning-rate range test.

    Trains a deep copy of ``model`` from ``setup(rule, copy)`` with the pure
    :func:`update`, for up to ``steps`` steps whose rate grows exponentially from
    ``start`` to ``end``: before step ``i``, :func:`adjust` sets the ``eta`` of every rule
    in the tree (through chains and wrappers; a schedule there is replaced) to
    ``lrs[i] = start * (end / start) ** (i / (steps - 1))`` (every subset of a mapping of
    rules alike, as torch-lr-finder's groups; a chain with two rates, such as
    ``OptimiserChain(RMSProp(1.0), Momentum(0.01))``, has both set: sweep a chain with one).
    ``loss_and_grad(model, i)``
    returns the loss (a number or 0-d array) and the gradients (as :func:`update` takes
    them) on batch ``i``. The caller's model, its arrays and ``rule`` are left as they were.

    The smoothed loss is the bias-corrected exponential average (fastai's):
    ``a_i = smooth * a_(i-1) + (1 - smooth) * loss_i`` and ``smoothed_i = a_i /
    (1 - smooth ** (i + 1))``. The run stops at a non-finite loss (not recorded), or
    after recording a smoothed loss above ``diverge`` times the lowest so far (above it by
    ``(diverge - 1) * |lowest|``, for a loss that may be negative). The
    suggestion is the rate where the smoothed loss has its steepest descent: the most
    negative ``numpy.gradient(smoothed, log(lrs))``, as fastai's ``steep`` leaving out the
    first ``steps // 10`` points (the first batches' noise) and the last 5 (the blow-up)
    when two or more remain. A rate near it, or a tenth of where the smoothed loss is
    lowest, is the usual choice; look at the curve with :meth:`LRRange.plot`.

    lr_find draws no random numbers: the curve is a function of ``loss_and_grad``. Draw
    batch ``i`` from a seeded generator (``numpy.random.default_rng([seed, i])``) and two
    runs give the same curve.

    Args:
        rule: a rule, or what :func:`setup` takes (a mapping of patterns to rules).
        model: the model; NumPy, PyTorch or JAX arrays, or a ``torch.nn.Module``.
        loss_and_grad: ``(model, step) -> (loss, grads)``.
        start: the first rate (> 0).
        end: the last rate (> ``start``).
        steps: the most steps (>= 2).
        smooth: the smoothing factor, in ``[0, 1)``; 0 keeps the raw losses.
        diverge: the factor over the best smoothed loss that ends the run (> 1).

    Returns:
        An :class:`LRRange`: ``lrs``, ``losses``, ``smoothed`` (lists of floats, one per
        recorded step) and ``suggestion``.

    Raises:
        ValueError: an argument out of range, or fewer than two finite losses.
        TypeError: no rule in the tree has an ``eta``.

    Example:
        >>> from optimisers import Descent
        >>> x = np.random.default_rng(0).normal(size=(64, 3))
        >>> y = x @ np.array([1.0, -2.0, 0.5])
        >>> def loss_and_grad(w, step):
        ...     err = x @ w - y
        ...     return np.mean(err ** 2), 2 * x.T @ err / len(x)
        >>> found = lr_find(Descent(), np.zeros(3), loss_and_grad, start=1e-4)
        >>> found.losses[-1] > found.losses[0], 0.01 < found.suggestion < 1.0
        (True, True)
    """
    _check(start, end, steps, smooth, diverge)
    model = copy.deepcopy(model)
    tree = setup(rule, model)
    try:
        adjust(tree, start)
    except TypeError as err:
        err.add_note("lr_find sets the rate through each rule's eta: give it a rule that has "
                     "one, e.g. OptimiserChain(ClipGlobalNorm(1.0), AdamW())")
        raise
    lrs, losses, smoothed, average = [], [], [], 0.0
    rates = np.geomspace(start, end, steps).tolist()
    for i, lr in enumerate(rates):
        loss, grads = loss_and_grad(model, i)
        loss = float(loss.item() if hasattr(loss, "item") else loss)  # (torch: no warning)
        if not math.isfinite(loss):
            break
        average = smooth * average + (1 - smooth) * loss
        lrs.append(lr)
        losses.append(loss)
        smoothed.append(average / (1 - smooth ** (i + 1)))
        if smoothed[-1] - min(smoothed) > (diverge - 1) * abs(min(smoothed)):
            break
        tree, model = update(adjust(tree, lr), model, grads)
    if len(lrs) < 2:
        raise ValueError(f"lr_find recorded {len(lrs)} finite loss(es) before the loss was not "
                         f"finite at lr={rates[len(lrs)]:.3g}; lower start= (now {start:g})")
    return LRRange(lrs, losses, smoothed, _steepest(lrs, smoothed, steps // 10))


def _steepest(lrs: list[float], smoothed: list[float], skip: int) -> float:
    """The rate of the most negative slope of ``smoothed`` against ``log(lrs)``, leaving out
    the first ``skip`` and the last 5 points where enough remain (fastai's ``steep``)."""
    lo, hi = (skip, len(lrs) - 5) if len(lrs) - 5 - skip >= 2 else (0, len(lrs))
    slope = np.gradient(smoothed[lo:hi], np.log(lrs[lo:hi]))
    return lrs[lo + int(np.argmin(slope))]


def _check(start: float, end: float, steps: int, smooth: float, diverge: float) -> None:
    """Refuse an argument of :func:`lr_find` out of its range."""
    for name, ok, want, got in [("start", 0 < start < math.inf, "> 0", start),
                                ("end", start < end < math.inf, f"> start={start}", end),
                                ("steps", isinstance(steps, int) and steps >= 2, ">= 2", steps),
                                ("smooth", 0 <= smooth < 1, "in [0, 1)", smooth),
                                ("diverge", diverge > 1, "> 1", diverge)]:
        if not ok:
            raise ValueError(f"lr_find: {name} must be {want}, got {got!r}")
