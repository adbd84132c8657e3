"""One-pass group steps for PyTorch tensors: the numba kernel of ``fast/kernels.py`` over
NumPy views of CPU tensors, and torch's own fused Adam kernel
(``torch.optim.Adam(fused=True)``'s), set up for a group.
"""

from __future__ import annotations

from typing import Any

import torch

from optimisers.fast import kernels, trace

COMPILED = True
"""Groups of large CPU tensors (:data:`COMPILED_FROM`) run the numba one-pass kernel
(``fast/kernels.py``) on their memory when numba is installed: faster than torch's fused Adam
on shape A (benchmarks/README.md), and it serves every rule with a program. ``False``
leaves them to torch's own kernels."""

COMPILED_FROM = 1 << 14
"""Tensors must average this many elements for :data:`COMPILED`: below it the per-tensor
NumPy views and version bumps cost more than torch's fused Adam kernel saves
(benchmarks/README.md)."""


def onepass(rule: Any, sig: Any, xs: list, arrays: list) -> Any:
    """A one-pass step for a whole group, or ``None``: the numba kernel on CPU tensors
    (:func:`_compiled`), else, for Adam and AdamW, torch's own fused kernel
    (:func:`_fused_adam`). The step has a ``kind``: ``"compiled"`` or ``"fused_adam"``."""
    return (_compiled(rule, sig, xs, arrays) if COMPILED else None) or _fused_adam(
        rule, sig, xs, arrays)


def _compiled(rule: Any, sig: Any, xs: list, arrays: list) -> Any:
    """The NumPy backend's numba kernel over NumPy views of the group's CPU tensors, or
    ``None``. Its constants come from Python-float hyper-parameters, as this backend's
    plain path has them; it agrees with that path to rounding (torch divides by a scalar
    as a multiplication by its reciprocal). Writing memory behind torch's back, it then
    bumps each written tensor's version counter, as torch's own in-place operations do,
    so that autograd still sees the change. (A tensor whose memory is replaced since,
    ``p.data = ...``, ends the group: ``fused.Group.moved``.)"""
    written = [*xs, *(a for member in arrays for a in member)]
    if not kernels.available() or sum(x.numel() for x in xs) < COMPILED_FROM * len(xs) or not all(
            _viewable(t) and t.dtype in (torch.float32, torch.float64) for t in written):
        return None
    inner = kernels.onepass(rule, sig, [x.detach().numpy() for x in xs],
                            [[a.detach().numpy() for a in member] for member in arrays],
                            scalars=float)  # hyper-parameters as this backend's hyper has them
    if inner is None:
        return None
    bump = torch.autograd.graph.increment_version

    def step(grads: list, sig: Any, rule: Any) -> Any:
        if not all(map(_viewable, grads)):
            grads = [g.to_dense().resolve_conj().resolve_neg().cpu() for g in grads]
        after = inner([g.detach().numpy() for g in grads], sig, rule)
        bump(written)
        return after

    step.kind = "compiled"
    return step


def _viewable(t: torch.Tensor) -> bool:
    """Whether ``t.detach().numpy()`` is a view of ``t``'s memory, values as they read."""
    return (t.device.type == "cpu" and t.layout == torch.strided and not t.is_conj()
            and not t.is_neg())


def _fused_adam(rule: Any, sig: Any, xs: list, arrays: list) -> Any:
    """A step running a whole Adam or AdamW group in torch's fused kernel, or ``None``.

    The kernel is torch's own (``torch.optim.Adam(fused=True)``): it computes the same
    formula in a different order of operations, so it agrees with the plain path to
    rounding, not bit for bit; tests check it to float32 rounding. Used only where it can
    express the step exactly: float32 or float64 contiguous tensors, Python-number
    hyper-parameters, and a step count below 2^24 (the kernel reads it as float32).
    """
    kernel = _AdamKernel.make(rule, xs, arrays)
    program = trace.trace(rule, sig) if kernel is not None else None
    if program is None:
        return None
    scalars, last = trace.stepper(program, float), [rule, trace.numbers(rule)]

    def step(grads: list, sig: Any, now: Any) -> Any:
        args = _adam_scalars(now, sig[2]) if _AdamKernel.takes(now) else None
        if args is None:  # bias corrections the kernel cannot take: the group's other path
            return NotImplemented
        kernel(grads, now, *args)
        if now is not last[0]:  # a schedule's new values
            last[:] = now, trace.numbers(now)
        return scalars(last[1], sig)[1]

    step.kind, step.kernel = "fused_adam", kernel
    return step


