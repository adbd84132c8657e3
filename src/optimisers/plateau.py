"""Plateau: a hyper-parameter reduced when a metric stops improving (torch's
``ReduceLROnPlateau``), fed by :func:`observe`. Its progress lives in its fields, so
checkpoints, ``adjust``, ``jit`` and the other schedules take it as any schedule."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optimisers import backends
from optimisers.adjust import Where, select
from optimisers.leaf import map_leaves
from optimisers.rules import Rule
from optimisers.rules.fields import hyperparameter
from optimisers.schedules import Schedule, rebuilt

__all__ = ["Plateau", "observe", "observe_"]

_CHOICES = {"threshold_mode": ("rel", "abs"), "mode": ("min", "max")}


def _whole(default: int) -> Any:
    return hyperparameter(default, "[0, inf)", kind="whole")


def _choice(default: str) -> Any:
    return dataclasses.field(default=default, metadata={"static": True})  # (jit: structure)


@dataclass(frozen=True, slots=True)
class Plateau(Schedule):
    """Plateau(value, *, factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
    cooldown=0, min=0.0, mode="min", epsilon=1e-8): ``value`` at every step, multiplied by
    ``factor`` (not below ``min``) each time the metric given to :func:`observe` has not
    improved for more than ``patience`` calls in a row; torch's ``ReduceLROnPlateau``.

    An observation improves on ``best`` (the best metric so far) when it is lower by more
    than ``threshold * |best|`` (``"rel"``) or ``threshold`` (``"abs"``); higher, with
    ``mode="max"``. Otherwise it counts as a bad epoch; after a reduction, ``cooldown``
    observations count none; a reduction smaller than ``epsilon`` is skipped. This is
    torch's arithmetic, value for value, with ``"abs"``, and with ``"rel"`` wherever ``best``
    is positive; where it is negative, torch's ``metric < best * (1 - threshold)`` (and
    optax's ``contrib.reduce_on_plateau``) takes a worse metric for an improvement, so a
    negative loss that stalls never plateaus there; here it does.

    Its progress is in its fields (``best``, ``bad_epochs``, ``cooldown_left``, the current
    ``value``): a checkpoint keeps them and resumes exactly, and under ``jax.jit`` they are
    data, so an observation does not re-trace. Inside ``Warmup``, ``Join`` or ``Scaled`` it
    composes as any schedule (the step count is theirs: a Plateau ignores it).

    Args:
        value: the starting value (>= 0), then the current one.
        factor: what a reduction multiplies the value by, in [0, 1).
        patience: how many bad epochs in a row are borne before a reduction.
        threshold: the least improvement that counts (>= 0).
        threshold_mode: ``"rel"`` (relative to ``|best|``) or ``"abs"``.
        cooldown: how many observations after a reduction count no bad epochs.
        min: the value is never reduced below this.
        mode: ``"min"`` (a loss: lower is better) or ``"max"`` (an accuracy).
        epsilon: the smallest reduction made; a smaller one is skipped.
        best: the best metric so far (``None``: none yet, stored as ``inf`` or ``-inf``).
        bad_epochs: the bad epochs since the last improvement or reduction.
        cooldown_left: the observations left in the cooldown.

    Example:
        >>> s = Plateau(1.0, factor=0.5, patience=1)
        >>> for loss in [3.0, 2.0, 2.0, 2.0, 2.0, 2.0]:
        ...     s = observe(s, loss)
        ...     print(s(0), end=" ")
        1.0 1.0 1.0 0.5 0.5 0.25
        >>> s.best, s.bad_epochs
        (2.0, 0)
    """

    value: float = hyperparameter(dataclasses.MISSING, "[0, inf)")
    _: dataclasses.KW_ONLY
    factor: float = hyperparameter(0.1, "[0, 1)")
    patience: int = _whole(10)
    threshold: float = hyperparameter(1e-4, "[0, inf)")
    threshold_mode: str = _choice("rel")
    cooldown: int = _whole(0)
    min: float = hyperparameter(0.0, "[0, inf)")
    mode: str = _choice("min")
    epsilon: float = hyperparameter(1e-8, "[0, inf)")
    best: float | None = hyperparameter(None, "[-inf, inf] or None")
    bad_epochs: int = _whole(0)
    cooldown_left: int = _whole(0)

    def __post_init__(self) -> None:
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"Invalid {name} parameter: {getattr(self, name)!r}; "
                                 f"Plateau's {name} must be {choices[0]!r} or {choices[1]!r}, "
                                 f"as torch's ReduceLROnPlateau's")
        Schedule.__post_init__(self)
        if self.best is None:  # no metric yet: the worst, as torch's
            object.__setattr__(self, "best", math.inf if self.mode == "min" else -math.inf)

    def __call__(self, t: Any) -> Any:
        return self.value

    def _improves(self, metric: float) -> bool:
        """Whether ``metric`` beats ``best`` by the threshold (torch's arithmetic where
        ``best`` is positive: ``best * (1 - threshold)``, the sign taken as a minimum)."""
        sign = 1.0 if self.mode == "min" else -1.0
        a, best = sign * metric, sign * self.best
        if self.threshold_mode == "abs":
            return a < best - self.threshold
        return a < best * (1.0 - math.copysign(self.threshold, best))

    def _observed(self, metric: float) -> Plateau:
        """The Plateau one metric further: torch's ``ReduceLROnPlateau.step(metric)``."""
        now = dataclasses.replace(self)  # (0-d arrays a jitted step returned: numbers)
        improved = now._improves(metric)
        bad = 0 if improved else now.bad_epochs + 1
        left, value = now.cooldown_left, now.value
        if left > 0:  # cooling down: no bad epochs
            bad, left = 0, left - 1
        if bad > now.patience:
            reduced = max(value * now.factor, now.min)
            value = reduced if value - reduced > now.epsilon else value
            bad, left = 0, now.cooldown
        return dataclasses.replace(now, value=value, best=metric if improved else now.best,
                                   bad_epochs=bad, cooldown_left=left)


