"""The demo's command line, and its run that shows every feature, one checked line each."""

from __future__ import annotations

import argparse
import copy
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import optimisers as opt
from optimisers.demo import comparison
from optimisers.demo import model as net
from optimisers.schedules import at

TOUR_RULE = opt.OptimiserChain(  # a step per two micro-batches, clipped, AdamW warmed up
    opt.AccumGrad(2), opt.ClipGlobalNorm(1.0),
    opt.AdamW(opt.Warmup(opt.Cosine(0.01, 0.001, 100), 10, 0.001), lambd=0.01))


def _steps(text: str) -> int:
    if not text.isdigit() or int(text) < 8:
        raise argparse.ArgumentTypeError(f"must be at least 8 (the run freezes, adjusts, "
                                          f"saves and thaws at its quarters), got {text!r}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser``."""
    parser.add_argument("--steps", type=_steps, default=2000, metavar="N",
                        help="training steps of each run (default: 2000; at least 8)")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="seed of the data, weights and minibatches (default: 0)")
    parser.add_argument("--backend", choices=list(net.Backend.KINDS), default="numpy",
                        help="gradients by hand in numpy (the default), by torch.autograd "
                             "or by jax.grad")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="write the loss curves of the compared rules to this image "
                             '(needs matplotlib: pip install "optimisers[plot]")')


