#!/usr/bin/env python
"""Speed of one Adam step: optimisers against torch.optim, optax, a NumPy loop and the
memory-bandwidth floor, side by side in one process.

    python benchmarks/run.py                 # everything, about 3-5 minutes
    python benchmarks/run.py --quick         # fewer repetitions, under a minute
    python benchmarks/run.py --only numpy    # or torch / jax; may be repeated
    python benchmarks/run.py --markdown      # the tables as markdown, with the machine

See benchmarks/README.md for what each row means. Progress goes to stderr, the tables to
stdout. A row whose library is missing is skipped with a message; a row that raises
prints its error (a footnote) and the rest of the run goes on.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import platform
import pstats
import random
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

LR = 1e-3
JAX_FLOOR = ("jitted SGD step (floor)", "Adam, flat state (sketch)")  # --jax-floor rows
BYTES_PER_PARAM = 28  # Adam, float32: read x, g, m, v (16 B) and write x, m, v (12 B)
SHAPES = ("A", "B", "C")
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
    raise ValueError(name)


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


# --- contestants: one Adam step ---------------------------------------------------------------

def numpy_rows(o: Any, x0: Any, g: Any) -> list[Row]:
    import numpy as np

    def ours() -> Callable:
        model = tmap(np.copy, x0)
        tree = o.setup(o.Adam(LR), model)
        return lambda: o.update_(tree, model, g)

    return [Row("ours numpy", "numpy", ours),
            Row("numpy loop", "numpy", lambda: adam_loop(x0, g)[0])]


def adam_loop(x0: Any, g: Any) -> tuple[Callable[[], None], list]:
    """The NumPy peer: a Python loop over the arrays, Adam by in-place ufuncs (``out=``) with
    one preallocated scratch buffer. Returns the step and the parameter arrays."""
    import numpy as np

    xs = [a.copy() for a in tleaves(x0)]
    gs = tleaves(g)
    ms = [np.zeros_like(a) for a in xs]
    vs = [np.zeros_like(a) for a in xs]
    scratch = np.empty(max(a.size for a in xs), np.float32)
    tmps = [scratch[:a.size].reshape(a.shape) for a in xs]
    b1, b2, eps = 0.9, 0.999, 1e-8
    t = [0]

    def step() -> None:
        t[0] += 1
        c1, c2 = 1 - b1 ** t[0], 1 - b2 ** t[0]
        lr, rc2, f1, f2 = LR / c1, 1 / c2 ** 0.5, 1 - b1, 1 - b2
        for x, gi, m, v, tmp in zip(xs, gs, ms, vs, tmps):
            np.multiply(m, b1, out=m)          # m = b1 m + (1-b1) g
            np.multiply(gi, f1, out=tmp)
            np.add(m, tmp, out=m)
            np.multiply(v, b2, out=v)          # v = b2 v + (1-b2) g^2
            np.multiply(gi, gi, out=tmp)
            np.multiply(tmp, f2, out=tmp)
            np.add(v, tmp, out=v)
            np.sqrt(v, out=tmp)                # x -= lr/c1 * m / (sqrt(v/c2) + eps)
            np.multiply(tmp, rc2, out=tmp)
            np.add(tmp, eps, out=tmp)
            np.divide(m, tmp, out=tmp)
            np.multiply(tmp, lr, out=tmp)
            np.subtract(x, tmp, out=x)

    return step, xs


def bandwidth_rows(n: int, use_torch: bool) -> list[Row]:
    """Streaming kernels over flat arrays of ``n`` float32: their GB/s give the floor. The
    adds work in place (``a += b``), reading and writing the same lines as Adam does, so
    the bytes they move are exactly the 12 per element counted (no write-allocate)."""
    import numpy as np

    def arrays() -> tuple:
        a = np.random.default_rng(1).standard_normal(n, dtype=np.float32)
        return a, a[::-1].copy(), np.empty_like(a)

    def copyto() -> Callable:
        a, _, out = arrays()
        return lambda: np.copyto(out, a)

    def add() -> Callable:
        a, b, _ = arrays()
        return lambda: np.add(a, b, out=a)

    def tadd() -> Callable:
        import torch

        a, b, _ = (torch.from_numpy(v) for v in arrays())
        return lambda: a.add_(b)

    rows = [Row("bw np.copyto", "numpy", copyto), Row("bw numpy a += b", "numpy", add)]
    if use_torch:
        rows.append(Row("bw torch a.add_(b)", "torch", tadd))
    return rows


BW_BYTES = {"bw np.copyto": 8, "bw numpy a += b": 12, "bw torch a.add_(b)": 12}


def torch_module(torch: Any, params: Any) -> Any:
    """An ``nn.Module`` mirroring nested dicts/lists of ``nn.Parameter``s."""
    nn = torch.nn
    if isinstance(params, dict):
        m = nn.Module()
        for k, v in params.items():
            setattr(m, k, torch_module(torch, v) if isinstance(v, (dict, list)) else v)
        return m
    if all(isinstance(v, nn.Parameter) for v in params):
        return nn.ParameterList(params)
    return nn.ModuleList([torch_module(torch, v) for v in params])


def torch_rows(o: Any, x0: Any, g: Any) -> list[Row]:
    import numpy as np
    import torch

    tg = tmap(torch.from_numpy, g)  # shares memory with the NumPy gradients

    def params() -> tuple[Any, list]:
        p = tmap(lambda a, gi: torch.nn.Parameter(torch.from_numpy(np.copy(a))), x0, g)
        for pi, gi in zip(tleaves(p), tleaves(tg)):
            pi.grad = gi
        return p, tleaves(p)

    def ours() -> Callable:
        model = tmap(lambda a: torch.from_numpy(np.copy(a)), x0)
        tree = o.setup(o.Adam(LR), model)

        def step() -> None:
            with torch.no_grad():
                o.update_(tree, model, tg)

        return step

    def ours_module() -> Callable:
        p, _ = params()
        model = torch_module(torch, p)
        tree = o.setup(o.Adam(LR), model)

        def step() -> None:
            with torch.no_grad():
                o.update_(tree, model)  # gradients from each parameter's .grad

        return step

    def peer(**kw: Any) -> Callable[[], Callable]:
        def build() -> Callable:
            _, ps = params()
            opt = torch.optim.Adam(ps, lr=LR, **kw)
            return opt.step

        return build

    return [Row("ours torch", "torch", ours),
            Row("ours torch nn.Module", "torch", ours_module),
            Row("torch Adam fused", "torch", peer(fused=True)),
            Row("torch Adam foreach", "torch", peer(foreach=True))]


def cache(f: Any) -> Callable[[], int]:
    """How many programs the jitted ``f`` has compiled, for ``Row.compiled``."""
    return lambda: f._cache_size() if hasattr(f, "_cache_size") else 1


def jax_rows(o: Any, x0: Any, g: Any, donate: bool) -> list[Row]:
    import jax
    import jax.numpy as jnp

    jg = tmap(jnp.asarray, g)
    dn = (0, 1) if donate else ()

    f_ours = jax.jit(lambda t, m, gr: o.update(t, m, gr), donate_argnums=dn)

    def ours() -> Callable:
        model = tmap(lambda a: jnp.array(a), x0)
        box = [o.setup(o.Adam(LR), model), model]

        def step() -> None:
            box[0], box[1] = f_ours(box[0], box[1], jg)
            first(box[1]).block_until_ready()

        return step

    rows = [Row("ours jax (jit)", "jax", ours, cache(f_ours))]
    try:
        import optax
    except ImportError:
        log("optax is not installed: its row is skipped")
        return rows
    opt = optax.adam(LR)

    def optax_step(p: Any, s: Any, gr: Any) -> tuple:
        u, s = opt.update(gr, s, p)
        return optax.apply_updates(p, u), s

    f_optax = jax.jit(optax_step, donate_argnums=dn)

    def peer() -> Callable:
        p = tmap(lambda a: jnp.array(a), x0)
        box = [p, opt.init(p)]

        def step() -> None:
            box[0], box[1] = f_optax(box[0], box[1], jg)
            first(box[0]).block_until_ready()

        return step

    rows.append(Row("optax.adam (jit)", "jax", peer, cache(f_optax)))
    return rows


def jax_floor_rows(x0: Any, g: Any, donate: bool) -> list[Row]:
    """Two jitted steps that are not the library (``--jax-floor``), to show where the JAX
    step's time and compile go: SGD on the same arrays, the least that any jitted step
    handing back every parameter costs; and Adam with its moments in one flat buffer for
    all arrays, a sketch of the cross-Leaf state layout that the contract's per-Leaf state
    rules out (CONTRACT.md section 2), kept to measure what that layout would gain."""
    import jax
    import jax.numpy as jnp

    jg = [jnp.asarray(a) for a in tleaves(g)]
    dn = (0,) if donate else ()

    f_sgd = jax.jit(lambda p, gr: [x - LR * d for x, d in zip(p, gr)], donate_argnums=dn)

    def sgd() -> Callable:
        box = [[jnp.array(a) for a in tleaves(x0)]]

        def step() -> None:
            box[0] = f_sgd(box[0], jg)
            box[0][0].block_until_ready()

        return step

    f_flat = jax.jit(flat_adam_step, donate_argnums=dn)

    def flat() -> Callable:
        state, starts = flat_adam_init([jnp.array(a) for a in tleaves(x0)])
        box = [state]

        def step() -> None:
            box[0] = f_flat(box[0], jg, starts)
            box[0][0][0].block_until_ready()

        return step

    return [Row("jitted SGD step (floor)", "jax", sgd, cache(f_sgd)),
            Row("Adam, flat state (sketch)", "jax", flat, cache(f_flat))]


def flat_adam_init(params: list) -> tuple[tuple, list]:
    """The state of ``flat_adam_step``, (params, m, v, t) with ``m`` and ``v`` flat, and
    where each array starts in them."""
    import jax.numpy as jnp
    import numpy as np

    sizes = [a.size for a in params]
    starts = [jnp.asarray(np.int32(i)) for i in np.cumsum([0, *sizes[:-1]])]
    m, v = (jnp.zeros(sum(sizes), params[0].dtype) for _ in range(2))
    return (params, m, v, jnp.zeros(())), starts


def flat_adam_step(s: tuple, gr: list, starts: list) -> tuple:
    """Adam over one flat buffer per moment. Each array's update is sliced from one flat
    step at ``starts``, given as run-time int32 scalars: as constants they would make every
    slice a different XLA kernel, and XLA's CPU compile costs ~12 ms per distinct kernel
    (identical kernels are compiled once). The flat step is materialised once
    (``optimization_barrier``), else XLA repeats the formula in every array's kernel."""
    import jax.numpy as jnp
    from jax import lax

    b1, b2, eps = 0.9, 0.999, 1e-8
    p, m, v, t = s
    flat_g = jnp.concatenate([d.ravel() for d in gr])
    m = b1 * m + (1 - b1) * flat_g
    v = b2 * v + (1 - b2) * flat_g * flat_g
    t = t + 1
    u = lax.optimization_barrier(LR * (m / (1 - b1**t)) / (jnp.sqrt(v / (1 - b2**t)) + eps))
    p = [x - lax.dynamic_slice_in_dim(u, i, x.size).reshape(x.shape) for x, i in zip(p, starts)]
    return p, m, v, t


