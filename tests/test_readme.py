"""Every Python example in README.md runs, and prints what the README says it prints
(the mechanism, shared with the site's pages, is in ``markdown_examples.py``).

The README is the front page; what it held before (the examples, the rules and schedules
tables, "How it differs") moved to the site's pages under docs/, and the checks of those
claims below read them there (``page``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

import optimisers
from markdown_examples import FENCE, examples, run

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [*sorted(set((ROOT / "docs").rglob("*.md")) - {ROOT / "docs" / "api.md"}), README]


def blocks(*pages: Path) -> list[tuple[str, str, str | None]]:
    """``(heading, code, expected output or None)`` for each ```python block."""
    return [(e.heading, e.code, e.expected) for page in pages for e in examples(page)]


README_BLOCKS = blocks(README)  # run here; the site's pages' in test_site.py
BLOCKS = blocks(*PAGES)  # the README's examples before it became a front page, and more


def page(heading: str) -> Path:
    """The first page (the site's, then the README) with a section ``heading``."""
    for path in PAGES:
        if re.search(rf"^#+ {re.escape(heading)}\n", path.read_text(encoding="utf-8"), re.M):
            return path
    raise AssertionError(f"no page has a section {heading!r}")


def test_readme_has_examples():
    assert len(BLOCKS) >= 10
    assert sum(expected is not None for _, _, expected in BLOCKS) >= 8


@pytest.mark.parametrize(("heading", "code", "expected"), README_BLOCKS,
                         ids=[f"{i}-{h}" for i, (h, _, _) in enumerate(README_BLOCKS)])
def test_example_runs(heading, code, expected):
    run(code, expected, f"README.md ({heading})")


def test_the_two_commands_are_there():
    text = README.read_text(encoding="utf-8")
    assert "```bash\npip install . && optimisers demo\n```" in text
    assert '```bash\npip install -e ".[test]" && python -m pytest\n```' in text


def rule_rows() -> dict[str, str]:
    text = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
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


# ------------------------------------------------- what the README says exists, against the code


def section(heading: str) -> str:
    """The prose of the section ``heading`` of its page (to the next heading of its level
    or above), code blocks left out."""
    text = page(heading).read_text(encoding="utf-8")
    found = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.M)
    assert found, f"README has no section {heading!r}"
    rest = text[found.end():]
    end = re.search(rf"^#{{1,{len(found.group(1))}}} ", rest, re.M)
    return FENCE.sub("", rest[:end.start()] if end else rest)


def sentences(text: str) -> list[str]:
    """The sentences of some prose, each on one line."""
    return [s.strip() for s in re.split(r"(?<=[.;])\s+(?=[A-Z`*(])", " ".join(text.split()))
            if s.strip()]


DIFFERS = "How it differs from optax and torch.optim"
NEGATION = re.compile(r"\b(no|none|not|never|nor|neither|without|lacks?)\b", re.I)


def has_schedules() -> None:
    """Schedules exist, are exported, and a rule's field takes one, read at each step."""
    assert {"Cosine", "Warmup", "OneCycle"} <= set(optimisers.SCHEDULES)
    assert all(getattr(optimisers, name) is cls for name, cls in optimisers.SCHEDULES.items()
               if name in optimisers.__all__)
    model = [np.zeros(1)]
    tree = optimisers.setup(optimisers.Descent(eta=optimisers.Linear(1.0, 0.0, 2)), model)
    for _ in range(2):
        optimisers.update_(tree, model, [np.ones(1)])
    assert model[0].tolist() == [-1.5]


def has_rules_per_subset() -> None:
    """setup takes rules by where= pattern or by a function, and names the paths in errors."""
    model = {"enc": {"weight": np.ones((2, 2)), "bias": np.ones(2)}}
    tree = optimisers.setup({"*.bias": optimisers.AdamW(lambd=0.0),
                             "*": optimisers.AdamW(lambd=0.1)}, model)
    assert (tree["enc"]["bias"].rule.lambd, tree["enc"]["weight"].rule.lambd) == (0.0, 0.1)
    tree = optimisers.setup(lambda kp, x: optimisers.Descent() if x.ndim == 2 else None, model)
    assert tree["enc"]["bias"] is None and tree["enc"]["weight"].rule == optimisers.Descent()
    with pytest.raises(ValueError, match=r"enc\.bias"):
        optimisers.setup({"*.weight": optimisers.Adam()}, model)
    w = np.ones(2)
    with pytest.raises(ValueError, match=r"a and b would get two rules"):
        optimisers.setup({"a": optimisers.Adam(), "*": None}, {"a": w, "b": w})


def has_tree_level_rules() -> None:
    """ClipGlobalNorm and SkipNonFinite are tree-level rules that sit in a chain."""
    for rule in (optimisers.ClipGlobalNorm, optimisers.SkipNonFinite):
        assert issubclass(rule, optimisers.TreeRule)
    model = [np.zeros(1), np.zeros(1)]
    tree = optimisers.setup(optimisers.OptimiserChain(
        optimisers.SkipNonFinite(), optimisers.ClipGlobalNorm(1.0), optimisers.Descent(1.0)),
        model)
    optimisers.update_(tree, model, [np.array([3.0]), np.array([4.0])])
    np.testing.assert_allclose(np.concatenate(model), [-0.6, -0.8])
    optimisers.update_(tree, model, [np.array([np.nan]), np.array([4.0])])
    np.testing.assert_allclose(np.concatenate(model), [-0.6, -0.8])


