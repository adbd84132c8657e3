"""Adam and AdamW (``couple=True``) groups of float32 or float64 tensors, alone or after
:class:`~optimisers.ClipGlobalNorm`, through torch.optim's public ``adam`` (fused on CPU
and CUDA, else foreach); equal to the rule's ``apply`` to rounding. The Leafs' states stay
``Adam.init``'s; the group also keeps the count as the tensors torch advances.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import torch
from torch.optim.adam import adam

from optimisers import backends
from optimisers.rules import Adam, AdamW, OptimiserChain
from optimisers.rules.tree import ClipGlobalNorm

__all__ = ["native", "takes", "Native"]

FLOATS = (torch.float32, torch.float64)
FUSED = ("cpu", "cuda")  # devices where torch.optim's Adam offers fused=True
tb = backends.ops("torch")


def native(rule: Any, sig: Any, xs: list, arrays: list) -> Native | None:
    """native(rule, sig, xs, arrays) -> a :class:`Native` stepping the group of tensors
    ``xs`` (state arrays ``arrays``, signature ``sig``), or ``None`` where torch's Adam
    does not compute ``rule``'s formula."""
    clip, x0 = _clipped(rule), xs[0]
    if not takes(rule) or x0.dtype not in FLOATS:
        return None
    inner_sig = sig[1] if clip else sig
    if not isinstance(inner_sig, tuple) or len(inner_sig) != 3 or type(inner_sig[2]) not in (
            int, float) or not all(
            type(x) in (torch.Tensor, torch.nn.Parameter) and x.dtype == x0.dtype
            and x.device == x0.device and not x.is_sparse and x.is_contiguous() for x in xs
    ) or not all(a.is_contiguous() for state in arrays for a in state):
        return None  # (torch's kernel walks each tensor's memory in order)
    return Native(clip, inner_sig[2], xs, arrays)


def takes(rule: Any) -> bool:
    """Whether torch's Adam computes ``rule``'s formula (Adam, AdamW decoupled or without
    decay, alone or after ClipGlobalNorm of p = 2), whatever the tensors."""
    inner = rule.rules[1] if _clipped(rule) else rule
    return type(inner) is Adam or type(inner) is AdamW and (inner.couple or inner.lambd == 0)


def _clipped(rule: Any) -> bool:
    return type(rule) is OptimiserChain and len(rule.rules) == 2 and isinstance(
        rule.rules[0], ClipGlobalNorm) and rule.rules[0].p == 2


