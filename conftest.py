"""Repository-wide pytest setup: the optional backends are doctested only where their
library is installed, so a NumPy-only install collects and passes the rest."""

from __future__ import annotations

import importlib.util


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


collect_ignore = [f"src/optimisers/backends/{lib}.py" for lib in ("torch", "jax")
                  if _missing(lib)]
if _missing("torch"):
    collect_ignore += ["src/optimisers/backends/dtensor.py", "src/optimisers/distributed"]
if _missing("jax"):
    collect_ignore.append("src/optimisers/backends/sharding.py")
