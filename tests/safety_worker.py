"""The worker of ``test_safety.py``, run as a script (conftest.py keeps pytest from
importing it): random sequences of documented operations on one array library, every
step checked against a float64 reference; and the two halves of a torch run resumed in
a new process.

    python tests/safety_worker.py sequences numpy FIRST COUNT
    python tests/safety_worker.py resume first DIRECTORY
    python tests/safety_worker.py resume second DIRECTORY

A sequence is drawn from its seed alone: a model (dicts and lists of float32 arrays, ties
included where the library's arrays are mutable), a rule, and up to 8 operations, the last
two steps, among ``update`` / ``update_`` (and ``jax.jit(update)``), ``adjust`` /
``adjust_`` (a number, a schedule in its place and back, another field, a misspelt field),
``freeze_`` / ``thaw_``, a parameter resized after ``setup`` (refused, nothing written),
``save`` and ``load``, and ``os.fork`` (the child finishes the sequence too and must end bit
for bit where its parent does).

The reference is a float64 copy of the model, set up with the same rule and stepped by
``update_`` with each Leaf alone (its rule's ``apply``, no group, no ``jit``). What
``adjust``, ``freeze_`` and ``thaw_`` mean is worked out here, on the reference's Leafs
(their ``rule`` and ``frozen``), not by calling them; and the operations that must not
change the numbers (``save``/``load``, fork, the refused resize) are not done to it. So a
fault in any of those, in a group's step, under ``jit`` or in float32 shows as a parameter
past float32 rounding of the reference, or a clock or frozen flag unlike it.

Each sequence prints ``start SEED`` before it runs and ``ok SEED`` or ``FAIL SEED`` and a
traceback after, so that a crash names the sequence it happened in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import optimisers as O
from optimisers.fast import fused

EPSILON = float(np.finfo(np.float32).eps)
"""float32's rounding unit: the run under test works in float32, its reference in float64."""

RTOL = ATOL = 16 * EPSILON
"""How far a float32 parameter may lie from its float64 reference: ``|x - y| <= 16 eps (|y|
+ 1)``. A sequence takes at most 8 steps; each rounds the parameter (half a unit, relative
to it) and its update (a unit or two, relative to the update, itself a hundredth of the
parameter or less), so a correct run stays within about 8 units; 16 is twice that. A wrong
step, a lost clock or a dropped hyper-parameter is a thousand times larger (a learning rate
of 1e-3 or more applied wrongly)."""

LAYOUTS: list[tuple[Any, list[tuple[int, ...]]]] = [
    ({"w": 0, "b": 1, "s": 2}, [(3, 4), (4,), ()]),
    ({"enc": {"w": 0, "b": 1}, "dec": [2, 3]}, [(2, 2), (2,), (2, 2), (3,)]),
    ([0, {"k": 1, "v": 2}], [(5,), (2, 3), (2, 3)]),
    ({"emb": 0, "head": 0, "bias": 1}, [(4, 3), (3,)]),
    ([{"a": 0}, {"a": 0, "c": 1}], [(3,), (2,)]),
]
"""Models as a nesting of array numbers with each number's shape; a number at two paths is
one array there (a tie). The first three have none (JAX arrays are never tied), and JAX
takes only the first two: each new structure under ``jit`` is a compilation, and those
take most of the time its sequences take."""

RULES = [
    O.Adam(1e-2),
    O.AdamW(O.Cosine(1e-2, 1e-3, 50), lambd=0.01),
    O.Momentum(1e-2, 0.9),
    O.Nesterov(1e-2, 0.9),
    O.Lion(1e-3),
    O.RMSProp(1e-3),
    O.OptimiserChain(O.ClipGlobalNorm(1.0), O.AdamW(1e-2, lambd=0.01)),
    O.OptimiserChain(O.ClipGrad(0.5), O.Momentum(1e-2)),
    O.OptimiserChain(O.WeightDecay(1e-3), O.Adam(1e-2)),
]

ETAS: list[Any] = [5e-3, 2e-2, O.Cosine(1e-2, 1e-3, 20), O.Warmup(O.Cosine(1e-2, 1e-3, 20), 3),
                   O.Linear(2e-2, 1e-3, 10)]
"""Learning rates that ``adjust`` puts in: numbers, and schedules in place of a number."""

FIELDS = {"beta": (0.8, 0.99), "lambd": 0.02, "rho": 0.8, "delta": 0.3, "omega": 0.7}
"""Other hyper-parameters that ``adjust`` changes: a rule without the field is left as it
is, and when no chosen rule has it ``adjust`` refuses with ``TypeError``."""

