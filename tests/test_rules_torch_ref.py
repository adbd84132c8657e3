"""Muon and Adafactor against torch.optim.Muon and torch.optim.Adafactor, on PyTorch, NumPy
and JAX (under jax.jit); their stacked (batched) path against the per-matrix one; Muon's
refusals; checkpoints resumed bit for bit after an adjust_.

How close: Adafactor's arithmetic is torch's, to float32 rounding (1e-5 of a step, and
1e-12 in float64). Muon's Newton-Schulz runs in bfloat16 as torch's does: on PyTorch the
operations are torch's own (parameters within 1e-5 of torch's in float32, steps within
1e-10 in float64); on NumPy and JAX a value one float32 bit off torch's (a momentum, a
product summed in another order) may round to another bfloat16, and the steps then
differ by bfloat16's rounding (Muon's docstring): 1e-2 of a step's size bounds it here.
"""

from __future__ import annotations

import copy
import dataclasses
import re

import numpy as np
import pytest

import optimisers as O
from optimisers.fast import fused

torch = pytest.importorskip("torch")

STEPS = 12
MATRICES = [(16, 16), (32, 8), (8, 32)]  # square, tall, wide
ARRAYS = [*MATRICES, (5,), (3, 4, 6), ()]  # Adafactor: a vector, a 3-D array, a scalar too

MUONS = [
    (O.Muon(0.02), {"lr": 0.02}),
    (O.Muon(0.05, 0.9, 0.0, False, 7, (2.0, -1.5, 0.5), 1e-6),
     {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0, "nesterov": False, "ns_steps": 7,
      "ns_coefficients": (2.0, -1.5, 0.5), "eps": 1e-6}),
]
ADAFACTORS = [
    (O.Adafactor(), {}),
    (O.Adafactor(0.05, -0.6, (1e-20, 1e-2), 1.5, 0.1),
     {"lr": 0.05, "beta2_decay": -0.6, "eps": (1e-20, 1e-2), "d": 1.5, "weight_decay": 0.1}),
]
BFLOAT16 = 1e-2  # Muon's steps off torch's by bfloat16's rounding: see the module docstring


def data(shape: tuple, dtype: type, seed: int = 0) -> tuple[np.ndarray, list]:
    rng = np.random.default_rng(seed)
    x0 = np.asarray(rng.normal(size=shape)).astype(dtype)
    return x0, [np.asarray(rng.normal(size=shape)).astype(dtype) for _ in range(STEPS)]


def torch_steps(cls: type, kwargs: dict, x0: np.ndarray, grads: list) -> np.ndarray:
    """``torch.optim``'s optimiser ``cls`` stepped on ``x0`` with ``grads``."""
    p = torch.nn.Parameter(torch.tensor(x0))
    opt = cls([p], **kwargs)
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
    return p.detach().numpy()


def our_steps(rule: O.Rule, lib: str, x0: np.ndarray, grads: list) -> np.ndarray:
    """``rule`` stepped on ``x0`` with ``grads``, in ``lib`` (JAX: under ``jax.jit``)."""
    if lib == "jax":
        jax = pytest.importorskip("jax")
        model, step, conv = {"w": jax.numpy.asarray(x0)}, jax.jit(O.update), jax.numpy.asarray
    else:
        conv = torch.tensor if lib == "torch" else np.array
        model, step = {"w": conv(x0)}, O.update_
    tree = O.setup(rule, model)
    for g in grads:
        tree, model = step(tree, model, {"w": conv(g)})
    return np.asarray(model["w"])


def step_error(ours: np.ndarray, theirs: np.ndarray, x0: np.ndarray) -> float:
    """How far our whole displacement ``ours - x0`` is from torch's, relative to torch's."""
    assert ours.dtype == theirs.dtype
    return float(np.abs((ours - x0) - (theirs - x0)).max() / np.abs(theirs - x0).max())


