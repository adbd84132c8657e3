"""Steady-state torch steps, many interleaved rounds: ours against torch.optim on the CPU.

``gpu.py --device cpu`` times 2-3 steps a row on the CPU, too few on a shared machine;
this times ``--steps`` interleaved rounds (after 3 warm-up steps) of each pair and prints
the median and the minimum of each side, their ratios, and the median of each round's ratio:

- ``gpt4-clip``: ``OptimiserChain(ClipGlobalNorm(1.0), AdamW(1e-3, lambd=0.01))`` on the
  52-array GPT-like tree of ``harness.small_gpt(4)`` against ``clip_grad_norm_(foreach=True)``
  and ``torch.optim.AdamW(fused=True)``;
- ``C-clip``: the same on shape C (100 arrays, 23.6M parameters);
- ``gpt2``: ``AdamW`` alone on ``small_gpt(2)`` (28 arrays) against ``AdamW(fused=True)``;
- ``B``: ``Adam(1e-3)`` on 2,000 vectors of 512 against ``Adam(fused=True)``;
- ``gpt2-module``, ``B-module``: the same as an ``nn.Module`` (``contestants.torch_module``)
  read through ``.grad``, against ours on the tensors.

Usage: ``PYTHONPATH=src python benchmarks/torch_steady.py [--steps 40] [--only gpt4-clip,B]
[--cpu-time]`` (one thread: ``torch.set_num_threads(1)``; ``--cpu-time`` times each step by
this thread's CPU time rather than the wall clock, which on a loaded machine counts the
waits for a core too).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contestants  # noqa: E402
import harness  # noqa: E402

import optimisers as o  # noqa: E402


def pair(case: str) -> tuple:
    """``(ours, peer)``: two functions, one step each."""
    g = torch.Generator().manual_seed(0)
    tree_shape = [(512,)] * 2000 if case.startswith("B") else harness.shape_spec(
        "C") if case.startswith("C") else harness.small_gpt(4 if case == "gpt4-clip" else 2)
    shapes = harness.tleaves(tree_shape)
    xs = [torch.randn(s, generator=g) * 0.02 for s in shapes]
    gs = [torch.randn(s, generator=g) for s in shapes]
    rule = o.Adam(1e-3) if case.startswith("B") else o.AdamW(1e-3, lambd=0.01)
    if case.endswith("-clip"):
        rule = o.OptimiserChain(o.ClipGlobalNorm(1.0), rule)
    ps = [torch.nn.Parameter(x.clone()) for x in xs]
    for p, gr in zip(ps, gs):
        p.grad = gr.clone()
    tree = o.setup(rule, xs)

    def ours() -> None:
        o.update_(tree, xs, gs)

    if case.endswith("-module"):
        it = iter(ps)
        module = contestants.torch_module(torch, harness.tmap(lambda s: next(it), tree_shape))
        mtree = o.setup(rule, module)
        return (lambda: o.update_(mtree, module)), ours
    opt = (torch.optim.Adam(ps, lr=1e-3, fused=True) if case.startswith("B") else
           torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True))

    def peer() -> None:
        if case.endswith("-clip"):
            torch.nn.utils.clip_grad_norm_(ps, 1.0, foreach=True)
        opt.step()

    return ours, peer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--only", default="gpt4-clip,gpt2,gpt2-module,B,B-module")
    p.add_argument("--cpu-time", action="store_true",
                   help="time by this thread's CPU time (time.thread_time)")
    a = p.parse_args()
    clock = time.thread_time if a.cpu_time else time.perf_counter
    torch.set_num_threads(1)
    for case in a.only.split(","):
        fns = pair(case)
        times: list[list[float]] = [[], []]
        for _ in range(3):
            for f in fns:
                f()
        for _ in range(a.steps):
            for t, f in zip(times, fns):
                start = clock()
                f()
                t.append(clock() - start)
        med = [statistics.median(t) * 1e3 for t in times]
        low = [min(t) * 1e3 for t in times]
        each = statistics.median(a / b for a, b in zip(*times))  # (a round's pair: one load)
        print(f"{case}: median {med[0]:.2f} / {med[1]:.2f} ms = {med[0] / med[1]:.2f}; "
              f"min {low[0]:.2f} / {low[1]:.2f} ms = {low[0] / low[1]:.2f}; "
              f"median of each round's ratio {each:.2f}")


if __name__ == "__main__":
    main()