OPERATIONS = ["step"] * 6 + ["adjust"] * 3 + ["freeze", "thaw", "resize", "save", "fork"]


@dataclass(frozen=True)
class Library:
    """How a sequence meets one array library."""

    name: str
    array: Callable[[np.ndarray], Any]  # a float32 NumPy array -> the library's own
    numpy: Callable[[Any], np.ndarray]
    steps: dict[str, Callable]  # how a step may be taken, by name
    mutable: bool  # its arrays can be tied (one object at two paths) and forked
    layouts: int  # how many of LAYOUTS it takes


def library(name: str) -> Library:
    """The :class:`Library` called ``name``: numpy, torch or jax."""
    steps = {"update": O.update, "update_": O.update_}
    if name == "numpy":
        return Library(name, np.copy, np.asarray, steps, True, len(LAYOUTS))
    if name == "torch":
        import torch

        torch.set_num_threads(1)  # three workers share the machine's cores
        return Library(name, torch.from_numpy, lambda x: x.detach().numpy(), steps, True,
                       len(LAYOUTS))
    import jax
    import jax.numpy as jnp

    return Library(name, jnp.asarray, np.asarray, {**steps, "jit": jax.jit(O.update)}, False, 2)


def nest(layout: Any, make: Callable[[int, int], Any]) -> Any:
    """``layout`` with each array number ``n`` at the ``i``-th path replaced by
    ``make(n, i)``."""
    count = iter(range(1 << 30))

    def build(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: build(v) for k, v in node.items()}
        if isinstance(node, list):
            return [build(v) for v in node]
        return make(node, next(count))

    return build(layout)


def paths(layout: Any, prefix: str = "") -> list[str]:
    """The dotted paths of ``layout``'s nodes (sub-trees and arrays), for ``where=``."""
    items = layout.items() if isinstance(layout, dict) else enumerate(layout)
    found = []
    for key, node in items:
        path = f"{prefix}{key}"
        found.append(path)
        if isinstance(node, dict | list):
            found += paths(node, path + ".")
    return found


@dataclass(frozen=True)
class Op:
    """One operation of a sequence: a key of ``HANDLERS`` (or ``fork``) and its arguments."""

    kind: str
    args: tuple = ()


@dataclass
class Sequence:
    """What a seed draws: a model's layout and shapes, a rule, and the operations."""

    seed: int
    layout: Any
    shapes: list
    rule: O.Rule
    methods: list[str]  # how it may take a step
    ops: list[Op] = field(default_factory=list)


def draw(seed: int, lib: Library) -> Sequence:
    """The sequence of ``seed`` on ``lib``: its model, rule and operations (at least two
    steps, at most one fork). Those of odd seeds do not step under ``jit``: each new
    structure there costs a compilation, and these take most of JAX's time."""
    rng = np.random.default_rng(seed)
    layout, shapes = LAYOUTS[rng.integers(lib.layouts)]
    methods = [m for m in lib.steps if m != "jit" or seed % 2 == 0]
    sequence = Sequence(seed, layout, shapes, RULES[rng.integers(len(RULES))], methods)
    kinds = [str(k) for k in rng.choice(OPERATIONS, size=rng.integers(2, 7))]
    if not lib.mutable or kinds.count("fork") > 1:
        kinds = [k for k in kinds if k != "fork"] + (["fork"] if lib.mutable else [])
    for kind in [*kinds, "step", "step"]:
        sequence.ops.append(Op(kind, ARGUMENTS.get(kind, lambda *_: ())(rng, sequence, lib)))
    return sequence


def step_arguments(rng: np.random.Generator, sequence: Sequence, lib: Library) -> tuple:
    """How the step is taken and its gradients: float32 NumPy arrays, each path its own
    (so a tie sums two), sometimes ``None`` at one path (not under ``jit``)."""
    method = str(rng.choice(sequence.methods))
    positions: list[int] = []
    nest(sequence.layout, lambda n, i: positions.append(i))
    missing = int(rng.integers(len(positions))) if method != "jit" and rng.random() < 0.2 else -1
    grads = nest(sequence.layout, lambda n, i: None if i == missing else
                 rng.normal(size=sequence.shapes[n]).astype(np.float32))
    return method, grads


