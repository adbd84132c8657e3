"""``optimisers demo``: the whole library at work on one small training run.

A small MLP with a BatchNorm layer and a tied weight learns to tell two interleaved
spirals apart. The NumPy backend writes its backward pass by hand; ``--backend torch`` and
``--backend jax`` take the gradients from ``torch.autograd`` and ``jax.grad`` instead.
On the way it shows, one printed line each: trainable children declared by name, a tied
weight, ``freeze_`` / ``thaw_``, ``adjust_`` of the learning rate, weight decay switched off
for biases with ``where=``, ``AccumGrad``, a checkpoint resumed bit for bit, and
``summary``. Then it trains the same network with several rules and prints a table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import optimisers
from optimisers import (
    AccumGrad,
    Adam,
    AdamW,
    Descent,
    Lion,
    Momentum,
    Nesterov,
    OptimiserChain,
    adjust_,
    destructure,
    fleaves,
    fmap_with_path,
    freeze_,
    isnumeric,
    load,
    save,
    select,
    setup,
    summary,
    thaw_,
    trainable,
    trainables,
)
from optimisers.demo.backends import BACKENDS, Backend
from optimisers.demo.model import (  # noqa: F401 (the names tests and users reach)
    HIDDEN,
    MLP,
    MOMENTUM,
    forward,
    init_arrays,
    logistic_loss,
    make_model,
    numpy_grads,
    spirals,
)

BATCH = 64
TOUR_RULE = OptimiserChain(AccumGrad(2), AdamW(0.01, lambd=0.01))
COMPARED = [Descent(0.2), Momentum(0.02, 0.9), Nesterov(0.02, 0.9), Adam(0.005),
            AdamW(0.005, lambd=0.01), Lion(0.001)]


# ----------------------------------------------------------------------------- progress


class Progress:
    """A progress bar: tqdm when it is installed and stdout is a terminal, else a plain
    text line half-way and at the end. Lines printed meanwhile go through :meth:`write`."""

    def __init__(self, label: str, start: int, stop: int) -> None:
        self.label, self.stop, self.bar = label, stop, None
        self.marks = {(start + stop) // 2, stop}
        if sys.stdout.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            width = shutil.get_terminal_size().columns  # 80 where the size is unknown
            self.bar = tqdm(total=stop - start, desc=f"{label:>10}", file=sys.stdout,
                            ncols=min(width, 120), unit="step")

    def step(self, i: int, loss: float) -> None:
        """Step ``i`` (counting from 1) is done, with this training loss."""
        if self.bar is not None:
            self.bar.update(1)
            if i % 20 == 0 or i == self.stop:
                self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        elif i in self.marks:
            print(f"  {self.label:>10}  step {i:>5}/{self.stop}  loss {loss:.4f}", flush=True)

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------- training


@dataclass
class Task:
    """What every run shares: the backend, the data, the initial weights, and the
    minibatch of each step (fixed in advance, so a resumed run sees the same ones)."""

    bk: Backend
    points: np.ndarray
    labels: np.ndarray
    test_points: np.ndarray
    test_labels: np.ndarray
    batches: np.ndarray
    init: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        self.x, self.x_test = self.bk.array(self.points), self.bk.array(self.test_points)


def make_task(bk: Backend, steps: int, seed: int, n: int = 512) -> Task:
    x, s = spirals(n, seed)
    xt, st = spirals(n, seed + 10_000)
    batches = np.random.default_rng([seed, 1]).integers(0, n, (steps, BATCH))
    return Task(bk, x, s, xt, st, batches, init_arrays(seed))


def train(task: Task, tree: Any, model: MLP, start: int, stop: int, label: str,
          hook: Callable | None = None) -> tuple[Any, MLP]:
    """Steps ``start`` to ``stop``; ``hook(i, tree, model, bar)`` runs before step ``i``."""
    bk = task.bk
    with Progress(label, start, stop) as bar:
        for i in range(start, stop):
            if hook is not None:
                hook(i, tree, model, bar)
            idx = task.batches[i]
            tree, model, loss, (mean, var) = bk.step(
                tree, model, bk.array(task.points[idx]), bk.array(task.labels[idx]))
            bn = model.norm  # the running statistics follow the forward pass's batches
            bn.mu = (1 - MOMENTUM) * bn.mu + MOMENTUM * mean
            bn.var = (1 - MOMENTUM) * bn.var + MOMENTUM * var
            bar.step(i + 1, loss)
    return tree, model


def evaluate(task: Task, model: MLP) -> tuple[float, float, float]:
    """Loss and accuracy on the training points, accuracy on the test points."""
    z = task.bk.logits(model, task.x).astype(np.float64)
    zt = task.bk.logits(model, task.x_test)
    return (float(logistic_loss(z, task.labels, np)), float(np.mean(z * task.labels > 0)),
            float(np.mean(zt * task.test_labels > 0)))


# ----------------------------------------------------------------------------- the tour


def arrays_of(bk: Backend, tree: Any, model: MLP) -> list[np.ndarray]:
    """Every array of the model and of the optimiser state, as NumPy, in walk order."""
    out = [bk.numpy(a) for a in fleaves(model) if isnumeric(a)]
    for leaf in select(tree):
        out += [bk.numpy(a) for a in fleaves(leaf.state) if isnumeric(a)]
    return out


def save_model(path: str, bk: Backend, model: MLP) -> None:
    """The model's arrays into an ``.npz``, keyed by path (a tied array once)."""
    found: dict[str, np.ndarray] = {}
    fmap_with_path(lambda kp, a: found.setdefault(str(kp), bk.numpy(a)) if isnumeric(a)
                   else a, model)
    np.savez(path, **found)


