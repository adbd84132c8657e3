"""JAX on many devices: a model over a 4x2 mesh of 8 virtual CPU devices, and two
``jax.distributed`` processes. JAX fixes its device count when it starts, so each check
runs in a fresh process (tests/jaxmesh.py's workers), bounded in time."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("jax")

WORKER = Path(__file__).with_name("jaxmesh.py")
TIMEOUT = 240.0
"""Seconds a worker may take (8 devices compile on 2 shared cores) before it is killed."""


def _env(devices: int) -> dict:
    src = str(Path(__file__).resolve().parents[1] / "src")
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, JAXMESH_DEVICES=str(devices),
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                PYTHONPATH=src + (os.pathsep + path if path else ""))


def _start(args: list, devices: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), *args], env=_env(devices),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _finish(processes: list) -> list[str]:
    """Each process's output, once all have ended; all killed after TIMEOUT seconds, and
    the first that failed raises with its standard error."""
    outs = []
    deadline = time.monotonic() + TIMEOUT
    try:
        for p in processes:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"a worker took over {TIMEOUT} s") from None
    finally:
        for p in processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    for p, (_, err) in zip(processes, outs):
        assert p.returncode == 0, f"{p.args[2:]} exited with {p.returncode}:\n{err[-4000:]}"
    return [out for out, _ in outs]


def run(*args: str) -> str:
    (out,) = _finish([_start(list(args), 8)])
    return out


@pytest.mark.parametrize("rule", ["adamw", "clip_adamw", "lion", "muon", "lowprecision"])
def test_mesh_training_keeps_shardings_and_matches_one_device(rule):
    """A model of large and small arrays over a 4x2 mesh, some
    sharded on both axes, some on one, some replicated, trained by a jitted, donated
    update: after setup and each step every parameter and state array has its
    parameter's sharding, no array is gathered, and the results are one device's."""
    assert run("mesh_rule", rule).split() == ["ok"]


def test_a_mesh_of_explicit_axes_keeps_shardings():
    assert run("explicit").split() == ["ok"]


def test_update_outside_jit_keeps_shardings():
    assert run("eager").split() == ["ok"]


def test_stats_outside_jit_of_arrays_on_several_devices():
    assert run("stats_devices").split() == ["ok"]


def test_clip_global_norm_takes_the_norm_of_whole_arrays():
    """ClipGlobalNorm over sharded gradients scales by the norm of the whole arrays (a
    NumPy sum over them), not of a device's shards."""
    assert run("clip").split() == ["ok"]


def test_save_load_and_orbax_keep_shardings(tmp_path):
    """save/load of a sharded tree (load places each array as ``like``'s), and orbax's
    PyTreeCheckpointer saving the state dict beside the model, restored onto other
    shardings; training continues as it would have."""
    assert run("checkpoints", str(tmp_path)).split() == ["ok"]


def test_jax_distributed_two_processes_match_one():
    """Two ``jax.distributed`` processes on 127.0.0.1 (gloo), 2 CPU devices each, run a
    data-parallel jitted step over one mesh of all 4 devices (AdamW through the custom
    call, and ClipGlobalNorm + AdamW): shardings kept, results one process's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    outs = _finish([_start(["distributed", str(rank), port], 2) for rank in (0, 1)])
    assert [out.split()[-1:] for out in outs] == [["ok"], ["ok"]]  # (after gloo's lines)


def test_the_readme_mesh_example_runs_on_8_devices(tmp_path):
    """The JAX mesh example (docs/guides/devices.md), which test_site.py only defines (its
    training is under ``if __name__ == "__main__"``), run as a script on 8 devices: it
    prints what the page says."""
    from markdown_examples import text_after
    from test_readme import BLOCKS, page

    (code, expected), = [(code, expected) for heading, code, expected in BLOCKS
                         if heading == "Training on many devices" and "Mesh(" in code]
    script = tmp_path / "example.py"
    script.write_text(code)
    process = subprocess.Popen([sys.executable, str(script)], env=_env(8),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    (out,) = _finish([process])
    want = expected or text_after(page("Training on many devices"), code)  # past a line
    assert out.splitlines() == want.splitlines()
