"""The readable state tree: Leaf's repr and summary."""

from __future__ import annotations

import time

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
    assert lines[-1] == "3 Leafs, 19 parameters, 152 B of state, 1 frozen"
    assert O.summary(tree).splitlines()[-1] == lines[-1]  # counts read off the state


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