def load_model(path: str, bk: Backend, like: MLP) -> MLP:
    """``like`` with its arrays read back from :func:`save_model`'s file, ties kept."""
    with np.load(path, allow_pickle=False) as f:
        return bk.prepare(fmap_with_path(
            lambda kp, a: bk.array(f[str(kp)]) if isnumeric(a) else a, like))


def _identical(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape
                                    and x.tobytes() == y.tobytes() for x, y in zip(a, b))


class Tour:
    """The run that shows every feature: what happens at which step, and its lines."""

    def __init__(self, task: Task, steps: int, folder: str, out: Callable[[str], None]):
        self.task, self.steps, self.out = task, steps, out
        self.freeze_at, self.adjust_at, self.thaw_at = steps // 4, steps // 2, 3 * steps // 4
        self.save_at = self.adjust_at | 1  # odd: half-way through an AccumGrad(2) cycle
        self.eta = 0.003
        self.ckpt = os.path.join(folder, "state.ckpt")
        self.weights = os.path.join(folder, "model.npz")
        self.seen: dict[Any, Any] = {}

    def snap(self, model: MLP, *layers: str) -> list[np.ndarray]:
        bk = self.task.bk
        return [bk.numpy(a).copy() for n in layers for a in vars(getattr(model, n)).values()]

    def hook(self, i: int, tree: Any, model: MLP, bar: Progress, quiet: bool = False) -> None:
        say = (lambda line: None) if quiet else bar.write
        if i < 3:  # AccumGrad(2): the first micro-batch of each pair moves nothing
            self.seen[i] = self.snap(model, "head")
        if i == 2:
            same = _identical(self.seen[0], self.seen[1])
            moved = not _identical(self.seen[1], self.seen[2])
            say(f"AccumGrad(2): after micro-batch 1 the weights are unchanged ({same}); "
                f"after micro-batch 2 they took one step with the mean gradient ({moved})")
        if i == self.freeze_at:
            freeze_(tree["encoder"])
            self.seen["encoder"] = self.snap(model, "encoder")
            say(f"freeze_: step {i}: freeze_(tree['encoder']) marks the encoder's Leafs "
                f"frozen; updates skip them")
        if i == self.adjust_at:
            old = float(tree["head"]["weight"].rule.rules[1].eta)
            adjust_(tree, self.eta)
            say(f"adjust_: step {i}: adjust_(tree, {self.eta}) lowers the learning rate "
                f"{old:g} -> {self.eta} in every rule, keeping the optimiser state")
        if i == self.save_at and not quiet:
            save(self.ckpt, tree)
            save_model(self.weights, self.task.bk, model)
        if i == self.thaw_at:
            thaw_(tree["encoder"])
            if not quiet:
                still = _identical(self.seen["encoder"], self.snap(model, "encoder"))
                say(f"thaw_: step {i}: thaw_(tree['encoder']): the encoder trains again; it "
                    f"did not move while frozen for {i - self.freeze_at} steps: {still}")

    def resume(self, tree: Any, model: MLP) -> None:
        """Train again from the checkpoint, in fresh objects; compare with the run."""
        bk = self.task.bk
        m2 = load_model(self.weights, bk, make_model(bk, self.task.init))
        t2 = load(self.ckpt, like=setup(TOUR_RULE, m2))
        t2, m2 = train(self.task, t2, m2, self.save_at, self.steps, "resumed",
                       lambda i, *a: i > self.save_at and self.hook(i, *a, quiet=True))
        a, b = arrays_of(bk, tree, model), arrays_of(bk, t2, m2)
        self.out(f"checkpoint: save(path, tree) at step {self.save_at} (mid-accumulation, "
                 f"encoder frozen, eta {self.eta}; {os.path.getsize(self.ckpt)} bytes, no "
                 f"pickle), load(path, like=setup(rule, model)), {self.steps - self.save_at} "
                 f"more steps: {len(a)} arrays {'match' if _identical(a, b) else 'MISMATCH'} "
                 f"the uninterrupted run bit for bit")


