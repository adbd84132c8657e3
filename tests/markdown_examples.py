"""Markdown pages whose Python examples the suite runs: README.md (``test_readme.py``) and
the site's pages under docs/ (``test_site.py``).

A ```python block is run on its own, in a fresh namespace. When a ```text block follows it
directly, the block's output must equal that text. A block that imports PyTorch, JAX,
flax, equinox or orbax is skipped when that library is not installed; one preceded
directly by ``<!-- no-run: reason -->`` is not run, for that reason.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import sys
import types
from pathlib import Path
from typing import NamedTuple

import pytest

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
NO_RUN = re.compile(r"<!-- no-run: (.+?) -->\s*$")


class Example(NamedTuple):
    heading: str  # the last heading above the block
    code: str
    expected: str | None  # the ```text block right after it, if any
    no_run: str | None  # the reason given in a <!-- no-run: ... --> right before it


def examples(path: Path) -> list[Example]:
    """Every ```python block of the Markdown file ``path``, in order."""
    text = path.read_text(encoding="utf-8")
    found = list(FENCE.finditer(text))
    out = []
    for i, m in enumerate(found):
        if m.group(1) != "python":
            continue
        heading = re.findall(r"^#+ (.*)$", text[: m.start()], re.M)[-1]
        after = found[i + 1] if i + 1 < len(found) else None
        expected = None
        between = text[m.end():after.start()] if after is not None else "x"
        if after is not None and after.group(1) == "text" and not between.strip():
            expected = after.group(2)
        before = NO_RUN.search(text[found[i - 1].end() if i else 0:m.start()])
        out.append(Example(heading, m.group(2), expected, before and before.group(1)))
    return out


def run(code: str, expected: str | None, label: str) -> None:
    """Runs ``code`` as a module of its own; its output must be ``expected`` (if given)."""
    for lib in ("torch", "jax", "flax", "equinox", "orbax"):
        if re.search(rf"^\s*(import|from) {lib}\b", code, re.M):
            if importlib.util.find_spec(lib) is None:
                pytest.skip(f"{lib} is not installed")
    module = types.ModuleType("readme_example")  # a real module: dataclasses look it up
    sys.modules[module.__name__] = module
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, label, "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    if expected is not None:
        got = [line.rstrip() for line in out.getvalue().rstrip("\n").splitlines()]
        assert got == [line.rstrip() for line in expected.rstrip("\n").splitlines()]


def text_after(path: Path, code: str) -> str:
    """The ```text block that follows ``code`` in ``path`` (past a sentence)."""
    rest = path.read_text(encoding="utf-8").split(code, 1)[1]
    return re.search(r"^```text\n(.*?)^```\n", rest, re.S | re.M).group(1)