def _number(metric: Any) -> float:
    """The metric as a Python float (a 0-d array's too); a ``TypeError`` for anything else."""
    if not (isinstance(metric, numbers.Real) and not isinstance(metric, bool) or (
            backends.library(metric) is not None and tuple(metric.shape) == ())):
        raise TypeError(f"observe's metric must be one real number (a float, or a 0-d array "
                        f"such as loss.item()'s tensor), got {type(metric).__name__} "
                        f"{metric!r:.60}")
    try:
        return float(metric)
    except TypeError as e:  # a value traced under jax.jit
        e.add_note("observe takes the metric's value: call it outside the jitted step")
        raise


def _advancer(metric: Any) -> tuple[Callable[[Any], Any], list]:
    """A function ``v -> v`` with each Plateau in it one ``metric`` further, made once per
    object (shared rules and schedules stay shared), and the list of Plateaus it advanced."""
    metric, made, plateaus = _number(metric), {}, []

    def advanced(v: Any) -> Any:  # a rule, or a schedule: through every field of either
        if id(v) not in made:
            made[id(v)] = rebuilt(v, advanced) if isinstance(v, Rule) else schedule(v)
        return made[id(v)]

    def schedule(s: Schedule) -> Schedule:
        if isinstance(s, Plateau):
            plateaus.append(s)
            return s._observed(metric)
        new = {f.name: rebuilt(getattr(s, f.name), advanced) for f in dataclasses.fields(s)}
        changed = {name: v for name, v in new.items() if v is not getattr(s, name)}
        return dataclasses.replace(s, **changed) if changed else s  # (Warmup, Join, Scaled)

    return advanced, plateaus


def _found(plateaus: list, where: Where) -> None:
    if not plateaus:
        chosen = "" if where is None else f" picked by where={where!r}"
        raise ValueError(f"observe found no Plateau in the rules{chosen}; give one a "
                         f"hyper-parameter such as Adam(eta=Plateau(1e-3, patience=5))")


def observe(tree: Any, metric: Any, *, where: Where = None) -> Any:
    """observe(tree, metric, where=None) -> a new tree with every :class:`Plateau` in its
    rules one metric further: torch's ``scheduler.step(metric)``.

    Every Plateau in the rules of the Leafs ``where`` picks (see
    :func:`~optimisers.select`) takes ``metric``: in any field, in chains and wrappers,
    inside ``Warmup``, ``Join`` and ``Scaled``. A rule or Plateau shared by Leafs is advanced
    once and stays shared; states are kept. Also works on a bare rule or schedule. Call it
    outside a jitted step, with the metric's value.

    Args:
        tree: a state tree from :func:`~optimisers.setup`, or a rule, or a schedule.
        metric: one real number (a float, or a 0-d NumPy, PyTorch or JAX array).
        where: which Leafs' rules observe it (``None``: all).

    Returns:
        The new tree (or rule, or schedule).

    Raises:
        TypeError: when ``metric`` is not one real number.
        ValueError: when no Plateau is found.

    Example:
        >>> from optimisers import Adam, Warmup, setup
        >>> tree = setup(Adam(Warmup(Plateau(1e-3, patience=0), steps=2)), {"w": np.ones(2)})
        >>> tree = observe(observe(tree, 2.0), 2.0)
        >>> tree["w"].rule.eta.schedule.value
        0.0001
    """
    advanced, plateaus = _advancer(metric)
    if isinstance(tree, (Rule, Schedule)):
        new = advanced(tree)
    else:
        ids = {id(leaf) for leaf in select(tree, where)}
        new = map_leaves(lambda leaf: type(leaf)(
            advanced(leaf.rule) if id(leaf) in ids else leaf.rule, leaf.state, leaf.frozen,
            leaf.clock), tree)
    _found(plateaus, where)
    return new


def observe_(tree: Any, metric: Any, *, where: Where = None) -> Any:
    """observe_(tree, metric, where=None) -> tree, each Plateau in its Leafs' rules one
    metric further, the Leafs changed in place.

    As :func:`observe`, but mutating the Leafs.

    Example:
        >>> from optimisers import Descent, setup
        >>> tree = setup(Descent(Plateau(0.1, factor=0.5, patience=1)), [np.ones(2)])
        >>> for loss in [1.0, 1.0, 1.0]:
        ...     _ = observe_(tree, loss)
        >>> tree[0].rule.eta.value, tree[0].rule.eta.best
        (0.05, 1.0)
    """
    advanced, plateaus = _advancer(metric)
    chosen = select(tree, where)
    new = [advanced(leaf.rule) for leaf in chosen]  # all made, then written
    _found(plateaus, where)
    for leaf, rule in zip(chosen, new):
        leaf.rule = rule
    return tree
