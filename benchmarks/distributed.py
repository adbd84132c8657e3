"""Optimiser state per process and the optimiser step's time on 2 gloo processes (CPU):
AdamW of `optimisers` against `torch.optim.AdamW` on an FSDP2 model, and ZeRO-1
(`optimisers.distributed`) against `torch.distributed.optim.ZeroRedundancyOptimizer` on a
DistributedDataParallel one.

    python benchmarks/distributed.py [--width 1024] [--steps 20]

Prints one markdown table: per row, the state bytes each process holds and the median ms
of the step (gradients made once, reused: the step alone is timed), rank 0's and rank 1's.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import optimisers as O  # noqa: E402


def model(width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 256))


def state_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def ours_bytes(tree) -> int:
    return state_bytes(a for _, leaf in O.state.leaves(tree) for a in O.fleaves(leaf.state)
                       if isinstance(a, torch.Tensor))


def torch_bytes(opt) -> int:
    opt = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer: its local optimiser's
    return state_bytes(v for s in opt.state.values() for v in s.values()
                       if isinstance(v, torch.Tensor) and v.dim() > 0)


def timed(step, steps: int) -> float:
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def grads_once(m: nn.Module) -> None:
    g = torch.Generator().manual_seed(dist.get_rank())
    m(torch.randn(32, 256, generator=g)).pow(2).mean().backward()


def rows(width: int, steps: int) -> list:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from optimisers import distributed

    def sharded():
        m = model(width)
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        return fully_shard(m)

    out = []
    m = sharded()
    grads_once(m)
    tree = O.setup(O.AdamW(1e-3, lambd=0.01), m)
    out.append(("FSDP2, optimisers AdamW", ours_bytes(tree), timed(lambda: O.update_(tree, m),
                                                                  steps)))
    m = sharded()
    grads_once(m)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
    ms = timed(opt.step, steps)
    out.append(("FSDP2, torch.optim.AdamW", torch_bytes(opt), ms))
    m = nn.parallel.DistributedDataParallel(model(width))
    grads_once(m)
    tree = O.setup(O.AdamW(1e-3, lambd=0.01), m)
    out.append(("DDP, optimisers AdamW", ours_bytes(tree), timed(lambda: O.update_(tree, m),
                                                                steps)))
    tree = distributed.setup(O.AdamW(1e-3, lambd=0.01), m)
    out.append(("DDP, optimisers.distributed (ZeRO-1)", ours_bytes(tree),
                timed(lambda: distributed.update_(tree, m), steps)))
    opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3,
                                  weight_decay=0.01)
    ms = timed(opt.step, steps)
    out.append(("DDP, ZeroRedundancyOptimizer", torch_bytes(opt), ms))
    return out


def worker(rank: int, world: int, port: int, width: int, steps: int, path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    got = rows(width, steps)
    every = [None] * world
    dist.all_gather_object(every, got)
    if rank == 0:
        lines = ["| 2 gloo processes, CPU | state MiB, rank 0 / 1 | step ms, rank 0 / 1 |",
                 "|---|---|---|"]
        for i, (name, _, _) in enumerate(got):
            mib = " / ".join(f"{r[i][1] / 2**20:.1f}" for r in every)
            ms = " / ".join(f"{r[i][2]:.1f}" for r in every)
            lines.append(f"| {name} | {mib} | {ms} |")
        Path(path).write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"optimisers-distributed-{os.getpid()}.md"
    torch.multiprocessing.spawn(worker, args=(2, port, args.width, args.steps, str(out)),
                                nprocs=2)
    params = sum(p.numel() for p in model(args.width).parameters())
    print(f"{params:,} parameters, float32; AdamW's state is 2 arrays of each\n")
    print(out.read_text(), end="")
    out.unlink()


if __name__ == "__main__":
    main()
