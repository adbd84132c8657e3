"""Safety (issue 28): 200 random sequences of documented operations on NumPy, torch and JAX
(``update`` and ``update_``, ``jax.jit``, ``adjust`` between numbers and schedules,
``freeze_`` / ``thaw_``, a resized parameter refused, ``save`` / ``load``, ``os.fork``), run
in worker processes so that a crash fails the test with its sequence's seed, every step
within float32 rounding of a float64 reference; and a torch run resumed in a new process,
the user's thread count 1, ends bit for bit where the uninterrupted run does. The worker
and what each sequence does: ``safety_worker.py``."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("safety_worker.py")

SHARES = {"numpy": 75, "torch": 75, "jax": 50}
"""How many of the 200 sequences each library runs (seeds 0, 1, ...). JAX's are fewer: a
new structure under ``jit`` costs a compilation."""

TIMEOUT = 300.0
"""Seconds the workers may take (they share 2 cores with other work) before they are
killed and the test fails with the sequence each was in."""


def start(*args: str) -> subprocess.Popen:
    """The worker with ``args``, on this checkout's ``optimisers``, in a session of its own."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    path = os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, PYTHONPATH=src + (os.pathsep + path if path else ""))
    return subprocess.Popen([sys.executable, str(WORKER), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def finish(processes: dict[str, subprocess.Popen]) -> dict[str, tuple[int | None, str, str]]:
    """Each worker's exit status (``None`` when it was killed for taking too long),
    output and error output."""
    import time

    deadline = time.monotonic() + TIMEOUT
    ended = {}
    for name, process in processes.items():
        try:
            out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            ended[name] = process.returncode, out, err
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            ended[name] = None, out, err
    return ended


def problems(name: str, count: int, code: int | None, out: str, err: str) -> list[str]:
    """What went wrong in one library's worker: each failed sequence with its traceback,
    and a crash or a hang with the sequence it happened in."""
    started = re.findall(r"^start (\d+)$", out, re.M)
    passed = re.findall(r"^ok (\d+)$", out, re.M)
    found = [f"{name} sequence {block}" for block in re.split(r"^FAIL ", out, flags=re.M)[1:]]
    if code is None or code < 0 or len(started) < count:
        how = "took too long" if code is None else f"ended with status {code}"
        last = started[-1] if started else "none"
        found.append(f"{name} worker {how} in sequence {last}:\n{err[-3000:]}")
    elif not found and (code != 0 or len(passed) != count):
        found.append(f"{name} worker: status {code}, {len(passed)} of {count} passed:\n"
                     f"{err[-3000:]}")
    return found


def test_random_sequences_agree_with_a_float64_reference():
    shares = {name: count for name, count in SHARES.items()
              if name == "numpy" or importlib.util.find_spec(name) is not None}
    processes = {name: start("sequences", name, "0", str(count))
                 for name, count in shares.items()}
    ended = finish(processes)
    found = [p for name, count in shares.items() for p in problems(name, count, *ended[name])]
    assert not found, "\n\n".join(found)


def test_a_torch_run_resumed_in_a_new_process_is_bit_exact(tmp_path):
    torch = pytest.importorskip("torch")
    for half in ("first", "second"):
        code, out, err = finish({half: start("resume", half, str(tmp_path))})[half]
        assert code == 0, f"the {half} half ended with status {code}:\n{err[-3000:]}"
    first, second, saved = (torch.load(tmp_path / f"{name}.pt")
                            for name in ("first", "second", "model"))
    assert first.keys() == second.keys() == saved.keys()
    for key in first:
        assert not torch.equal(first[key], saved[key]), f"{key} did not train after the save"
        assert torch.equal(first[key], second[key]), f"{key} differs once resumed"