def x64(lib: str, dtype: type):
    """JAX's 64-bit mode for float64 (restored after), else nothing."""
    if lib == "jax" and dtype == np.float64:
        return pytest.importorskip("jax").enable_x64(True)
    return _Nothing()


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ---------------------------------------------------------------- against torch.optim


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", MATRICES, ids=str)
@pytest.mark.parametrize("rule, kwargs", MUONS, ids=["defaults", "other"])
def test_muon_on_pytorch_is_torchs_arithmetic(rule, kwargs, shape, dtype):
    """On PyTorch: torch's own operations, its lerp and its bfloat16 Newton-Schulz
    included; only the parameter's update rounds otherwise (``x - (decay*x + eta*o)``)."""
    x0, grads = data(shape, dtype)
    theirs = torch_steps(torch.optim.Muon, kwargs, x0, grads)
    ours = our_steps(rule, "torch", x0, grads)
    if dtype == np.float32:
        assert np.abs(ours - theirs).max() < 1e-5 * np.abs(theirs).max()
    else:
        assert step_error(ours, theirs, x0) < 1e-10


@pytest.mark.parametrize("lib, dtype", [("torch", np.float32), ("numpy", np.float32),
                                        ("numpy", np.float64), ("jax", np.float32),
                                        ("jax", np.float64)])
@pytest.mark.parametrize("shape", MATRICES, ids=str)
@pytest.mark.parametrize("rule, kwargs", MUONS, ids=["defaults", "other"])
def test_muon_matches_torch_to_bfloat16(rule, kwargs, shape, lib, dtype):
    x0, grads = data(shape, dtype, seed=1)
    theirs = torch_steps(torch.optim.Muon, kwargs, x0, grads)
    with x64(lib, dtype):
        ours = our_steps(rule, lib, x0, grads)
    assert step_error(ours, theirs, x0) < BFLOAT16


@pytest.mark.parametrize("lib, dtype", [("torch", np.float32), ("torch", np.float64),
                                        ("numpy", np.float32), ("numpy", np.float64),
                                        ("jax", np.float32), ("jax", np.float64)])
@pytest.mark.parametrize("shape", ARRAYS, ids=str)
@pytest.mark.parametrize("rule, kwargs", ADAFACTORS, ids=["defaults", "other"])
def test_adafactor_matches_torch(rule, kwargs, shape, lib, dtype):
    x0, grads = data(shape, dtype, seed=2)
    theirs = torch_steps(torch.optim.Adafactor, kwargs, x0, grads)
    with x64(lib, dtype):
        ours = our_steps(rule, lib, x0, grads)
    assert step_error(ours, theirs, x0) < (1e-5 if dtype == np.float32 else 1e-12)


def test_a_module_trained_as_torch_trains_it():
    """``update_(tree, module)`` reading ``.grad``: Muon on the weight matrices, Adafactor
    on the biases, against the two torch optimisers on a copy of the module."""
    torch.manual_seed(0)
    ours = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ours.double()
    theirs = copy.deepcopy(ours)
    tree = O.setup({"*.weight": O.Muon(0.02), "*": O.Adafactor(0.05)}, ours)
    opts = [torch.optim.Muon([p for n, p in theirs.named_parameters() if "weight" in n], lr=0.02),
            torch.optim.Adafactor([p for n, p in theirs.named_parameters() if "bias" in n],
                                  lr=0.05)]
    for step in range(STEPS):
        x = torch.randn(32, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(step))
        for net in (ours, theirs):
            net.zero_grad()
            (net(x) ** 2).mean().backward()
        tree, ours = O.update_(tree, ours)
        for opt in opts:
            opt.step()
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-9,
                                   atol=1e-12, err_msg=name)


# ---------------------------------------------------------------- what Muon refuses


@pytest.mark.parametrize("bad, why", [
    (np.zeros(3), r"2-D arrays\), not arrays of shape \(3,\)"),
    (np.zeros((2, 3, 4)), r"not arrays of shape \(2, 3, 4\)"),
    (np.zeros((2, 3), np.complex64), "real matrices"),
], ids=["vector", "3-D", "complex"])
def test_muon_setup_refuses_other_arrays_naming_the_path(bad, why):
    model = {"layers": [{"w": np.ones((3, 2)), "b": bad}]}
    for rule in (O.Muon(), O.OptimiserChain(O.ClipNorm(), O.Muon()), O.EMA(O.Muon())):
        with pytest.raises(ValueError, match=rf"cannot train the array at layers\.0\.b: .*{why}"):
            O.setup(rule, model)
    tree = O.setup({"*.w": O.Muon(), "*": O.AdamW()}, model)  # the way: rules by path
    assert type(tree["layers"][0]["w"].rule) is O.Muon
    assert type(tree["layers"][0]["b"].rule) is O.AdamW


