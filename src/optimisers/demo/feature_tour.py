"""The demo's feature tour: one printed line for each feature the library has, each checked."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from optimisers import (
    AccumGrad,
    AdamW,
    ClipGlobalNorm,
    Cosine,
    OptimiserChain,
    Warmup,
    adjust_,
    destructure,
    freeze_,
    load,
    save,
    setup,
    summary,
    thaw_,
    trainable,
    trainables,
)
from optimisers.demo.model import (
    MLP,
    make_model,
)
from optimisers.demo.training import (
    Progress,
    Task,
    arrays_of,
    identical,
    load_model,
    save_model,
    train,
)
from optimisers.schedules import at

TOUR_RULE = OptimiserChain(AccumGrad(2), ClipGlobalNorm(1.0),
                           AdamW(Warmup(Cosine(0.01, 0.001, 100), 10, 0.001), lambd=0.01))
"""The tour's rule: one step per two micro-batches, all gradients clipped together to
norm 1, and AdamW whose learning rate warms up from 0.001 over 10 real steps, then decays on a half
cosine over 100 (the clock counts AccumGrad's real steps)."""




class Tour:
    """The run that shows every feature: what happens at which step, and its lines."""

    def __init__(self, task: Task, steps: int, folder: str, out: Callable[[str], None]):
        self.task, self.steps, self.out = task, steps, out
        self.freeze_at, self.adjust_at, self.thaw_at = steps // 4, steps // 2, 3 * steps // 4
        self.save_at = self.adjust_at | 1  # odd: half-way through an AccumGrad(2) cycle
        self.eta = 0.003
        self.ckpt = os.path.join(folder, "state.ckpt")
        self.weights = os.path.join(folder, "model.npz")
        self.seen: dict[Any, Any] = {}

    def snap(self, model: MLP, *layers: str) -> list[np.ndarray]:
        bk = self.task.bk
        return [bk.numpy(a).copy() for n in layers for a in vars(getattr(model, n)).values()]

    def hook(self, i: int, tree: Any, model: MLP, bar: Progress, quiet: bool = False) -> None:
        say = (lambda line: None) if quiet else bar.write
        if i < 3:  # AccumGrad(2): the first micro-batch of each pair moves nothing
            self.seen[i] = self.snap(model, "head")
        if i == 2:
            same = identical(self.seen[0], self.seen[1])
            moved = not identical(self.seen[1], self.seen[2])
            say(f"AccumGrad(2): after micro-batch 1 the weights are unchanged ({same}); "
                f"after micro-batch 2 they took one step with the mean gradient ({moved})")
        if i == self.freeze_at:
            freeze_(tree["encoder"])
            self.seen["encoder"] = self.snap(model, "encoder")
            say(f"freeze_: step {i}: freeze_(tree['encoder']) marks the encoder's Leafs "
                f"frozen; updates skip them")
        if i == self.adjust_at:
            leaf = tree["head"]["weight"]
            old = at(leaf.rule, leaf.clock).rules[2].eta
            adjust_(tree, self.eta)
            say(f"adjust_: step {i}: adjust_(tree, {self.eta}) puts a number in place of "
                f"the schedule, at {old:.4g} after {leaf.clock} real steps, in every rule, "
                f"keeping the optimiser state")
        if i == self.save_at and not quiet:
            save(self.ckpt, tree)
            save_model(self.weights, self.task.bk, model)
        if i == self.thaw_at:
            thaw_(tree["encoder"])
            if not quiet:
                still = identical(self.seen["encoder"], self.snap(model, "encoder"))
                say(f"thaw_: step {i}: thaw_(tree['encoder']): the encoder trains again; it "
                    f"did not move while frozen for {i - self.freeze_at} steps: {still}")

    def resume(self, tree: Any, model: MLP) -> None:
        """Train again from the checkpoint, in fresh objects; compare with the run."""
        bk = self.task.bk
        m2 = load_model(self.weights, bk, make_model(bk, self.task.init))
        t2 = load(self.ckpt, like=setup(TOUR_RULE, m2))
        t2, m2 = train(self.task, t2, m2, self.save_at, self.steps, "resumed",
                       lambda i, *a: i > self.save_at and self.hook(i, *a, quiet=True))
        a, b = arrays_of(bk, tree, model), arrays_of(bk, t2, m2)
        self.out(f"checkpoint: save(path, tree) at step {self.save_at} (mid-accumulation, "
                 f"encoder frozen, eta {self.eta}; {os.path.getsize(self.ckpt)} bytes, no "
                 f"pickle), load(path, like=setup(rule, model)), {self.steps - self.save_at} "
                 f"more steps: {len(a)} arrays {'match' if identical(a, b) else 'MISMATCH'} "
                 f"the uninterrupted run bit for bit")


def tour(task: Task, steps: int, out: Callable[[str], None]) -> None:
    bk = task.bk
    model = make_model(bk, task.init)
    tree = setup(TOUR_RULE, model)
    out(f"rule: {TOUR_RULE!r}")
    eta = TOUR_RULE.rules[2].eta
    out(f"schedule: eta = {eta!r} at each Leaf's clock (AccumGrad's real steps): "
        f"{eta(0):g} at 0, {eta(10):g} at 10, {eta(60):.4g} at 60; ClipGlobalNorm(1.0) "
        f"rescales all gradients of a step together")
    adjust_(tree, where="*.bias", lambd=0.0)
    biases = [str(kp) for kp, _ in trainables(model, path=True) if kp[-1] == "bias"]
    out(f"weight decay: adjust_(tree, where='*.bias', lambd=0.0) switches it off for "
        f"{', '.join(biases)}; the other Leafs keep lambd="
        f"{tree['head']['weight'].rule.rules[2].lambd}")
    mu0, var0 = (float(np.abs(bk.numpy(v)).mean()) for v in (model.norm.mu, model.norm.var))
    with tempfile.TemporaryDirectory(prefix="optimisers-demo-") as folder:
        t = Tour(task, steps, folder, out)
        tree, model = train(task, tree, model, 0, steps, "tour", t.hook)
        t.resume(tree, model)
    bn, nt = model.norm, tree["norm"]
    mu1, var1 = (float(np.abs(bk.numpy(v)).mean()) for v in (bn.mu, bn.var))
    out(f"BatchNorm: trainable(model.norm) = {trainable(bn)}; the state tree has mu: "
        f"{nt['mu']}, var: {nt['var']}, so no rule trains them, yet the forward pass moved "
        f"them: mean |mu| {mu0:.3f} -> {mu1:.3f}, mean var {var0:.3f} -> {var1:.3f}")
    if bk.name == "jax":
        out("tied weight: JAX arrays are immutable, so optimisers never ties them by "
            "identity; here block2 reuses block1.weight in the forward pass, and jax.grad "
            "adds up both uses")
    else:
        shared = tree["block1"]["weight"] is tree["block2"]["weight"]
        tied = model.block1.weight is model.block2.weight
        out(f"tied weight: block1.weight is block2.weight, with one shared Leaf ({shared}) "
            f"that gets the sum of both paths' gradients; still one array after {steps} "
            f"steps: {tied}")
    flat, re = destructure(model)
    out(f"destructure(model): {len(re)} trainable numbers in one vector (the tied weight "
        f"once, the running statistics not at all)")
    out("summary(tree, model):")
    out(summary(tree, model))