# --- destructure and setup ------------------------------------------------------------------

def flatten_rows(o: Any, x0: Any, libs: set) -> list[Row]:
    import numpy as np

    rows: list[Row] = []

    def pair(lib: str, model_fn: Callable, block: Callable) -> None:
        def d() -> Callable:
            model = model_fn()
            return lambda: block(o.destructure(model)[0])

        def r() -> Callable:
            flat, re = o.destructure(model_fn())
            return lambda: block(first(re(flat)))

        rows.extend([Row(f"ours destructure {lib}", lib, d), Row(f"ours re(v) {lib}", lib, r)])

    if "numpy" in libs:
        pair("numpy", lambda: x0, lambda a: a)
    if "torch" in libs:
        import torch
        from torch.nn.utils import parameters_to_vector, vector_to_parameters

        def tmodel() -> Any:
            return tmap(lambda a: torch.from_numpy(np.copy(a)), x0)

        pair("torch", tmodel, lambda a: a)

        def p2v() -> Callable:
            ps = tleaves(tmodel())
            return lambda: parameters_to_vector(ps)

        def v2p() -> Callable:
            ps = tleaves(tmodel())
            v = parameters_to_vector(ps)
            return lambda: vector_to_parameters(v, ps)

        rows.extend([Row("parameters_to_vector", "torch", p2v),
                     Row("vector_to_parameters", "torch", v2p)])
    if "jax" in libs:
        import jax.numpy as jnp
        from jax.flatten_util import ravel_pytree

        def jmodel() -> Any:
            return tmap(jnp.asarray, x0)

        def ready(a: Any) -> Any:
            return a.block_until_ready()

        pair("jax", jmodel, ready)

        def rav() -> Callable:
            model = jmodel()
            return lambda: ready(ravel_pytree(model)[0])

        def unrav() -> Callable:
            flat, un = ravel_pytree(jmodel())
            return lambda: ready(first(un(flat)))

        rows.extend([Row("ravel_pytree", "jax", rav), Row("unravel(v)", "jax", unrav)])
    return rows