class Native:
    """One group's step through ``torch.optim.adam.adam``: over its tensors, or (many small
    ones on the CPU, :data:`SMALL`) over flat buffers."""

    __slots__ = ("clip", "xs", "ms", "vs", "steps", "kind", "gbuf", "gviews", "flat")

    def __init__(self, clip: bool, count: float, xs: list, arrays: list) -> None:
        x0 = xs[0]
        self.clip = clip
        self.xs = [x.detach() for x in xs]  # (plain tensors: no Parameter dispatch per call)
        self.ms, self.vs = [a[0] for a in arrays], [a[1] for a in arrays]
        self.kind = {"fused": True} if x0.device.type in FUSED else {"foreach": True}
        sizes = [x.numel() for x in xs]
        self.flat = _flat(xs, self.ms, self.vs, sizes)
        one = torch.tensor(float(count), dtype=torch.float32, device=x0.device)
        self.steps = [one] if self.flat else [one.clone() for _ in xs]
        self.gbuf = self.gviews = None
        if clip or self.flat:
            self.gbuf = torch.empty(sum(sizes), dtype=x0.dtype, device=x0.device)
            self.gviews = [v.view_as(x) for v, x in zip(self.gbuf.split(sizes), xs)]

    def step(self, now: Any, grads: list) -> bool:
        """One step of the rule ``now``; ``False`` (nothing done) unless its numbers are plain."""
        rule, scale = (now.rules[1], _scale(now.rules[0], self.gbuf)) if self.clip else (
            now, 1.0)
        hypers = (rule.eta, *rule.beta, rule.epsilon, getattr(rule, "lambd", 0.0))
        if not all(type(h) in (float, int) for h in hypers) or scale is False:
            return False
        eta, b1, b2, eps, lambd = map(float, hypers)
        mul = _scaling(scale)
        ps, ms, vs = self.xs, self.ms, self.vs
        if self.flat:
            xbuf, m, v, xviews, vectors = self.flat
            # (without decay, the step taken from zeros is added to each below)
            _cat(self.xs, xbuf, vectors) if lambd else xbuf.zero_()
            _cat(grads, self.gbuf, vectors)  # (shaped as the parameters: checked)
            ps, grads, ms, vs = [xbuf], [self.gbuf], [m], [v]
            if mul is not None:
                self.gbuf.mul_(mul)
        elif mul is not None:  # scaled into a copy: the user's gradients kept
            for g, into in zip(grads, self.gviews):
                torch.mul(g, mul, out=into)
            grads = self.gviews
        else:  # (laid out as the parameters)
            grads = list(map(torch.Tensor.contiguous, grads))
        adam(ps, grads, ms, vs, [], self.steps, decoupled_weight_decay=lambd != 0,
             amsgrad=False, beta1=b1, beta2=b2, lr=eta, weight_decay=lambd, eps=eps,
             maximize=False, **self.kind)
        if self.flat:
            (torch._foreach_copy_ if lambd else torch._foreach_add_)(self.xs, xviews)
        return True

    def moved(self, params: list) -> bool:
        """Whether a parameter is not the tensor stepped (storage, offset, shape, strides)."""
        return not all(map(torch.Tensor.is_set_to, params, self.xs))

    def states(self, sig: Any) -> list:
        """Each member's new state: its moments, and the count in ``sig``."""
        if self.clip:
            head, (_, _, t) = sig
            return list(zip(repeat(head), zip(self.ms, self.vs, repeat(t))))
        return list(zip(self.ms, self.vs, repeat(sig[2])))


SMALL = (64, 8192)
"""A CPU group of at least this many tensors averaging at most this many elements steps
over flat buffers (benchmarks/README.md)."""


def _flat(xs: list, ms: list, vs: list, sizes: list) -> tuple | None:
    """``(xbuf, m, v, views of xbuf, all 1-d)`` for many small CPU tensors, else ``None``."""
    if xs[0].device.type != "cpu" or len(xs) < SMALL[0] or sum(sizes) > SMALL[1] * len(xs):
        return None  # (on a GPU, torch's fused kernel takes many tensors a launch)
    (m, packed_m), (v, packed_v) = tb.joined(tuple(ms)), tb.joined(tuple(vs))
    if not (packed_m and packed_v):
        return None
    xbuf = torch.empty_like(m)
    return (xbuf, m, v, [y.view_as(x) for y, x in zip(xbuf.split(sizes), xs)],
            all(x.dim() == 1 for x in xs))


def _cat(arrays: list, into: Any, vectors: bool) -> None:
    """The tensors (``vectors``: all 1-d), flattened, one after another into ``into``."""
    torch.cat(arrays if vectors else [a.reshape(-1) for a in arrays], out=into)


def _scaling(scale: Any) -> Any:
    """ClipGlobalNorm's factor ``scale``, or ``None`` where it is exactly 1 (read on the CPU
    only: no wait for a device), the gradients then stepped as they are."""
    on_cpu = isinstance(scale, torch.Tensor) and scale.device.type == "cpu"
    plain = scale.item() if on_cpu else scale
    return None if isinstance(plain, float) and plain == 1.0 else scale


def _scale(clipped: Any, like: Any) -> Any:
    """ClipGlobalNorm's factor for gradients like ``like``; ``False`` where not a number."""
    factor = getattr(clipped, "factor", None)
    if isinstance(factor, torch.Tensor) and factor.dim() == 0:
        return factor.to(device=like.device, dtype=like.dtype)
    return float(factor) if type(factor) in (float, int) else False  # (1.0: not clipped)