def test_muons_suggested_setup_runs_and_trains_a_torch_model():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16),
                              torch.nn.Linear(16, 1))
    with pytest.raises(ValueError, match=r"cannot train the array at 0\.bias") as err:
        O.setup(O.Muon(0.02), net)
    code = re.search(r"e\.g\. (setup\(.*, model\))$", str(err.value)).group(1)
    assert code.startswith("setup({'*.bias': AdamW(), '1.weight': AdamW(), '*': Muon(")
    tree = eval(code, {**vars(O), "model": net})
    x = torch.randn(64, 8)
    y = x.sum(1, keepdim=True)
    losses = []
    for _ in range(10):
        net.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        O.update_(tree, net)
    assert losses[-1] < losses[0]
    assert tree["0"]["weight"].rule == O.Muon(0.02) and tree["1"]["weight"].rule == O.AdamW()


def test_muon_refuses_a_vector_in_a_leaf_made_by_hand():
    leaf = O.Leaf(O.Muon(), np.zeros(3))
    with pytest.raises(ValueError, match=r"Muon trains matrices .* at KeyPath\('v'\)"):
        O.update({"v": leaf}, {"v": np.ones(3)}, {"v": np.ones(3)})


def test_refuses_is_asked_of_every_nested_rule():
    m = np.zeros((2, 2))
    assert O.Muon().refuses(m) is None and O.Adam().refuses(np.zeros(3)) is None
    for rule in (O.MixedPrecision(O.Muon()), O.OptimiserChain(O.ClipGrad(), O.Muon())):
        assert rule.refuses(m) is None and "2-D" in rule.refuses(np.zeros(2))


# ---------------------------------------------------------------- stacks


def stack_model(lib: str, seed: int = 0) -> dict:
    """Three (4, 3) matrices (two of them one tied array), two (3, 5), one (2, 2)."""
    rng = np.random.default_rng(seed)
    arrays = {k: rng.normal(size=s).astype(np.float32) for k, s in
              [("a", (4, 3)), ("c", (4, 3)), ("d", (4, 3)), ("e", (3, 5)), ("f", (3, 5)),
               ("g", (2, 2))]}
    conv = {"numpy": np.asarray, "torch": torch.tensor}.get(lib)
    if conv is None:
        conv = pytest.importorskip("jax").numpy.asarray
    model = {k: conv(v) for k, v in arrays.items()}
    model["b"] = model["a"]  # a tie: one Leaf, its gradients summed, in the stack
    return model


def stack_grads(model: dict, step: int) -> dict:
    rng = np.random.default_rng(100 + step)
    conv = type(next(iter(model.values())))
    made = {k: rng.normal(size=tuple(v.shape)).astype(np.float32) for k, v in model.items()}
    if step % 3 == 1:
        made["d"] = None  # no gradient: one member less in this step's stack
    if conv.__module__.startswith("torch"):
        return {k: None if g is None else torch.tensor(g) for k, g in made.items()}
    if conv.__module__.startswith(("jax", "jaxlib")):
        jnp = pytest.importorskip("jax").numpy
        return {k: None if g is None else jnp.asarray(g) for k, g in made.items()}
    return made


def run_stack(rule, lib, stacked, monkeypatch, jit=False):
    """Five steps of ``rule`` on :func:`stack_model`; ``stacked=False``: every Leaf alone.
    Returns the model, the tree, and the sizes of the stacks stepped."""
    from optimisers.fast import batched

    sizes: list = []
    with monkeypatch.context() as m:
        if not stacked:
            m.setattr(fused, "MIN_GROUP", 10**9)
        real_run, real_step = fused.Stack.run, batched._step
        m.setattr(fused.Stack, "run", lambda self, g, *rest: sizes.append(len(g)) or
                  real_run(self, g, *rest))
        m.setattr(batched, "_step", lambda members: sizes.append(len(members)) or
                  real_step(members))
        model = stack_model(lib)
        tree = O.setup(rule, model)
        step = O.update_
        if jit:
            step = pytest.importorskip("jax").jit(O.update)
        for i in range(5):
            tree, model = step(tree, model, stack_grads(model, i))
    return model, tree, sizes


@pytest.mark.parametrize("lib, jit", [("numpy", False), ("torch", False), ("jax", False),
                                      ("jax", True)], ids=["numpy", "torch", "jax", "jax-jit"])