def adjust_arguments(rng: np.random.Generator, sequence: Sequence, lib: Library) -> tuple:
    """``(in_place, where, eta, fields)``: a learning rate (a number or a schedule), another
    field, or a misspelt one."""
    where = str(rng.choice(paths(sequence.layout))) if rng.random() < 0.3 else None
    pick = rng.integers(len(ETAS) + len(FIELDS) + 1)
    if pick < len(ETAS):
        return bool(rng.integers(2)), where, ETAS[pick], {}
    name = [*FIELDS, "lamdb"][pick - len(ETAS)]
    return bool(rng.integers(2)), where, None, {name: FIELDS.get(name, 0.1)}


def where_argument(rng: np.random.Generator, sequence: Sequence, lib: Library) -> tuple:
    return (str(rng.choice(paths(sequence.layout))) if rng.random() < 0.8 else None,)


def resize_argument(rng: np.random.Generator, sequence: Sequence, lib: Library) -> tuple:
    return int(rng.integers(1 << 20)), str(rng.choice(sequence.methods))


ARGUMENTS = {"step": step_arguments, "adjust": adjust_arguments, "freeze": where_argument,
             "thaw": where_argument, "resize": resize_argument}


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """Every Leaf stepped alone by its rule's ``apply``, as the reference is."""
    saved, fused.MIN_GROUP = fused.MIN_GROUP, 10**9
    try:
        yield
    finally:
        fused.MIN_GROUP = saved


def canonical(value: Any) -> Any:
    """``value`` (a state dict's entry) in a form that ``==`` compares exactly."""
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if hasattr(value, "shape"):
        array = np.array(value.detach().numpy() if hasattr(value, "detach") else value)
        return (str(array.dtype), array.shape, array.tobytes())
    return value


def snapshot(lib: Library, tree: Any, model: Any) -> Any:
    """Every trainable array of ``model`` and the whole state of ``tree``, as they are now."""
    return canonical([[lib.numpy(x).copy() for x in O.trainables(model)], O.state_dict(tree)])


class Run:
    """The run under test and its float64 reference, side by side."""

    def __init__(self, sequence: Sequence, lib: Library, directory: str):
        rng = np.random.default_rng([sequence.seed, 1])
        values = [rng.normal(size=s).astype(np.float32) for s in sequence.shapes]
        ours: dict[int, Any] = {}
        theirs: dict[int, Any] = {}
        self.lib, self.sequence, self.directory = lib, sequence, directory
        self.model = nest(sequence.layout, lambda n, i: ours.setdefault(
            n if lib.mutable else i, lib.array(values[n])))
        self.reference = nest(sequence.layout, lambda n, i: theirs.setdefault(
            n if lib.mutable else i, values[n].astype(np.float64)))
        self.tree = O.setup(sequence.rule, self.model)
        with alone():
            self.expected = O.setup(sequence.rule, self.reference)

    def check(self, what: str) -> None:
        """Our parameters, clocks and frozen flags against the reference's."""
        ours = dict(O.trainables(self.model, path=True))  # (jax.jit sorts a dict's keys)
        theirs = dict(O.trainables(self.reference, path=True))
        assert ours.keys() == theirs.keys(), (what, ours.keys(), theirs.keys())
        for kp, y in theirs.items():
            x = self.lib.numpy(ours[kp])
            assert x.dtype == np.float32 and x.shape == y.shape, (what, kp, x.dtype, x.shape)
            error = np.max(np.abs(x - y) - RTOL * np.abs(y), initial=0.0)
            assert error <= ATOL, f"{what}: {kp} is {error:.3g} past float32 rounding"
        flags = [{k: int(v) for k, v in O.state_dict(t).items()
                  if k.endswith((".clock", ".frozen"))} for t in (self.tree, self.expected)]
        assert flags[0] == flags[1], (what, flags)

    def grads(self, grads: Any) -> tuple[Any, Any]:
        """A step's gradients for us and for the reference."""
        ours = O.fmap(lambda g: None if g is None else self.lib.array(g), grads)
        return ours, O.fmap(lambda g: None if g is None else g.astype(np.float64), grads)


def step(run: Run, method: str, grads: Any) -> None:
    """One step by ``method``; ``update`` must leave the old tree and model as they were."""
    ours, theirs = run.grads(grads)
    old = run.tree, run.model
    before = snapshot(run.lib, *old) if method == "update" else None
    run.tree, run.model = run.lib.steps[method](run.tree, run.model, ours)
    assert before is None or snapshot(run.lib, *old) == before, "update wrote into its input"
    with alone():
        run.expected, run.reference = O.update_(run.expected, run.reference, theirs)
    run.check(f"after {method}")


