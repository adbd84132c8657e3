"""lr_find: the learning-rate range test, on NumPy, PyTorch and JAX."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import ALL_RULES, fitting, rules_param
from optimisers import (
    AdamW,
    ClipGlobalNorm,
    ClipGrad,
    Constant,
    Descent,
    LRRange,
    OptimiserChain,
    adjust,
    lr_find,
)

X = np.random.default_rng(0).normal(size=(64, 3))
Y = X @ np.array([1.0, -2.0, 0.5]) + 0.3


def regression(model, step):
    """Mean squared error of a linear model on (X, Y), and its gradients (by hand)."""
    err = X @ model["w"] + model["b"] - Y
    return np.mean(err**2), {"w": 2 * X.T @ err / len(X), "b": 2 * np.mean(err, keepdims=True)}


def batches(seed):
    """``loss_and_grad`` on a minibatch of 16 drawn for each step from ``seed``."""

    def loss_and_grad(model, step):
        rows = np.random.default_rng([seed, step]).choice(len(X), 16, replace=False)
        err = X[rows] @ model["w"] + model["b"] - Y[rows]
        grads = {"w": 2 * X[rows].T @ err / 16, "b": 2 * np.mean(err, keepdims=True)}
        return np.mean(err**2), grads

    return loss_and_grad


def fresh():
    return {"w": np.zeros(3), "b": np.zeros(1)}


def test_descent_on_a_quadratic_falls_then_diverges_and_suggests_a_stable_rate():
    model = fresh()
    found = lr_find(Descent(), model, regression, start=1e-4)
    assert isinstance(found, LRRange) and len(found.lrs) == len(found.losses) == len(found.smoothed)
    assert len(found.lrs) < 100  # stopped: the smoothed loss passed 4 times its best
    assert found.smoothed[-1] > 4 * min(found.smoothed)
    assert min(found.losses) < 1e-3 * found.losses[0]
    np.testing.assert_allclose(found.lrs, np.geomspace(1e-4, 10, 100)[:len(found.lrs)])
    # gradient descent on this loss diverges above 2 / (the Hessian's largest eigenvalue)
    hessian = 2 * np.block([[X.T @ X, X.sum(0)[:, None]], [X.sum(0), len(X)]]) / len(X)
    unstable = 2 / np.linalg.eigvalsh(hessian).max()
    falling = found.lrs[next(i for i, loss in enumerate(found.losses)
                             if loss < 0.99 * found.losses[0])]
    assert falling < found.suggestion < unstable
    # the steepest descent, leaving out the first 10 (a tenth of steps) and the last 5 points
    slope = np.gradient(found.smoothed[10:-5], np.log(found.lrs[10:-5]))
    assert found.suggestion == found.lrs[10 + int(np.argmin(slope))]
    assert not model["w"].any() and not model["b"].any()


def test_smoothed_is_the_bias_corrected_average():
    found = lr_find(Descent(), fresh(), regression, start=1e-4, smooth=0.9)
    average, want = 0.0, []
    for i, loss in enumerate(found.losses):
        average = 0.9 * average + 0.1 * loss
        want.append(average / (1 - 0.9 ** (i + 1)))
    np.testing.assert_allclose(found.smoothed, want, rtol=1e-12)
    raw = lr_find(Descent(), fresh(), regression, start=1e-4, smooth=0.0)
    assert raw.smoothed == raw.losses


def test_the_suggestion_leaves_out_the_first_tenth_of_the_steps():
    def made_up(model, step):  # a dip at step 1, then the real fall from step 50
        return (0.1 if step == 1 else 1.0 if step < 50 else 1.0 / (step - 48)), fresh()

    found = lr_find(Descent(), fresh(), made_up, start=1e-6, end=1.0, steps=100)
    assert found.lrs.index(found.suggestion) >= 50
    short = lr_find(Descent(), fresh(), made_up, start=1e-6, end=1.0, steps=6)
    assert short.suggestion == short.lrs[0]  # too few points to leave any out: the dip


def test_a_negative_loss_diverges_by_its_distance_from_the_best():
    def shifted(model, step):  # the regression's loss less 10: negative until it explodes
        loss, grads = regression(model, step)
        return loss - 10.0, grads

    found = lr_find(Descent(), fresh(), shifted, start=1e-4)
    plain = lr_find(Descent(), fresh(), regression, start=1e-4)
    assert found.smoothed[0] < 0 and len(found.lrs) > 50 and found.smoothed[-1] > 0
    assert found.smoothed[-1] - min(found.smoothed) > 3 * abs(min(found.smoothed))
    assert found.suggestion == plain.suggestion


def test_each_step_takes_the_swept_rate_through_chains_and_over_a_schedule():
    seen = []

    def constant(model, step):
        seen.append(model["w"].copy())
        return 1.0, {"w": np.ones(2)}

    rule = OptimiserChain(ClipGlobalNorm(1e6), Descent(Constant(5.0)))
    found = lr_find(rule, {"w": np.zeros(2)}, constant, start=1e-3, end=1.0, steps=8)
    assert len(found.lrs) == 8
    np.testing.assert_allclose(np.diff(seen, axis=0)[:, 0], [-lr for lr in found.lrs[:-1]])
    assert rule == OptimiserChain(ClipGlobalNorm(1e6), Descent(Constant(5.0)))


def test_the_callers_arrays_are_untouched():
    model = {"w": np.arange(3.0), "b": np.ones(1)}
    before = {k: v.copy() for k, v in model.items()}
    arrays = dict(model)
    lr_find(AdamW(), model, batches(0), steps=20)
    assert all(model[k] is arrays[k] and np.array_equal(model[k], before[k]) for k in model)


def test_the_same_batches_give_the_same_curve():
    first = lr_find(AdamW(), fresh(), batches(7), start=1e-5)
    assert first == lr_find(AdamW(), fresh(), batches(7), start=1e-5)
    assert first != lr_find(AdamW(), fresh(), batches(8), start=1e-5)


def test_a_rule_without_eta_is_refused_saying_what_to_give():
    with pytest.raises(TypeError, match="no rule here has a field 'eta'") as info:
        lr_find(ClipGrad(), fresh(), regression)
    assert any("lr_find sets the rate through each rule's eta" in n for n in info.value.__notes__)


@pytest.mark.parametrize(("bad", "message"), [
    ({"start": 0.0}, "start must be > 0, got 0.0"), ({"end": 1e-8}, "end must be > start"),
    ({"steps": 1}, "steps must be >= 2"), ({"smooth": 1.0}, r"smooth must be in \[0, 1\)"),
    ({"diverge": 1.0}, "diverge must be > 1")])
def test_arguments_out_of_range_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        lr_find(Descent(), fresh(), regression, **bad)


def test_a_loss_not_finite_at_once_asks_for_a_lower_start():
    with pytest.raises(ValueError, match="recorded 1 finite loss.*lower start="):
        lr_find(Descent(), fresh(), lambda m, i: (np.inf if i else 1.0, fresh()))


@rules_param(ALL_RULES)
def test_every_rule_with_an_eta_sweeps(rule):
    model = {"w": np.ones((3, 2)), "b": np.zeros(2)}

    def loss_and_grad(m, step):
        err = X[:8] @ m["w"] + m["b"] - Y[:8, None]
        return np.mean(err**2), {"w": X[:8].T @ err / 4, "b": np.mean(err, 0)}

    try:
        adjust(rule, 1.0)
    except TypeError:
        with pytest.raises(TypeError, match="'eta'"):
            lr_find(rule, model, loss_and_grad, steps=10)
        return
    found = lr_find(fitting(rule), model, loss_and_grad, start=1e-4, end=1.0, steps=10)
    assert 2 <= len(found.lrs) <= 10 and found.suggestion in found.lrs
    assert np.isfinite(found.smoothed).all()
    assert np.array_equal(model["w"], np.ones((3, 2))) and not model["b"].any()


def test_torch_module_and_its_parameters_are_untouched():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    x, y = torch.tensor(X, dtype=torch.float32), torch.tensor(Y, dtype=torch.float32)[:, None]

    def loss_and_grad(model, step):
        loss = torch.nn.functional.mse_loss(model(x), y)
        model.zero_grad()
        loss.backward()  # into the copy's .grad
        return loss, {n: p.grad for n, p in model.named_parameters()}

    found = lr_find(OptimiserChain(ClipGlobalNorm(1.0), AdamW()), net, loss_and_grad,
                    start=1e-5)
    assert min(found.losses) < 0.1 * found.losses[0] and 1e-4 < found.suggestion < 10
    for n, p in net.named_parameters():
        assert torch.equal(p, before[n]) and p.grad is None
    assert found == lr_find(OptimiserChain(ClipGlobalNorm(1.0), AdamW()), net, loss_and_grad,
                            start=1e-5)


def test_jax_arrays():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    model = {"w": jnp.zeros(3), "b": jnp.zeros(1)}
    x, y = jnp.asarray(X, dtype=jnp.float32), jnp.asarray(Y, dtype=jnp.float32)

    @jax.jit
    def loss_and_grad(m, step):
        return jax.value_and_grad(lambda m: jnp.mean((x @ m["w"] + m["b"] - y) ** 2))(m)

    found = lr_find(Descent(), model, loss_and_grad, start=1e-4)
    numpy = lr_find(Descent(), fresh(), regression, start=1e-4)
    assert len(found.lrs) == len(numpy.lrs) and found.suggestion == numpy.suggestion
    # (float32 against float64: apart where the loss is tiny and then explodes)
    np.testing.assert_allclose(found.smoothed[:-3], numpy.smoothed[:-3], rtol=1e-4)
    assert not model["w"].any() and not model["b"].any()


def test_plot_marks_the_suggestion_and_writes_a_png(tmp_path):
    figure = pytest.importorskip("matplotlib.figure")
    found = lr_find(Descent(), fresh(), regression, start=1e-4)
    ax = found.plot(tmp_path / "lr.png")
    assert (tmp_path / "lr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ax.get_xscale() == "log"
    assert [line.get_xdata()[0] for line in ax.lines][-1] == found.suggestion
    mine = figure.Figure().subplots(1, 2)[1]  # on axes of the caller's
    assert found.plot(ax=mine) is mine and len(mine.lines) == 3


def test_plot_without_matplotlib_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError) as info:
        LRRange([0.1, 1.0], [1.0, 2.0], [1.0, 2.0], 0.1).plot()
    assert any('pip install "optimisers[plot]"' in n for n in info.value.__notes__)