@pytest.mark.parametrize("rule", [O.Muon(0.05), O.OptimiserChain(O.WeightDecay(0.01),
                                                                  O.Muon(0.05, nesterov=False)),
                                  O.EMA(O.Muon(0.05), 0.9)], ids=["Muon", "chain", "EMA"])
def test_stacked_path_equals_the_per_matrix_path(rule, lib, jit, monkeypatch):
    """Leafs of one shape step as one apply over their stack (NumPy, PyTorch), or one
    jax.vmap (JAX), each Newton-Schulz product batched: exactly what each alone gives."""
    together, tree_t, sizes = run_stack(rule, lib, True, monkeypatch, jit)
    alone, tree_a, none = run_stack(rule, lib, False, monkeypatch, jit)
    # (4, 3): 3 Leafs, 2 in the steps without "d"'s gradient; (3, 5): 2. A tie of JAX's
    # immutable arrays is no tie: a and b are two Leafs there
    assert none == [] and sorted(set(sizes)) == ([2, 3, 4] if lib == "jax" else [2, 3])
    assert (together["a"] is together["b"]) == (lib != "jax")
    for k in together:
        np.testing.assert_array_equal(np.asarray(together[k]), np.asarray(alone[k]), err_msg=k)
    for (kp, lt), (_, la) in zip(O.state.leaves(tree_t), O.state.leaves(tree_a)):
        for s, t in zip(O.fleaves(lt.state), O.fleaves(la.state)):
            np.testing.assert_array_equal(np.asarray(s), np.asarray(t), err_msg=str(kp))


def test_stack_state_is_one_packed_buffer_and_stays_in_place():
    """setup lays each shape's momenta out as one stack (fused.pack); a step writes them in
    place, and the plan keeps the Stack groups for the next step."""
    model = stack_model("numpy")
    tree = O.setup(O.Muon(0.05), model)
    bufs = [tree[k].state for k in ("a", "c", "d")]
    assert bufs[0].base is not None and all(b.base is bufs[0].base for b in bufs)
    for i in (0, 2):  # (step 1 leaves "d" out)
        tree, model = O.update_(tree, model, stack_grads(model, i))
    assert all(tree[k].state is b for k, b in zip(("a", "c", "d"), bufs))
    groups = O.state.plan_of(tree).groups
    assert sorted(len(g.leaves) for g in groups if type(g) is fused.Stack) == [2, 3]


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_a_tree_of_one_stack_steps_it_straight_from_the_gradients(lib):
    """Every Leaf in one Stack: update_'s plan steps it without gathering (Plan.whole),
    with what the per-matrix path gives."""
    conv = torch.tensor if lib == "torch" else np.asarray
    rng = np.random.default_rng(5)
    start = [rng.normal(size=(6, 4)).astype(np.float32) for _ in range(4)]
    grads = [[conv(rng.normal(size=(6, 4)).astype(np.float32)) for _ in start]
             for _ in range(4)]
    out = []
    for group in (fused.MIN_GROUP, 10**9):
        model = [conv(a.copy()) for a in start]
        fused_min, fused.MIN_GROUP = fused.MIN_GROUP, group
        try:
            tree = O.setup(O.Muon(0.05), model)
            for g in grads:
                tree, model = O.update_(tree, model, g)
        finally:
            fused.MIN_GROUP = fused_min
        out.append([np.asarray(x) for x in model])
        plan = O.state.plan_of(tree)
        assert (type(plan.group) is fused.Stack) == (group == fused_min)
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("rule, change", [
    (O.Muon(0.02), {"rho": 0.9, "lambd": 0.05}),
    (O.Adafactor(0.1), {"beta2_decay": -0.6, "epsilon": (1e-20, 1e-2), "lambd": 0.01}),
], ids=["Muon", "Adafactor"])
def test_resume_is_bit_for_bit_after_adjust(rule, change, lib, tmp_path):
    """Three steps, ``adjust_``, save; the loaded tree's four more steps are those of a
    run never interrupted."""

    def fresh() -> dict:
        model = stack_model(lib, seed=3)
        if isinstance(rule, O.Adafactor):  # every rank Adafactor knows
            conv = torch.tensor if lib == "torch" else np.asarray
            model.update(v=conv(np.arange(5.0, dtype=np.float32)),
                         s=conv(np.float32(0.5) * np.ones((), np.float32)),
                         t=conv(np.ones((2, 3, 4), np.float32)))
        return model

    def train(tree, model, steps):
        for i in steps:
            if i == 3:
                O.adjust_(tree, 0.01, **change)
            tree, model = O.update_(tree, model, stack_grads(model, i))
        return tree, model

    tree_a, model_a = train(O.setup(rule, fresh()), fresh(), range(7))
    model_b = fresh()
    tree_b, model_b = train(O.setup(rule, model_b), model_b, range(4))
    O.save(tmp_path / "ckpt", tree_b)
    loaded = O.load(tmp_path / "ckpt", like=O.setup(rule, model_b))
    assert O.fleaves(loaded) and loaded["a"].rule == dataclasses.replace(rule, eta=0.01,
                                                                         **change)
    tree_b, model_b = train(loaded, model_b, range(4, 7))
    for k in model_a:
        a, b = np.asarray(model_a[k]), np.asarray(model_b[k])
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), k