def chosen(run: Run, where: str | None) -> list[O.Leaf]:
    """The reference's Leafs that ``where`` chooses, each once, by the documented meaning
    of ``where=`` worked out here: a node's dotted path chooses every Leaf below it, and a
    Leaf at several paths (a tie) is chosen by any of them; ``None`` chooses all."""
    found: dict[int, O.Leaf] = {}

    def walk(tree: Any, layout: Any, prefix: str) -> None:
        for key, node in layout.items() if isinstance(layout, dict) else enumerate(layout):
            path = f"{prefix}{key}"
            if isinstance(node, dict | list):
                walk(tree[key], node, path + ".")
            elif where is None or path == where or path.startswith(where + "."):
                found[id(tree[key])] = tree[key]

    walk(run.expected, run.sequence.layout, "")
    return list(found.values())


def names(rule: O.Rule) -> set[str]:
    """The fields of ``rule`` that ``adjust`` may change (through a chain)."""
    if isinstance(rule, O.OptimiserChain):
        return set().union(*(names(r) for r in rule.rules))
    return {f.name for f in dataclasses.fields(rule)}


def adjusted(rule: O.Rule, changes: dict) -> O.Rule:
    """``rule`` with each of ``changes`` that it has (through a chain)."""
    if isinstance(rule, O.OptimiserChain):
        return O.OptimiserChain(*(adjusted(r, changes) for r in rule.rules))
    return dataclasses.replace(rule, **{k: v for k, v in changes.items() if k in names(rule)})


def adjust(run: Run, in_place: bool, where: str | None, eta: Any, fields: dict) -> None:
    """``adjust`` or ``adjust_`` on the tree under test; the reference's chosen Leafs get
    their new rules here, by the documented meaning: each rule takes the fields it has,
    and when no chosen rule has one of them the call refuses with ``TypeError`` and
    changes nothing. A pure ``adjust`` leaves its input as it was."""
    changes = dict(fields, **({} if eta is None else {"eta": eta}))
    leaves = chosen(run, where)
    refuse = not set(changes) <= set().union(*(names(leaf.rule) for leaf in leaves))
    old = run.tree
    before = canonical(O.state_dict(old))
    try:
        if in_place:
            O.adjust_(run.tree, eta, where=where, **fields)
        else:
            run.tree = O.adjust(run.tree, eta, where=where, **fields)
    except TypeError as e:
        assert refuse and "check the spelling" in str(e), e
    else:
        assert not refuse, f"adjust took {changes}, which no rule at {where!r} has"
        for leaf in leaves:
            leaf.rule = adjusted(leaf.rule, changes)
    assert (in_place and not refuse) or canonical(O.state_dict(old)) == before, \
        "adjust changed the tree it was given"
    run.check(f"after adjust({eta!r}, where={where!r}, **{fields!r})")


def freeze(run: Run, where: str | None) -> None:
    """``freeze_`` on the tree under test; the reference's chosen Leafs frozen here."""
    O.freeze_(run.tree, where)
    for leaf in chosen(run, where):
        leaf.frozen = True
    run.check(f"after freeze_(where={where!r})")


def thaw(run: Run, where: str | None) -> None:
    """``thaw_`` on the tree under test; the reference's chosen Leafs thawed here."""
    O.thaw_(run.tree, where)
    for leaf in chosen(run, where):
        leaf.frozen = False
    run.check(f"after thaw_(where={where!r})")


def resize(run: Run, pick: int, method: str) -> None:
    """A parameter (one that is trained now) replaced by an array of another shape, as if
    resized after ``setup``: the step is refused with a ``ValueError`` naming its path,
    and nothing is written."""
    trained = [x for kp, x in O.trainables(run.model, path=True)
               if not O.getkeypath(run.tree, kp).frozen]
    if not trained:
        return
    old = trained[pick % len(trained)]
    shape = run.lib.numpy(old).shape
    new = run.lib.array(np.zeros((shape[0] + 1, *shape[1:]) if shape else (2,), np.float32))
    at: list = []
    model = O.fmap_with_path(lambda kp, x: (at.append(kp), new)[1] if x is old else x,
                             run.model)
    grads = O.fmap(lambda x: run.lib.array(np.full(run.lib.numpy(x).shape, 0.5, np.float32)),
                   model)
    before = snapshot(run.lib, run.tree, run.model)
    try:
        run.lib.steps[method](run.tree, model, grads)
    except ValueError as e:
        assert any(repr(kp) in str(e) for kp in at), (at, str(e))
    else:
        raise AssertionError(f"{method} took a step with the parameter at {at} resized")
    assert snapshot(run.lib, run.tree, run.model) == before, f"{method} wrote, then refused"