SERIAL_BELOW = 4096
"""On CPU, groups whose tensors average fewer elements than this run the kernel on one
thread: it would start a parallel region per tensor, which costs more than it saves."""


class _AdamKernel:
    """torch's fused Adam kernel set up for one group."""

    __slots__ = ("xs", "ms", "vs", "steps", "serial")

    @classmethod
    def make(cls, rule: Any, xs: list, arrays: list) -> _AdamKernel | None:
        from optimisers.rules import Adam, AdamW

        if type(rule) not in (Adam, AdamW) or not hasattr(torch, "_fused_adam_") or not (
                cls.takes(rule)):
            return None
        x0 = xs[0]
        if x0.dtype not in (torch.float32, torch.float64) or x0.device.type not in (
                "cpu", "cuda"):
            return None
        ms, vs = [a[0] for a in arrays], [a[1] for a in arrays]
        if not all(t.dtype == x0.dtype and t.device == x0.device and t.is_contiguous()
                   for t in (*xs, *ms, *vs)) or not all(
                m.numel() == x.numel() == v.numel() for x, m, v in zip(xs, ms, vs)):
            return None  # the kernel indexes each state by its parameter's size
        return cls(xs, ms, vs)

    @staticmethod
    def takes(rule: Any) -> bool:
        """Whether the kernel can take the rule's numbers: Python numbers, all."""
        fields = (rule.eta, *rule.beta, rule.epsilon, getattr(rule, "lambd", 0.0))
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in fields)

    def __init__(self, xs: list, ms: list, vs: list) -> None:
        self.xs, self.ms, self.vs = list(xs), ms, vs
        self.steps = [torch.zeros((), dtype=torch.float32, device=xs[0].device)] * len(xs)
        self.serial = xs[0].device.type == "cpu" and (
            sum(x.numel() for x in xs) < SERIAL_BELOW * len(xs))

    def __call__(self, grads: list, rule: Any, lr: float, step: float, wd: float) -> None:
        if not _dense(grads):
            grads = [g.to_dense().contiguous() for g in grads]
        self.steps[0].fill_(step)  # the same tensor for all: the kernel only reads it
        fn = torch._fused_adamw_ if wd else torch._fused_adam_  # wd: AdamW's decay only
        threads = torch.get_num_threads() if self.serial else 1
        if threads > 1:
            torch.set_num_threads(1)
        try:
            fn(self.xs, grads, self.ms, self.vs, [], self.steps, lr=lr,
               beta1=float(rule.beta[0]), beta2=float(rule.beta[1]), weight_decay=wd,
               eps=float(rule.epsilon), amsgrad=False, maximize=False)
        finally:
            if threads > 1:
                torch.set_num_threads(threads)


def _dense(grads: list) -> bool:
    """Whether all ``grads`` are dense contiguous tensors, as the kernel needs them."""
    try:
        return all(map(torch.Tensor.is_contiguous, grads))
    except RuntimeError:  # a sparse gradient
        return False


def _adam_scalars(rule: Any, t: Any) -> tuple | None:
    """``(lr, step, weight_decay)`` for torch's kernel so that its step is ours:
    ``eta * m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps)`` (plus AdamW's decay), or ``None``.
    The kernel's bias corrections are ours (the current betas to the power of the step
    count, which it reads as float32: exact below 2^24)."""
    if not (isinstance(t, float) and 0 <= t < 2**24 - 1):
        return None
    lr, step = float(rule.eta), t + 1
    lambd = float(getattr(rule, "lambd", 0.0))
    if not lambd:
        return lr, step, 0.0
    if lr <= 0:
        return None
    # AdamW: the kernel multiplies x by 1 - lr*wd before the step
    return lr, step, (lr * lambd if rule.couple else lambd) / lr
