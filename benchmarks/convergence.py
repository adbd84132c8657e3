"""Convergence with memory-lean state (issue 29, item 4): AdamW with float32 state against
``LowPrecision(AdamW)`` (bfloat16 state) and ``Quantised(AdamW)`` (8-bit blockwise state).

Two tasks, each from the same initial arrays and batches on every library:

* ``demo``: the demo's spirals network (``optimisers.demo``: ``spirals``, ``init_arrays``,
  ``make_model``, ``Backend.step``, ``forward``, ``logistic_loss``) on NumPy (its
  hand-written backward pass), PyTorch and JAX. Its largest weight is 32 x 32 (1,024
  numbers), under ``Quantised``'s default ``min_size`` of 4,096, so here ``min_size=1024``:
  the hidden matrix's state is 8-bit, the smaller arrays' float32.
* ``gpt``: a small GPT-like next-token model (2 pre-norm blocks of 4-head causal attention
  and an MLP, width 64, context 32, vocabulary 64, 109k parameters; every weight matrix but
  the positions has at least 4,096 numbers) on a sequence drawn from a fixed random Markov
  chain (4 likely successors a token), on PyTorch (autograd) and JAX (``jax.grad`` under
  ``jax.jit``). On PyTorch, torchao's ``AdamW8bit`` too, where it imports.

The loss is measured every ``--every`` steps (the demo: on all training points; gpt: on 64
held-out sequences). Printed: each run's final loss (the mean of the last 5 measured
points), its difference relative to float32 state's on the same library, and the bytes of
optimiser state a parameter, summed over the arrays the state tree holds (step counters
included). The figure of the loss curves goes to ``benchmarks/convergence.png``.

    PYTHONPATH=src python benchmarks/convergence.py [--steps-demo 1000] [--steps-gpt 500]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

import optimisers as O
from optimisers.demo import Backend, forward, init_arrays, logistic_loss, make_model, spirals

ETA, LAMBD = 0.005, 0.01  # the demo's AdamW
GPT_ETA = 0.01
VOCAB, WIDTH, CONTEXT, HEADS, LAYERS, BATCH = 64, 64, 32, 4, 2, 16
LAST = 5  # the final loss: the mean of the last 5 measured points


def rules(min_size: int = 4096) -> dict[str, Any]:
    """The three states compared, by name, for AdamW(eta, lambd)."""
    return {"float32": lambda eta: O.AdamW(eta, lambd=LAMBD),
            "bfloat16": lambda eta: O.LowPrecision(O.AdamW(eta, lambd=LAMBD)),
            "8-bit": lambda eta: O.Quantised(O.AdamW(eta, lambd=LAMBD), min_size=min_size)}


def state_bytes(tree: Any) -> int:
    """The bytes of every array in the state tree's Leafs (a tied Leaf once)."""
    seen: set[int] = set()

    def walk(node: Any) -> int:
        if isinstance(node, O.Leaf):
            if id(node) in seen:
                return 0
            seen.add(id(node))
            return walk(node.state)
        if isinstance(node, dict):
            return sum(walk(v) for v in node.values())
        if isinstance(node, (list, tuple)):
            return sum(walk(v) for v in node)
        if hasattr(node, "__dataclass_fields__"):
            return sum(walk(getattr(node, f)) for f in node.__dataclass_fields__)
        return int(node.nbytes) if hasattr(node, "shape") else 0

    return walk(tree)


def result(curve: list, t0: float, bytes_: float) -> dict:
    """A run's record: its curve, its final loss (the mean of the last ``LAST`` measured
    points: one step's loss is noisy), the seconds since ``t0``, bytes a parameter."""
    final = float(np.mean([loss for _, loss in curve[-LAST:]]))
    return {"curve": curve, "loss": final, "seconds": time.perf_counter() - t0, "bytes": bytes_}


def n_params(model: Any) -> int:
    """Trainable numbers in ``model`` (a tie once)."""
    return sum(math.prod(p.shape) for p in O.trainables(model))


# ---------------------------------------------------------------- the demo's task


