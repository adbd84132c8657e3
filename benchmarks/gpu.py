#!/usr/bin/env python
"""optimisers on a GPU: agreement with torch.optim on CUDA and optax on a JAX GPU, then
issue 28's speed ratios against them, in one process (the first steps in fresh ones).

    PYTHONPATH=src python3 benchmarks/gpu.py            # everything: about 4 minutes
    PYTHONPATH=src python3 benchmarks/gpu.py --quick    # fewer steps, no GPT48 or B for JAX
    PYTHONPATH=src python3 benchmarks/gpu.py --out gpu.md   # the markdown also into gpu.md
    PYTHONPATH=src python3 benchmarks/gpu.py --only torch   # or jax

The PyTorch half runs where ``torch.cuda.is_available()``, the JAX half where
``jax.devices("gpu")`` finds one; with neither it says so in one line and exits 0. The
exit status is 1 when an agreement check fails (a ratio off its target does not fail).
See benchmarks/README.md ("GPU: gpu.py") for what each check and row is.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX beside torch on a GPU
HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parent / "src"):  # this checkout's optimisers, installed or not
    if _path.is_dir() and str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from contestants import (  # noqa: E402
    CLIP_ROWS,
    FIRST,
    KEPT,
    clip_rows,
    first_step,
    jax_rows,
    optax_step,
    torch_on,
    torch_rows,
)
from harness import (  # noqa: E402
    GPTS,
    LR,
    SHAPES,
    count,
    log,
    machine,
    numpy_model,
    run_rows,
    shape_spec,
    tleaves,
    tmap,
)
from run import Results, Table, fmt_ratio  # noqa: E402

DECAY = 0.01  # AdamW's weight decay in the timed rows
CHECK_LR, CHECK_STEPS = 1e-2, 5
# the agreement checks' model: one large array, mid-sized and small ones, a list of layers
CHECK_SPEC = {"emb": (1024, 1024), "w": (256, 512), "b": [(512,), (7,)],
              "layers": [{"w": (64, 64), "b": (64,)} for _ in range(3)]}
RTOL, ATOL = 1e-5, 1e-6  # float32, parameters of about 0.02 moved by about 0.05
TORCH_TARGET = {"A": "<= 1.05", "B": "<= 0.5", "C": "<= 1.05"}


class Plan(NamedTuple):
    """What a run times: the shapes of each table's rows (see harness.shape_spec)."""

    torch: tuple[str, ...]  # AdamW against torch.optim.AdamW(fused=True)
    clip: tuple[str, ...]  # ClipGlobalNorm(1.0) + AdamW against clip_grad_norm_ + AdamW
    jax: tuple[str, ...]  # Adam against optax.adam under jax.jit, donated and kept
    first_torch: str  # the first step in a fresh process
    first_jax: str
    warmup: int
    reps: int


PLANS = {
    "full": Plan(("A", "B", "C"), ("C", "GPT4"), ("GPT2", "GPT12", "GPT48", "B"), "C", "GPT12",
                 3, 20),
    "quick": Plan(("A", "B", "C"), ("C", "GPT4"), ("GPT2", "GPT12"), "C", "GPT12", 1, 5),
    "cpu": Plan(("GPT2", "B"), ("GPT4",), ("GPT2",), "GPT2", "GPT2", 1, 3),  # --device cpu
}


class Check(NamedTuple):
    """One agreement check's outcome: where ours ran, the largest difference, and why it
    failed (``None`` if it passed)."""

    name: str
    lib: str
    on: str
    diff: float | None
    failure: str | None


# --- which GPUs ------------------------------------------------------------------------------