def setup_rows(o: Any, x0: Any, libs: set) -> list[Row]:
    import numpy as np

    def ours(model_fn: Callable, block: Callable) -> Callable[[], Callable]:
        def build() -> Callable:
            model = model_fn()
            return lambda: block(o.setup(o.Adam(LR), model))

        return build

    def zeros() -> Callable:
        xs = tleaves(x0)
        return lambda: [(np.zeros_like(a), np.zeros_like(a)) for a in xs]

    rows = []
    if "numpy" in libs:
        rows += [Row("ours setup numpy", "numpy", ours(lambda: x0, lambda t: t)),
                 Row("2 x np.zeros_like", "numpy", zeros)]
    if "torch" in libs:
        import torch

        rows.append(Row("ours setup torch", "torch",
                        ours(lambda: tmap(torch.from_numpy, x0), lambda t: t)))
    if "jax" in libs:
        import jax
        import jax.numpy as jnp

        def jmodel() -> Any:
            return tmap(jnp.asarray, x0)

        def block(t: Any) -> Any:
            return jax.block_until_ready(t)

        rows.append(Row("ours setup jax", "jax", ours(jmodel, block)))
        try:
            import optax

            def oinit() -> Callable:
                p, opt = jmodel(), optax.adam(LR)
                return lambda: block(opt.init(p))

            rows.append(Row("optax.adam init", "jax", oinit))
        except ImportError:
            pass
    return rows


