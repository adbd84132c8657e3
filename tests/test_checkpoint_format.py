"""The file format stays: a checkpoint written by the code of main at 5fb34dd (before the
checkpoint package was rewritten, issue 28) loads, and the same tree saves to the same bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import optimisers as O
from test_checkpoint import assert_same_tree

WRITTEN_BY_MAIN = Path(__file__).parent / "data" / "format_v2.ckpt"


def build() -> tuple[Any, Any, Any]:
    """The tree that ``format_v2.ckpt`` holds: a tie, a frozen Leaf, an adjusted rule, a
    schedule, a chain, a dtype field, None nodes; and the rules it was set up with."""
    r = np.random.default_rng(7)
    w = r.standard_normal((3, 2)).astype(np.float32)
    model = {"enc": {"w": w, "b": r.standard_normal(2)},
             "dec": [w, r.standard_normal(4).astype(np.float32)],
             "mp": np.ones(3, np.float16), "steps": np.arange(3), "name": "net"}
    rules = {"mp": O.MixedPrecision(O.Momentum(0.1), np.float32), "enc.b": O.Rprop(),
             "*": O.OptimiserChain(O.ClipNorm(1.0),
                                   O.AdamW(O.Cosine(1e-2, 1e-3, 50), lambd=0.1))}
    tree = O.setup(rules, model)
    for s in range(3):
        g = np.random.default_rng(100 + s)
        grads = {"enc": {"w": g.standard_normal((3, 2)).astype(np.float32),
                         "b": g.standard_normal(2)},
                 "dec": [g.standard_normal((3, 2)).astype(np.float32),
                         g.standard_normal(4).astype(np.float32)],
                 "mp": np.full(3, 0.5, np.float16)}
        tree, model = O.update_(tree, model, grads)
        if s == 0:
            O.adjust_(O.select(tree, "enc.b"), eta=0.5)
            O.freeze_(tree, "dec.1")
    return tree, model, rules


def test_a_file_written_by_the_earlier_code_loads() -> None:
    tree, model, rules = build()
    back = O.load(WRITTEN_BY_MAIN, like=O.setup(rules, model))
    assert_same_tree(tree, back)
    assert back["enc"]["w"] is back["dec"][0] and back["dec"][1].frozen
    assert back["enc"]["b"].rule == O.Rprop(eta=0.5) and back["enc"]["w"].clock == 3


def test_the_same_tree_saves_to_the_bytes_the_earlier_code_wrote(tmp_path: Any) -> None:
    tree, _, _ = build()
    O.save(tmp_path / "again.ckpt", tree)
    assert (tmp_path / "again.ckpt").read_bytes() == WRITTEN_BY_MAIN.read_bytes()
