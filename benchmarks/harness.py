"""The benchmark's harness: the model shapes, the timing of rows side by side, and what
the machine was doing meanwhile (used by ``run.py``)."""

from __future__ import annotations

import gc
import os
import platform
import random
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

LR = 1e-3
BYTES_PER_PARAM = 28  # Adam, float32: read x, g, m, v (16 B) and write x, m, v (12 B)
SHAPES = ("A", "B", "C")
GPTS = {"GPT2": 2, "GPT4": 4, "GPT12": 12, "GPT48": 48}  # issue 19's trees: --shapes
# gpt2,gpt12,gpt48,B; GPT4 is issue 28's "52-array GPT" (ClipGlobalNorm + AdamW, gpu.py)
# Issue 19's GPT-like trees, without scan: width 256, vocabulary 2048, context 256; per
# layer a LayerNorm (gain, bias), a fused qkv projection and an output projection (weight,
# bias each), a second LayerNorm and a two-layer MLP of width 4 * 256 (weight, bias each):
# 12 arrays a layer, half of them small vectors, plus the two embeddings and a final
# LayerNorm (4 arrays): 28, 52, 148 and 580 arrays for 2, 4, 12 and 48 layers.
SMALL_GPT = {"d": 256, "vocab": 2048, "ctx": 256, "mlp": 4}
LIBS = ("numpy", "torch", "jax")

# The GPT-like shape C (documented in README.md): d_model 512, 6 layers, 8 heads,
# vocabulary 8192, context 1024, MLP width 4 * 512. Per layer 16 arrays: two LayerNorms
# (gain, bias), separate q, k, v and output projections (weight, bias) and a two-layer MLP
# (weight, bias each); plus token and position embeddings and a final LayerNorm: 100 arrays,
# 6 * (12 d^2 + 13 d) + (V + T + 2) d = 23,633,920 parameters.
GPT = {"d": 512, "layers": 6, "vocab": 8192, "ctx": 1024, "mlp": 4}


# --- shapes ---------------------------------------------------------------------------------

def shape_spec(name: str) -> Any:
    """The model of a shape as a nested structure (dicts, lists) of array shapes."""
    if name == "A":  # 8 arrays of 2048 x 1024: 16,777,216 parameters
        return [(2048, 1024) for _ in range(8)]
    if name == "B":  # 2,000 arrays of 512: 1,024,000 parameters
        return [(512,) for _ in range(2000)]
    if name == "C":
        d, h = GPT["d"], GPT["d"] * GPT["mlp"]

        def dense(i: int, o: int) -> dict:
            return {"w": (i, o), "b": (o,)}

        def norm() -> dict:
            return {"g": (d,), "b": (d,)}

        layer = {"ln1": norm(),
                 "attn": {"q": dense(d, d), "k": dense(d, d), "v": dense(d, d),
                          "proj": dense(d, d)},
                 "ln2": norm(),
                 "mlp": {"fc": dense(d, h), "out": dense(h, d)}}
        return {"wte": (GPT["vocab"], d), "wpe": (GPT["ctx"], d),
                "layers": [layer for _ in range(GPT["layers"])], "lnf": norm()}
    if name in GPTS:
        return small_gpt(GPTS[name])
    raise ValueError(name)


def small_gpt(layers: int) -> dict:
    """Issue 19's GPT-like tree of ``layers`` layers (see ``SMALL_GPT``)."""
    d, h = SMALL_GPT["d"], SMALL_GPT["d"] * SMALL_GPT["mlp"]

    def dense(i: int, o: int) -> dict:
        return {"w": (i, o), "b": (o,)}

    def norm() -> dict:
        return {"g": (d,), "b": (d,)}

    layer = {"ln1": norm(), "attn": {"qkv": dense(d, 3 * d), "out": dense(d, d)},
             "ln2": norm(), "mlp": {"fc": dense(d, h), "proj": dense(h, d)}}
    return {"wte": (SMALL_GPT["vocab"], d), "wpe": (SMALL_GPT["ctx"], d),
            "layers": [layer for _ in range(layers)], "lnf": norm()}


def tmap(f: Callable, *trees: Any) -> Any:
    """Map ``f`` over the leaves of nested dicts and lists (a tuple is a leaf)."""
    t = trees[0]
    if isinstance(t, dict):
        return {k: tmap(f, *(s[k] for s in trees)) for k in t}
    if isinstance(t, list):
        return [tmap(f, *(s[i] for s in trees)) for i in range(len(t))]
    return f(*trees)


def tleaves(t: Any) -> list:
    if isinstance(t, dict):
        return [x for v in t.values() for x in tleaves(v)]
    if isinstance(t, list):
        return [x for v in t for x in tleaves(v)]
    return [t]


def first(t: Any) -> Any:
    """The first array of a nested dict/list, found in microseconds (for blocking on JAX)."""
    while isinstance(t, (dict, list)):
        t = next(iter(t.values())) if isinstance(t, dict) else t[0]
    return t


