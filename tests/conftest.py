"""Shared fixtures: ALL_RULES, the list every behaviour test is parametrised over."""

from __future__ import annotations

import numpy as np
import pytest

from optimisers import (
    ADOPT,
    EMA,
    LAMB,
    LARS,
    AccumGrad,
    AdaBelief,
    AdaDelta,
    Adafactor,
    AdaGrad,
    Adam,
    AdaMax,
    AdamW,
    AMSGrad,
    ClipGlobalNorm,
    ClipGrad,
    ClipNorm,
    Descent,
    Lion,
    LowPrecision,
    MixedPrecision,
    Momentum,
    Muon,
    NAdam,
    Nesterov,
    OAdam,
    OptimiserChain,
    Quantised,
    RAdam,
    RMSProp,
    Rprop,
    Rule,
    ScheduleFreeAdamW,
    SignDecay,
    SkipNonFinite,
    WeightDecay,
    freeze_,
    setup,
    update,
    update_,
)

collect_ignore = ["jaxmesh.py", "safety_worker.py"]  # workers, run as scripts: importing
# jaxmesh.py (test_jax_mesh.py's) sets XLA_FLAGS (8 devices), which would reach JAX in the
# test process itself; safety_worker.py (test_safety.py's) has nothing to collect

# Rules that descend on their own: defaults, chains and non-default variants.
DESCENDING = [
    Descent(0.1), Momentum(0.01, 0.9), Nesterov(0.01, 0.9), RMSProp(0.01),
    Momentum(0.01, 0.9, eta_outside=True), Nesterov(0.01, 0.9, eta_outside=True),
    RMSProp(0.01, centred=True), Rprop(0.01), Adam(0.05), RAdam(0.05), AdaMax(0.05),
    AMSGrad(0.05), NAdam(0.05), OAdam(0.05), AdamW(0.05), AdamW(0.05, lambd=0.01, couple=False),
    AdaBelief(0.05), Lion(0.01), AdaGrad(0.2), AdaDelta(0.9, 1e-4),
    OptimiserChain(WeightDecay(1e-4), Adam(0.05)),
    OptimiserChain(ClipGrad(1.0), Descent(0.1)),
    OptimiserChain(ClipNorm(1.0), Momentum(0.05)),
    OptimiserChain(ClipNorm(1.0, p=1.0), Descent(0.1)),
    OptimiserChain(SignDecay(1e-4), Descent(0.1)),
    OptimiserChain(AccumGrad(2), Adam(0.05)),
    MixedPrecision(Adam(0.05)), MixedPrecision(OptimiserChain(ClipGrad(1.0), Momentum(0.05))),
    EMA(Adam(0.05), 0.9), LowPrecision(Adam(0.05)),
    LowPrecision(OptimiserChain(ClipGrad(1.0), Momentum(0.05)), ("float16",)),
    Quantised(Adam(0.05), block=8, min_size=1),
    OptimiserChain(SkipNonFinite(), ClipGlobalNorm(1.0), AdamW(0.05, lambd=0.01)),
    LAMB(0.02, lambd=0.01), LARS(1.0, trust=0.01),
    LARS(0.5, lambd=1e-4, trust=0.02, nesterov=True), ADOPT(0.05), ADOPT(0.05, clip=False),
    ScheduleFreeAdamW(0.05), ScheduleFreeAdamW(0.05, lambd=0.01, warmup=10),
    # Muon trains real matrices only: see fitting() for the other arrays
    Muon(0.02), Muon(0.05, lambd=0.01, nesterov=False),
    OptimiserChain(WeightDecay(1e-4), Muon(0.02)), OptimiserChain(ClipNorm(1.0), Muon(0.02)),
    EMA(Muon(0.02), 0.9),
    Adafactor(0.1), Adafactor(0.3, lambd=0.01),
    Adafactor(0.3, beta2_decay=-0.5, epsilon=(1e-30, 1e-2), d=2.0),
]
# Rules that only transform gradients: they "descend" as gradient descent with step 1.
TRANSFORMS = [WeightDecay(), SignDecay(), ClipGrad(), ClipNorm(), OptimiserChain(),
              AccumGrad(3), ClipGlobalNorm(), SkipNonFinite()]

# Defaults with small steps: they descend, slowly.
SLOW = [Adam(), AdaDelta(), Muon(), Adafactor()]

ALL_RULES = DESCENDING + TRANSFORMS + SLOW