def find_devices(device: str, only: set[str]) -> tuple[str | None, str | None, list[str]]:
    """The torch device and JAX platform to run on (``None``: that half does not run), and
    why a half does not. ``device`` "cpu" runs both halves on the CPU (a test of the code
    paths, not a measurement)."""
    torch_dev = jax_dev = None
    why: list[str] = []
    if "torch" in only:
        try:
            import torch

            if device == "cpu":
                torch_dev = "cpu"
            elif torch.cuda.is_available():
                torch_dev = "cuda"
            else:
                why.append("no CUDA GPU for torch (torch.cuda.is_available() is False)")
        except ImportError:
            why.append("torch is not installed")
    if "jax" in only:
        try:
            import jax
            import optax  # noqa: F401 -- the JAX half's peer

            if device == "cpu":
                jax_dev = "cpu"
            else:
                try:
                    jax.devices("gpu")  # raises where there is none
                    jax_dev = "gpu"
                except RuntimeError:
                    why.append("no GPU for JAX (jax.devices('gpu') raised RuntimeError)")
        except ImportError as err:
            why.append(f"{err.name or 'jax'} is not installed")
    return torch_dev, jax_dev, why


def describe(torch_dev: str | None, jax_dev: str | None) -> list[str]:
    """The devices and versions, a line each."""
    lines = []
    if torch_dev:
        import torch

        name = torch.cuda.get_device_name(torch_dev) if torch_dev == "cuda" else "CPU"
        lines.append(f"torch on {torch_dev}: {name} (torch {torch.__version__}, "
                     f"CUDA {torch.version.cuda})")
    if jax_dev:
        import jax

        d = jax.devices(jax_dev)[0]
        lines.append(f"JAX on {jax_dev}: {d} {d.device_kind} (jax {jax.__version__})")
    libs = {"torch"} if torch_dev else set()
    return lines + machine(libs | ({"jax"} if jax_dev else set()))


# --- agreement -------------------------------------------------------------------------------

def compare(name: str, lib: str, run: Callable[[], tuple[list, list, list]]) -> Check:
    """Runs ``run`` (our parameters, the peer's, the start) and checks that ours moved and
    equal the peer's to float32 rounding; any exception is a failure."""
    import numpy as np

    def host(a: Any) -> Any:
        return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)

    on, diff = "?", None
    try:
        ours, theirs, start = run()
        on = where(ours[0])
        xs, ys, x0 = [host(a) for a in ours], [host(b) for b in theirs], list(start)
        diff = max(float(np.max(np.abs(x - y))) for x, y in zip(xs, ys, strict=True))
        if max(float(np.max(np.abs(x - s))) for x, s in zip(xs, x0)) == 0:
            return Check(name, lib, on, diff, "our parameters did not move")
        for i, (x, y) in enumerate(zip(xs, ys)):
            np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, err_msg=f"array {i}")
    except Exception as err:  # noqa: BLE001 -- reported as the check's failure
        msg = " ".join(f"{type(err).__name__}: {err}".split())
        return Check(name, lib, on, diff, msg[:300])
    return Check(name, lib, on, diff, None)


def where(a: Any) -> str:
    """The device an array or tensor lives on, as "cuda:0" (torch) or "gpu:0" (JAX)."""
    if hasattr(a, "devices"):
        d = next(iter(a.devices()))
        return f"{d.platform}:{d.id}"
    return str(getattr(a, "device", "cpu"))  # a tensor's; NumPy's is "cpu"


def checks_data() -> tuple[Any, list]:
    x0 = numpy_model(CHECK_SPEC, seed=11)
    return x0, [numpy_model(CHECK_SPEC, seed=20 + k, grad=True) for k in range(CHECK_STEPS)]


