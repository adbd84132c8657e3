"""Every Python example in README.md runs, and prints what the README says it prints.

A ```python block is run on its own, in a fresh namespace. When a ```text block follows it
directly, the block's output must equal that text. A block that imports PyTorch, JAX,
flax, equinox or orbax is skipped when that library is not installed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import re
import sys
import types
from pathlib import Path

import pytest

import optimisers

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


def blocks() -> list[tuple[str, str, str | None]]:
    """``(heading, code, expected output or None)`` for each ```python block."""
    text = README.read_text(encoding="utf-8")
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
        out.append((heading, m.group(2), expected))
    return out


BLOCKS = blocks()


def test_readme_has_examples():
    assert len(BLOCKS) >= 10
    assert sum(expected is not None for _, _, expected in BLOCKS) >= 8


@pytest.mark.parametrize(("heading", "code", "expected"), BLOCKS,
                         ids=[f"{i}-{h}" for i, (h, _, _) in enumerate(BLOCKS)])
def test_example_runs(heading, code, expected):
    for lib in ("torch", "jax", "flax", "equinox", "orbax"):
        if re.search(rf"^\s*(import|from) {lib}\b", code, re.M):
            if importlib.util.find_spec(lib) is None:
                pytest.skip(f"{lib} is not installed")
    module = types.ModuleType("readme_example")  # a real module: dataclasses look it up
    sys.modules[module.__name__] = module
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"README.md ({heading})", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    if expected is not None:
        got = [line.rstrip() for line in out.getvalue().rstrip("\n").splitlines()]
        assert got == [line.rstrip() for line in expected.rstrip("\n").splitlines()]


def test_the_two_commands_are_there():
    text = README.read_text(encoding="utf-8")
    assert "```bash\npip install . && optimisers demo\n```" in text
    assert '```bash\npip install -e ".[test]" && python -m pytest\n```' in text


def rule_rows() -> dict[str, str]:
    text = README.read_text(encoding="utf-8")
    return dict(re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", text, re.M))


def test_rules_table_lists_every_rule():
    builtin = {name for name, cls in optimisers.RULES.items()
               if cls.__module__.startswith("optimisers.rules.")
               and name not in ("Rule", "TreeRule") and not name.startswith("_")}
    assert builtin <= set(rule_rows())


@pytest.mark.parametrize("name", sorted(rule_rows()))
def test_rules_table_defaults_are_right(name):
    """Each row's call, evaluated, is the rule with its defaults (composites by fields)."""
    cls = getattr(optimisers, name)
    signature = rule_rows()[name]
    if name in ("OptimiserChain", "AccumGrad", "MixedPrecision", "EMA"):
        fields = [f.name for f in dataclasses.fields(cls)]
        shown = re.findall(r"[(,] ?\*?(\w+)", signature)
        assert shown == fields or name == "OptimiserChain" and shown == ["rules"], signature
        return
    assert eval(signature, vars(optimisers)) == cls()