def as_descent(rule, eta=0.3):
    """A rule that descends: transforms get a Descent after them."""
    return rule if rule in DESCENDING or rule in SLOW else OptimiserChain(rule, Descent(eta))


def fitting(rule, other=Descent(0.1)):
    """What a behaviour test sets up for ``rule``: the rule itself, or, for a rule that
    trains only some arrays (``Muon``: real matrices, see ``Rule.refuses``), rules by array:
    ``rule`` on each it takes and ``other`` on the rest, as a user gives Muon the weight
    matrices and AdamW the rest. Every test over ALL_RULES so covers such a rule on the
    arrays of its model that it trains."""
    probes = [np.zeros(2), np.zeros(()), np.zeros((2, 2), np.complex64)]
    if not isinstance(rule, Rule) or all(rule.refuses(p) is None for p in probes):
        return rule  # (rules by path or by function: as they are)
    return lambda kp, x: rule if rule.refuses(x) is None else other


def normal(rng, shape, dtype=np.float32):
    """Standard normal numbers of ``dtype``; complex ones get a normal imaginary part too."""
    x = rng.normal(size=shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.normal(size=shape)
    return x.astype(dtype)


def rule_id(rule) -> str:
    return repr(rule).replace(" ", "")


def rules_param(rules=ALL_RULES):
    return pytest.mark.parametrize("rule", rules, ids=[rule_id(r) for r in rules])


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def spy_runs(monkeypatch) -> list:
    """A list that collects ``(id(group), number of arrays)`` for each fused group run."""
    from optimisers.fast import fused

    runs: list = []
    original = fused.Group.run

    def spy(self, grads, new, found=None):
        runs.append((id(self), len(grads)))
        return original(self, grads, new, found)

    monkeypatch.setattr(fused.Group, "run", spy)
    return runs


def run_fused(rule, model, grads_at, steps, inplace, fuse, monkeypatch, before=None):
    """Set up ``rule`` on ``model``, freeze its ``frozen`` child, and take ``steps``
    steps with ``grads_at(model, step)``, by ``update_`` or ``update``; ``fuse=False``
    keeps every Leaf on the plain path. ``before(tree, step)`` runs first in each step."""
    from optimisers.fast import fused

    with monkeypatch.context() as m:
        if not fuse:
            m.setattr(fused, "MIN_GROUP", 10**9)
        tree = setup(fitting(rule), model)
        freeze_(tree, "frozen")
        for step in range(steps):
            if before is not None:
                before(tree, step)
            g = grads_at(model, step)
            tree, model = (update_ if inplace else update)(tree, model, g)
        return tree, model


def numpy_adam_job(size: int, count: int, steps: int):
    """A job for :func:`alone_and_together`: ``steps`` Adam steps by ``update_`` on
    ``count`` float32 arrays of ``size``, data seeded by the job's key."""

    def run(key):
        rng = np.random.default_rng(key)
        model = [rng.normal(size=size).astype(np.float32) for _ in range(count)]
        tree = setup(Adam(0.01), model)
        for _ in range(steps):
            update_(tree, model, [rng.normal(size=size).astype(np.float32) for _ in model])
        return model

    return run


def alone_and_together(jobs: list) -> tuple[list, list]:
    """Each ``(fn, key)`` of ``jobs`` run alone, one after another, then all at once in
    threads: the two lists of ``fn(key)`` results, in job order."""
    import threading

    alone = [fn(key) for fn, key in jobs]
    together: list = [None] * len(jobs)

    def run(i, fn, key):
        together[i] = fn(key)

    threads = [threading.Thread(target=run, args=(i, fn, key))
               for i, (fn, key) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return alone, together


def counted(f):
    """``f``, noting each call in the list returned beside it: under ``jit``, each trace."""
    calls = []

    def noted(*args):
        calls.append(1)
        return f(*args)

    return noted, calls


def beside_optax(step, tree, model, tx, draw, steps):
    """Train ``model`` ``steps`` times with ``step(tree, model, grads)`` and, beside it, with
    optax's ``tx``, on the same gradients ``draw()``: ``(tree, ours, theirs)``."""
    import optax

    ours, theirs, state = model, model, tx.init(model)
    for _ in range(steps):
        g = draw()
        tree, ours = step(tree, ours, g)
        u, state = tx.update(g, state, theirs)
        theirs = optax.apply_updates(theirs, u)
    return tree, ours, theirs
