"""update(..., stats=True): what a step did to each Leaf, keyed by path, on every library."""

from __future__ import annotations

import math

import numpy as np
import pytest

import optimisers as opt
from optimisers import LeafStats, summary

RULE = opt.OptimiserChain(opt.ClipGlobalNorm(1.0), opt.AdamW(opt.Cosine(0.1, 0.0, 10), lambd=0.1))


def _model(rng: np.random.Generator) -> tuple[dict, dict]:
    shapes = {"enc": {"w": (16, 8), "b": (8,)}, "dec": {"w": (8, 4)}, "head": (4,), "frozen": (3,),
              "nograd": (2,)}
    model = {k: ({kk: rng.standard_normal(s).astype(np.float32) for kk, s in v.items()}
                 if isinstance(v, dict) else rng.standard_normal(v).astype(np.float32))
             for k, v in shapes.items()}
    grads = {k: ({kk: rng.standard_normal(a.shape).astype(np.float32) for kk, a in v.items()}
                 if isinstance(v, dict) else rng.standard_normal(v.shape).astype(np.float32))
             for k, v in model.items()}
    grads["nograd"] = None
    return model, grads


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif v is not None:
            out[prefix + k] = np.asarray(v, np.float64)
    return out


def _lib(name: str):
    if name == "torch":
        torch = pytest.importorskip("torch")
        return lambda a: None if a is None else torch.tensor(a)
    if name == "jax":
        jnp = pytest.importorskip("jax.numpy")
        return lambda a: None if a is None else jnp.asarray(a)
    return lambda a: None if a is None else a.copy()


def _convert(tree: dict, f) -> dict:
    return {k: _convert(v, f) if isinstance(v, dict) else f(v) for k, v in tree.items()}


def _expected(before: dict, after: dict, grads: dict, tree, clock: int) -> dict:
    """The record from float64 NumPy copies of the arrays."""
    out = {}
    for path, g in _flat(grads).items():
        if path == "frozen":
            continue
        x0, x1 = before[path], after[path]
        leaf = opt.getkeypath(tree, tuple(path.split(".")))
        rms = {}
        opt.backends.common.mapstate(
            lambda a, k, rms=rms: rms.__setitem__(k, math.sqrt(np.mean(np.asarray(
                a, np.float64) ** 2))) if getattr(a, "ndim", 0) else None, leaf.state, "state")
        out[path] = (np.linalg.norm(g), np.linalg.norm(x0 - x1), np.linalg.norm(x0),
                     np.linalg.norm(x0 - x1) / np.linalg.norm(x0), rms,
                     {"rules.1.eta": 0.05 * (1 + math.cos(math.pi * clock / 10))})
    return out


def _check(stats: dict, expected: dict) -> None:
    assert set(stats) == set(expected)  # the stepped Leafs only: not frozen, not gradient-less
    for path, (g, u, p, r, rms, hyper) in expected.items():
        s = stats[path]
        assert isinstance(s, LeafStats)
        np.testing.assert_allclose([float(v) for v in s[:4]], [g, u, p, r], rtol=2e-5,
                                   err_msg=path)
        assert float(s.nonfinite) == 0
        assert s.state_rms.keys() == rms.keys()
        np.testing.assert_allclose([float(v) for v in s.state_rms.values()], list(rms.values()),
                                   rtol=2e-5, atol=1e-12)
        assert s.hyper.keys() == hyper.keys()
        np.testing.assert_allclose(float(s.hyper["rules.1.eta"]), hyper["rules.1.eta"], rtol=1e-6)


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("inplace", [True, False])
def test_stats_equal_a_float64_reference(lib: str, inplace: bool) -> None:
    rng = np.random.default_rng(1)
    model, grads = _model(rng)
    f = _lib(lib)
    m, g = _convert(model, f), _convert(grads, f)
    tree = opt.freeze_(opt.setup(RULE, m), "frozen")
    step = opt.update_ if inplace else opt.update
    for _ in range(2):
        tree, m = step(tree, m, g)
    before = _flat(_convert(m, np.asarray))
    tree, m, stats = step(tree, m, g, stats=True)
    _check(stats, _expected(before, _flat(_convert(m, np.asarray)), grads, tree, clock=2))
    assert step(tree, m, g)[2:] == ()  # without stats: (tree, model) as ever