# --- sanity: the timed code really takes Adam steps ---------------------------------------

def sanity(o: Any, libs: set, donate: bool, flat: bool = False) -> str:
    """Three steps of each contestant on a small model, against Adam in float64: the largest
    absolute difference of the parameters (float32 rounding is ~1e-9 here)."""
    import numpy as np

    spec = {"w": (64, 32), "b": [(512,), (7,)]}
    x0, g = numpy_model(spec, 5), numpy_model(spec, 6, grad=True)
    b1, b2, eps = 0.9, 0.999, 1e-8
    ref_tree = tmap(lambda a: a.astype(np.float64), x0)
    ref = tleaves(ref_tree)
    ms = [np.zeros_like(a) for a in ref]
    vs = [np.zeros_like(a) for a in ref]
    for t in range(1, 4):
        for x, gi, m, v in zip(ref, tleaves(g), ms, vs):
            m[...] = b1 * m + (1 - b1) * gi
            v[...] = b2 * v + (1 - b2) * gi.astype(np.float64) ** 2
            x -= LR * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)

    def err(model: Any) -> float:
        if isinstance(model, dict):  # by key: JAX hands dicts back with their keys sorted
            model = tleaves(tmap(lambda r, a: a, ref_tree, model))
        return max(float(np.max(np.abs(np.asarray(a, np.float64) - r)))
                   for a, r in zip(model, ref))

    def ours_np() -> Any:
        model = tmap(np.copy, x0)
        tree = o.setup(o.Adam(LR), model)
        for _ in range(3):
            tree, model = o.update_(tree, model, g)
        return model

    def loop() -> Any:
        step, xs = adam_loop(x0, g)
        for _ in range(3):
            step()
        return xs

    cases: list[tuple[str, Callable]] = []
    if "numpy" in libs:
        cases += [("ours numpy", ours_np), ("numpy loop", loop)]
    if "torch" in libs:
        import torch

        def ours_torch() -> Any:
            model = tmap(lambda a: torch.from_numpy(np.copy(a)), x0)
            tree = o.setup(o.Adam(LR), model)
            with torch.no_grad():
                for _ in range(3):
                    tree, model = o.update_(tree, model, tmap(torch.from_numpy, g))
            return model

        def fused() -> Any:
            ps = [torch.nn.Parameter(torch.from_numpy(np.copy(a))) for a in tleaves(x0)]
            for p, gi in zip(ps, tleaves(g)):
                p.grad = torch.from_numpy(gi)
            opt = torch.optim.Adam(ps, lr=LR, fused=True)
            for _ in range(3):
                opt.step()
            return [p.detach().numpy() for p in ps]

        cases += [("ours torch", ours_torch), ("torch fused", fused)]
    if "jax" in libs:
        import jax
        import jax.numpy as jnp

        def ours_jax() -> Any:
            f = jax.jit(lambda t, m, gr: o.update(t, m, gr), donate_argnums=(0, 1) if donate
                        else ())
            model = tmap(jnp.array, x0)
            tree = o.setup(o.Adam(LR), model)
            for _ in range(3):
                tree, model = f(tree, model, tmap(jnp.asarray, g))
            return model

        cases.append(("ours jax", ours_jax))
        try:
            import optax

            def ox() -> Any:
                opt = optax.adam(LR)
                p = tmap(jnp.array, x0)
                st = opt.init(p)
                for _ in range(3):
                    u, st = opt.update(tmap(jnp.asarray, g), st, p)
                    p = optax.apply_updates(p, u)
                return p

            cases.append(("optax", ox))
        except ImportError:
            pass
        if flat:
            def flat_sketch() -> Any:
                s, starts = flat_adam_init([jnp.array(a) for a in tleaves(x0)])
                for _ in range(3):
                    s = jax.jit(flat_adam_step)(s, [jnp.asarray(a) for a in tleaves(g)], starts)
                return s[0]

            cases.append(("flat-state sketch", flat_sketch))
    parts = []
    for name, fn in cases:
        try:
            e = err(fn())
            parts.append(f"{name} {e:.1e}" + (" MISMATCH" if e > 1e-5 else ""))
        except Exception as ex:  # noqa: BLE001
            parts.append(f"{name} error ({type(ex).__name__})")
    return ("sanity, max |x - x_float64| after 3 Adam steps on a small model: "
            + ", ".join(parts))


# --- tables ---------------------------------------------------------------------------------