def save(run: Run) -> None:
    """``save``, then ``load(like=tree)``: the same state, which the run goes on with."""
    path = os.path.join(run.directory, f"{run.sequence.seed}-{os.getpid()}.ckpt")
    O.save(path, run.tree)
    loaded = O.load(path, like=run.tree)
    assert canonical(O.state_dict(loaded)) == canonical(O.state_dict(run.tree)), \
        "load gave another state than save was given"
    run.tree = loaded


HANDLERS = {"step": step, "adjust": adjust, "freeze": freeze, "thaw": thaw,
            "resize": resize, "save": save}


class Fork:
    """``os.fork`` in the middle of a sequence: the child finishes the sequence too (checked
    against its own copy of the reference) and sends its parameters back, which must equal
    its parent's bit for bit."""

    def __init__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.read, self.write = os.pipe()
        self.pid = os.fork()
        os.close(self.read if self.pid == 0 else self.write)

    @property
    def child(self) -> bool:
        return self.pid == 0

    def finish(self, run: Run) -> None:
        ours = b"".join(run.lib.numpy(x).tobytes() for x in O.trainables(run.model))
        if self.child:
            with os.fdopen(self.write, "wb") as pipe:
                pipe.write(ours)
            os._exit(0)
        with os.fdopen(self.read, "rb") as pipe:
            theirs = pipe.read()
        code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        assert code == 0, f"the forked child exited with {code}"
        assert theirs == ours, "the forked child ended elsewhere than its parent"


def execute(seed: int, lib: Library, directory: str) -> None:
    """Run the sequence of ``seed`` on ``lib`` beside its reference."""
    sequence = draw(seed, lib)
    run = Run(sequence, lib, directory)
    forked = None
    for op in sequence.ops:
        if op.kind == "fork":
            forked = Fork()
        else:
            HANDLERS[op.kind](run, *op.args)
    run.check("at the end")
    if forked is not None:
        forked.finish(run)


def sequences(name: str, first: int, count: int) -> int:
    """Sequences ``first`` to ``first + count - 1`` on the library ``name``; the exit
    status: 1 if any failed."""
    lib = library(name)
    parent = os.getpid()
    failed = []
    with tempfile.TemporaryDirectory() as directory:
        for seed in range(first, first + count):
            print(f"start {seed}", flush=True)
            try:
                execute(seed, lib, directory)
            except Exception:
                if os.getpid() != parent:  # a forked child: its parent reports
                    traceback.print_exc()
                    os._exit(1)
                print(f"FAIL {seed}", flush=True)
                traceback.print_exc(file=sys.stdout)
                failed.append(seed)
            else:
                print(f"ok {seed}", flush=True)
    return 1 if failed else 0


STEPS, SAVED_AT = 12, 5
"""The resumed torch run: its length, and the step after which it is saved."""


def resume(half: str, directory: str) -> int:
    """One half of a torch run resumed in a new process, the user's thread count 1: the
    ``first`` trains ``STEPS`` steps, saving the tree and the model after ``SAVED_AT``; the
    ``second`` loads both and trains the rest. Each writes its final parameters. The
    model holds 269,316 numbers, most in one matrix: enough for a multi-threaded path to
    be worth starting (which must not change the user's thread count)."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.Tanh(),
                                torch.nn.Linear(512, 512), torch.nn.Tanh(), torch.nn.Linear(512, 4))
    tree = O.setup(O.OptimiserChain(O.ClipGlobalNorm(1.0),
                                    O.AdamW(O.Cosine(1e-2, 1e-3, STEPS), lambd=0.01)), model)
    saved = (os.path.join(directory, "tree.ckpt"), os.path.join(directory, "model.pt"))
    if half == "second":
        model.load_state_dict(torch.load(saved[1]))
        tree = O.load(saved[0], like=tree)
    for t in range(SAVED_AT if half == "second" else 0, STEPS):
        data = torch.Generator().manual_seed(t)
        x, y = torch.randn(16, 8, generator=data), torch.randn(16, 4, generator=data)
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        tree, model = O.update_(tree, model)
        assert torch.get_num_threads() == 1, f"update_ set {torch.get_num_threads()} threads"
        if half == "first" and t + 1 == SAVED_AT:
            O.save(saved[0], tree)
            torch.save(model.state_dict(), saved[1])
    torch.save(model.state_dict(), os.path.join(directory, f"{half}.pt"))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "sequences":
        sys.exit(sequences(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    sys.exit(resume(sys.argv[2], sys.argv[3]))
