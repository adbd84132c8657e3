"""destructure, Restructure and trainables (ported in spirit from Optimisers.jl's tests)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from optimisers import destructure, trainables


@dataclasses.dataclass
class Foo:
    x: object
    y: object


@dataclasses.dataclass
class BatchNorm:
    beta: object
    gamma: object
    mu: object
    sigma: object
    __trainable__ = ("beta", "gamma")


def test_plain_arrays_and_containers():
    m1 = np.arange(1.0, 4.0)
    flat, re = destructure(m1)
    np.testing.assert_array_equal(flat, m1)
    assert flat is not m1 and re(flat * 2).tolist() == [2.0, 4.0, 6.0]
    flat, re = destructure((np.arange(3), np.array([4.0, 5.0, 6.0])))  # integers skipped
    assert flat.tolist() == [4.0, 5.0, 6.0]
    out = re(np.zeros(3))
    assert out[0].tolist() == [0, 1, 2] and out[1].tolist() == [0.0, 0.0, 0.0]
    flat, re = destructure({"x": m1, "y": np.sin, "z": np.arange(4.0, 7.0)})
    assert flat.tolist() == [1, 2, 3, 4, 5, 6] and re(flat)["y"] is np.sin


def test_ties_once_and_restored():
    m1 = np.arange(1.0, 4.0)
    model = {"x": m1, "y": m1, "z": np.arange(4.0, 7.0), "f": Foo(m1, (m1, 7.0))}
    flat, re = destructure(model)
    assert flat.tolist() == [1, 2, 3, 4, 5, 6] and len(re) == 6
    new = re(flat * 10)
    assert new["x"] is new["y"] is new["f"].x is new["f"].y[0]
    assert new["x"].tolist() == [10, 20, 30] and new["f"].y[1] == 7.0
    assert m1.tolist() == [1, 2, 3]  # the old model is untouched
    assert len(trainables(model)) == 2


def test_immutable_copies_are_not_tied():
    ro = np.ones(2)
    ro.setflags(write=False)
    flat, re = destructure({"a": ro, "b": ro})
    assert len(flat) == 4
    new = re(np.arange(4.0))
    assert new["a"].tolist() == [0, 1] and new["b"].tolist() == [2, 3]


def test_trainable_subset_only():
    bn = BatchNorm(np.zeros(2), np.ones(2), np.full(2, 5.0), np.full(2, 6.0))
    flat, re = destructure([bn, np.array([7.0])])
    assert flat.tolist() == [0, 0, 1, 1, 7]
    new = re(np.arange(5.0))
    assert new[0].beta.tolist() == [0, 1] and new[0].gamma.tolist() == [2, 3]
    assert new[0].mu is bn.mu and new[0].sigma is bn.sigma
    assert [str(kp) for kp, _ in trainables([bn], path=True)] == ["0.beta", "0.gamma"]


def test_dtype_promotion_and_restoration():
    model = (np.ones(2, np.float32), np.ones(1, np.float16))
    flat, re = destructure(model)
    assert flat.dtype == np.float32
    out = re(flat)
    assert out[0].dtype == np.float32 and out[1].dtype == np.float16
    flat, re = destructure((np.ones(2), np.array([1 + 2j], np.complex64)))
    assert flat.dtype == np.complex128
    out = re(flat)
    assert out[0].dtype == np.float64 and out[1].dtype == np.complex64 and out[1][0] == 1 + 2j


def test_shapes_are_restored():
    model = {"w": np.arange(6.0).reshape(2, 3), "s": np.array(7.0)}
    flat, re = destructure(model)
    new = re(flat)
    assert new["w"].shape == (2, 3) and new["s"].shape == ()
    np.testing.assert_array_equal(new["w"], model["w"])


@pytest.mark.parametrize("bad,match", [
    (np.ones(5), r"expected a 1-D vector of length 6, got shape \(5,\)"),
    (np.ones((2, 3)), r"got shape \(2, 3\)"),
    ([1.0] * 6, "got a list"),
])
def test_wrong_length(bad, match):
    _, re = destructure({"w": np.ones((2, 2)), "b": np.ones(2)})
    with pytest.raises(ValueError, match=match):
        re(bad)


def test_repr_and_empty_model():
    _, re = destructure({"w": np.ones((2, 2)), "b": np.ones(2)})
    assert repr(re) == "Restructure(dict, ..., 6)"
    flat, re = destructure({"n": 3})
    assert flat.shape == (0,) and re(flat) == {"n": 3}


def test_re_in_a_loop_does_not_call_trainable():
    calls = []

    @dataclasses.dataclass
    class Layer:
        w: object
        b: object

        def __trainable__(self):
            calls.append(1)
            return ("w",)

    flat, re = destructure([Layer(np.ones(2), np.ones(2))])
    n = len(calls)
    for _ in range(5):
        re(flat)
    assert len(calls) == n