def test_stats_under_jit_are_arrays_in_the_output() -> None:
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(2)
    model, grads = _model(rng)
    f = _lib("jax")
    m, g = _convert(model, f), _convert(grads, f)
    tree = opt.freeze_(opt.setup(RULE, m), "frozen")
    traces = []

    @jax.jit
    def step(tree, m, g):
        traces.append(1)
        return opt.update(tree, m, g, stats=True)

    for i in range(4):
        before = _flat(_convert(m, np.asarray))
        tree, m, stats = step(tree, m, g)
        if i == 1:
            traced = len(traces)  # (setup's tree, and the one a step returns)
    assert len(traces) == traced
    assert all(isinstance(v, jax.Array) for s in stats.values() for v in s[:5])
    _check(stats, _expected(before, _flat(_convert(m, np.asarray)), grads, tree, clock=3))


def test_a_tie_is_recorded_once_at_its_first_path() -> None:
    w = np.ones((2, 2))
    model = {"a": w, "b": w, "c": np.ones(2)}
    tree = opt.setup(opt.Descent(0.5), model)
    _, _, stats = opt.update_(tree, model, {"a": np.ones((2, 2)), "b": np.ones((2, 2)),
                                            "c": np.ones(2)}, stats=True)
    assert list(stats) == ["a", "c"]
    assert float(stats["a"].grad_norm) == pytest.approx(4.0)  # the two paths' sum, 2 * 1
    assert float(stats["a"].update_norm) == pytest.approx(2.0)  # 0.5 * 2 * 2 elements * ...
    assert float(stats["a"].ratio) == pytest.approx(1.0)
    assert stats["a"].state_rms == {} and stats["a"].hyper == {}


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_nonfinite_gradients_are_counted(lib: str) -> None:
    f = _lib(lib)
    model = {"w": f(np.ones(5, np.float32)), "v": f(np.ones(3, np.float32))}
    grads = {"w": f(np.array([1, np.nan, np.inf, -np.inf, 2], np.float32)),
             "v": f(np.ones(3, np.float32))}
    tree = opt.setup(opt.OptimiserChain(opt.SkipNonFinite(), opt.Adam()), model)
    tree, model, stats = opt.update(tree, model, grads, stats=True)
    assert float(stats["w"].nonfinite) == 3 and float(stats["v"].nonfinite) == 0
    assert float(stats["w"].update_norm) == 0 and float(stats["w"].ratio) == 0  # skipped


def test_a_zero_parameter_that_moves_has_an_infinite_ratio() -> None:
    model = {"b": np.zeros(3)}
    _, _, stats = opt.update(opt.setup(opt.Descent(0.1), model), model, {"b": np.ones(3)},
                             stats=True)
    assert float(stats["b"].ratio) == math.inf and float(stats["b"].param_norm) == 0


def test_torch_reads_once_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    tree = opt.setup(opt.Adam(opt.Cosine(0.1, 0.0, 10)), model)
    reads = []
    for name in ("item", "__float__", "__bool__", "__int__", "tolist"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, real=real, name=name: (
            reads.append(name), real(self, *a))[1])

    def host_reads(stats: bool) -> int:
        model(torch.ones(5, 4)).sum().backward()
        reads.clear()
        opt.update_(tree, model, stats=stats)
        return len(reads)

    host_reads(False)
    assert host_reads(True) == host_reads(False) + 1  # whether all gradients are finite


def test_summary_prints_the_stats() -> None:
    model = {"w": np.array([3.0, 4.0]), "b": np.zeros(2)}
    tree = opt.setup(opt.Adam(opt.Cosine(0.1, 0.0, 10)), model)
    tree, model, stats = opt.update_(tree, model, {"w": np.array([1.0, np.nan]),
                                                   "b": np.ones(2)}, stats=True)
    text = summary(tree, stats)
    assert text == summary(tree, stats=stats)
    lines = text.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("path  grad")))
    assert lines[head].split() == ["path", "grad", "update", "param", "ratio", "nonfinite",
                                   "state", "rms,", "schedules"]
    w, b = lines[head + 1].split(), lines[head + 2].split()
    assert w[:6] == ["w", "nan", "nan", "5", "nan", "1"] and w[-1] == "eta=0.1"
    assert b[:6] == ["b", "1.41", "0.141", "0", "inf", "0"]
    assert "path  grad" in summary(tree, model, stats)


