"""Repository-wide pytest setup: the optional backends are doctested only where their
library is installed, so a NumPy-only install collects and passes the rest; every
docstring example finds ``np`` already imported."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest


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


@pytest.fixture(autouse=True)
def _numpy_in_examples(doctest_namespace):
    """``np`` in every doctest's namespace, as the package docstring promises."""
    doctest_namespace["np"] = np
