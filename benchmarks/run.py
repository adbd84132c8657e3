#!/usr/bin/env python
"""Speed of one Adam step: optimisers against torch.optim, optax, a NumPy loop and the
memory-bandwidth floor, side by side in one process.

    python benchmarks/run.py                 # everything, about 3-5 minutes
    python benchmarks/run.py --quick         # fewer repetitions, under a minute
    python benchmarks/run.py --only numpy    # or torch / jax; may be repeated
    python benchmarks/run.py --markdown      # the tables as markdown, with the machine
    python benchmarks/run.py --only jax --shapes gpt2,gpt12,gpt48,B --donation both
                                             # issue 19's trees: JAX steps and compiles
    python benchmarks/run.py --matrix --shapes none --only torch   # Muon and Adafactor

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
import pstats
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from contestants import (
    BW_BYTES,
    JAX_FLOOR,
    KEPT,
    MATRIX_ROWS,
    bandwidth_rows,
    flatten_rows,
    jax_floor_rows,
    jax_rows,
    matrix_rows,
    numpy_rows,
    sanity,
    setup_rows,
    torch_rows,
)
from harness import (
    BYTES_PER_PARAM,
    GPTS,
    LIBS,
    LR,
    SHAPES,
    SRC,
    Row,
    busy,
    count,
    load,
    log,
    machine,
    numpy_model,
    run_rows,
    shape_spec,
)

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
        self.matrix_steps = 0

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


# --- main -----------------------------------------------------------------------------------

def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a short run: 3-7 timed steps, no JAX on shape B unless --shapes names it")
    p.add_argument("--only", action="append", default=[], metavar="LIB",
                   help="numpy, torch or jax (repeatable, or comma-separated)")
    p.add_argument("--shapes", default=None,
                   help="which shapes, e.g. A,C (default A,B,C; also gpt2, gpt12, gpt48; none: "
                        "no Adam step)")
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
    p.add_argument("--donation", choices=("on", "off", "both"), default=None,
                   help="donate the JAX buffers (on, the default), not (off, as --no-donate), "
                        "or time both ways side by side (both: rows ending 'kept' donate none)")
    p.add_argument("--no-extras", action="store_true",
                   help="skip the destructure and setup tables")
    p.add_argument("--jax-floor", action="store_true",
                   help="also time, under jax.jit, an SGD step on the same arrays and a sketch "
                        "of Adam with flat state (see benchmarks/README.md)")
    p.add_argument("--profile", action="store_true",
                   help="also print a cProfile (top 15, cumulative) of our update_ on shape B")
    p.add_argument("--matrix", action="store_true",
                   help="also time Muon and Adafactor against torch.optim's on shape C "
                        "(PyTorch; a Muon step there takes seconds)")
    p.add_argument("--matrix-reps", type=int, default=5,
                   help="timed steps per Muon and Adafactor row (default 5)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    only = {s.strip() for v in a.only for s in v.split(",") if s.strip()}
    bad = only - set(LIBS)
    if bad:
        p.error(f"--only takes numpy, torch or jax, not {', '.join(sorted(bad))}")
    a.libs = only or set(LIBS)
    a.explicit_shapes = a.shapes is not None
    a.shapes = [] if (a.shapes or "").lower() == "none" else [
        s.strip().upper() for s in (a.shapes or ",".join(SHAPES)).split(",")]
    if set(a.shapes) - set(SHAPES) - set(GPTS):
        p.error("--shapes takes A, B, C, gpt2, gpt12 and/or gpt48 (or none)")
    a.donation = a.donation or ("off" if a.no_donate else "on")
    a.no_donate = a.donation == "off"
    a.most = a.reps or (7 if a.quick else 40)
    a.reps = a.reps or (3 if a.quick else 20)
    a.budget = 4.0 if a.quick else 15.0
    a.cap = a.cap if a.cap is not None else (15.0 if a.quick else 90.0)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.quick else 3)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
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
                if a.donation != "off":
                    rows += jax_rows(o, x0, g, donate=True)
                if a.donation != "on":
                    rows += jax_rows(o, x0, g, donate=False,
                                     suffix=KEPT if a.donation == "both" else "")
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

    if a.matrix:
        time_matrix_rules(o, a, libs, res)
    res.load.append(load())
    res.busy.append(busy())
    print(report(a, libs, res, skipped))
    if a.profile and "B" in a.shapes:
        print(profile(o, libs, a.markdown))
    log(f"total {time.perf_counter() - t_start:.0f} s")
    return 0


def time_matrix_rules(o: Any, a: argparse.Namespace, libs: set, res: Results) -> None:
    """``--matrix``: Muon and Adafactor on shape C, ours against torch.optim's."""
    if "torch" not in libs:
        res.notes.append("--matrix needs PyTorch: its rows are skipped")
        return
    spec = shape_spec("C")
    x0 = numpy_model(spec, seed=a.seed)
    g = numpy_model(spec, seed=a.seed + 1, grad=True)
    rows = matrix_rows(o, x0, g)
    log(f"shape C: timing Muon and Adafactor, 1 warm-up + {a.matrix_reps} steps each")
    done, res.others["C, Muon and Adafactor"] = run_rows(rows, 1, a.matrix_reps, a.seed)
    res.matrix_steps = done
    res.take("C", rows, steps=False)