def torch_checks(o: Any, device: str) -> list[Check]:
    """A few steps of ours through ``setup`` / ``update_`` on tensors on ``device``, against
    torch.optim on the same tensors."""
    import numpy as np
    import torch

    tensor, _ = torch_on(device)
    x0, grads = checks_data()
    optim = torch.optim
    chain = o.OptimiserChain(o.ClipGlobalNorm(1.0), o.AdamW(CHECK_LR, lambd=0.1))
    peers = [
        ("Adam / Adam(fused=True)", o.Adam(CHECK_LR),
         lambda ps: optim.Adam(ps, lr=CHECK_LR, fused=True), False),
        ("AdamW / AdamW(fused=True)", o.AdamW(CHECK_LR, lambd=0.1),
         lambda ps: optim.AdamW(ps, lr=CHECK_LR, weight_decay=0.1, fused=True), False),
        ("AdamW / AdamW(foreach=True)", o.AdamW(CHECK_LR, lambd=0.1),
         lambda ps: optim.AdamW(ps, lr=CHECK_LR, weight_decay=0.1, foreach=True), False),
        ("Momentum / SGD(momentum=0.9)", o.Momentum(0.05, 0.9),
         lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9), False),
        ("Nesterov / SGD(momentum=0.9, nesterov=True)", o.Nesterov(0.05, 0.9),
         lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True), False),
        ("ClipGlobalNorm(1.0) + AdamW / clip_grad_norm_(foreach=True) + AdamW(fused=True)",
         chain, lambda ps: optim.AdamW(ps, lr=CHECK_LR, weight_decay=0.1, fused=True), True),
    ]

    def copy(a: Any) -> Any:  # each side its own tensors: a clip scales them in place
        return tensor(np.copy(a))

    def pair(rule: Any, make: Callable, clip: bool) -> tuple[list, list, list]:
        model = tmap(copy, x0)
        tree = o.setup(rule, model)
        ps = [torch.nn.Parameter(copy(a)) for a in tleaves(x0)]
        opt = make(ps)
        for g in grads:
            with torch.no_grad():
                o.update_(tree, model, tmap(copy, g))
            for p, gi in zip(ps, tleaves(g)):
                p.grad = copy(gi)
            if clip:
                torch.nn.utils.clip_grad_norm_(ps, 1.0, foreach=True)
            opt.step()
        return tleaves(model), [p.detach() for p in ps], tleaves(x0)

    return [compare(name, "torch", lambda r=rule, m=make, c=clip: pair(r, m, c))
            for name, rule, make, clip in peers]


def jax_checks(o: Any) -> list[Check]:
    """A few steps of ours, ``jax.jit(update)`` donating tree and model, against the optax
    optimiser jitted the same way, on JAX's default device (set by the caller)."""
    import jax
    import jax.numpy as jnp
    import optax

    x0, grads = checks_data()
    peers = [
        ("Adam / optax.adam", o.Adam(CHECK_LR), optax.adam(CHECK_LR)),
        ("AdamW / optax.adamw", o.AdamW(CHECK_LR, lambd=0.1),
         optax.adamw(CHECK_LR, weight_decay=0.1)),
        ("Momentum / optax.sgd(momentum=0.9)", o.Momentum(0.05, 0.9),
         optax.sgd(0.05, momentum=0.9)),
        ("Nesterov / optax.sgd(momentum=0.9, nesterov=True)", o.Nesterov(0.05, 0.9),
         optax.sgd(0.05, momentum=0.9, nesterov=True)),
        ("ClipGlobalNorm(1.0) + AdamW / optax.chain(clip_by_global_norm(1.0), adamw)",
         o.OptimiserChain(o.ClipGlobalNorm(1.0), o.AdamW(CHECK_LR, lambd=0.1)),
         optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(CHECK_LR, weight_decay=0.1))),
    ]

    def pair(rule: Any, opt: Any) -> tuple[list, list, list]:
        model, params = tmap(jnp.array, x0), tmap(jnp.array, x0)
        tree, state = o.setup(rule, model), opt.init(params)
        ours = jax.jit(o.update, donate_argnums=(0, 1))
        theirs = jax.jit(optax_step(opt), donate_argnums=(0, 1))
        for g in grads:
            jg = tmap(jnp.asarray, g)
            tree, model = ours(tree, model, jg)
            params, state = theirs(params, state, jg)
        return jax.tree.leaves(model), jax.tree.leaves(params), jax.tree.leaves(x0)

    return [compare(name, "jax", lambda r=rule, p=opt: pair(r, p)) for name, rule, opt in peers]


# --- speed ---------------------------------------------------------------------------------

def models(shape: str) -> tuple[Any, Any]:
    """A shape's parameters and gradients, as NumPy arrays (as run.py builds them)."""
    spec = shape_spec(shape)
    return numpy_model(spec, seed=0), numpy_model(spec, seed=1, grad=True)


