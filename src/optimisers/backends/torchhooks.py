"""The step inside ``backward`` (PyTorch, opt-in): each parameter's post-accumulate-grad
hook steps its Leaf as soon as its gradient is whole and then frees the gradient, so that a
model's gradients never all exist at once."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from optimisers import state
from optimisers.keypath import getkeypath
from optimisers.reduce import places

__all__ = ["step_in_backward", "Hooks"]


class Hooks(NamedTuple):
    """What :func:`step_in_backward` registered, one handle a parameter."""

    handles: tuple

    def remove(self) -> None:
        """Take the hooks away: ``backward`` then leaves the gradients to ``update_``."""
        for handle in self.handles:
            handle.remove()


def step_in_backward(tree: Any, model: Any) -> Hooks:
    """step_in_backward(tree, model) -> hooks: from now on, each ``backward`` steps every
    trainable tensor of ``model`` as ``update_`` would, the moment its gradient is whole,
    and sets its ``.grad`` to ``None``.

    Peak memory drops by about the gradients' size (``benchmarks/README.md``). The steps
    are ``update_``'s bit for bit: the same tree, rules, schedules and checkpoints; under
    :class:`~optimisers.AccumGrad` a parameter steps on every ``n``-th backward. A tied
    tensor steps once, when its summed gradient is whole. The hooks step ``tree``'s own
    Leafs: change those in place (``adjust_``, ``freeze_``); a new tree (``adjust``, ``load``,
    ``reinit``) is not stepped until its own hooks replace these.

    Args:
        tree: the state tree from ``setup(rule, model)``.
        model: the ``torch.nn.Module`` (or tree of tensors) it was set up for.

    Returns:
        The :class:`Hooks`; ``hooks.remove()`` ends this.

    Raises:
        ValueError: a rule that needs every gradient before any step (``ClipGlobalNorm``,
            ``SkipNonFinite``), named with its path: use ``update_`` after ``backward``.

    Example:
        >>> import torch
        >>> from optimisers import Descent, setup
        >>> net = torch.nn.Linear(2, 1)
        >>> hooks = step_in_backward(setup(Descent(0.1), net), net)
        >>> before = net.weight.detach().clone()
        >>> net(torch.ones(1, 2)).sum().backward()
        >>> torch.allclose(net.weight, before - 0.1), net.weight.grad is None
        (True, True)
        >>> hooks.remove()
    """
    found: dict[int, tuple] = {}

    def note(kp: Any, x: Any) -> None:
        if isinstance(x, torch.Tensor) and x.requires_grad and id(x) not in found:
            found[id(x)] = (kp, x)

    state.walk_trainable(note, model)
    pairs = [(kp, getkeypath(tree, kp), x) for kp, x in found.values()]
    for kp, leaf, _ in pairs:  # (all checked before any hook is registered)
        if leaf is not None and places(leaf.rule):
            raise ValueError(
                f"step_in_backward cannot step {kp!r} alone: its rule {leaf.rule!r} holds "
                f"{places(leaf.rule)[0][1]!r}, which needs every gradient before any step; "
                f"call update_(tree, model) after backward instead")
    return Hooks(tuple(x.register_post_accumulate_grad_hook(_stepper(leaf))
                       for _, leaf, x in pairs if leaf is not None))


def _stepper(leaf: Any) -> Any:
    def step(x: torch.Tensor) -> None:
        state.update_(leaf, x, x.grad)
        x.grad = None

    return step
