"""The code generator (``fast/trace.py``): a rule's ``apply`` run on symbols gives the
programs that every compiled path runs, so a rule's maths is written once, and a user's
own elementwise rule gets the compiled paths too."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import optimisers as O
from conftest import ALL_RULES, rules_param, run_fused
from optimisers import backends, reduce
from optimisers.fast import fused, kernels, torchsteps, trace, ufuncs
from optimisers.fast.trace import Num, Untraceable

HAVE_NUMBA = kernels.available()
needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed")


@dataclass(frozen=True)
class SignMomentum(O.Rule):
    """A user's rule: a momentum whose step mixes the velocity and its sign."""

    elementwise = True

    eta: float = 0.01
    rho: float = 0.9

    def init(self, x):
        return backends.of(x).zeros_like(x)

    def apply(self, state, x, dx):
        xp = backends.of(x)
        eta, rho = xp.hyper(x, self.eta, self.rho)
        v = xp.assign(state, rho * state + dx)
        return v, eta * xp.sign(v) + eta / 2 * v

    def raises(self) -> bool:
        return False


@dataclass(frozen=True)
class Branchy(O.Rule):
    """A user's rule that branches in Python on its step count: no program."""

    elementwise = True

    eta: float = 0.1

    def init(self, x):
        return 0

    def apply(self, state, x, dx):
        eta = self.eta if state < 2 else self.eta / 10
        return state + 1, eta * dx

    def raises(self) -> bool:
        return False


def test_a_number_known_only_when_a_step_runs_has_no_truth_value():
    s = Num("R0")
    with pytest.raises(Untraceable, match="when a step runs"):
        bool(s)
    with pytest.raises(TypeError):
        bool(s == 1)
    assert (1 - s * 2).src == "(NUM(1) - (R0 * NUM(2)))"


def test_the_programs_of_descent_and_adam():
    assert trace.trace(O.Descent(0.1), None).lines == ("t0 = K0 * g", "t0 = xi - t0",
                                                       "x[i] = t0")
    sig = (fused.ARRAY, fused.ARRAY, 0.0)
    p = trace.trace(O.Adam(), sig)
    assert (p.nrule, p.nscalar, p.nstate, p.reads_x) == (4, 1, 2, False)
    assert p.news == ("(S0 + NUM(1))",)  # the step count, as apply computes it
    assert "CAST(Q2)" in p.consts  # 1 - b2 from the Python float, as decays has it
    assert [line for line in p.lines if line.startswith(("s", "x"))] == [
        "s0[i] = t1", "s1[i] = t2", "x[i] = t3"]


def test_constants_are_the_plain_paths_scalars():
    sig = (fused.ARRAY, fused.ARRAY, 2.0)
    p = trace.trace(O.Adam(0.01), sig)
    consts, after = trace.step_scalars(p, np.float32, trace.numbers(O.Adam(0.01)), sig)
    assert np.float32(1 - 0.999) in consts and np.float32(0.01) in consts
    assert all(type(c) in (np.float32, float) for c in consts)
    assert 1 - 0.9 ** 3 in consts and after[2] == 3.0


@rules_param([r for r in ALL_RULES if fused.fusible(r)[0]])
def test_each_elementwise_rule_has_a_program_or_a_reason(rule):
    x = np.zeros(3, np.float32)
    sig = fused.signature(rule.init(x), [])
    # a tree-level rule is traced as a group steps it: given its total
    rule = reduce.given(rule, {(p, r): r.total([r.part(x + 1)]) for p, r in reduce.places(rule)})
    branches = {"RAdam", "AccumGrad"}  # Python branches on their step counts
    has = trace.trace(rule, sig) is not None
    names = {type(r).__name__ for r in getattr(rule, "rules", (rule,))}
    assert has == (not names & branches)


def test_the_symbols_have_no_matrix_functions():
    """The code generator follows elementwise rules only: its symbol backend lacks the
    matrix functions of protocol.Backend, so Muon and Adafactor (never fused by it
    anyway) get no program."""
    for name in ("matmul", "matmul_add", "transpose", "vector_norm", "mean", "to_bfloat16"):
        assert not hasattr(trace, name)
    x = np.zeros((3, 2), np.float32)
    for rule in (O.Muon(), O.Adafactor()):
        assert trace.trace(rule, fused.signature(rule.init(x), [])) is None


def user_model(seed=0, n=4, size=6):
    rng = np.random.default_rng(seed)
    model = {f"p{i}": rng.normal(size=size).astype(np.float32) for i in range(n)}
    model["frozen"] = rng.normal(size=size).astype(np.float32)  # run_fused freezes it
    return model


def user_grads(model, step):
    rng = np.random.default_rng(100 + step)
    return {k: rng.normal(size=v.shape).astype(np.float32) for k, v in model.items()}


@needs_numba
def test_a_users_elementwise_rule_runs_compiled_and_equals_the_plain_path(monkeypatch):
    runs = []
    made = kernels.onepass

    def spy(*args, **kwargs):
        found = made(*args, **kwargs)
        runs.append(found is not None)
        return found

    monkeypatch.setattr(kernels, "onepass", spy)
    fast = run_fused(SignMomentum(), user_model(), user_grads, 4, True, True, monkeypatch)
    assert runs and all(runs)
    plain = run_fused(SignMomentum(), user_model(), user_grads, 4, True, False, monkeypatch)
    for a, b in zip(O.destructure(fast[1])[0], O.destructure(plain[1])[0]):
        np.testing.assert_array_equal(a, b)
    for k in fast[1]:
        np.testing.assert_array_equal(fast[0][k].state, plain[0][k].state)