def has_sharded_state() -> None:
    """The state is placed as its parameter is (JAX), as a DTensor's (torch), and ZeRO-1
    shards it by Leaf across processes (optimisers.distributed)."""
    if importlib.util.find_spec("jax") is None and importlib.util.find_spec("torch") is None:
        pytest.skip("neither JAX nor PyTorch is installed")
    if importlib.util.find_spec("jax") is not None:
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        mesh = Mesh(np.array(jax.devices()), ("x",))
        w = jax.device_put(np.ones((len(jax.devices()) * 2,), np.float32),
                           NamedSharding(mesh, PartitionSpec("x")))
        state = optimisers.setup(optimisers.Adam(), {"w": w})["w"].state
        assert state[0].sharding.is_equivalent_to(w.sharding, 1)
    if importlib.util.find_spec("torch") is not None:
        import inspect

        import optimisers.backends.dtensor as dtensor
        import optimisers.distributed as distributed

        assert "shard" in inspect.signature(distributed.setup).parameters
        assert dtensor.__name__ == "optimisers.backends.dtensor"


HAS = {  # what the README says the library has: its words for it, and the check
    "schedules": (r"schedul", has_schedules),
    "rules per subset": (r"rules per subset|param(eter)? groups|key-path globs",
                         has_rules_per_subset),
    "tree-level rules": (r"tree-level|global norm|non-finite", has_tree_level_rules),
    "sharded state": (r"shard|distributed", has_sharded_state),
}


def no_pickle_in_checkpoints() -> None:
    import json
    import tempfile
    import zipfile

    tree = optimisers.setup(optimisers.Adam(optimisers.Cosine(0.1, steps=5)), {"w": np.ones(2)})
    path = Path(tempfile.mkdtemp()) / "tree.zip"
    optimisers.save(path, tree)
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            assert name.endswith((".json", ".npy")), name
            with z.open(name) as f:
                json.load(f) if name.endswith(".json") else np.load(f, allow_pickle=False)


def no_closure_based_rules() -> None:
    import inspect

    assert not [name for name in optimisers.RULES if "bfgs" in name.lower()]
    for cls in optimisers.RULES.values():
        assert "closure" not in inspect.signature(cls.apply).parameters, cls


LACKS = {  # what the README says the library lacks, each checked: it fails once the code has it
    "checkpoints hold no pickle": no_pickle_in_checkpoints,
    "no closure-based rules such as L-BFGS": no_closure_based_rules,
}

OTHERS = {  # names in "How it differs" that are optax's, torch's or JAX's, not this library's
    "pmap", "(init, update)", "inject_hyperparams", "optax.masked",
    "multi_transform", "optax.partition", "foreach", "jax.jit", "DTensor",
}


@pytest.mark.parametrize("name", sorted(HAS))
def test_how_it_differs_says_what_exists_and_the_code_has_it(name):
    words, check = HAS[name]
    said = [s for s in sentences(section(DIFFERS)) if re.search(words, s, re.I)]
    assert said, f"'How it differs' does not mention {name}"
    denied = [s for s in said if NEGATION.search(s)]
    assert not denied, f"'How it differs' says the library lacks {name}, which it has: {denied}"
    check()


@pytest.mark.parametrize("claim", sorted(LACKS))
def test_how_it_differs_says_what_is_missing_and_the_code_lacks_it(claim):
    assert claim in " ".join(section(DIFFERS).split())
    LACKS[claim]()


def test_every_sentence_of_how_it_differs_that_says_something_is_missing_is_checked():
    unchecked = [s for s in sentences(section(DIFFERS))
                 if NEGATION.search(s) and not any(claim in s for claim in LACKS)]
    assert not unchecked, f"add each to LACKS with a check against the code: {unchecked}"


def test_the_names_how_it_differs_gives_this_library_exist():
    text = section(DIFFERS)
    spans = set(re.findall(r"`([^`]+)`", text))
    assert OTHERS <= spans, f"OTHERS lists names the section no longer has: {OTHERS - spans}"
    model = {"enc": {"weight": np.ones((2, 2)), "bias": np.ones(2)}}
    ours = {**vars(optimisers), "optimisers": optimisers, "model": model}
    unknown = []
    for span in sorted(spans - OTHERS):
        try:
            if span.startswith("optimisers."):
                importlib.import_module(span)
            else:
                eval(span, ours)
        except ImportError:
            assert importlib.util.find_spec("torch") is None, span  # (a package of torch's)
        except (NameError, AttributeError, SyntaxError, TypeError):
            unknown.append(span)
    assert not unknown, f"not names of this library (nor in OTHERS): {unknown}"


def test_the_schedules_table_names_every_schedule_with_its_fields():
    text = section("Schedules")
    rows = re.findall(r"^\| `(\w+)\(([^`]*)\)` \|", text, re.M)
    assert rows
    for name, args in rows:
        cls = optimisers.SCHEDULES[name]
        assert getattr(optimisers, name) is cls and name in optimisers.__all__
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for arg in (a.strip() for a in args.split(",")):
            key, _, default = arg.partition("=")
            assert key in fields, f"{name} has no field {key}"
            if default and default != "...":
                assert fields[key].default == eval(default), f"{name}.{key}"
    public = {n for n in optimisers.SCHEDULES if n in optimisers.__all__ and n != "Schedule"}
    assert public <= set(re.findall(r"`(\w+)\(", text)), "a schedule the section does not name"


def test_a_sentence_saying_the_library_lacks_what_it_has_is_caught():
    """The README once said so of schedules; the test above would refuse it."""
    said = ("It has no learning-rate schedules of its own (call `adjust_` in your loop), and it "
            "offers none of optax's distributed tooling.")
    for name in ("schedules", "sharded state"):
        found = [s for s in sentences(said) if re.search(HAS[name][0], s, re.I)]
        assert found and all(NEGATION.search(s) for s in found), name
