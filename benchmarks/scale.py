"""Scaling of setup, update_, summary, save and load with the number of arrays.

Run: ``PYTHONPATH=src python benchmarks/scale.py [N ...]`` (default 5000 20000 50000).
Prints seconds per operation and microseconds per array; linear cost shows as a
constant per-array column (time(50k)/time(5k) about 10).
"""

import os
import sys
import tempfile
import time

import numpy as np

import optimisers as opt


def flat_model(n: int) -> dict:
    """A dict of ``n`` float32 arrays of 8 elements."""
    return {f"w{i}": np.ones(8, np.float32) for i in range(n)}


def nested_model(n: int) -> dict:
    """``n`` arrays in blocks of 10 layers, each a dict of a weight and a bias."""
    return {f"b{i}": [{"w": np.ones(4, np.float32), "b": np.ones(4, np.float32)}
                      for _ in range(5)] for i in range(n // 10)}


def timed(f, *args) -> tuple[float, object]:
    """Seconds of one call of ``f(*args)`` and its result."""
    t = time.perf_counter()
    out = f(*args)
    return time.perf_counter() - t, out


def bench(name: str, model: dict, rule: object, folder: str) -> None:
    """Print the five timings for one model and rule."""
    n = len(opt.fleaves(model)) if hasattr(opt, "fleaves") else len(model)
    grads = opt.fmap(lambda a: np.full_like(a, 0.1), model)
    t_setup, state = timed(opt.setup, rule, model)
    opt.update_(state, model, grads)
    t_update, _ = timed(opt.update_, state, model, grads)
    t_summary, _ = timed(opt.summary, state)
    path = os.path.join(folder, "ck.npz")
    t_save, _ = timed(opt.save, path, state)
    t_load, _ = timed(opt.load, path, state)
    row = {"setup": t_setup, "update_": t_update, "summary": t_summary,
           "save": t_save, "load": t_load}
    cells = "  ".join(f"{k} {v:7.3f}s {1e6 * v / n:6.1f}us" for k, v in row.items())
    print(f"{name:>22} N={n:6d}  {cells}", flush=True)


def main(sizes: list[int]) -> None:
    """Run every model and rule at every size."""
    rules = {"Adam": opt.Adam(1e-3),
             "Chain(ClipNorm,AdamW)": opt.OptimiserChain(opt.ClipNorm(1.0), opt.AdamW(1e-3))}
    with tempfile.TemporaryDirectory() as folder:
        for rname, rule in rules.items():
            for mname, make in (("flat", flat_model), ("nested", nested_model)):
                for n in sizes:
                    bench(f"{mname} {rname}", make(n), rule, folder)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [5000, 20000, 50000])