def tour(task: Task, steps: int, out: Callable[[str], None]) -> None:
    bk = task.bk
    model = make_model(bk, task.init)
    tree = setup(TOUR_RULE, model)
    out(f"rule: {TOUR_RULE!r}")
    adjust_(tree, where="*.bias", lambd=0.0)
    biases = [str(kp) for kp, _ in trainables(model, path=True) if kp[-1] == "bias"]
    out(f"weight decay: adjust_(tree, where='*.bias', lambd=0.0) switches it off for "
        f"{', '.join(biases)}; the other Leafs keep lambd="
        f"{tree['head']['weight'].rule.rules[1].lambd}")
    mu0, var0 = (float(np.abs(bk.numpy(v)).mean()) for v in (model.norm.mu, model.norm.var))
    with tempfile.TemporaryDirectory(prefix="optimisers-demo-") as folder:
        t = Tour(task, steps, folder, out)
        tree, model = train(task, tree, model, 0, steps, "tour", t.hook)
        t.resume(tree, model)
    bn, nt = model.norm, tree["norm"]
    mu1, var1 = (float(np.abs(bk.numpy(v)).mean()) for v in (bn.mu, bn.var))
    out(f"BatchNorm: trainable(model.norm) = {trainable(bn)}; the state tree has mu: "
        f"{nt['mu']}, var: {nt['var']}, so no rule trains them, yet the forward pass moved "
        f"them: mean |mu| {mu0:.3f} -> {mu1:.3f}, mean var {var0:.3f} -> {var1:.3f}")
    if bk.name == "jax":
        out("tied weight: JAX arrays are immutable, so optimisers never ties them by "
            "identity; here block2 reuses block1.weight in the forward pass, and jax.grad "
            "adds up both uses")
    else:
        shared = tree["block1"]["weight"] is tree["block2"]["weight"]
        tied = model.block1.weight is model.block2.weight
        out(f"tied weight: block1.weight is block2.weight, with one shared Leaf ({shared}) "
            f"that gets the sum of both paths' gradients; still one array after {steps} "
            f"steps: {tied}")
    flat, re = destructure(model)
    out(f"destructure(model): {len(re)} trainable numbers in one vector (the tied weight "
        f"once, the running statistics not at all)")
    out("summary(tree, model):")
    out(summary(tree, model))


# ----------------------------------------------------------------------------- comparison


