"""Gradients as users hold them (flat dicts of dotted names), and ties declared by the
state tree alone (Optimisers.jl's "artificial shared leaf")."""

from __future__ import annotations

import numpy as np
import pytest

import optimisers as O
from optimisers.gather import nest_dotted


def test_dotted_names_become_nested_dicts():
    model = {"enc": [np.ones(2), {"w": np.ones(3)}], "b": np.ones(1), "a.b": np.ones(1)}
    g = nest_dotted({"enc.0": 1, "enc.1.w": 2, "b": 3, "a.b": 4}, model)
    assert g == {"enc": {0: 1, 1: {"w": 2}}, "b": 3, "a.b": 4}
    nested = {"enc": [None, None]}
    assert nest_dotted(nested, model) is nested  # nothing to do: the very object


def test_dotted_name_that_leads_nowhere_is_the_gathers_error():
    model = {"enc": [np.ones(2)]}
    tree = O.setup(O.Descent(), model)
    with pytest.raises(ValueError, match="has key 'enc.5', which the model lacks"):
        O.update(tree, model, {"enc.5": np.ones(2)})


def test_numpy_model_with_flat_gradient_dict():
    model = {"layers": [{"w": np.ones(3), "b": np.zeros(3)}, {"w": np.ones(2)}]}
    tree = O.setup(O.Momentum(0.1), model)
    flat = {"layers.0.w": np.ones(3), "layers.1.w": np.full(2, 2.0)}
    tree, new = O.update(tree, model, flat)
    np.testing.assert_allclose(new["layers"][0]["w"], 0.9)
    np.testing.assert_allclose(new["layers"][1]["w"], 0.8)
    np.testing.assert_array_equal(new["layers"][0]["b"], 0.0)  # no gradient: left alone


torch = pytest.importorskip("torch")


def gpt_like():
    torch.manual_seed(0)
    m = torch.nn.ModuleDict({
        "wte": torch.nn.Embedding(20, 8),
        "h": torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)]),
        "ln": torch.nn.LayerNorm(8),
        "head": torch.nn.Linear(8, 20, bias=False),
    })
    m["head"].weight = m["wte"].weight  # tied, as GPT-2's
    return m


def forward(m, ids):
    h = m["wte"](ids)
    for layer in m["h"]:
        h = torch.tanh(layer(h))
    return m["head"](m["ln"](h)).logsumexp(-1).sum()


def test_torch_flat_gradient_dict_matches_adamw_param_groups():
    ours, ref = gpt_like(), gpt_like()
    decay = [p for n, p in ref.named_parameters() if not n.endswith("bias") and "ln" not in n]
    rest = [p for n, p in ref.named_parameters() if n.endswith("bias") or "ln" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=0.01)
    tree = O.setup(O.AdamW(0.01, lambd=0.1), ours)
    O.adjust_(tree, where="*.bias", lambd=0.0)
    O.adjust_(tree, where="ln.*", lambd=0.0)
    ids = torch.arange(12)
    for _ in range(5):
        for m in (ours, ref):
            m.zero_grad()
            forward(m, ids).backward()
        flat = {name: p.grad for name, p in ours.named_parameters()}
        assert "head.weight" not in flat  # named_parameters gives a tie once
        tree, ours = O.update_(tree, ours, flat)
        opt.step()
    assert ours["head"].weight is ours["wte"].weight
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
