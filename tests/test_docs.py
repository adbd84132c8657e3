"""Every public name is documented with an example, and the test suite runs the examples.

The examples themselves run through ``--doctest-modules`` (see ``pyproject.toml``); these
tests make sure there is one for each public name, that doctest finds it, and run the
examples of public data (whose attribute docstrings doctest cannot see) here.
"""

from __future__ import annotations

import ast
import doctest
import inspect
import sys
import tomllib
from pathlib import Path

import pytest

import optimisers

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = sorted(optimisers.__all__)


def _defining_module(obj):
    return sys.modules[obj.__module__]


def _attribute_docstring(name: str) -> tuple[str | None, object]:
    """The string literal right after ``name = ...`` in the module that exports it."""
    for mod in list(sys.modules.values()):
        if not getattr(mod, "__name__", "").startswith("optimisers."):
            continue
        if getattr(mod, name, None) is not getattr(optimisers, name):
            continue
        path = getattr(mod, "__file__", None)
        if path is None:
            continue
        body = ast.parse(Path(path).read_text(encoding="utf-8")).body
        for stmt, nxt in zip(body, body[1:]):
            targets = (stmt.targets if isinstance(stmt, ast.Assign) else
                       [stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                        and isinstance(nxt.value.value, str)):
                    return inspect.cleandoc(nxt.value.value), mod
    return None, None


def _docstring(name: str) -> str | None:
    obj = getattr(optimisers, name)
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return obj.__doc__ if "__doc__" in vars(obj) or inspect.isroutine(obj) else None
    return _attribute_docstring(name)[0]


def test_all_is_sorted_out():
    assert len(PUBLIC) == len(set(PUBLIC))
    missing = [n for n in PUBLIC if not hasattr(optimisers, n)]
    assert not missing, f"optimisers.__all__ names what the package lacks: {missing}"


def test_doctests_run_in_the_suite():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pytest_ini = config["tool"]["pytest"]["ini_options"]
    assert "--doctest-modules" in pytest_ini["addopts"]
    assert "src/optimisers" in pytest_ini["testpaths"]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_has_docstring_with_example(name):
    doc = _docstring(name)
    assert doc and doc.strip(), f"optimisers.{name} has no docstring"
    assert ">>>" in doc, f"the docstring of optimisers.{name} has no >>> example"
    first = doc.strip().splitlines()[0]
    assert name in first, (f"the docstring of optimisers.{name} should start with the call "
                           f"it documents, e.g. '{name}(...) -> ...', not {first!r}")


@pytest.mark.parametrize("name", [n for n in PUBLIC if inspect.isclass(getattr(optimisers, n))
                                  or inspect.isroutine(getattr(optimisers, n))])
def test_doctest_finds_the_example(name):
    """The example is where ``--doctest-modules`` looks: in the defining module."""
    obj = getattr(optimisers, name)
    mod = _defining_module(obj)
    tests = doctest.DocTestFinder().find(mod)
    wanted = f"{mod.__name__}.{obj.__qualname__}"
    assert any(t.name == wanted and t.examples for t in tests), (
        f"doctest does not collect an example for {wanted}")


@pytest.mark.parametrize("name", [n for n in PUBLIC if not inspect.isclass(getattr(optimisers, n))
                                  and not inspect.isroutine(getattr(optimisers, n))])
def test_examples_of_public_data_run(name):
    """Attribute docstrings are invisible to doctest: run their examples here."""
    doc, mod = _attribute_docstring(name)
    assert doc is not None, f"optimisers.{name} has no docstring"
    test = doctest.DocTestParser().get_doctest(doc, dict(vars(mod)), name, mod.__file__, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0 and test.examples, f"the example of optimisers.{name} fails"
