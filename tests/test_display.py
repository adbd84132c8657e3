"""How a Leaf reads: its state by shape and dtype, its rule with the numbers it holds."""

from __future__ import annotations

import numpy as np

import optimisers as O
from optimisers.display import brief, leaf_text, shown


def test_state_is_shown_by_shape_and_dtype():
    state = (np.zeros((3, 2), np.float32), [np.ones(1, np.float16)], {"t": (2,)}, None)
    assert brief(state) == "(f32[3, 2], [f16[1]], {'t': (2,)}, None)"
    assert brief(np.zeros((), np.complex64)) == "c64[]"


def test_rule_numbers_are_shown_as_numbers():
    rule = O.OptimiserChain(O.ClipGrad(np.float32(0.1)), O.Adam(np.array(0.5)))
    assert shown(rule) == ("OptimiserChain(ClipGrad(delta=0.1), "
                           "Adam(eta=0.5, beta=(0.9, 0.999), epsilon=1e-08))")
    assert leaf_text(O.Descent(), None, False) == "Leaf(Descent(eta=0.1), None)"
    assert repr(O.Leaf(O.Descent(), None, True)) == "Leaf(Descent(eta=0.1), None, frozen=True)"