def run(args: argparse.Namespace) -> int:
    """Run the demo with parsed ``args``; returns the exit status."""
    need = "matplotlib", "--plot", "plot"
    try:
        if args.plot is not None:
            import matplotlib  # noqa: F401

            folder = os.path.dirname(os.path.abspath(args.plot))
            if not os.path.isdir(folder):
                print(f"optimisers demo: --plot {args.plot}: there is no folder {folder}",
                      file=sys.stderr)
                return 2
        need = net.Backend.KINDS[args.backend][0], f"--backend {args.backend}", args.backend
        bk = net.Backend(args.backend)
    except ImportError:
        print(f"optimisers demo: {need[1]} needs {need[0]}, which is not installed; install "
              f'it with: pip install "optimisers[{need[2]}]"', file=sys.stderr)
        return 1
    try:
        out, t0, task = functools.partial(print, flush=True), time.perf_counter(), net.make_task(
            bk, args.steps, args.seed)
        out(f"optimisers {opt.__version__} demo, backend {bk.name} ({bk.how})")
        out(f"data: two interleaved spirals, {len(task.labels)} training and "
            f"{len(task.test_labels)} test points; model: an MLP 2-{net.HIDDEN}-BatchNorm-"
            f"{net.HIDDEN}-{net.HIDDEN}-1 with a tied weight; {args.steps} steps of {net.BATCH} "
            f"points; seed {args.seed}")
        out("\n== one run that shows every feature ==")
        tour(task, args.steps, out)
        out(f"\n== {len(comparison.COMPARED)} rules on the same task: the same initial weights "
            f"and batches ==")
        history: list = []  # (step, stats) of the AdamW run, recorded for --plot only
        curves = comparison.compare(task, args.steps, out,
                                    history if args.plot is not None else None)
        if args.plot is not None:
            eta = TOUR_RULE.rules[2].eta  # per real step: one per two micro-batches
            lr = range(args.steps), [eta(i // 2) for i in range(args.steps)]
            comparison.plot(args.plot, curves, f"optimisers demo: two spirals, {bk.name}, "
                            f"seed {args.seed}", lr, history)
            out(f"plot: wrote the loss curves of {len(curves)} rules and the tour's learning "
                f"rate to {args.plot}")
            out(f"plot: beside them, each layer's update/parameter ratio over the AdamW run "
                f"(update(..., stats=True) at {len(history)} of its steps)")
        out(f"done in {time.perf_counter() - t0:.1f} s")
        return 0
    finally:
        bk.close()


def _arrays(bk: net.Backend, *parts: Any) -> list[tuple]:
    """Every array in ``parts``, as NumPy dtype, shape and bytes."""
    return [(a.dtype, a.shape, a.tobytes()) for a in map(bk.numpy, (
        a for a in opt.fleaves(parts) if opt.isnumeric(a)))]


def tour(task: net.Task, steps: int, out: Callable[[str], None]) -> None:
    """Train once with :data:`TOUR_RULE`, printing a checked line per feature."""
    bk, eta, model = task.bk, TOUR_RULE.rules[2].eta, net.make_model(task.bk, task.init)
    tree = opt.setup(TOUR_RULE, model)
    out(f"rule: {TOUR_RULE!r}")
    out(f"schedule: eta = {eta!r} at each Leaf's clock (AccumGrad's real steps): "
        f"{eta(0):g} at 0, {eta(10):g} at 10, {eta(60):.4g} at 60; ClipGlobalNorm(1.0) "
        f"rescales all gradients of a step together")
    opt.adjust_(tree, where="*.bias", lambd=0.0)
    biases = [str(kp) for kp, _ in opt.trainables(model, path=True) if kp[-1] == "bias"]
    out(f"weight decay: adjust_(tree, where='*.bias', lambd=0.0) switches it off for "
        f"{', '.join(biases)}; the other Leafs keep lambd="
        f"{tree['head']['weight'].rule.rules[2].lambd}")
    mu0, var0 = (float(np.abs(bk.numpy(v)).mean()) for v in (model.norm.mu, model.norm.var))
    tree, model = _run_and_resume(task, steps, tree, model, out)
    mu1, var1 = (float(np.abs(bk.numpy(v)).mean()) for v in (model.norm.mu, model.norm.var))
    out(f"BatchNorm: trainable(model.norm) = {opt.trainable(model.norm)}; the state tree has mu: "
        f"{tree['norm']['mu']}, var: {tree['norm']['var']}, so no rule trains them, yet the "
        f"forward pass moved them: mean |mu| {mu0:.3f} -> {mu1:.3f}, mean var {var0:.3f} -> "
        f"{var1:.3f}")
    if bk.name == "jax":
        out("tied weight: JAX arrays are immutable, so optimisers never ties them by "
            "identity; here block2 reuses block1.weight in the forward pass, and jax.grad "
            "adds up both uses")
    else:
        out(f"tied weight: block1.weight is block2.weight, with one shared Leaf "
            f"({tree['block1']['weight'] is tree['block2']['weight']}) that gets the sum of "
            f"both paths' gradients; still one array after {steps} steps: "
            f"{model.block1.weight is model.block2.weight}")
    out(f"destructure(model): {len(opt.destructure(model)[1])} trainable numbers in one vector "
        f"(the tied weight once, the running statistics not at all)")
    out("summary(tree, model):")
    out(opt.summary(tree, model))


def _run_and_resume(task: net.Task, steps: int, tree: Any, model: net.MLP,
                    out: Callable[[str], None]) -> tuple[Any, net.MLP]:
    """The tour's run: AccumGrad, freeze_, adjust_, save, thaw_ at their steps; then the
    run resumed from the checkpoint, compared with it bit for bit."""
    freeze_at, adjust_at, thaw_at, new_eta = steps // 4, steps // 2, 3 * steps // 4, 0.003
    save_at = adjust_at | 1  # odd: half-way through an AccumGrad(2) cycle
    seen: dict[Any, Any] = {}

    def everything(tree: Any, model: net.MLP) -> list[tuple]:
        return _arrays(task.bk, model, [leaf.state for leaf in opt.select(tree)])

    def hook(i: int, tree: Any, model: net.MLP, say: Callable[[str], None]) -> None:
        if i < 3:  # AccumGrad(2): the first micro-batch of each pair moves nothing
            seen[i] = _arrays(task.bk, model.head)
            if i == 2:
                say(f"AccumGrad(2): after micro-batch 1 the weights are unchanged "
                    f"({seen[0] == seen[1]}); after micro-batch 2 they took one step with "
                    f"the mean gradient ({seen[1] != seen[2]})")
        if i == freeze_at:
            opt.freeze_(tree["encoder"])
            seen["encoder"] = _arrays(task.bk, model.encoder)
            say(f"freeze_: step {i}: freeze_(tree['encoder']) marks the encoder's Leafs "
                f"frozen; updates skip them")
        if i == adjust_at:
            leaf = tree["head"]["weight"]
            say(f"adjust_: step {i}: adjust_(tree, {new_eta}) puts a number in place of the "
                f"schedule, at {at(leaf.rule, leaf.clock).rules[2].eta:.4g} after "
                f"{leaf.clock} real steps, in every rule, keeping the optimiser state")
            opt.adjust_(tree, new_eta)
        if i == save_at:
            opt.save(ckpt, tree)
            seen["model"] = copy.deepcopy(model)  # ties kept
        if i == thaw_at:
            say(f"thaw_: step {i}: thaw_(tree['encoder']): the encoder trains again; it "
                f"did not move while frozen for {i - freeze_at} steps: "
                f"{seen['encoder'] == _arrays(task.bk, model.encoder)}")
            opt.thaw_(tree["encoder"])

    with tempfile.TemporaryDirectory(prefix="optimisers-demo-") as folder:
        ckpt = os.path.join(folder, "state.ckpt")
        tree, model = net.train(task, tree, model, 0, steps, "tour", hook)
        again = opt.load(ckpt, like=opt.setup(TOUR_RULE, seen["model"]))
        again = net.train(task, again, seen["model"], save_at, steps, "resumed",  # quiet
                          lambda i, *a: i > save_at and hook(i, *a[:2], lambda _: None))
        same = everything(tree, model) == everything(*again)
        out(f"checkpoint: save(path, tree) at step {save_at} (mid-accumulation, encoder "
            f"frozen, eta {new_eta}; {os.path.getsize(ckpt)} bytes, no pickle), load(path, "
            f"like=setup(rule, model)), {steps - save_at} more steps: "
            f"{len(everything(tree, model))} arrays "
            f"{'match' if same else 'MISMATCH'} the uninterrupted run bit for bit")
    return tree, model