def test_a_users_rule_runs_as_a_numpy_program_without_numba(monkeypatch):
    monkeypatch.setattr(kernels, "_AVAILABLE", False)
    monkeypatch.setattr(ufuncs, "PIECE", 4)
    monkeypatch.setattr(ufuncs, "LARGE", 1)
    made = []
    real = ufuncs.onepass
    monkeypatch.setattr(ufuncs, "onepass",
                        lambda *a: made.append(real(*a)) or made[-1])
    fast = run_fused(SignMomentum(), user_model(), user_grads, 3, True, True, monkeypatch)
    assert made and all(m is not None for m in made)
    plain = run_fused(SignMomentum(), user_model(), user_grads, 3, True, False, monkeypatch)
    for k in fast[1]:
        np.testing.assert_array_equal(fast[1][k], plain[1][k])


def test_a_rule_that_branches_gets_no_program_and_still_steps_right(monkeypatch):
    assert trace.trace(Branchy(), 0) is None
    fast = run_fused(Branchy(), user_model(), user_grads, 3, True, True, monkeypatch)
    plain = run_fused(Branchy(), user_model(), user_grads, 3, True, False, monkeypatch)
    for k in fast[1]:
        np.testing.assert_array_equal(fast[1][k], plain[1][k])
        assert fast[0][k].state == (0 if k == "frozen" else 3)


@needs_numba
def test_a_users_rule_runs_compiled_on_torch_tensors(monkeypatch):
    torch = pytest.importorskip("torch")

    monkeypatch.setattr(torchsteps, "COMPILED_FROM", 1)
    model = {k: torch.tensor(v) for k, v in user_model().items()}
    twin = {k: v.clone() for k, v in model.items()}
    tree, twin_tree = O.setup(SignMomentum(), model), O.setup(SignMomentum(), twin)
    for step in range(3):
        g = {k: torch.tensor(v) for k, v in user_grads(model, step).items()}
        O.update_(tree, model, g)
        with monkeypatch.context() as m:
            m.setattr(fused, "MIN_GROUP", 10**9)
            O.update_(twin_tree, twin, g)
    group = O.state.plan_of(tree).groups[0]
    assert group.step.kind == "compiled"
    for k in model:
        torch.testing.assert_close(model[k], twin[k], rtol=1e-6, atol=1e-7)


def test_a_users_rule_runs_as_one_xla_call_under_jit(monkeypatch):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    from optimisers.fast import xla

    if not HAVE_NUMBA or jax.default_backend() != "cpu" or not xla._usable():
        pytest.skip("the XLA custom call needs numba and JAX on the CPU")
    monkeypatch.setattr(xla, "LARGE", 4)
    calls = []
    real = xla._call
    monkeypatch.setattr(xla, "_call", lambda *a: calls.append(1) or real(*a))
    model = {k: jnp.asarray(v) for k, v in user_model().items()}
    g = {k: jnp.asarray(v) for k, v in user_grads(model, 0).items()}
    tree = O.setup(SignMomentum(), model)
    fast = jax.jit(O.update)(tree, model, g)
    assert calls
    plain = O.update(tree, model, g)
    for k in model:
        np.testing.assert_allclose(fast[1][k], plain[1][k], rtol=1e-6, atol=1e-7)


@dataclass(frozen=True)
class KeepsPrevious(O.Rule):
    """A user's rule that sets the new parameter itself and remembers the old one."""

    elementwise = True
    reads_x = True

    eta: float = 0.1

    def init(self, x):
        xp = backends.of(x)
        return xp.zeros_like(x), xp.zeros_like(x)

    def apply(self, state, x, dx):
        p, q = state
        xp = backends.of(x)
        new = x - self.eta * dx
        xp.assign(q, q * 0.5 + p)
        xp.assign(p, x)  # the parameter before this step
        return (p, q), O.NewValue(new)

    def raises(self) -> bool:
        return False


@dataclass(frozen=True)
class Derived(O.Rule):
    """A user's rule keeping a value beside its fields: no program (it would be baked in)."""

    elementwise = True

    eta: float = 0.1

    def __post_init__(self):
        object.__setattr__(self, "k", self.eta * 2)

    def apply(self, state, x, dx):
        return state, dx * self.k * np.float32(1.0)

    def raises(self) -> bool:
        return False


@pytest.mark.parametrize("mode", ["numba", "ufuncs", "joined", "update"])
@pytest.mark.parametrize("rule", [KeepsPrevious(), Derived(0.1)], ids=["NewValue", "derived"])
def test_review_cases_equal_the_plain_path(rule, mode, monkeypatch):
    """Found by review: the ufunc program stored a state given the old parameter after
    writing the new one; the concatenating path could not take a NewValue; a value kept
    beside a rule's fields was baked into a program that other rules of the class reused;
    a NumPy scalar literal broke the scalar program."""
    if mode == "numba" and not HAVE_NUMBA:
        pytest.skip("numba is not installed")
    if mode != "numba":
        monkeypatch.setattr(kernels, "_AVAILABLE", False)
    if mode == "ufuncs":
        monkeypatch.setattr(ufuncs, "LARGE", 1)
        monkeypatch.setattr(ufuncs, "PIECE", 4)
    other = type(rule)(1.0)
    rules = {"p0": rule, "p1": rule, "*": other}
    inplace = mode != "update"
    fast = run_fused(rules, user_model(), user_grads, 3, inplace, True, monkeypatch)
    plain = run_fused(rules, user_model(), user_grads, 3, inplace, False, monkeypatch)
    for k in fast[1]:
        np.testing.assert_array_equal(fast[1][k], plain[1][k])
        for a, b in zip(fast[0][k].state or (), plain[0][k].state or ()):
            np.testing.assert_array_equal(a, b)
