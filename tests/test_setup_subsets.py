"""setup with rules per subset (CONTRACT section 8): patterns or a function of the path."""

from __future__ import annotations

import numpy as np
import pytest

import optimisers as O
from optimisers.keypath import KeyPath


def model():
    rng = np.random.default_rng(0)
    return {"enc": {"weight": rng.normal(size=(3, 2)), "bias": rng.normal(size=2)},
            "norm": {"scale": np.ones(2)}, "steps": np.arange(3)}


def test_first_matching_pattern_wins_and_none_is_not_trained():
    tree = O.setup({"*.bias": O.AdamW(lambd=0.0), "norm": None, "*": O.AdamW(lambd=0.1)},
                   model())
    assert tree["enc"]["bias"].rule.lambd == 0.0
    assert tree["enc"]["weight"].rule.lambd == 0.1
    assert tree["norm"]["scale"] is None and tree["steps"] is None


def test_an_unmatched_trainable_array_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"norm\.scale"):
        O.setup({"enc": O.Adam()}, model())


def test_a_function_of_the_path_and_array():
    def pick(kp: KeyPath, x):
        return O.Descent(0.5) if x.ndim == 2 else None

    tree = O.setup(pick, model())
    assert isinstance(tree["enc"]["weight"].rule, O.Descent)
    assert tree["enc"]["bias"] is None
    with pytest.raises(TypeError, match=r"gave a str for enc\.weight"):
        O.setup(lambda kp, x: "adam", model())


def test_a_tie_that_would_get_two_rules_is_an_error_naming_both_paths():
    w = np.ones(2)
    with pytest.raises(ValueError, match=r"a and b would get two rules"):
        O.setup({"a": O.Adam(), "b": O.Descent()}, {"a": w, "b": w})
    tree = O.setup({"a": O.Adam(), "b": O.Adam()}, {"a": w, "b": w})
    assert tree["a"] is tree["b"]


def test_bad_rules_are_type_errors():
    with pytest.raises(TypeError, match="rules or None"):
        O.setup({"*": 3}, model())
    with pytest.raises(TypeError, match="takes a Rule first"):
        O.setup(3, model())


def test_patterns_equal_torch_param_groups():
    torch = pytest.importorskip("torch")

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                   torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))

    ours, ref = net(), net()
    no_decay = [p for n, p in ref.named_parameters() if n.endswith("bias") or n.startswith("2.")]
    decay = [p for n, p in ref.named_parameters() if not (n.endswith("bias") or n.startswith("2."))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=0.01)
    tree = O.setup({"*.bias": O.AdamW(0.01, lambd=0.0), "2": O.AdamW(0.01, lambd=0.0),
                    "*": O.AdamW(0.01, lambd=0.1)}, ours)
    x = torch.randn(16, 4)
    for _ in range(5):
        for m in (ours, ref):
            m.zero_grad()
            m(x).square().sum().backward()
        O.update_(tree, ours)
        opt.step()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