def time_torch(o: Any, device: str, plan: Plan, res: Results) -> None:
    """AdamW against torch.optim.AdamW on ``plan.torch``, ClipGlobalNorm + AdamW against
    clip_grad_norm_ + AdamW on ``plan.clip``: medians into ``res``."""
    for shapes, make in ((plan.torch, lambda x0, g: torch_rows(o, x0, g, device, DECAY)),
                         (plan.clip, lambda x0, g: clip_rows(o, x0, g, device, DECAY))):
        for shape in shapes:
            x0, g = models(shape)
            rows = make(x0, g)
            log(f"torch, shape {shape}: {len(rows)} rows, {plan.warmup} warm-up + "
                f"{plan.reps} steps each")
            run_rows(rows, plan.warmup, plan.reps, seed=0)
            res.take(shape, rows)
            del rows, x0, g
    if device != "cpu":
        import torch

        torch.cuda.empty_cache()


def time_jax(o: Any, plan: Plan, res: Results, deadline: float) -> list[str]:
    """Adam against optax.adam under jax.jit, donated and kept, on ``plan.jax``: step medians
    and compile times into ``res``. No shape begins after ``deadline`` (perf_counter)."""
    notes = []
    for shape in plan.jax:
        if time.perf_counter() > deadline:
            notes.append(f"JAX on {shape} was not timed: the run passed its time budget "
                         f"(--budget); run it alone with --only jax --jax-shapes {shape}")
            continue
        x0, g = models(shape)
        rows = jax_rows(o, x0, g, donate=True) + jax_rows(o, x0, g, donate=False, suffix=KEPT)
        log(f"jax, shape {shape}: compiling {len(rows)} steps, then {plan.warmup} warm-up + "
            f"{plan.reps} steps each")
        run_rows(rows, plan.warmup, plan.reps, seed=0)
        res.take(shape, rows)
        if not any(r.compiles for r in rows) and any(r.samples for r in rows):
            notes.append(f"JAX on {shape}: no compile counted (this jax's jit has no "
                         f"_cache_size, which harness.run_rows reads)")
        del rows, x0, g
    return notes


