"""The demo's command line: its arguments, and the run they ask for."""

from __future__ import annotations

import argparse
import os
import sys
import time

import optimisers
from optimisers.demo import comparison
from optimisers.demo.model import BACKENDS, HIDDEN, Backend
from optimisers.demo.tour import BATCH, TOUR_RULE, make_task, tour


def _steps(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 8:
        raise argparse.ArgumentTypeError(f"must be at least 8 (the run freezes, adjusts, "
                                          f"saves and thaws at its quarters), got {n}")
    return n


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser``."""
    parser.add_argument("--steps", type=_steps, default=2000, metavar="N",
                        help="training steps of each run (default: 2000; at least 8)")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="seed of the data, the initial weights and the minibatches "
                             "(default: 0)")
    parser.add_argument("--backend", choices=list(BACKENDS), default="numpy",
                        help="the array library and its gradients: numpy (hand-written "
                             "backward pass; the default), torch (torch.autograd) or jax "
                             "(jax.grad)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="write the loss curves of the compared rules to this image "
                             '(needs matplotlib: pip install "optimisers[plot]")')


def run(args: argparse.Namespace) -> int:
    """Run the demo with parsed ``args``; returns the exit status."""
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print('optimisers demo: --plot needs matplotlib, which is not installed; '
                  'install it with: pip install "optimisers[plot]"', file=sys.stderr)
            return 1
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):
            print(f"optimisers demo: --plot {args.plot}: there is no folder {folder}",
                  file=sys.stderr)
            return 2
    cls, pretty = BACKENDS[args.backend]
    try:
        bk = cls()
    except ImportError:
        print(f"optimisers demo: --backend {args.backend} needs {pretty}, which is not "
              f'installed; install it with: pip install "optimisers[{args.backend}]"',
              file=sys.stderr)
        return 1
    with bk:
        return _run(bk, args)


def _run(bk: Backend, args: argparse.Namespace) -> int:
    def out(line: str) -> None:
        print(line, flush=True)

    t0 = time.perf_counter()
    task = make_task(bk, args.steps, args.seed)
    h = HIDDEN
    out(f"optimisers {optimisers.__version__} demo, backend {bk.name} ({bk.how})")
    out(f"data: two interleaved spirals, {len(task.labels)} training and "
        f"{len(task.test_labels)} test points; model: an MLP 2-{h}-BatchNorm-{h}-{h}-1 with a "
        f"tied weight; {args.steps} steps of {BATCH} points; seed {args.seed}")
    out("\n== one run that shows every feature ==")
    tour(task, args.steps, out)
    out(f"\n== {len(comparison.COMPARED)} rules on the same task: the same initial weights "
        f"and batches ==")
    curves = comparison.compare(task, args.steps, out)
    if args.plot is not None:
        eta = TOUR_RULE.rules[2].eta  # per real step: one per two micro-batches
        lr = (list(range(args.steps)), [eta(i // 2) for i in range(args.steps)])
        comparison.plot(args.plot, curves,
                        f"optimisers demo: two spirals, {bk.name}, seed {args.seed}", lr)
        out(f"plot: wrote the loss curves of {len(curves)} rules and the tour's learning "
            f"rate to {args.plot}")
    out(f"done in {time.perf_counter() - t0:.1f} s")
    return 0
