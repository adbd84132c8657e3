"""benchmarks/gpu.py, the GPU benchmark: without a GPU it says so in one line and exits 0;
its agreement check fails where ours and the peer's parameters differ or did not move."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if not BENCHMARKS.is_dir():
    pytest.skip("no benchmarks/ beside the tests (an installed copy)", allow_module_level=True)


def test_without_a_gpu_it_says_so_and_exits_0():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")  # no GPU, anywhere
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu.py")], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and "no GPU found" in lines[0] and "Nothing to run" in lines[0]
    for lib, says in (("torch", "no CUDA GPU for torch"), ("jax", "no GPU for JAX")):
        try:
            __import__(lib)
        except ImportError:
            says = f"{lib} is not installed"
        assert says in lines[0]


def test_the_agreement_check_fails_on_a_difference_and_on_no_step():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gpu
    finally:
        sys.path.remove(str(BENCHMARKS))
    x0 = np.zeros((3, 4), np.float32)
    moved = x0 - 0.05

    def check(ours: np.ndarray, theirs: np.ndarray) -> object:
        return gpu.compare("rule / peer", "numpy", lambda: ([ours], [theirs], [x0]))

    same = check(moved, moved.copy())
    assert same.failure is None and same.diff == 0
    off = check(moved, moved + 1e-4)
    assert off.failure is not None and "array 0" in off.failure
    assert off.diff == pytest.approx(1e-4, rel=1e-3)
    assert check(x0.copy(), x0.copy()).failure == "our parameters did not move"

    def raises() -> tuple:
        raise RuntimeError("no kernel for this device")

    broken = gpu.compare("rule / peer", "torch", raises)
    assert broken.failure == "RuntimeError: no kernel for this device" and broken.diff is None