class Table:
    def __init__(self, title: str, columns: list[str]) -> None:
        self.title, self.columns = title, columns
        self.rows: list[tuple[str, list[str], str]] = []

    def add(self, name: str, cells: list[str], note: str = "") -> None:
        self.rows.append((name, cells, note))

    def render(self, markdown: bool) -> str:
        has_note = any(n for _, _, n in self.rows)
        head = ["", *self.columns] + (["target"] if has_note else [])
        body = [[name, *cells] + ([note] if has_note else []) for name, cells, note in self.rows]
        if markdown:
            out = [f"**{self.title}**", "", "| " + " | ".join(head) + " |",
                   "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
            out += ["| " + " | ".join(r) + " |" for r in body]
            return "\n".join(out) + "\n"
        widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

        def line(r: list[str]) -> str:
            return "  ".join(c.ljust(w) if i == 0 or i == len(r) - 1 and has_note else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip()

        rule = "-" * len(line(head))
        return "\n".join([self.title, rule, line(head), rule, *map(line, body), rule]) + "\n"


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def fmt_ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


class Results:
    """Every row's outcome per shape: a median, or an error (shown as a footnote)."""

    def __init__(self) -> None:
        self.ms: dict[tuple[str, str], float] = {}
        self.compile: dict[tuple[str, str], tuple[float, int]] = {}
        self.errors: dict[tuple[str, str], str] = {}
        self.skips: dict[tuple[str, str], str] = {}
        self.notes: list[str] = []
        self.steps: dict[tuple[str, str], int] = {}
        self.load: list[str] = []
        self.busy: list[float | None] = []
        self.others: dict[str, float | None] = {}
        self.first: dict[tuple[str, str], float] = {}

    def take(self, shape: str, rows: list[Row], steps: bool = True) -> None:
        for r in rows:
            key = (r.key, shape)
            if r.error is not None:
                self.errors[key] = r.error
            elif r.samples:
                self.ms[key] = statistics.median(r.samples) * 1e3
                if steps:
                    self.steps[key] = len(r.samples)
            if r.compiles:
                self.compile[key] = (r.compile_s, r.compiles)
            if r.first_s is not None and r.error is None:
                self.first[key] = r.first_s

    def cell(self, key: str, shape: str, footnotes: list[str]) -> str:
        k = (key, shape)
        if k in self.errors:
            footnotes.append(f"{key}, shape {shape}: {short(self.errors[k])}")
            return f"error [{len(footnotes)}]"
        if k in self.skips:
            return self.skips[k]
        return fmt_ms(self.ms.get(k))

    def get(self, key: str, shape: str) -> float | None:
        return self.ms.get((key, shape))


def short(msg: str, n: int = 300) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= n else msg[: n - 3] + "..."


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


# --- machine --------------------------------------------------------------------------------

def machine(libs: set, numba_blocked: bool) -> list[str]:
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
    if numba_blocked:
        vers.append("numba blocked (--no-numba)")
    else:
        try:
            import numba

            vers.append(f"numba {numba.__version__}")
        except ImportError:
            vers.append("numba not installed")
    rev = "?"
    try:
        rev = subprocess.run(["git", "-C", str(HERE.parent), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        pass
    return [f"CPU: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
            f"optimisers {optimisers.__version__} ({rev}) from {Path(optimisers.__file__).parent}",
            "versions: " + ", ".join(vers)]


# --- main -----------------------------------------------------------------------------------

def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a short run: 3-7 timed steps, no JAX on shape B unless --shapes names it")
    p.add_argument("--only", action="append", default=[], metavar="LIB",
                   help="numpy, torch or jax (repeatable, or comma-separated)")
    p.add_argument("--shapes", default=None, help="which shapes, e.g. A,C (default A,B,C)")
    p.add_argument("--markdown", action="store_true", help="print markdown tables")
    p.add_argument("--reps", type=int, default=None,
                   help="timed steps per row (default: 20 to 40 as time allows; --quick 3 to 7)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 3)")
    p.add_argument("--cap", type=float, default=None,
                   help="begin no timed round after this many seconds per shape, even short "
                        "of --reps (default 90; --quick 15)")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="torch.set_num_threads(N) first (default: PyTorch's own choice)")
    p.add_argument("--no-donate", action="store_true",
                   help="do not donate the JAX buffers (tree, model / params, state) to jit")
    p.add_argument("--no-numba", action="store_true",
                   help="hide numba from optimisers, to time the pure-NumPy path")
    p.add_argument("--no-extras", action="store_true",
                   help="skip the destructure and setup tables")
    p.add_argument("--jax-floor", action="store_true",
                   help="also time, under jax.jit, an SGD step on the same arrays and a sketch "
                        "of Adam with flat state (see benchmarks/README.md)")
    p.add_argument("--profile", action="store_true",
                   help="also print a cProfile (top 15, cumulative) of our update_ on shape B")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    only = {s.strip() for v in a.only for s in v.split(",") if s.strip()}
    bad = only - set(LIBS)
    if bad:
        p.error(f"--only takes numpy, torch or jax, not {', '.join(sorted(bad))}")
    a.libs = only or set(LIBS)
    a.explicit_shapes = a.shapes is not None
    a.shapes = [s.strip().upper() for s in (a.shapes or ",".join(SHAPES)).split(",")]
    if set(a.shapes) - set(SHAPES):
        p.error("--shapes takes A, B and/or C")
    a.most = a.reps or (7 if a.quick else 40)
    a.reps = a.reps or (3 if a.quick else 20)
    a.budget = 4.0 if a.quick else 15.0
    a.cap = a.cap if a.cap is not None else (15.0 if a.quick else 90.0)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.quick else 3)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.no_numba:
        sys.modules["numba"] = None  # type: ignore[assignment]  # `import numba` now fails
    if SRC.is_dir():
        sys.path.insert(0, str(SRC))  # time this checkout, installed or not
    import optimisers as o

    libs = {"numpy"}
    skipped: list[str] = []
    if "torch" in a.libs:
        try:
            import torch  # noqa: F401

            libs.add("torch")
        except ImportError:
            skipped.append("torch is not installed: the PyTorch rows are skipped")
    if "jax" in a.libs:
        try:
            import jax  # noqa: F401

            libs.add("jax")
            warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
        except ImportError:
            skipped.append("jax is not installed: the JAX rows are skipped")
    if "numpy" not in a.libs:
        libs.discard("numpy")
    for s in skipped:
        log(s)

    if a.torch_threads and "torch" in libs:
        import torch

        torch.set_num_threads(a.torch_threads)
    res = Results()
    res.busy = [busy()]
    res.load = [load()]
    res.notes.append(sanity(o, libs, not a.no_donate, a.jax_floor))
    t_start = time.perf_counter()
    for shape in a.shapes:
        spec = shape_spec(shape)
        narr, n = count(spec)
        log(f"shape {shape}: {narr} arrays, {n:,} parameters; building")
        x0 = numpy_model(spec, seed=a.seed)
        g = numpy_model(spec, seed=a.seed + 1, grad=True)
        rows: list[Row] = []
        if "numpy" in libs:
            rows += numpy_rows(o, x0, g)
        rows += bandwidth_rows(n, "torch" in libs)
        if "torch" in libs:
            rows += torch_rows(o, x0, g)
        skip_jax = a.quick and shape == "B" and not a.explicit_shapes
        if "jax" in libs:
            if skip_jax:
                for k in ("ours jax (jit)", "optax.adam (jit)"):
                    res.skips[(k, shape)] = "skip (quick)"
                res.notes.append("--quick skips JAX on shape B (optax alone compiles for "
                                 "~15 s there, eager unravel ~20 s); run without --quick, or "
                                 "name --shapes B")
            else:
                rows += jax_rows(o, x0, g, donate=not a.no_donate)
                if a.jax_floor:
                    rows += jax_floor_rows(x0, g, donate=not a.no_donate)
        log(f"shape {shape}: timing {len(rows)} rows, {a.warmup} warm-up + {a.reps} steps each "
            f"(JAX rows compile first)")
        done, res.others[shape] = run_rows(rows, a.warmup, a.reps, a.seed, a.most, a.budget,
                                           a.cap)
        if done < a.reps:
            res.notes.append(f"shape {shape}: only {done} timed rounds, not {a.reps}: the "
                             f"rounds passed the {a.cap:.0f} s cap (an overloaded machine?)")
        res.take(shape, rows)
        del rows
        gc.collect()
        if not a.no_extras:
            log(f"shape {shape}: destructure and setup")
            xlibs = libs - {"jax"} if skip_jax else libs
            extra = flatten_rows(o, x0, xlibs) + setup_rows(o, x0, xlibs)
            _, res.others[shape + " extras"] = run_rows(extra, 1, 3 if a.quick else 10, a.seed)
            res.take(shape, extra, steps=False)
            del extra
        del x0, g
        gc.collect()
        log(f"shape {shape}: done at {time.perf_counter() - t_start:.0f} s")

    res.load.append(load())
    res.busy.append(busy())
    print(report(a, libs, res, skipped))
    if a.profile and "B" in a.shapes:
        print(profile(o, libs, a.markdown))
    log(f"total {time.perf_counter() - t_start:.0f} s")
    return 0


def report(a: argparse.Namespace, libs: set, res: Results, skipped: list[str]) -> str:
    shapes = a.shapes
    cols = []
    for s in shapes:
        narr, n = count(shape_spec(s))
        cols.append(f"{s}: {narr} arr, {n / 1e6:.1f}M")
    md = a.markdown
    out: list[str] = []
    info = machine(libs, a.no_numba)
    out += [("- " if md else "") + line for line in info]
    mode = "quick" if a.quick else "full"
    steps = [max((v for (_, s), v in res.steps.items() if s == sh), default=0)
             for sh in shapes]
    out.append(("- " if md else "") + f"run: {mode}, medians of {'/'.join(map(str, steps))} "
               f"interleaved steps per row (by shape) after {a.warmup} warm-up, Adam lr {LR}, "
               f"float32, JAX donation {'off' if a.no_donate else 'on'}")
    def pct(v: float | None) -> str:
        return "?" if v is None else f"{v:.0%}"

    during = ", ".join(f"{k} {pct(v)}" for k, v in res.others.items())
    out.append(("- " if md else "") + f"other processes' share of the CPU: {pct(res.busy[0])} "
               f"before the run, {pct(res.busy[-1])} after it, and while timing: {during}; "
               f"load average (1 min) {' at start, '.join(res.load)} at end")
    out.append("")
    foot: list[str] = []

    # 1. one step
    t = Table("One Adam step, median ms", cols)
    keys = []
    if "numpy" in libs:
        keys += ["ours numpy", "numpy loop"]
    if "torch" in libs:
        keys += ["ours torch", "ours torch nn.Module", "torch Adam fused", "torch Adam foreach"]
    if "jax" in libs:
        keys += ["ours jax (jit)", "optax.adam (jit)"]
        keys += [k for k in JAX_FLOOR if res_has(res, k, shapes)]
    for k in keys:
        t.add(k, [res.cell(k, s, foot) for s in shapes])
    bw_keys = [k for k in BW_BYTES if "torch" in libs or "torch" not in k]
    floors: dict[str, float | None] = {}
    best: dict[str, str] = {}
    for s in shapes:
        n = count(shape_spec(s))[1]
        gbs = {k: BW_BYTES[k] * n / (res.get(k, s) * 1e-3) / 1e9 for k in bw_keys
               if res.get(k, s)}
        if gbs:
            k = max(gbs, key=gbs.get)
            best[s] = f"{gbs[k]:.1f} ({k[3:]})"
            floors[s] = BYTES_PER_PARAM * n / (gbs[k] * 1e9) * 1e3
        else:
            best[s], floors[s] = "-", None
    t.add("bandwidth floor, 28 B/param", [fmt_ms(floors[s]) for s in shapes])
    t.add("  best GB/s (kernel)", [best[s] for s in shapes])
    for k in bw_keys:
        n_by = {s: count(shape_spec(s))[1] for s in shapes}
        t.add(f"  {k[3:]} GB/s, {BW_BYTES[k]} B/param",
              [f"{BW_BYTES[k] * n_by[s] / (res.get(k, s) * 1e-3) / 1e9:.1f}"
               if res.get(k, s) else res.cell(k, s, foot) for s in shapes])
    out.append(t.render(md))

    # 2. ratios
    r = Table("Ratios (lower is better for ours)", cols)

    def ratio(name: str, a_: str, b_: str, target: str = "") -> None:
        if res_has(res, a_, shapes) or res_has(res, b_, shapes):
            r.add(name, [fmt_ratio(res.get(a_, s), res.get(b_, s)) for s in shapes], target)

    def ratio_floor(name: str, a_: str) -> None:
        if res_has(res, a_, shapes):
            r.add(name, [fmt_ratio(res.get(a_, s), floors[s]) for s in shapes])

    if "numpy" in libs and "torch" in libs:
        ratio("ours numpy / torch fused", "ours numpy", "torch Adam fused",
              "A,C <= 1.0, B <= 0.25 (with numba)")
    if "numpy" in libs:
        ratio("ours numpy / numpy loop", "ours numpy", "numpy loop", "<= 1.0 (without numba)")
    if "torch" in libs:
        ratio("ours torch / torch fused", "ours torch", "torch Adam fused",
              "A,C <= 1.0, B <= 0.5")
        ratio("ours torch nn.Module / torch fused", "ours torch nn.Module", "torch Adam fused",
              "A,C <= 1.0, B <= 0.5")
        ratio("ours torch / torch foreach", "ours torch", "torch Adam foreach")
    if "jax" in libs:
        ratio("ours jax / optax", "ours jax (jit)", "optax.adam (jit)", "A,C <= 1.0, B <= 0.25")
        for k in JAX_FLOOR:
            if res_has(res, k, shapes):
                ratio(f"{k} / optax", k, "optax.adam (jit)")
    for k in keys:
        if k.startswith("ours"):
            ratio_floor(f"{k} / bandwidth floor", k)
    if r.rows:
        out.append(r.render(md))

    # 3. compile
    if "jax" in libs:
        c = Table("JAX compile time, s (trace + compile, summed over every compiling call)",
                  cols)
        for k in ("ours jax (jit)", "optax.adam (jit)", *JAX_FLOOR):
            if k in JAX_FLOOR and not any((k, s) in res.compile for s in shapes):
                continue
            cells = []
            for s in shapes:
                if (k, s) in res.compile:
                    sec, times = res.compile[(k, s)]
                    cells.append(f"{sec:.2f}" + (f" ({times}x)" if times > 1 else ""))
                else:
                    cells.append(res.cell(k, s, foot) if (k, s) in res.errors or
                                 (k, s) in res.skips else "-")
            c.add(k, cells)
        def compile_ratio(name: str, k: str, target: str = "") -> None:
            c.add(name, [fmt_ratio(res.compile.get((k, s), (None,))[0],
                                   res.compile.get(("optax.adam (jit)", s), (None,))[0])
                         for s in shapes], target)

        compile_ratio("ours / optax", "ours jax (jit)", "B <= 0.25")
        for k in JAX_FLOOR:
            if any((k, s) in res.compile for s in shapes):
                compile_ratio(f"{k} / optax", k)
        out.append(c.render(md))

    # 4. destructure and setup
    if not a.no_extras:
        d = Table("destructure and re(v), median ms", cols)
        pairs = [("numpy", None, None)] if "numpy" in libs else []
        if "torch" in libs:
            pairs.append(("torch", "parameters_to_vector", "vector_to_parameters"))
        if "jax" in libs:
            pairs.append(("jax", "ravel_pytree", "unravel(v)"))
        ratios = []
        for lib, pd, pr in pairs:
            for ours_k, peer in ((f"ours destructure {lib}", pd), (f"ours re(v) {lib}", pr)):
                d.add(ours_k, [res.cell(ours_k, s, foot) for s in shapes])
                if peer:
                    d.add(peer, [res.cell(peer, s, foot) for s in shapes])
                    ratios.append((f"{ours_k[5:]} / {peer}", ours_k, peer))
        for name, x, y in ratios:
            d.add(f"ratio {name}", [fmt_ratio(res.get(x, s), res.get(y, s)) for s in shapes])
        if "jax" in libs:  # JAX compiles on the first call: that cost is its own row
            for k in ("ours destructure jax", "ravel_pytree", "ours re(v) jax", "unravel(v)"):
                d.add(f"first call, s: {k}",
                      [f"{res.first[(k, s)]:.2f}" if (k, s) in res.first else "-"
                       for s in shapes])
        out.append(d.render(md))
        st = Table("setup(Adam(), model), median ms", cols)
        for k in ("ours setup numpy", "2 x np.zeros_like", "ours setup torch", "ours setup jax",
                  "optax.adam init"):
            if any((k, s) in res.ms or (k, s) in res.errors for s in shapes):
                st.add(k, [res.cell(k, s, foot) for s in shapes])
        out.append(st.render(md))

    notes = skipped + res.notes
    try:
        worst = max(float(v) for v in res.load)
    except ValueError:
        worst = 0.0
    other = max((b for b in [*res.busy, *res.others.values()] if b is not None), default=0.0)
    if other > 0.1:
        notes.append(f"WARNING: other processes were using the CPU (up to {other:.0%} of it; "
                     f"load average up to {worst:.1f} on {os.cpu_count()} cores): "
                     f"times are inflated and noisy, multi-threaded rows most (a PyTorch "
                     f"step over many tensors can slow 10-1000x when a core is taken); "
                     f"rerun on a quiet machine")
    if foot:
        out.append("Errors:" if not md else "**Errors:**\n")
        out += [f"[{i}] {f}" if not md else f"{i}. {f}" for i, f in enumerate(foot, 1)]
        out.append("")
    if notes:
        out.append("Notes:" if not md else "**Notes:**\n")
        out += [("- " if md else "  ") + s for s in notes]
        out.append("")
    return "\n".join(out)


def res_has(res: Results, key: str, shapes: list[str]) -> bool:
    return any((key, s) in res.ms or (key, s) in res.errors for s in shapes)


def profile(o: Any, libs: set, markdown: bool) -> str:
    """cProfile of 20 steps of our update_ on shape B, top 15 lines by cumulative time."""
    spec = shape_spec("B")
    x0 = numpy_model(spec, 0)
    g = numpy_model(spec, 1, grad=True)
    out = []
    cases: list[tuple[str, Callable]] = []
    if "numpy" in libs:
        model = [a.copy() for a in x0]
        tree = o.setup(o.Adam(LR), model)
        cases.append(("numpy", lambda: o.update_(tree, model, g)))
    if "torch" in libs:
        import torch

        tm = [torch.from_numpy(a.copy()) for a in x0]
        tg = [torch.from_numpy(a) for a in g]
        ttree = o.setup(o.Adam(LR), tm)

        def tstep() -> None:
            with torch.no_grad():
                o.update_(ttree, tm, tg)

        cases.append(("torch", tstep))
    for lib, step in cases:
        try:
            step()
            step()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                step()
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(15)
            text = buf.getvalue().strip()
        except Exception as err:  # noqa: BLE001
            text = f"error: {type(err).__name__}: {err}"
        head = f"cProfile: 20 steps of ours {lib} update_ on shape B, top 15 by cumulative time"
        out.append(f"**{head}**\n\n```\n{text}\n```\n" if markdown else f"{head}\n{text}\n")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