def test_plot_ratios_writes_a_figure(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    model = {"w": np.ones(3), "v": np.ones(2)}
    tree, history = opt.setup(opt.Adam(0.1), model), []
    for i in range(4):
        history.append((i, opt.update_(tree, model, {"w": np.ones(3), "v": np.ones(2)},
                                       stats=True)[2]))
    ax = opt.plot_ratios(history, str(tmp_path / "ratios.png"))
    assert (tmp_path / "ratios.png").stat().st_size > 1000
    assert [line.get_label() for line in ax.get_lines()] == ["w", "v"]
    assert len(ax.get_lines()[0].get_xdata()) == 4


def test_the_demos_plot_has_the_ratios_beside_the_losses(capsys, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from optimisers import __main__ as cli

    path = tmp_path / "demo.png"
    assert cli.main(["demo", "--steps", "100", "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("plot: beside them, each layer's update/parameter ratio over the AdamW run "
            "(update(..., stats=True) at 50 of its steps)") in out
    assert path.stat().st_size > 10_000


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_nonfinite_count_is_exact_past_float32s_integers(lib: str) -> None:
    f = _lib(lib)
    g = np.ones((1 << 24) + 8, np.float32)
    g[[5, 17, 99]] = np.nan
    model = {"w": f(np.ones(g.size, np.float32))}
    tree = opt.setup(opt.OptimiserChain(opt.SkipNonFinite(), opt.Descent(0.1)), model)
    assert float(opt.update(tree, model, {"w": f(g)}, stats=True)[2]["w"].nonfinite) == 3


def test_an_empty_array_has_no_state_rms_and_a_nan_parameter_a_nan_ratio() -> None:
    model = {"e": np.zeros((0, 3)), "w": np.array([np.nan, 1.0])}
    tree = opt.setup(opt.Adam(0.1), model)
    with np.errstate(all="raise"):
        _, _, stats = opt.update(tree, model, {"e": np.zeros((0, 3)), "w": np.ones(2)},
                                 stats=True)
    assert stats["e"].state_rms == {} and float(stats["e"].ratio) == 0
    assert math.isnan(float(stats["w"].ratio))


def test_summary_of_a_step_that_moved_no_leaf() -> None:
    model = {"w": np.ones(2)}
    tree = opt.setup(opt.Adam(), model)
    tree, model, stats = opt.update_(tree, model, {"w": None}, stats=True)
    assert stats == {} and summary(tree, stats) == summary(tree)


def test_two_leafs_of_one_path_are_refused_before_anything_is_written() -> None:
    model = {"a.b": np.ones(2), "a": {"b": np.ones(2)}}
    tree = opt.setup(opt.Descent(0.1), model)
    with pytest.raises(ValueError, match="two Leafs have the path 'a.b'"):
        opt.update_(tree, model, {"a.b": np.ones(2), "a": {"b": np.ones(2)}}, stats=True)
    assert (model["a.b"] == 1).all() and (model["a"]["b"] == 1).all()
    opt.update_(tree, model, {"a.b": np.ones(2), "a": {"b": np.ones(2)}})  # (without: fine)


def test_scheduled_values_read_the_clock_as_the_step_does() -> None:
    jnp = pytest.importorskip("jax.numpy")
    model = {"w": jnp.ones(2)}
    tree = opt.setup(opt.Adam(opt.Cosine(1.0, 0.0, 10)), model)
    import jax

    tree, model = jax.jit(opt.update)(tree, model, {"w": jnp.ones(2)})  # (the clock: an array)
    _, _, stats = opt.update(tree, model, {"w": jnp.ones(2)}, stats=True)
    assert type(stats["w"].hyper["eta"]) is float
    assert stats["w"].hyper["eta"] == opt.Cosine(1.0, 0.0, 10)(1)