def numpy_model(spec: Any, seed: int, grad: bool = False) -> Any:
    import numpy as np

    rng = np.random.default_rng(seed)

    def make(shape: tuple) -> Any:
        x = rng.standard_normal(shape, dtype=np.float32)
        return x if grad else x * np.float32(0.02)

    return tmap(make, spec)


def count(spec: Any) -> tuple[int, int]:
    import math

    shapes = tleaves(spec)
    return len(shapes), sum(math.prod(s) for s in shapes)


# --- timing ---------------------------------------------------------------------------------

class Row:
    """One contestant: ``build()`` makes its state, ``step()`` runs (and finishes) one step."""

    def __init__(self, key: str, lib: str, build: Callable[[], Callable[[], Any]],
                 compiled: Callable[[], int] | None = None) -> None:
        self.key, self.lib, self._build, self.compiled = key, lib, build, compiled
        self.step: Callable[[], Any] | None = None
        self.error: str | None = None
        self.samples: list[float] = []
        self.compile_s = 0.0
        self.compiles = 0
        self.first_s: float | None = None  # the first call, compiles and caches included

    def fail(self, err: BaseException) -> None:
        self.error = f"{type(err).__name__}: {err}".strip()
        self.step = None
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_rows(rows: list[Row], warmup: int, reps: int, seed: int, most: int | None = None,
             budget_s: float = 0.0, cap_s: float = float("inf")) -> tuple[int, float | None]:
    """Build every row, warm each up (timing JAX compiles), then time rounds in which every
    row takes one step, in a fresh random order each round: at least ``reps`` rounds, and
    more, up to ``most``, while the rounds so far took under ``budget_s`` seconds; but
    never a round begun after ``cap_s`` seconds (a safety valve for an overloaded machine).
    Returns the number of rounds, and the share of the CPU other processes used meanwhile."""
    for r in rows:
        tb = time.perf_counter()
        try:
            r.step = r._build()
        except Exception as err:  # noqa: BLE001 -- any failure is reported in its row
            r.fail(err)
            continue
        try:
            if r.compiled:  # JAX: every call that compiles counts as compile time
                for _ in range(5):
                    before = r.compiled()
                    t0 = time.perf_counter()
                    r.step()
                    dt = time.perf_counter() - t0
                    if r.compiled() == before:
                        break
                    r.compile_s += dt
                    r.compiles += r.compiled() - before
            for i in range(warmup):
                t0 = time.perf_counter()
                r.step()
                if i == 0 and not r.compiled:
                    r.first_s = time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001
            r.fail(err)
        tb = time.perf_counter() - tb
        if tb > 2:
            log(f"  {r.key}: build and warm-up took {tb:.1f} s"
                + (f" ({r.compile_s:.1f} s compiling)" if r.compiles else ""))
    live = [r for r in rows if r.step is not None]
    rng = random.Random(seed)
    gc.collect()
    t0 = time.perf_counter()
    others = Others()
    done = 0
    while done < reps or done < (most or reps) and time.perf_counter() - t0 < budget_s:
        if time.perf_counter() - t0 > cap_s:
            break
        done += 1
        rng.shuffle(live)
        for r in live:
            if r.step is None:
                continue
            try:
                t1 = time.perf_counter()
                r.step()
                r.samples.append(time.perf_counter() - t1)
            except Exception as err:  # noqa: BLE001
                r.fail(err)
    return done, others.share()


# --- the machine ---------------------------------------------------------------------------

def cpu_ticks() -> tuple[int, int] | None:
    """(total, busy) jiffies of all cores from /proc/stat, or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]  # guest time is in user's
    except (OSError, ValueError):
        return None
    return sum(v), sum(v) - v[3] - v[4]  # idle and iowait are not busy


class Others:
    """Measures the share of all cores that *other* processes kept busy over an interval:
    the machine's busy time (/proc/stat) less this process's own CPU time (all threads)."""

    def __init__(self) -> None:
        self.t0, self.own0 = cpu_ticks(), time.process_time()

    def share(self) -> float | None:
        t1, own1 = cpu_ticks(), time.process_time()
        if self.t0 is None or t1 is None or t1[0] <= self.t0[0]:
            return None
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        busy_ticks = (t1[1] - self.t0[1]) - (own1 - self.own0) * hz
        return max(0.0, busy_ticks / (t1[0] - self.t0[0]))


def busy(seconds: float = 1.0) -> float | None:
    """Other processes' share of all cores over ``seconds`` while this process sleeps."""
    o = Others()
    time.sleep(seconds)
    return o.share()


def load() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def machine(libs: set) -> list[str]:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import numpy as np

    import optimisers

    vers = [f"python {platform.python_version()}", f"numpy {np.__version__}"]
    if "torch" in libs:
        import torch

        vers.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    if "jax" in libs:
        import jax

        vers.append(f"jax {jax.__version__}")
        try:
            import optax

            vers.append(f"optax {optax.__version__}")
        except ImportError:
            pass
    rev = "?"
    try:
        rev = subprocess.run(["git", "-C", str(HERE.parent), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        pass
    return [f"CPU: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
            f"optimisers {optimisers.__version__} ({rev}) from {Path(optimisers.__file__).parent}",
            "versions: " + ", ".join(vers)]
