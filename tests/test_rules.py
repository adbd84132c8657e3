"""Every rule: hand-computed steps, convergence, dtypes, complex numbers, validation."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest

import optimisers as O
from conftest import SLOW, as_descent, fitting, normal, rules_param
from optimisers import backends

# ---------------------------------------------------------------- reference implementations
# Written from RULES.md element by element with Python floats, independently of rules.py.


def ref_steps(name, kw, x, grads):
    """The steps d_1..d_n of rule ``name`` for one scalar parameter and gradients."""
    eta = kw.get("eta")
    b1, b2 = kw.get("beta", (0.9, 0.999))
    eps = kw.get("epsilon", 1e-8)
    out, st = [], {}
    for t, g in enumerate(grads, start=1):
        if name == "Descent":
            d = eta * g
        elif name == "Momentum":
            st["v"] = kw["rho"] * st.get("v", 0.0) + eta * g
            d = st["v"]
        elif name == "Nesterov":
            v, rho = st.get("v", 0.0), kw["rho"]
            d = -(rho**2) * v + (1 + rho) * eta * g
            st["v"] = rho * v - eta * g
        elif name == "RMSProp":
            rho = kw["rho"]
            st["q"] = rho * st.get("q", 0.0) + (1 - rho) * g * g
            st["l"] = rho * st.get("l", 0.0) + (1 - rho) * g if kw["centred"] else 0.0
            d = eta * g / (math.sqrt(st["q"] - st["l"] ** 2) + eps)
        elif name == "Rprop":
            (lo, hi), (gmin, gmax) = kw["ell"], kw["gamma"]
            gp, s = st.get("gp", 0.0), st.get("s", eta)
            if gp * g > 0:
                s = min(s * hi, gmax)
            elif gp * g < 0:
                s = max(s * lo, gmin)
            gp = 0.0 if gp * g < 0 else g
            st.update(gp=gp, s=s)
            d = s * np.sign(gp)
        elif name in ("Adam", "RAdam", "OAdam", "NAdam", "AdamW"):
            m = st["m"] = b1 * st.get("m", 0.0) + (1 - b1) * g
            v = st["v"] = b2 * st.get("v", 0.0) + (1 - b2) * g * g
            mhat, vhat = m / (1 - b1**t), v / (1 - b2**t)
            adam = mhat / (math.sqrt(vhat) + eps)
            if name == "Adam":
                d = eta * adam
            elif name == "AdamW":
                d = eta * (adam + kw["lambd"] * x) if kw["couple"] else eta * adam + kw["lambd"] * x
            elif name == "OAdam":
                d = 2 * eta * adam - st.get("term", 0.0)
                st["term"] = eta * adam
            elif name == "NAdam":
                d = eta * (b1 * m / (1 - b1 ** (t + 1)) + (1 - b1) * g / (1 - b1**t)) / (
                    math.sqrt(vhat) + eps)
            else:
                rinf = 2 / (1 - b2) - 1
                r = rinf - 2 * t * b2**t / (1 - b2**t)
                if r > 4:
                    rect = math.sqrt((r - 4) * (r - 2) * rinf / ((rinf - 4) * (rinf - 2) * r))
                    d = eta * adam * rect
                else:
                    d = eta * mhat
        elif name == "AdaMax":
            m = st["m"] = b1 * st.get("m", 0.0) + (1 - b1) * g
            u = st["u"] = max(b2 * st.get("u", 0.0), abs(g))
            d = eta / (1 - b1**t) * m / (u + eps)
        elif name == "AMSGrad":
            m = st["m"] = b1 * st.get("m", eps) + (1 - b1) * g
            v = st["v"] = b2 * st.get("v", eps) + (1 - b2) * g * g
            vh = st["vh"] = max(st.get("vh", eps), v)
            d = eta * m / (math.sqrt(vh) + eps)
        elif name == "AdaBelief":
            m = st["m"] = b1 * st.get("m", 0.0) + (1 - b1) * g
            s = st["s"] = b2 * st.get("s", 0.0) + (1 - b2) * (g - m) ** 2 + eps
            d = eta * m / (1 - b1**t) / (math.sqrt(s / (1 - b2**t)) + eps)
        elif name == "Lion":
            m = st.get("m", 0.0)
            d = eta * np.sign(b1 * m + (1 - b1) * g)
            st["m"] = b2 * m + (1 - b2) * g
        elif name == "AdaGrad":
            acc = st["acc"] = st.get("acc", eps) + g * g
            d = eta * g / (math.sqrt(acc) + eps)
        elif name == "AdaDelta":
            rho = kw["rho"]
            acc = st["acc"] = rho * st.get("acc", 0.0) + (1 - rho) * g * g
            d = g * math.sqrt(st.get("dacc", 0.0) + eps) / math.sqrt(acc + eps)
            st["dacc"] = rho * st.get("dacc", 0.0) + (1 - rho) * d * d
        elif name == "WeightDecay":
            d = g + kw["lambd"] * x
        elif name == "SignDecay":
            d = g + kw["lambd"] * np.sign(x)
        elif name == "ClipGrad":
            d = min(max(g, -kw["delta"]), kw["delta"])
        out.append(d)
        x = x - d
    return out


CASES = [
    ("Descent", {"eta": 0.1}), ("Momentum", {"eta": 0.1, "rho": 0.8}),
    ("Nesterov", {"eta": 0.1, "rho": 0.8}),
    ("RMSProp", {"eta": 0.1, "rho": 0.8, "epsilon": 1e-8, "centred": False}),
    ("RMSProp", {"eta": 0.1, "rho": 0.8, "epsilon": 1e-8, "centred": True}),
    ("Rprop", {"eta": 0.1, "ell": (0.5, 1.2), "gamma": (1e-6, 50.0)}),
    ("Adam", {"eta": 0.1, "beta": (0.8, 0.9), "epsilon": 1e-8}),
    ("RAdam", {"eta": 0.1, "beta": (0.8, 0.7), "epsilon": 1e-8}),
    ("AdaMax", {"eta": 0.1, "beta": (0.8, 0.9), "epsilon": 1e-8}),
    ("OAdam", {"eta": 0.1, "beta": (0.5, 0.9), "epsilon": 1e-8}),
    ("NAdam", {"eta": 0.1, "beta": (0.8, 0.9), "epsilon": 1e-8}),
    ("AdamW", {"eta": 0.1, "beta": (0.8, 0.9), "lambd": 0.3, "epsilon": 1e-8, "couple": True}),
    ("AdamW", {"eta": 0.1, "beta": (0.8, 0.9), "lambd": 0.3, "epsilon": 1e-8, "couple": False}),
    ("AMSGrad", {"eta": 0.1, "beta": (0.8, 0.9), "epsilon": 1e-8}),
    ("AdaBelief", {"eta": 0.1, "beta": (0.8, 0.9), "epsilon": 1e-16}),
    ("Lion", {"eta": 0.1, "beta": (0.8, 0.9)}), ("AdaGrad", {"eta": 0.1, "epsilon": 1e-8}),
    ("AdaDelta", {"rho": 0.8, "epsilon": 1e-4}), ("WeightDecay", {"lambd": 0.3}),
    ("SignDecay", {"lambd": 0.3}), ("ClipGrad", {"delta": 0.7}),
]
GRADS = [0.5, -1.3, 0.9, 0.9, -0.2, 2.0, 0.0, -0.7]


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}{i}" for i, (n, _) in enumerate(CASES)])
def test_steps_match_hand_computation(name, kw):
    rule = O.RULES[name](**kw)
    x = np.array([0.3, -0.4])
    ours, state = [], rule.init(x)
    for g in GRADS:
        state, d = rule.apply(state, x, np.array([g, -g]))
        ours.append(d.copy())
        x = x - d
    ref_pos = ref_steps(name, kw, 0.3, GRADS)
    ref_neg = ref_steps(name, kw, -0.4, [-g for g in GRADS])
    np.testing.assert_allclose(np.array(ours), np.array([ref_pos, ref_neg]).T, rtol=1e-12,
                               atol=1e-15)


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0, np.inf])  # p <= 0 is refused
def test_clipnorm_norms(p):
    g = np.array([3.0, -4.0, 0.0, 1.0])
    n = {0.5: (math.sqrt(3) + 2 + 1) ** 2, 1.0: 8.0, 2.0: math.sqrt(26),
         3.0: (27 + 64 + 1) ** (1 / 3), np.inf: 4.0}[p]
    d = O.ClipNorm(1.0, p).apply(None, np.zeros(4), g)[1]
    np.testing.assert_allclose(d, g * min(1.0 / n, 1.0) if n else g)
    assert O.ClipNorm(100.0, p).apply(None, np.zeros(4), g)[1] is not None


def test_clipnorm_throws_on_nonfinite():
    with pytest.raises(FloatingPointError, match="norm is nan"):
        O.ClipNorm().apply(None, np.zeros(2), np.array([np.nan, 1.0]))
    with np.errstate(invalid="ignore"):  # inf * 0, as in torch's clip_grad_norm_
        d = O.ClipNorm(throw=False).apply(None, np.zeros(2), np.array([np.inf, 1.0]))[1]
    np.testing.assert_array_equal(d, [np.nan, 0.0])  # scaled by omega / inf = 0


def test_accumgrad_averages_then_steps():
    rule = O.OptimiserChain(O.AccumGrad(3), O.Descent(1.0))
    x = np.zeros(1)
    s = rule.init(x)
    steps = []
    for g in [1.0, 2.0, 6.0, 3.0]:
        s, d = rule.apply(s, x, np.array([g]))
        steps.append(None if d is None else float(d[0]))
    assert steps == [None, None, 3.0, None]


def test_chain_feeds_steps_in_order():
    chain = O.OptimiserChain(O.ClipGrad(1.0), O.WeightDecay(0.5), O.Descent(0.1))
    x = np.array([2.0, 2.0])
    _, d = chain.apply(chain.init(x), x, np.array([5.0, 0.5]))
    np.testing.assert_allclose(d, 0.1 * (np.array([1.0, 0.5]) + 0.5 * x))
    assert O.OptimiserChain().apply((), x, np.array([1.0, 2.0]))[1].tolist() == [1.0, 2.0]


def test_mixedprecision_keeps_master_copy():
    x = np.full(3, 1.0, np.float16)
    rule = O.MixedPrecision(O.Descent(1e-4))
    tree = O.setup(rule, [x])
    model = [x]
    for _ in range(100):
        tree, model = O.update_(tree, model, [np.ones(3, np.float16)])
    assert model[0].dtype == np.float16 and tree[0].state[0].dtype == np.float32
    np.testing.assert_allclose(tree[0].state[0], 0.99, rtol=1e-5)
    np.testing.assert_allclose(model[0], 0.99, rtol=1e-3)
    # float16 alone cannot move: 1 - 1e-4 rounds back to 1
    assert (1 - np.float16(1e-4) * np.float16(1)) == np.float16(1)


@pytest.mark.parametrize("inplace", [True, False])
def test_mixedprecision_parameter_is_exactly_the_rounded_master(inplace):
    rng = np.random.default_rng(0)
    model = [rng.normal(size=1000).astype(np.float16)]
    tree = O.setup(O.MixedPrecision(O.Adam(0.3)), model)
    for _ in range(10):
        g = [rng.normal(size=1000).astype(np.float16)]
        tree, model = (O.update_ if inplace else O.update)(tree, model, g)
        np.testing.assert_array_equal(model[0], tree[0].state[0].astype(np.float16))


# ---------------------------------------------------------------- behaviour over ALL_RULES


def regression(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(32, 3))
    W, b = rng.normal(size=(3, 2)), rng.normal(size=2)
    model = {"w": np.zeros((3, 2), dtype), "b": np.zeros(2, dtype), "n": 3}

    def loss_grad(m):
        R = X @ m["w"].astype(np.float64) + m["b"] - (X @ W + b)
        loss = float((R**2).sum() / (2 * len(X)))
        return loss, {"w": (X.T @ R / len(X)).astype(dtype), "b": R.mean(0).astype(dtype)}

    return model, loss_grad


@rules_param()
def test_converges(rule):
    model, loss_grad = regression()
    tree = O.setup(fitting(as_descent(rule)), model)
    first = loss_grad(model)[0]
    for _ in range(600):
        tree, model = O.update_(tree, model, loss_grad(model)[1])
    assert loss_grad(model)[0] < (0.9 if rule in SLOW else 0.05) * first


@rules_param()
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtype_is_kept(rule, dtype):
    model, loss_grad = regression(dtype=dtype)
    tree = O.setup(fitting(rule), model)
    for _ in range(3):
        tree, model = O.update(tree, model, loss_grad(model)[1])
    assert model["w"].dtype == dtype and model["b"].dtype == dtype
    assert np.isfinite(model["w"]).all()


@rules_param()
def test_update_equals_update_(rule):
    model, loss_grad = regression(1)
    pure_tree, pure = O.setup(fitting(rule), model), model
    copy = {"w": model["w"].copy(), "b": model["b"].copy(), "n": 3}
    tree, inplace = O.setup(fitting(rule), copy), copy
    for _ in range(7):
        pure_tree, pure = O.update(pure_tree, pure, loss_grad(pure)[1])
        tree, inplace = O.update_(tree, inplace, loss_grad(inplace)[1])
    np.testing.assert_array_equal(pure["w"], inplace["w"])
    np.testing.assert_array_equal(pure["b"], inplace["b"])
    assert inplace["w"] is copy["w"]
    assert not (model["w"] == pure["w"]).all() or isinstance(rule, O.AccumGrad)


@rules_param()
def test_complex_parameters_learn_conjugation(rule):
    """Learn f(x) = conj(x) with w*x: a real loss of a complex parameter decreases."""
    rng = np.random.default_rng(3)
    xs = (rng.normal(size=8) + 1j * rng.normal(size=8)).astype(np.complex128)
    model = [np.array([1.0 + 1.0j])]

    def loss_grad(w):
        r = w * xs - xs.conj()
        return float((r * r.conj()).real.mean()), 2 * (r * xs.conj()).mean()

    tree = O.setup(fitting(as_descent(rule, 0.1)), model)
    first = loss_grad(model[0])[0]  # 6.8; the best w gives 2.7, since conj is not linear
    for _ in range(300):
        tree, model = O.update_(tree, model, [np.array([loss_grad(model[0])[1]])])
    assert model[0].dtype == np.complex128
    assert loss_grad(model[0])[0] < (0.95 if rule in SLOW else 0.6) * first


def converter(lib: str):
    """NumPy array -> array of ``lib`` (numpy, torch or jax); skips the test if it is absent."""
    if lib == "numpy":
        return np.asarray
    if lib == "torch":
        return pytest.importorskip("torch").from_numpy
    return pytest.importorskip("jax.numpy").asarray


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_complex_clip_and_mixed_precision_keep_the_imaginary_part(lib):
    """ClipGrad clamps a complex gradient's real and imaginary parts each, the same in
    every library (NumPy's own clip orders complex numbers, and dropped 4j from 3+4j);
    MixedPrecision keeps a complex master copy of float32's precision."""
    conv = converter(lib)
    g = np.array([3 + 4j, 0.5j, -2 - 0.3j], np.complex64)
    want = -np.array([1 + 1j, 0.5j, -1 - 0.3j], np.complex64)
    for rule in (O.ClipGrad(1.0), O.MixedPrecision(O.OptimiserChain(O.ClipGrad(1.0),
                                                                    O.Descent(1.0)))):
        model = {"c": conv(np.zeros(3, np.complex64))}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no ComplexWarning: nothing is dropped
            tree = O.setup(rule, model)
            tree, model = O.update(tree, model, {"c": conv(g)})
        np.testing.assert_array_equal(np.asarray(model["c"]), want)
        assert str(model["c"].dtype).endswith("complex64")
    assert str(tree["c"].state[0].dtype).endswith("complex64")  # the master copy


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_complex_rprop_steps_the_real_and_imaginary_parts_as_reals(lib):
    """A complex element is two real ones to Rprop: the same steps as Rprop on the
    real and imaginary parts stacked as a real array, in every library."""
    conv = converter(lib)
    rng = np.random.default_rng(4)
    x0 = normal(rng, 5, np.complex64)
    gs = [normal(rng, 5, np.complex64) for _ in range(6)]
    model = {"c": conv(x0.copy())}
    tree = O.setup(O.Rprop(0.1), model)
    ref = {"c": np.stack([x0.real, x0.imag])}
    ref_tree = O.setup(O.Rprop(0.1), ref)
    for g in gs:
        tree, model = O.update_(tree, model, {"c": conv(g)})
        ref_tree, ref = O.update_(ref_tree, ref, {"c": np.stack([g.real, g.imag])})
    np.testing.assert_array_equal(np.asarray(model["c"]), ref["c"][0] + 1j * ref["c"][1])


# ---------------------------------------------------------------- construction


@rules_param()
def test_rules_are_frozen_values(rule):
    same = dataclasses.replace(rule) if not isinstance(rule, O.OptimiserChain) else \
        O.OptimiserChain(*rule.rules)
    assert same == rule and hash(same) == hash(rule)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.eta = 1.0


def test_positional_and_keyword_construction():
    assert O.Adam(0.01, (0.8, 0.9), 1e-7) == O.Adam(eta=0.01, beta=(0.8, 0.9), epsilon=1e-7)
    assert O.AdamW(0.1, (0.9, 0.99), 0.5).lambd == 0.5
    assert O.RMSProp(0.1, 0.8, 1e-6, True).centred
    assert O.Adam() != O.Adam(0.01)
    assert O.OptimiserChain(O.Descent(), O.Adam()).rules == (O.Descent(), O.Adam())
    assert repr(O.OptimiserChain(O.ClipGrad(1.0), O.Descent())) == \
        "OptimiserChain(ClipGrad(delta=1.0), Descent(eta=0.1))"


@pytest.mark.parametrize("make,match", [
    (lambda: O.Descent(-1.0), "learning rate eta must be >= 0"),
    (lambda: O.Adam(-0.1), "learning rate eta must be >= 0"),
    (lambda: O.AccumGrad(0), r"Invalid n parameter: 0; AccumGrad's n must be >= 1"),
    (lambda: O.AccumGrad(1.5), "whole number"),
    (lambda: O.OptimiserChain(O.MixedPrecision(O.Adam())), "cannot sit inside an Optimiser"),
])
def test_bad_hyperparameters_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_chain_takes_rules_only():
    with pytest.raises(TypeError, match="OptimiserChain takes rules, got float"):
        O.OptimiserChain(0.1)


def test_float16_epsilon_floor():
    xp = backends.ops("numpy")
    assert xp.eps(np.zeros(1, np.float16), 1e-8) == np.float16(1e-7)
    assert xp.eps(np.zeros(1, np.float32), 1e-8) == np.float32(1e-8)
    assert xp.eps(np.zeros(1, np.float16), 0.0) == 0
    # Adam on float16 with the default epsilon stays finite where v underflows
    tree = O.setup(O.Adam(), [np.ones(2, np.float16)])
    _, m = O.update(tree, [np.ones(2, np.float16)], [np.array([1e-5, 0.0], np.float16)])
    assert np.isfinite(m[0]).all()


def test_user_defined_rule_works_everywhere():
    @dataclasses.dataclass(frozen=True)
    class Halve(O.Rule):
        eta: float = 0.5

        def init(self, x):
            return np.zeros_like(x)

        def apply(self, state, x, dx):
            return state + 1, self.eta * dx

    tree = O.setup(Halve(), {"a": np.ones(2)})
    tree, m = O.update(tree, {"a": np.ones(2)}, {"a": np.ones(2)})
    assert m["a"].tolist() == [0.5, 0.5] and tree["a"].state.tolist() == [1.0, 1.0]
    tree = O.adjust(tree, 0.25)
    assert tree["a"].rule == Halve(0.25)
    assert O.RULES["Halve"] is Halve


def test_higher_order_gradients_reach_apply():
    @dataclasses.dataclass(frozen=True)
    class Newton(O.Rule):
        def apply(self, state, x, dx, ddx):
            return state, dx / ddx

    model = [np.array([3.0])]
    tree = O.setup(Newton(), model)
    _, m = O.update(tree, model, [np.array([6.0])], [np.array([2.0])])
    assert m[0].tolist() == [0.0]
    # a rule taking one gradient gets the first only
    _, m = O.update(O.setup(O.Descent(1.0), model), model, [np.array([1.0])], [np.array([9.0])])
    assert m[0].tolist() == [2.0]
    # and chains pass them through
    tree = O.setup(O.OptimiserChain(O.ClipGrad(100.0), Newton()), model)
    _, m = O.update(tree, model, [np.array([6.0])], [np.array([2.0])])
    assert m[0].tolist() == [0.0]


@pytest.mark.parametrize("rule", [
    O.Adam(1e-2), O.RMSProp(1e-2), O.RAdam(1e-2), O.OAdam(1e-2), O.AdaGrad(1e-2),
    O.AdaDelta(0.9, 1e-5), O.NAdam(1e-2), O.AdaBelief(1e-2), O.Descent(1e-2),
    O.Momentum(1e-2), O.Nesterov(1e-2), O.AdamW(1e-2),
], ids=lambda r: type(r).__name__)
def test_complex_loss_decreases_monotonically(rule):
    """Optimisers.jl's 'complex numbers: Flux#1776' test: w*x learns conj(x)."""
    x = 1 + 1j

    def loss(w):
        return abs(w * x - np.conj(x)) ** 2

    model = {"w": np.zeros(1, np.complex128)}
    assert loss(model["w"][0]) == pytest.approx(2.0)
    tree, last = O.setup(rule, model), np.inf
    for i in range(10):
        g = 2 * (model["w"] * x - np.conj(x)) * np.conj(x)
        tree, model = O.update_(tree, model, {"w": g})
        if isinstance(rule, (O.Momentum, O.Nesterov)) and i > 7:
            continue  # very flat at the end
        assert loss(model["w"][0]) < last
        last = loss(model["w"][0])
    assert loss(model["w"][0]) < 1.9
