"""The code keeps its own bars: ruff's lint (with C901, complexity at most 10 in the
library) passes on the sources, tests and benchmarks, as CI runs it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_passes():
    done = subprocess.run(["ruff", "check", "src", "tests", "benchmarks"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:]