def demo_run(lib: str, rule: Any, steps: int, every: int, seed: int = 0) -> dict:
    """Train the demo's network with ``rule``: the loss curve, final loss, bytes a parameter."""
    bk = Backend(lib)
    try:
        x, s = spirals(512, seed)
        batches = np.random.default_rng([seed, 1]).integers(0, len(s), (steps, 64))
        model = make_model(bk, init_arrays(seed))
        tree = O.setup(rule, model)
        xs, ss = bk.array(x), bk.array(s)

        def loss() -> float:  # on all training points, with their own batch statistics
            if lib == "torch":
                import torch

                with torch.no_grad():
                    return float(logistic_loss(forward(model, xs, bk.xp, True)[0], ss, bk.xp))
            return float(logistic_loss(forward(model, xs, bk.xp, True)[0], ss, bk.xp))

        curve, t0 = [(0, loss())], time.perf_counter()
        for i, idx in enumerate(batches, 1):
            tree, model = bk.step(tree, model, bk.array(x[idx]), bk.array(s[idx]))[:2]
            if i % every == 0 or i == steps:
                curve.append((i, loss()))
        return result(curve, t0, state_bytes(tree) / n_params(model))
    finally:
        bk.close()


# ---------------------------------------------------------------- a small GPT


def markov_tokens(n: int, seed: int = 0) -> np.ndarray:
    """``n`` tokens of a fixed random Markov chain: after each token, one of 4 tokens
    (probabilities 0.55, 0.25, 0.15, 0.05): a floor of 1.1 nats against log 64 = 4.16."""
    rng = np.random.default_rng(seed)
    nxt = rng.integers(0, VOCAB, (VOCAB, 4))
    pick = rng.choice(4, n, p=[0.55, 0.25, 0.15, 0.05])
    out = np.zeros(n, np.int64)
    out[0] = rng.integers(0, VOCAB)
    for i in range(1, n):
        out[i] = nxt[out[i - 1], pick[i]]
    return out