# ---------------------------------------------------------------- Adafactor's state


def test_adafactor_state_is_factored_and_checked_against_its_parameter():
    model = {"w": np.ones((3, 4, 5)), "b": np.ones(5)}
    tree = O.setup(O.Adafactor(), model)
    r, c, t = tree["w"].state
    assert (r.shape, c.shape, t) == ((3, 4, 1), (3, 1, 5), 0)
    assert tree["b"].state[0].shape == (5,) and tree["b"].state[1] is None
    tree, model = O.update_(tree, model, {"w": np.ones((3, 4, 5)), "b": np.ones(5)})
    assert tree["w"].state[2] == 1
    model["w"] = np.ones((3, 4, 6))  # resized after setup
    with pytest.raises(ValueError, match=r"KeyPath\('w'\) holds state of shape "
                                         r"\(\(3, 4, 1\), \(3, 1, 5\)\).* has shape \(3, 4, 6\)"):
        O.update_(tree, model, {"w": np.ones((3, 4, 6)), "b": np.ones(5)})
    assert O.reinit(tree, model, where="w")["w"].state[1].shape == (3, 1, 6)


@pytest.mark.parametrize("make, match", [
    (lambda: O.Adafactor(epsilon=(None, None)), r"epsilon\[1\] must be a number >= 0"),
    (lambda: O.Adafactor(epsilon=(-1.0, 1e-3)), r"epsilon\[0\] must be >= 0 and finite, or None"),
    (lambda: O.Adafactor(beta2_decay=0.5), "beta2_decay must be in"),
    (lambda: O.Adafactor(d=0.5), "d must be >= 1"),
    (lambda: O.Muon(ns_steps=100), "ns_steps must be in"),
    (lambda: O.Muon(ns_steps=2.5), "whole number"),
    (lambda: O.Muon(ns_coefficients=(1.0, 2.0)), "a tuple of 3 numbers"),
    (lambda: O.Muon(rho=1.5), "rho must be in"),
])
def test_bad_hyperparameters_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ---------------------------------------------------------------- JAX


def test_adjust_does_not_retrace_under_jit():
    jax = pytest.importorskip("jax")
    traces: list = []

    @jax.jit
    def step(tree, model, grads):
        traces.append(1)
        return O.update(tree, model, grads)

    for rule, change in [(O.Muon(0.02), {"rho": 0.9, "lambd": 0.0, "epsilon": 1e-6,
                                         "ns_coefficients": (2.0, -1.5, 0.5)}),
                         (O.Adafactor(), {"beta2_decay": -0.5, "d": 2.0, "lambd": 0.1,
                                          "epsilon": (None, 1e-2)})]:
        traces.clear()
        model = stack_model("jax")
        tree = O.setup(rule, model)
        for i in (0, 2):  # (step 1's gradients lack one: another structure, a trace)
            tree, model = step(tree, model, stack_grads(model, i))
        tree = O.adjust(O.adjust(tree, 0.003), **change)
        _, jitted = step(tree, model, stack_grads(model, 3))
        _, eager = O.update(tree, model, stack_grads(model, 3))
        assert len(traces) == 1, rule
        for k in jitted:  # the new values are used (eager: the same bfloat16 roundings)
            np.testing.assert_allclose(np.asarray(jitted[k]), np.asarray(eager[k]),
                                       rtol=1e-5, atol=1e-6)
