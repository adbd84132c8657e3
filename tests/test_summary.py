"""The readable state tree: Leaf's repr and summary."""

from __future__ import annotations

import numpy as np

import optimisers as O


def test_leaf_repr_is_compact():
    big = np.zeros((300, 200), np.float32)
    leaf = O.setup(O.Adam(), big)
    text = repr(leaf)
    assert text == ("Leaf(Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-08), "
                    "(f32[300, 200], f32[300, 200], (0.9, 0.999)))")
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
    assert lines[-1] == "3 Leafs, 19 parameters, 152 B of state, 1 frozen"
    assert O.summary(tree).splitlines()[-1] == lines[-1]  # counts read off the state


def test_summary_of_stateless_rule_without_model():
    text = O.summary(O.setup(O.Descent(), {"w": np.ones(2)}))
    assert text.splitlines()[1].split()[-3:] == ["?", "0", "B"]
