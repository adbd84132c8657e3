"""Repository-wide pytest setup: the optional backends are doctested only where their
library is installed, so a NumPy-only install collects and passes the rest."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


collect_ignore = [f"src/optimisers/backends/{lib}.py" for lib in ("torch", "jax")
                  if _missing(lib)]
if _missing("torch"):
    collect_ignore += ["src/optimisers/backends/dtensor.py", "src/optimisers/distributed"]

if _missing("numba"):
    collect_ignore.append("src/optimisers/fast/jit.py")

if "OPTIMISERS_CACHE_DIR" not in os.environ:  # compiled kernels: not in the user's cache
    _KERNELS = tempfile.mkdtemp(prefix="optimisers-kernels-")
    os.environ["OPTIMISERS_CACHE_DIR"] = _KERNELS
    atexit.register(shutil.rmtree, _KERNELS, ignore_errors=True)
