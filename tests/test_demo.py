"""``optimisers demo``: it runs, shows every feature, and its options behave."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import optimisers
from optimisers import __main__ as cli
from optimisers import demo, fmap, isnumeric

STEPS = "40"
FEATURES = [  # a line that starts so, for each thing the demo must show
    "weight decay: adjust_(tree, where='*.bias', lambd=0.0)",
    "AccumGrad(2):",
    "freeze_: step 10: freeze_(tree['encoder'])",
    "schedule: eta = Warmup(",
    "adjust_: step 20: adjust_(tree, 0.003) puts a number in place of the schedule",
    "thaw_: step 30: thaw_(tree['encoder'])",
    "checkpoint: save(path, tree) at step 21",
    "BatchNorm: trainable(model.norm) = ('beta', 'gamma'); the state tree has mu: None, "
    "var: None",
    "tied weight:",
    "destructure(model):",
    "summary(tree, model):",
]
RULES = ["Descent(", "Momentum(", "Nesterov(", "Adam(", "AdamW(", "Lion(", "Muon+AdamW "]


def run_demo(capsys, *args: str) -> str:
    assert cli.main(["demo", "--steps", STEPS, *args]) == 0
    return capsys.readouterr().out


def lines_starting(out: str, start: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(start)]


def check_output(out: str, tied: bool = True, rules: list[str] = RULES) -> None:
    for start in FEATURES:
        assert len(lines_starting(out, start)) == 1, f"no line starting {start!r} in:\n{out}"
    tour = out[: out.index("summary(tree, model):")]
    assert "False" not in tour and "MISMATCH" not in tour
    assert re.search(r"^checkpoint: .* \d+ arrays match the uninterrupted run bit for bit$",
                     out, re.M)
    assert re.search(r"^AccumGrad\(2\): .*unchanged \(True\).*mean gradient \(True\)$", out,
                     re.M)
    assert re.search(r"did not move while frozen for 20 steps: True$", out, re.M)
    (bn,) = lines_starting(out, "BatchNorm:")
    mu = re.search(r"mean \|mu\| ([\d.]+) -> ([\d.]+)", bn)
    assert float(mu[1]) == 0 and float(mu[2]) > 0, "the running mean never moved"
    (tie,) = lines_starting(out, "tied weight:")
    if tied:
        assert tie.endswith(f"still one array after {STEPS} steps: True"), tie
    summary = out[out.index("summary(tree, model):"):].splitlines()[1:12]
    assert summary[0].split() == ["path", "rule", "params", "state", "frozen"]
    assert any(line.startswith("block1.weight = block2.weight") for line in summary) == tied
    assert "9 Leafs, 1281 parameters" in out
    # the table: a header, then one row per rule with loss and two accuracies
    header = out.index("final loss  train acc  test acc")
    rows = out[header:].splitlines()[1: 1 + len(rules)]
    assert len(rows) == len(rules)
    for row, rule in zip(rows, rules):
        assert row.startswith(rule), row
        assert re.search(r"\s\d+\.\d{4}\s+\d+\.\d%\s+\d+\.\d%\s+\d+\.\d s$", row), row
    assert re.search(r"^done in \d+\.\d s$", out, re.M)
    if "Muon+AdamW" in rules:  # the mapping's rules, named under the table
        assert re.search(r"^  'block\*\.weight' -> Muon\(eta=0.02, .*\n  '\*' -> AdamW\(", out,
                         re.M), out


def table(out: str) -> list[str]:
    header = out.index("final loss")
    return [re.sub(r"\d+\.\d s$", "", row) for row in out[header:].splitlines()[1:8]]


def test_demo_shows_every_feature(capsys):
    out = run_demo(capsys)
    check_output(out)
    assert "backend numpy (hand-written forward and backward passes)" in out


def test_demo_is_deterministic_and_follows_the_seed(capsys):
    first, again = table(run_demo(capsys, "--seed", "5")), table(run_demo(capsys, "--seed", "5"))
    other = table(run_demo(capsys, "--seed", "6"))
    assert first == again
    assert first != other


def test_demo_learns(capsys):
    out = run_demo(capsys, "--steps", "600")
    rows = out[out.index("final loss"):].splitlines()[1:7]
    accuracies = [float(re.findall(r"([\d.]+)%", row)[1]) for row in rows]  # test accuracy
    assert max(accuracies) > 90, rows


def test_plot_writes_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "losses.png"
    out = run_demo(capsys, "--plot", str(path))
    assert f"plot: wrote the loss curves of 7 rules and the tour's learning rate to {path}" in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_plot_without_matplotlib_says_how_to_install(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    assert cli.main(["demo", "--steps", STEPS, "--plot", str(tmp_path / "x.png")]) == 1
    captured = capsys.readouterr()
    assert 'pip install "optimisers[plot]"' in captured.err
    assert captured.out == ""  # it stops before training
    assert not (tmp_path / "x.png").exists()


def test_plot_into_missing_folder_is_an_error(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    assert cli.main(["demo", "--plot", str(tmp_path / "nowhere" / "x.png")]) == 2
    assert "there is no folder" in capsys.readouterr().err


@pytest.mark.parametrize(("backend", "extra"), [("torch", "torch"), ("jax", "jax")])
def test_missing_backend_says_how_to_install(capsys, monkeypatch, backend, extra):
    monkeypatch.setitem(sys.modules, backend, None)
    assert cli.main(["demo", "--steps", STEPS, "--backend", backend]) == 1
    assert f'pip install "optimisers[{extra}]"' in capsys.readouterr().err


def test_torch_backend(capsys):
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    out = run_demo(capsys, "--backend", "torch")
    check_output(out)
    assert "backend torch (gradients by torch.autograd)" in out
    assert torch.get_num_threads() == threads  # the demo gives back what it changed


def test_jax_backend(capsys, monkeypatch):
    pytest.importorskip("jax")
    # Each rule compiles its own step: two rules here (the NumPy test checks them all).
    monkeypatch.setattr(demo.comparison, "COMPARED",
                        [optimisers.Adam(0.005), optimisers.Lion(0.001)])
    out = run_demo(capsys, "--backend", "jax")
    check_output(out, tied=False, rules=["Adam(", "Lion("])
    assert "backend jax (gradients by jax.grad" in out
    assert "JAX arrays are immutable" in out
    assert "Array(" not in out  # hyper-parameters print as numbers, not 0-d arrays


def test_hand_written_gradients_match_finite_differences():
    bk = demo.Backend()
    a = {k: v.astype(np.float64) for k, v in demo.init_arrays(0).items()}
    rng = np.random.default_rng(1)
    a["beta"], a["gamma"] = rng.normal(size=demo.HIDDEN), 1 + rng.normal(size=demo.HIDDEN) / 3
    model = demo.make_model(bk, a)
    model = fmap(lambda x: x.astype(np.float64) if isnumeric(x) else x, model)  # tie kept
    x, s = (v.astype(np.float64) for v in demo.spirals(64, 0))
    _, grads, _ = demo.numpy_grads(model, x, s)

    def loss() -> float:
        return float(demo.logistic_loss(demo.forward(model, x, np, train=True)[0], s, np))

    for layer, field in [("encoder", "weight"), ("encoder", "bias"), ("norm", "gamma"),
                         ("norm", "beta"), ("block1", "bias"), ("block2", "weight"),
                         ("head", "weight"), ("head", "bias")]:
        p = getattr(getattr(model, layer), field)
        g = grads[layer][field]
        for i in list(np.ndindex(p.shape))[:5]:
            old = p[i]
            p[i] = old + 1e-6
            up = loss()
            p[i] = old - 1e-6
            down = loss()
            p[i] = old
            if layer == "block2" and field == "weight":  # tied: the sum of both paths
                g_total = grads["block1"]["weight"][i] + g[i]
                assert np.isclose((up - down) / 2e-6, g_total, rtol=1e-5, atol=1e-9)
            else:
                assert np.isclose((up - down) / 2e-6, g[i], rtol=1e-5, atol=1e-9), (layer, field)


def test_progress_bar_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    assert cli.main(["demo", "--steps", "8"]) == 0
    text = screen.getvalue()
    assert "step/s" in text or "s/step" in text  # tqdm's rate
    assert "\r" in text
    assert "AccumGrad(2):" in text  # lines printed through the bar


def test_plain_progress_without_tqdm(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    assert cli.main(["demo", "--steps", "8"]) == 0
    assert re.search(r"^\s+Adam  step     8/8  loss \d\.\d{4}$", screen.getvalue(), re.M)


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for option in ("--steps N", "--seed S", "--backend {numpy,torch,jax}", "--plot FILE.png"):
        assert option in out
    assert "two interleaved spirals" in " ".join(out.split())
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "demo" in capsys.readouterr().out


def test_bad_steps_is_a_usage_error(capsys):
    for bad in ("3", "many"):
        with pytest.raises(SystemExit) as e:
            cli.main(["demo", "--steps", bad])
        assert e.value.code == 2
    assert "--steps: must be at least 8" in capsys.readouterr().err


def test_version_and_no_command(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == optimisers.__version__
    assert cli.main([]) == 0
    assert "demo" in capsys.readouterr().out


def test_python_dash_m_needs_neither_torch_nor_jax(tmp_path):
    code = ("import runpy, sys\n"
            "sys.argv = ['optimisers', 'demo', '--steps', '8']\n"
            "try:\n"
            "    runpy.run_module('optimisers', run_name='__main__')\n"
            "finally:\n"
            "    print('imported:', 'torch' in sys.modules, 'jax' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "match the uninterrupted run bit for bit" in done.stdout
    assert done.stdout.rstrip().endswith("imported: False False")


def test_console_script():
    script = shutil.which("optimisers")
    if script is None:
        pytest.skip("the package is not installed: no optimisers command on PATH")
    done = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == optimisers.__version__