def fresh(who: str, shape: str, device: str) -> float | str:
    """``first_step`` of ``who`` in a new process: its seconds, or why there are none."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--first", who, "--shape", shape,
           "--device", device]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "timed out (300 s)"
    try:
        return float(done.stdout.split()[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"exit {done.returncode}: {tail[:200]}"


def time_first(lib: str, plan: Plan, device: str, res: Results) -> None:
    """The first step in a fresh process, ours then the peer's (one process each), into
    ``res.first`` (seconds) or ``res.errors``, keyed by (contestant, shape)."""
    shape = plan.first_torch if lib == "torch" else plan.first_jax
    for who in FIRST[:2] if lib == "torch" else FIRST[2:]:
        log(f"{lib}, shape {shape}: the first step of {who} in a fresh process")
        t = fresh(who, shape, device)
        if isinstance(t, float):
            res.first[(who, shape)] = t
        else:
            res.errors[(who, shape)] = t


# --- the report ------------------------------------------------------------------------------

def label(shape: str) -> str:
    return f"{shape} ({count(shape_spec(shape))[0]} arrays)"


def agreement_table(checks: list[Check]) -> Table:
    t = Table(f"Agreement: {CHECK_STEPS} steps on {label_spec()}, our parameters against "
              f"the peer's (rtol {RTOL:g}, atol {ATOL:g})", ["on", "max abs diff", "result"])
    for c in checks:
        diff = "-" if c.diff is None else f"{c.diff:.1e}"
        t.add(f"{c.lib}: {c.name}", [c.on, diff, "PASS" if c.failure is None
                                     else f"FAIL: {c.failure}"])
    return t


def label_spec() -> str:
    narr, n = count(CHECK_SPEC)
    return f"{narr} float32 arrays, {n:,} parameters"


class Rows:
    """A table of ours against a peer, a row each: both cells and their ratio."""

    def __init__(self, title: str, peer: str, res: Results, foot: list[str]) -> None:
        self.table = Table(title, ["ours", peer, "ratio"])
        self.res, self.foot = res, foot

    def medians(self, name: str, ours: str, peer: str, shape: str, target: str = "") -> None:
        res = self.res
        self.table.add(name, [res.cell(ours, shape, self.foot), res.cell(peer, shape, self.foot),
                              fmt_ratio(res.get(ours, shape), res.get(peer, shape))], target)

    def seconds(self, name: str, got: dict, ours: str, peer: str, shape: str,
                target: str) -> None:
        """Seconds from ``got`` (``res.first`` or ``res.compile``), keyed (row, shape)."""
        cells, values = [], []
        for k in (ours, peer):
            v = got.get((k, shape))
            v = v[0] if isinstance(v, tuple) else v  # res.compile holds (seconds, times)
            values.append(v)
            cells.append(f"{v:.2f}" if v is not None else self.res.cell(k, shape, self.foot))
        self.table.add(name, [*cells, fmt_ratio(*values)], target)


def torch_table(res: Results, plan: Plan, foot: list[str]) -> Table:
    r = Rows("PyTorch: ours against torch.optim, median ms of a step", "torch.optim", res, foot)
    for s in plan.torch:
        r.medians(f"AdamW, {label(s)}: / AdamW(fused=True)", "ours torch", "torch AdamW fused",
                  s, TORCH_TARGET.get(s, ""))
        r.medians(f"AdamW, {label(s)}: / AdamW(foreach=True)", "ours torch",
                  "torch AdamW foreach", s)
        r.medians(f"AdamW, {label(s)}: nn.Module reading .grad / tensors (both ours)",
                  "ours torch nn.Module", "ours torch", s, "<= 1.05")
    for s in plan.clip:
        r.medians(f"ClipGlobalNorm(1.0) + AdamW, {label(s)}: / clip_grad_norm_ + fused",
                  *CLIP_ROWS, s, "<= 1.1")
    r.seconds(f"first setup + update_ in a fresh process, s, {label(plan.first_torch)}",
              res.first, *FIRST[:2], plan.first_torch, "<= 1.2")
    return r.table


def jax_table(res: Results, plan: Plan, foot: list[str]) -> Table:
    r = Rows("JAX: ours against optax.adam under jax.jit, median ms of a step; compile, s",
             "optax", res, foot)
    for s in plan.jax:
        if not any(k[1] == s for k in (*res.ms, *res.errors, *res.compile)):
            continue  # not timed: a note says why
        for suffix, how in (("", "donated"), (KEPT, "kept")):
            ours, peer = "ours jax (jit)" + suffix, "optax.adam (jit)" + suffix
            r.medians(f"step, {label(s)}, {how}", ours, peer, s,
                      "<= 1.25" if s == "B" else "<= 1.0")
            r.seconds(f"compile, s, {label(s)}, {how}", res.compile, ours, peer, s, "<= 1.0")
    r.seconds(f"first setup + jitted step in a fresh process, s, {label(plan.first_jax)}",
              res.first, *FIRST[2:], plan.first_jax, "<= 1.0")
    return r.table


def report(a: argparse.Namespace, head: list[str], checks: list[Check], res: Results,
           libs: set[str], notes: list[str]) -> str:
    plan: Plan = a.plan
    out = ["## optimisers on a GPU (benchmarks/gpu.py)", ""]
    out += [f"- run: {a.mode}, medians of {plan.reps} interleaved steps after {plan.warmup} "
            f"warm-up; Adam / AdamW lr {LR:g} (weight decay {DECAY:g}), float32"]
    out += [f"- {line}" for line in head] + [""]
    foot: list[str] = []
    tables = [agreement_table(checks)]
    if "torch" in libs:
        tables.append(torch_table(res, plan, foot))
    if "jax" in libs:
        tables.append(jax_table(res, plan, foot))
    out += [t.render(markdown=True) for t in tables]
    if foot:
        out += ["**Errors:**", ""] + [f"{i}. {f}" for i, f in enumerate(foot, 1)] + [""]
    if notes:
        out += ["**Notes:**", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)


# --- main ------------------------------------------------------------------------------------

def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="5 timed steps after 1 warm-up, and JAX on GPT2 and GPT12 only")
    p.add_argument("--out", metavar="FILE", help="also write the markdown report to FILE")
    p.add_argument("--only", action="append", default=[], metavar="LIB",
                   help="torch or jax (the other half does not run)")
    p.add_argument("--jax-shapes", default=None,
                   help="the JAX rows' trees, e.g. GPT48,B (default GPT2,GPT12,GPT48,B; "
                        "--quick GPT2,GPT12)")
    p.add_argument("--budget", type=float, default=None,
                   help="begin no JAX tree after this many seconds (default 150, --quick 90)")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help=argparse.SUPPRESS)  # cpu: both halves on the CPU, small (a test)
    p.add_argument("--first", choices=FIRST, help=argparse.SUPPRESS)  # fresh()'s process
    p.add_argument("--shape", default="C", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.libs = {s.strip() for v in a.only for s in v.split(",") if s.strip()} or {"torch", "jax"}
    if a.libs - {"torch", "jax"}:
        p.error("--only takes torch or jax")
    a.mode = "cpu" if a.device == "cpu" else "quick" if a.quick else "full"
    a.plan = PLANS[a.mode]
    if a.quick and a.device == "cpu":
        a.plan = a.plan._replace(reps=2)
    if a.jax_shapes:
        shapes = tuple(s.strip().upper() for s in a.jax_shapes.split(",") if s.strip())
        if set(shapes) - set(SHAPES) - set(GPTS):
            p.error("--jax-shapes takes A, B, C, GPT2, GPT4, GPT12 and/or GPT48")
        a.plan = a.plan._replace(jax=shapes)
    a.budget = a.budget if a.budget is not None else 90.0 if a.quick else 150.0
    return a


def print_first(a: argparse.Namespace) -> int:
    """The hidden ``--first WHO``: print the seconds of ``first_step`` in this process."""
    import optimisers as o

    x0, g = models(a.shape)
    device = a.device  # JAX's platform; torch's device is "cuda" for a GPU
    if a.first in FIRST[:2] and device == "gpu":
        device = "cuda"
    print(f"{first_step(o, a.first, x0, g, device):.6f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.first:
        return print_first(a)
    torch_dev, jax_dev, why = find_devices(a.device, a.libs)
    if torch_dev is None and jax_dev is None:
        print("gpu.py: no GPU found: " + "; ".join(why) + ". Nothing to run.")
        return 0
    t0 = time.perf_counter()
    import optimisers as o

    warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
    libs = {lib for lib, d in (("torch", torch_dev), ("jax", jax_dev)) if d}
    head, notes = describe(torch_dev, jax_dev), list(why)
    if a.device == "cpu":
        notes.append("--device cpu: both halves on the CPU, on small trees: a test of the "
                     "code paths, not a GPU measurement")
    res, checks = Results(), []
    log("agreement checks")
    if torch_dev:
        checks += torch_checks(o, torch_dev)
    if jax_dev:
        with jax_on(jax_dev):
            checks += jax_checks(o)
    for c in checks:
        log(f"  {c.lib}: {c.name}: {'PASS' if c.failure is None else 'FAIL'}")
    if torch_dev:
        time_torch(o, torch_dev, a.plan, res)
        time_first("torch", a.plan, a.device, res)
    if jax_dev:
        time_first("jax", a.plan, a.device, res)
        with jax_on(jax_dev):
            notes += time_jax(o, a.plan, res, t0 + a.budget)
    head.append(f"took {time.perf_counter() - t0:.0f} s")
    text = report(a, head, checks, res, libs, notes)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    failed = [c for c in checks if c.failure is not None]
    if failed:
        log(f"{len(failed)} agreement check(s) failed")
    return 1 if failed else 0


def jax_on(platform: str) -> Any:
    """``jax.default_device`` of the first device of ``platform`` ("gpu" or "cpu")."""
    import jax

    return jax.default_device(jax.devices(platform)[0])


if __name__ == "__main__":
    sys.exit(main())
