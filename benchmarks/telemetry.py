"""What ``update_(..., stats=True)`` costs on shape C (issue 30, item 1): a step with the
record against a step without, in one process, alternating, per library; and the cost
spread over a run that records one step in ``k``.

    python benchmarks/telemetry.py [--reps 7] [--libs numpy,torch,jax]
"""

from __future__ import annotations

import argparse
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from harness import SRC, load, numpy_model, shape_spec, tmap  # noqa: E402

sys.path.insert(0, str(SRC))
import optimisers as opt  # noqa: E402


def timed(step, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def steppers(lib: str, spec: dict) -> tuple:
    """``(step, recorded)``: an AdamW step on ``lib``'s arrays of ``spec``, and one with stats."""
    params, grads = numpy_model(spec, 0), numpy_model(spec, 1, grad=True)
    if lib == "torch":
        import torch
        params, grads = tmap(torch.from_numpy, params), tmap(torch.from_numpy, grads)
    if lib != "jax":
        tree = opt.setup(opt.AdamW(1e-3), params)
        return (lambda: opt.update_(tree, params, grads),
                lambda: opt.update_(tree, params, grads, stats=True))
    import jax
    params, grads = tmap(jax.numpy.asarray, params), tmap(jax.numpy.asarray, grads)
    box = [opt.setup(opt.AdamW(1e-3), params), params]
    plain = jax.jit(lambda t, m, g: opt.update(t, m, g), donate_argnums=(0, 1))
    rec = jax.jit(lambda t, m, g: opt.update(t, m, g, stats=True), donate_argnums=(0, 1))

    def run(f) -> None:
        out = f(box[0], box[1], grads)
        box[:] = out[:2]
        jax.block_until_ready(out)

    return lambda: run(plain), lambda: run(rec)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--libs", default="numpy,torch,jax")
    a = ap.parse_args()
    spec = shape_spec("C")
    print(f"shape C, AdamW, median of {a.reps} alternating steps (wall time); load {load()}")
    for lib in a.libs.split(","):
        step, recorded = steppers(lib, spec)
        for f in (step, recorded, step, recorded):
            f()
        base, withs = [], []
        for _ in range(a.reps):
            base += timed(step, 1)
            withs += timed(recorded, 1)
        b, w = sorted(base)[len(base) // 2], sorted(withs)[len(withs) // 2]
        cost = w / b - 1
        print(f"{lib:6}  step {b * 1e3:7.2f} ms  with stats {w * 1e3:7.2f} ms  "
              f"+{cost:.0%} a recorded step; one step in 10: +{cost / 10:.1%}, "
              f"in 100: +{cost / 100:.2%}")


if __name__ == "__main__":
    main()