def gpt_data(steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each step's batch of windows ``(steps, BATCH, CONTEXT + 1)`` and 64 held-out ones."""
    tokens = markov_tokens(200_000, seed)
    held, train = tokens[:20_000], tokens[20_000:]
    rng = np.random.default_rng([seed, 2])
    starts = rng.integers(0, len(train) - CONTEXT - 1, (steps, BATCH))
    windows = train[starts[..., None] + np.arange(CONTEXT + 1)]
    test = held[np.arange(64)[:, None] * 300 + np.arange(CONTEXT + 1)]
    return windows, test


def gpt_init(seed: int = 0) -> dict:
    """The GPT's arrays in NumPy float32 (every library starts from these)."""
    rng, d = np.random.default_rng([seed, 3]), WIDTH

    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return rng.normal(0, std, shape).astype(np.float32)

    blocks = [{"g1": np.ones(d, np.float32), "qkv": normal(d, 3 * d), "o": normal(d, d),
               "g2": np.ones(d, np.float32), "w1": normal(d, 4 * d), "w2": normal(4 * d, d)}
              for _ in range(LAYERS)]
    return {"embed": normal(VOCAB, d), "pos": normal(CONTEXT, d), "blocks": blocks,
            "g": np.ones(d, np.float32), "head": normal(d, VOCAB)}


def gpt_loss(p: dict, windows: Any, xp: Any, ops: dict) -> Any:
    """Mean next-token cross-entropy; ``windows`` one-hot ``(B, T + 1, VOCAB)``, float32."""
    inputs, targets = windows[:, :-1], windows[:, 1:]
    b, t, hd = inputs.shape[0], CONTEXT, WIDTH // HEADS
    mask = ops["mask"]
    h = inputs @ p["embed"] + p["pos"]

    def norm(x: Any, g: Any) -> Any:
        return x / xp.sqrt(ops["mean"](x * x) + 1e-6) * g  # RMSNorm

    def heads(x: Any) -> Any:
        return xp.swapaxes(x.reshape(b, t, HEADS, hd), 1, 2)

    for blk in p["blocks"]:
        qkv = norm(h, blk["g1"]) @ blk["qkv"]
        q, k, v = (heads(qkv[..., i * WIDTH:(i + 1) * WIDTH]) for i in range(3))
        att = ops["softmax"](q @ xp.swapaxes(k, -1, -2) / math.sqrt(hd) + mask)
        h = h + xp.swapaxes(att @ v, 1, 2).reshape(b, t, WIDTH) @ blk["o"]
        u = norm(h, blk["g2"]) @ blk["w1"]
        h = h + (u * ops["sigmoid"](1.702 * u)) @ blk["w2"]  # GELU, sigmoid's approximation
    logits = norm(h, p["g"]) @ p["head"]
    return xp.mean(ops["logsumexp"](logits) - xp.sum(logits * targets, -1))


def _causal() -> np.ndarray:
    return np.triu(np.full((CONTEXT, CONTEXT), -1e9, np.float32), 1)


def _onehot(windows: np.ndarray) -> np.ndarray:
    return np.eye(VOCAB, dtype=np.float32)[windows]


def gpt_torch(make: Any, steps: int, every: int, torchao: bool = False) -> dict:
    """Train the GPT on PyTorch (one thread) with ``make(eta)``, or torchao's AdamW8bit."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ops = {"mean": lambda x: x.mean(-1, keepdim=True), "softmax": lambda x: x.softmax(-1),
               "sigmoid": torch.sigmoid, "logsumexp": lambda x: x.logsumexp(-1),
               "mask": torch.from_numpy(_causal())}
        windows, test = gpt_data(steps)
        p = O.fmap(lambda a: torch.tensor(a, requires_grad=True), gpt_init())
        params = O.trainables(p)
        test_t = torch.from_numpy(_onehot(test))
        if torchao:
            from torchao.optim import AdamW8bit

            opt = AdamW8bit(params, lr=GPT_ETA, weight_decay=LAMBD)
        else:
            tree = O.setup(make(GPT_ETA), p)

        def loss() -> float:
            with torch.no_grad():
                return float(gpt_loss(p, test_t, torch, ops))

        curve, t0 = [(0, loss())], time.perf_counter()
        for i, w in enumerate(windows, 1):
            for a in params:
                a.grad = None
            gpt_loss(p, torch.from_numpy(_onehot(w)), torch, ops).backward()
            if torchao:
                opt.step()
            else:
                tree, p = O.update_(tree, p, O.fmap(lambda a: a.grad, p))
            if i % every == 0 or i == steps:
                curve.append((i, loss()))
        held = torchao_bytes(opt) if torchao else state_bytes(tree)
        return result(curve, t0, held / n_params(p))
    finally:
        torch.set_num_threads(threads)


def torchao_bytes(opt: Any) -> int:
    """The bytes torchao's optimiser state holds: codes, scales, and each state's code table
    (``qmap``), each storage once."""
    seen, total = set(), 0
    for state in opt.state.values():
        for v in state.values():
            parts = [v.codes, v.scale, v.qmap] if hasattr(v, "codes") else [v]
            for a in parts:
                if a.untyped_storage().data_ptr() not in seen:
                    seen.add(a.untyped_storage().data_ptr())
                    total += a.nbytes
    return total


def gpt_jax(make: Any, steps: int, every: int) -> dict:
    """Train the GPT on JAX with ``make(eta)``, each step under ``jax.jit``."""
    import jax
    import jax.numpy as jnp

    ops = {"mean": lambda x: x.mean(-1, keepdims=True), "softmax": jax.nn.softmax,
           "sigmoid": jax.nn.sigmoid, "logsumexp": lambda x: jax.nn.logsumexp(x, -1),
           "mask": jnp.asarray(_causal())}
    windows, test = gpt_data(steps)
    p = jax.tree.map(jnp.asarray, gpt_init())
    tree = O.setup(make(GPT_ETA), p)
    test_j = jnp.asarray(_onehot(test))

    @jax.jit
    def step(tree: Any, p: Any, w: Any) -> tuple:
        grads = jax.grad(gpt_loss)(p, w, jnp, ops)
        return O.update(tree, p, grads)

    evaluate = jax.jit(lambda p: gpt_loss(p, test_j, jnp, ops))
    curve, t0 = [(0, float(evaluate(p)))], time.perf_counter()
    for i, w in enumerate(windows, 1):
        tree, p = step(tree, p, jnp.asarray(_onehot(w)))
        if i % every == 0 or i == steps:
            curve.append((i, float(evaluate(p))))
    return result(curve, t0, state_bytes(tree) / n_params(p))


# ---------------------------------------------------------------- the table and figure


def run_all(steps_demo: int, steps_gpt: int, every: int, libs: tuple = ("numpy", "torch", "jax"),
            torchao: bool = True) -> dict:
    """Every (task, library, state) run: ``{(task, lib, state): result}``; torchao's, where
    it imports, as ``("gpt", "torch", "torchao 8-bit")`` (or its error as ``"error"``)."""
    out: dict = {}
    for lib in libs:
        for state, make in rules(min_size=1024).items():
            out["demo", lib, state] = demo_run(lib, make(ETA), steps_demo, every)
    for lib in (lib for lib in libs if lib != "numpy"):
        for state, make in rules().items():
            train = gpt_torch if lib == "torch" else gpt_jax
            out["gpt", lib, state] = train(make, steps_gpt, every)
    if torchao and "torch" in libs:
        try:
            out["gpt", "torch", "torchao 8-bit"] = gpt_torch(None, steps_gpt, every, True)
        except Exception as e:  # torchao missing, or not working on this torch
            out["gpt", "torch", "torchao 8-bit"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def table(results: dict) -> str:
    """The markdown table: final loss, relative difference to float32 state, bytes."""
    lines = ["| task | library | state | final loss | vs float32 | state bytes/param | time |",
             "|---|---|---|---:|---:|---:|---:|"]
    for (task, lib, state), r in results.items():
        if "error" in r:
            lines.append(f"| {task} | {lib} | {state} | {r['error'][:60]} | | | |")
            continue
        ref = results[task, lib, "float32"]["loss"]
        lines.append(f"| {task} | {lib} | {state} | {r['loss']:.4f} | "
                     f"{(r['loss'] - ref) / ref:+.2%} | {r['bytes']:.2f} | {r['seconds']:.1f} s |")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """The loss curves, one column a task (colour by state, line style by library), and
    below each, every curve's difference relative to float32 state's on its library."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"float32": "black", "bfloat16": "tab:blue", "8-bit": "tab:orange",
               "torchao 8-bit": "tab:red"}
    styles = {"numpy": ":", "torch": "-", "jax": "--"}
    fig, axes = plt.subplots(2, 2, figsize=(10, 6), dpi=80, sharex="col",
                             gridspec_kw={"height_ratios": [2, 1]})
    titles = {"demo": "demo: spirals MLP (AdamW, lr 0.005)",
              "gpt": "small GPT, next token (AdamW, lr 0.01)"}
    for (top, low), task in zip(axes.T, titles):
        for (t, lib, state), r in results.items():
            if t == task and "curve" in r:
                steps, losses = map(np.array, zip(*r["curve"]))
                ref = np.array([v for _, v in results[t, lib, "float32"]["curve"]])
                kw = {"ls": styles[lib], "color": colours[state], "lw": 1.1}
                top.plot(steps, losses, label=f"{lib} {state}", **kw)
                low.plot(steps, 100 * (losses - ref) / ref, **kw)
        top.set(yscale="log", ylabel="loss", title=titles[task])
        low.set(xlabel="step", ylabel="vs float32 state (%)")
        for ax in (top, low):
            ax.grid(True, which="both", alpha=0.3)
        top.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps-demo", type=int, default=1000)
    parser.add_argument("--steps-gpt", type=int, default=500)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--only", default="numpy,torch,jax")
    parser.add_argument("--no-torchao", action="store_true")
    parser.add_argument("--figure", default=str(Path(__file__).with_name("convergence.png")))
    args = parser.parse_args()
    t0 = time.perf_counter()
    results = run_all(args.steps_demo, args.steps_gpt, args.every,
                      tuple(args.only.split(",")), not args.no_torchao)
    print(table(results))
    for key, r in results.items():
        if "error" in r:
            print(f"{' '.join(key)}: {r['error']}")
    plot(results, Path(args.figure))
    print(f"figure: {args.figure}; {time.perf_counter() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
