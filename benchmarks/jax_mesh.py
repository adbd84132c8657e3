"""One jitted, donated AdamW step on a JAX model sharded over a 4x2 mesh of 8 virtual CPU
devices, on the plain path (XLA's own fused elementwise kernels, each device stepping its
own shards).

    python benchmarks/jax_mesh.py [--arrays 8] [--steps 30] [--rounds 3]

Prints one markdown table: whether the parameters and states kept their shardings, the
median ms of a step (the median over ``--rounds`` rounds), and the first round's first
call (tracing and compiling; later rounds find XLA's compilation in JAX's cache).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import optimisers as O  # noqa: E402

SPECS = (P("data", "model"), P("model", None), P(None, "data"), P())


def model(mesh: Mesh, arrays: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(0)
    params, grads = {}, {}
    for i in range(arrays):
        where = NamedSharding(mesh, SPECS[i % len(SPECS)])
        params[f"w{i}"] = jax.device_put(rng.standard_normal((512, 1024), np.float32), where)
        grads[f"w{i}"] = jax.device_put(rng.standard_normal((512, 1024), np.float32), where)
    return params, grads


def run(path: str, mesh: Mesh, arrays: int, steps: int) -> tuple[bool, float, float]:
    params, grads = model(mesh, arrays)
    wanted = {k: v.sharding for k, v in params.items()}
    tree = O.setup(O.AdamW(1e-3, lambd=0.01), params)
    step = jax.jit(lambda t, m, g: O.update(t, m, g), donate_argnums=(0, 1))  # traced anew
    t = time.perf_counter()
    tree, params = step(tree, params, grads)
    jax.block_until_ready(params)
    compile_s = time.perf_counter() - t
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        tree, params = step(tree, params, grads)
        jax.block_until_ready(params)
        times.append(time.perf_counter() - t)
    kept = all(params[k].sharding.is_equivalent_to(s, 2) and all(
        a.sharding.is_equivalent_to(s, 2) for a in tree[k].state[:2])
        for k, s in wanted.items())
    return kept, 1e3 * statistics.median(times), compile_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    paths = {"plain path": lambda: None}
    print(f"{args.arrays} arrays of 512x1024 float32, AdamW, 4x2 mesh of CPU devices\n")
    print("| path | shardings kept | step, median ms | first call s |\n|---|---|---|---|")
    found: dict = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, prepare in paths.items():
            prepare()
            found[name].append(run(name, mesh, args.arrays, args.steps))
    for name, rows in found.items():
        kept = all(r[0] for r in rows)
        ms, first = statistics.median(r[1] for r in rows), rows[0][2]  # (later: cached)
        print(f"| {name} | {kept} | {ms:.2f} | {first:.2f} |")

if __name__ == "__main__":
    main()
