"""The readable state tree: Leaf's repr and summary."""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np

import optimisers as O


def test_leaf_repr_is_compact():
    big = np.zeros((300, 200), np.float32)
    leaf = O.setup(O.Adam(), big)
    text = repr(leaf)
    assert text == ("Leaf(Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-08), "
                    "(f32[300, 200], f32[300, 200], 0.0))")
    O.freeze_(leaf)
    assert repr(leaf).endswith(", frozen=True)")
    chain = O.setup(O.OptimiserChain(O.AccumGrad(2), O.Momentum()), np.zeros(3, np.float16))
    assert repr(chain).endswith("((f16[3], 1), f16[3]))")


def test_summary_lists_paths_ties_counts_and_totals():
    w = np.zeros((4, 3))
    model = {"encoder": {"weight": w, "bias": np.zeros(3)},
             "decoder": {"weight": w, "bias": np.zeros(4)}, "steps": np.arange(3)}
    tree = O.setup(O.Momentum(), model)
    O.freeze_(tree, "decoder.bias")
    text = O.summary(tree, model)
    lines = text.splitlines()
    assert lines[0].split() == ["path", "rule", "params", "state", "frozen"]
    assert lines[1].split()[:3] == ["encoder.weight", "=", "decoder.weight"]
    assert lines[1].split()[-3:] == ["12", "96", "B"]
    assert lines[3].split()[-1] == "frozen"
    totals = [line for line in lines if " Leafs, " in line]  # (the rule written out below)
    assert totals == ["3 Leafs, 19 parameters, 152 B of state, 1 frozen"]
    assert [line for line in O.summary(tree).splitlines() if " Leafs, " in line] == totals


def test_summary_of_stateless_rule_without_model():
    text = O.summary(O.setup(O.Descent(), {"w": np.ones(2)}))
    assert text.splitlines()[1].split()[-3:] == ["?", "0", "B"]


def test_summary_in_the_models_order_with_ties_frozen_and_dotted_keys():
    """The exact text, for a tree whose dicts are sorted (as ``jax.jit`` returns them)."""
    w = np.zeros((3, 2), np.float32)
    model = {"z": {"w": w, "b.c": np.zeros(2, np.float32)},
             "a": [w, np.zeros(5), (np.ones(1, np.float16),)], "k": np.arange(3)}
    tree = O.freeze_(O.setup(O.Adam(), model), "a.1")
    tree = {"a": tree["a"], "k": tree["k"], "z": {"b.c": tree["z"]["b.c"], "w": tree["z"]["w"]}}
    adam = "Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-08)"
    assert O.summary(tree, model) == "\n".join([
        "path        rule                                               params  state  frozen",
        f"z.w = a.0   {adam}       6   48 B",
        f"z.b.c       {adam}       2   16 B",
        f"a.1         {adam}       5   80 B  frozen",
        f"a.2.0       {adam}       1    4 B",
        "4 Leafs, 14 parameters, 148 B of state, 1 frozen"])


def test_summary_time_grows_linearly_with_a_nodes_width():
    """One walk: 8 times the arrays in one list take about 8 times as long, not 64 (it
    read the node's children once per Leaf: 5,000 arrays 1.35 s, 40,000 127 s)."""
    def seconds(n: int) -> float:
        model = [np.zeros(2, np.float32) for _ in range(n)]
        tree = O.setup(O.Descent(), model)
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            text = O.summary(tree, model)
            best = min(best, time.perf_counter() - start)
        assert text.splitlines()[-1] == f"{n} Leafs, {2 * n} parameters, 0 B of state"
        return best

    small, large = seconds(5_000), seconds(40_000)
    assert large < 30 * small, (small, large)


def _legend(lines: list[str]) -> dict[str, str]:
    """``{"[1]": rule text}`` from the lines under a summary's totals: a rule's further
    lines (indented) joined to its first with one space."""
    rules: dict[str, str] = {}
    for line in lines:
        if line.startswith("["):
            label, _, text = line.partition(" ")
            rules[label] = text
        else:
            rules[label] += " " + line.strip()
    return rules


def _check_named_once(text: str, tree: Any = None) -> dict[str, str]:
    """Every line of ``text`` (a summary) within 100 columns; each row's rule named by a
    label whose rule is written out, once and in full (it evaluates to a rule of that
    repr), under the totals. Returns the legend."""
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    end = next(i for i, line in enumerate(lines) if " Leafs, " in line)
    legend = _legend(lines[end + 1:])
    starts = [line for line in lines[end + 1:] if line.startswith("[")]
    assert len(starts) == len(set(starts)) == len(legend)
    labels = {re.search(r"\s(\[\d+\]) (\w+)\s", row).groups() for row in lines[1:end]}
    assert {label for label, _ in labels} == set(legend)
    for label, name in labels:
        rule = eval(legend[label], vars(O))  # noqa: S307 (the library's own reprs)
        assert isinstance(rule, O.Rule) and repr(rule) == legend[label]
        assert type(rule).__name__ == name
    assert len(set(legend.values())) == len(legend)
    return legend


def test_summary_of_a_chain_names_each_rule_once_within_100_columns():
    """A chain written in every row made a 150-column rule column: each distinct rule is
    now written once, in full, under the table, and each row names it."""
    w = np.zeros((4, 4), np.float32)
    model = {"encoder": {"weight": np.zeros((2, 4), np.float32), "bias": np.zeros(4)},
             "block1": {"weight": w, "bias": np.zeros(4)}, "block2": {"weight": w},
             "head": {"weight": np.zeros((4, 1), np.float32), "bias": np.zeros(1)}}
    rule = O.OptimiserChain(O.AccumGrad(2), O.ClipGlobalNorm(1.0),
                            O.AdamW(O.Warmup(O.Cosine(0.01, 0.001, 100), 10, 0.001), lambd=0.01))
    tree = O.setup(rule, model)
    O.adjust_(tree, where="*.bias", lambd=0.0)
    text = O.summary(tree, model)
    legend = _check_named_once(text)
    assert len(legend) == 2
    rows = {line.split("   ")[0]: line for line in text.splitlines()[1:7]}
    for path, leaf in [("encoder.bias", tree["encoder"]["bias"]),
                       ("block1.weight = block2.weight", tree["block1"]["weight"])]:
        label = re.search(r"\[\d+\]", rows[path])[0]
        assert legend[label] == repr(leaf.rule)
    assert text.splitlines()[7] == "6 Leafs, 37 parameters, 552 B of state"


def test_the_demos_summary_fits_100_columns_and_shows_each_rule_once(capsys):
    from optimisers import __main__ as cli

    assert cli.main(["demo", "--steps", "20"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("summary(tree, model):"):].split("\n\n")[0].splitlines()[1:]
    legend = _check_named_once("\n".join(section))
    assert [text.partition("(")[0] for text in legend.values()] == ["OptimiserChain"] * 2