def compare(task: Task, steps: int, out: Callable[[str], None]) -> dict[str, tuple]:
    """Train a fresh copy of the network with each rule; print the table; return each
    rule's loss curve (the loss on all training points, every 1% of the run)."""
    rows, curves = [], {}
    every = max(1, steps // 100)
    for rule in COMPARED:
        name = type(rule).__name__
        model = make_model(task.bk, task.init)
        at: list[int] = []
        losses: list[float] = []

        def record(i: int, tree: Any, model: MLP, bar: Progress, at: list = at,
                   losses: list = losses) -> None:
            if i % every == 0:
                at.append(i)
                losses.append(evaluate(task, model)[0])

        t0 = time.perf_counter()
        _, model = train(task, setup(rule, model), model, 0, steps, name, record)
        seconds = time.perf_counter() - t0
        result = evaluate(task, model)
        curves[name] = (at + [steps], losses + [result[0]])
        rows.append((repr(rule), *result, seconds))
    width = max(len(r[0]) for r in rows)
    out(f"{'rule':<{width}}  final loss  train acc  test acc  time")
    for rule, loss, acc, test, seconds in rows:
        out(f"{rule:<{width}}  {loss:>10.4f}  {acc:>9.1%}  {test:>8.1%}  {seconds:4.1f} s")
    return curves


def plot(path: str, curves: dict[str, tuple], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, (steps, losses) in curves.items():
        ax.plot(steps, losses, label=name, lw=1.6)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss on all training points")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------------- command line


def _steps(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 8:
        raise argparse.ArgumentTypeError(f"must be at least 8 (the run freezes, adjusts, "
                                          f"saves and thaws at its quarters), got {n}")
    return n


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser``."""
    parser.add_argument("--steps", type=_steps, default=2000, metavar="N",
                        help="training steps of each run (default: 2000; at least 8)")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="seed of the data, the initial weights and the minibatches "
                             "(default: 0)")
    parser.add_argument("--backend", choices=list(BACKENDS), default="numpy",
                        help="the array library and its gradients: numpy (hand-written "
                             "backward pass; the default), torch (torch.autograd) or jax "
                             "(jax.grad)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="write the loss curves of the compared rules to this image "
                             '(needs matplotlib: pip install "optimisers[plot]")')


def make_parser(prog: str = "optimisers demo") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=" ".join(__doc__.split("\n\n")[1].replace("``", "").split()))
    add_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the demo with parsed ``args``; returns the exit status."""
    err = sys.stderr
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print('optimisers demo: --plot needs matplotlib, which is not installed; '
                  'install it with: pip install "optimisers[plot]"', file=err)
            return 1
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):
            print(f"optimisers demo: --plot {args.plot}: there is no folder {folder}",
                  file=err)
            return 2
    cls, pretty = BACKENDS[args.backend]
    try:
        bk = cls()
    except ImportError:
        print(f"optimisers demo: --backend {args.backend} needs {pretty}, which is not "
              f'installed; install it with: pip install "optimisers[{args.backend}]"',
              file=err)
        return 1
    with bk:
        return _run(bk, args)


def _run(bk: Backend, args: argparse.Namespace) -> int:
    def out(line: str) -> None:
        print(line, flush=True)

    t0 = time.perf_counter()
    task = make_task(bk, args.steps, args.seed)
    h = HIDDEN
    out(f"optimisers {optimisers.__version__} demo, backend {bk.name} ({bk.how})")
    out(f"data: two interleaved spirals, {len(task.labels)} training and "
        f"{len(task.test_labels)} test points; model: an MLP 2-{h}-BatchNorm-{h}-{h}-1 with a "
        f"tied weight; {args.steps} steps of {BATCH} points; seed {args.seed}")
    out("")
    out("== one run that shows every feature ==")
    tour(task, args.steps, out)
    out("")
    out(f"== {len(COMPARED)} rules on the same task: the same initial weights and batches ==")
    curves = compare(task, args.steps, out)
    if args.plot is not None:
        plot(args.plot, curves, f"optimisers demo: two spirals, {bk.name}, seed {args.seed}")
        out(f"plot: wrote the loss curves of {len(curves)} rules to {args.plot}")
    out(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """main(argv) -> exit status: ``optimisers demo`` with the options in ``argv``."""
    return run(make_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