def matrix_table(res: Results, foot: list[str], md: bool) -> str:
    """The ``--matrix`` table: medians, and ours against torch's."""
    t = Table(f"Muon and Adafactor on shape C (PyTorch), median ms of "
              f"{res.matrix_steps} interleaved steps after 1 warm-up", ["C"])
    for k in MATRIX_ROWS:
        t.add(k, [res.cell(k, "C", foot)])
    for name, ours, peer, target in [
            ("ours Muon / torch.optim.Muon", "ours torch Muon", "torch.optim.Muon", "<= 1.0"),
            ("ours Adafactor / torch.optim.Adafactor", "ours torch Adafactor",
             "torch.optim.Adafactor", "<= 1.0"),
            ("ours Adafactor / torch.optim.Adafactor foreach", "ours torch Adafactor",
             "torch.optim.Adafactor foreach", "")]:
        t.add(name, [fmt_ratio(res.get(ours, "C"), res.get(peer, "C"))], target)
    return t.render(md)


def report(a: argparse.Namespace, libs: set, res: Results, skipped: list[str]) -> str:
    shapes = a.shapes
    cols = []
    for s in shapes:
        narr, n = count(shape_spec(s))
        cols.append(f"{s}: {narr} arr, {n / 1e6:.1f}M")
    md = a.markdown
    out: list[str] = []
    info = machine(libs)
    out += [("- " if md else "") + line for line in info]
    mode = "quick" if a.quick else "full"
    steps = [max((v for (_, s), v in res.steps.items() if s == sh), default=0)
             for sh in shapes]
    out.append(("- " if md else "") + f"run: {mode}, medians of {'/'.join(map(str, steps))} "
               f"interleaved steps per row (by shape) after {a.warmup} warm-up, Adam lr {LR}, "
               f"float32, JAX donation {a.donation}")
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
        keys += [k + x for x in ("", KEPT) for k in ("ours jax (jit)", "optax.adam (jit)")
                 if res_has(res, k + x, shapes)]
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
    if shapes:
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
        ratio("ours numpy / torch fused", "ours numpy", "torch Adam fused")
    if "numpy" in libs:
        ratio("ours numpy / numpy loop", "ours numpy", "numpy loop", "A,C <= 1.0, B <= 0.3")
        ratio("ours numpy scheduled / unscheduled", "ours numpy, scheduled eta", "ours numpy",
              "<= 1.2")
    if "torch" in libs:
        ratio("ours torch / torch fused", "ours torch", "torch Adam fused",
              "A,C <= 1.05, B <= 0.5")
        ratio("ours torch nn.Module / torch fused", "ours torch nn.Module", "torch Adam fused",
              "A,C <= 1.05, B <= 0.5")
        ratio("ours torch / torch foreach", "ours torch", "torch Adam foreach")
        ratio("ours torch scheduled / unscheduled", "ours torch, scheduled eta", "ours torch",
              "<= 1.2")
    if "jax" in libs:
        ratio("ours jax / optax", "ours jax (jit)", "optax.adam (jit)",
              "A,C,GPT* <= 1.0, B <= 1.25")
        ratio("ours jax / optax, kept", "ours jax (jit)" + KEPT, "optax.adam (jit)" + KEPT,
              "<= 1.0")
        for k in JAX_FLOOR:
            if res_has(res, k, shapes):
                ratio(f"{k} / optax", k, "optax.adam (jit)")
    for k in keys:
        if k.startswith("ours"):
            ratio_floor(f"{k} / bandwidth floor", k)
    if r.rows:
        out.append(r.render(md))

    if res_has(res, MATRIX_ROWS[0], ["C"]):
        out.append(matrix_table(res, foot, md))

    # 3. compile
    if "jax" in libs and shapes:
        c = Table("JAX compile time, s (trace + compile, summed over every compiling call)",
                  cols)
        for k in ("ours jax (jit)", "optax.adam (jit)", "ours jax (jit)" + KEPT,
                  "optax.adam (jit)" + KEPT, *JAX_FLOOR):
            if (k in JAX_FLOOR or k.endswith(KEPT)) and not any(
                    (k, s) in res.compile for s in shapes):
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
        def compile_ratio(name: str, k: str, target: str = "",
                          peer: str = "optax.adam (jit)") -> None:
            c.add(name, [fmt_ratio(res.compile.get((k, s), (None,))[0],
                                   res.compile.get((peer, s), (None,))[0])
                         for s in shapes], target)

        compile_ratio("ours / optax", "ours jax (jit)", "<= 1.0")
        if any(("ours jax (jit)" + KEPT, s) in res.compile for s in shapes):
            compile_ratio("ours / optax, kept", "ours jax (jit)" + KEPT, "<= 1.0",
                          "optax.adam (jit)" + KEPT)
        for k in JAX_FLOOR:
            if any((k, s) in res.compile for s in shapes):
                compile_ratio(f"{k} / optax", k)
        out.append(c.render(md))

    # 4. destructure and setup
    if not a.no_extras and shapes:
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
