"""Hyper-parameters are validated once, declaratively, on every path that makes a rule:
constructors, ``adjust``/``adjust_`` (``dataclasses.replace``) and checkpoints."""

from __future__ import annotations

import dataclasses
import json
import re
import zipfile
from typing import Any

import numpy as np
import pytest

import optimisers as O
from optimisers.rules.fields import InvalidKind, hyperparameter

BUILTIN = ["Descent", "Momentum", "Nesterov", "Rprop", "RMSProp", "Adam", "RAdam", "AdaMax",
           "OAdam", "AdaGrad", "AdaDelta", "AMSGrad", "NAdam", "AdamW", "AdaBelief", "Lion",
           "WeightDecay", "SignDecay", "ClipGrad", "ClipNorm", "OptimiserChain", "AccumGrad",
           "MixedPrecision", "Muon", "Adafactor"]


@pytest.mark.parametrize("name", BUILTIN)
def test_every_field_of_every_builtin_rule_declares_what_it_allows(name):
    cls = getattr(O, name)
    undeclared = [f.name for f in dataclasses.fields(cls) if "allowed" not in f.metadata]
    # OptimiserChain(*rules) has its own constructor, which checks that each is a Rule
    assert undeclared == (["rules"] if name == "OptimiserChain" else [])


BAD = [  # (make, the exception's message, or its beginning)
    (lambda: O.Adam(eta=np.float32(-1)),
     "Invalid learning rate: -1.0; Adam's learning rate eta must be >= 0 and finite"),
    (lambda: O.Descent(np.array(-1.0)),
     "Invalid learning rate: -1.0; Descent's learning rate eta must be >= 0 and finite"),
    (lambda: O.Adam(float("nan")), "Invalid learning rate: nan; "),
    (lambda: O.Adam(float("inf")), "Invalid learning rate: inf; "),
    (lambda: O.Momentum(rho=float("-inf")), "Invalid rho parameter: -inf; Momentum's rho must "
                                            "be in [0, 1]"),
    (lambda: O.Adam(None), "Invalid learning rate: None (NoneType); Adam's learning rate eta "
                           "must be a number >= 0 and finite"),
    (lambda: O.Adam("0.1"), "Invalid learning rate: '0.1' (str)"),
    (lambda: O.Adam(beta=(1.5, 0.9)),
     "Invalid beta parameter at index 0: 1.5; Adam's beta[0] must be in [0, 1)"),
    (lambda: O.AdamW(beta=(0.9, 1.0)), "Invalid beta parameter at index 1: 1.0; AdamW's "
                                       "beta[1] must be in [0, 1)"),
    (lambda: O.Adam(epsilon=-1e-8), "Invalid epsilon parameter: -1e-08; Adam's epsilon must be "
                                    ">= 0"),
    (lambda: O.ClipNorm(omega=-1), "Invalid omega parameter: -1; ClipNorm's omega must be >= 0"),
    (lambda: O.ClipNorm(p=float("nan")), "Invalid p parameter: nan; ClipNorm's p must be in "
                                         "[-inf, inf]"),
    (lambda: O.MixedPrecision(O.Adam(), dtype=np.int32),
     "MixedPrecision's dtype must be a floating dtype"),
    (lambda: O.MixedPrecision(O.Adam(), dtype=None), "MixedPrecision's dtype must be a floating"),
    (lambda: O.MixedPrecision(O.Adam(), dtype="complex64"), "must be a floating dtype"),
    (lambda: O.MixedPrecision(0.1), "Invalid rule parameter: 0.1 (float); MixedPrecision's "
                                    "rule must be a Rule"),
    (lambda: O.AccumGrad(True), "Invalid n parameter: True (bool); AccumGrad's n must be a "
                                "whole number >= 1"),
    (lambda: O.AccumGrad(np.float64(2.0)), "AccumGrad's n must be a whole number >= 1"),
    (lambda: O.Adam(beta=(0.9,)), "Invalid beta parameter: (0.9,); Adam's beta must be a "
                                  "tuple of 2 numbers: beta[0] in [0, 1), beta[1] in"),
    (lambda: O.Adam(beta=[0.9, 0.999]), "Adam's beta must be a tuple of 2 numbers"),
    (lambda: O.Adam(beta=(0.9, 0.999, 0.9)), "Adam's beta must be a tuple of 2 numbers"),
    (lambda: O.Rprop(ell=(1.5, 1.2)), "Invalid ell parameter at index 0: 1.5; Rprop's ell[0] "
                                      "must be in (0, 1)"),
    (lambda: O.Rprop(gamma=(-1.0, 50.0)), "Rprop's gamma[0] must be >= 0"),
    (lambda: O.RMSProp(centred=1), "Invalid centred parameter: 1 (int); RMSProp's centred "
                                   "must be True or False"),
    (lambda: O.Descent(np.array([0.1, -0.1])), "Invalid learning rate: -0.1"),
    (lambda: O.Descent(np.array(0.1 + 0j)), "(ndarray); Descent's learning rate eta must "
                                            "be a number"),
    (lambda: O.Descent(np.array(True)), "(ndarray)"),
    (lambda: O.Lion(beta=(0.9, 1.01)), "Lion's beta[1] must be in [0, 1]"),
    (lambda: O.WeightDecay(-5e-4), "WeightDecay's lambd must be >= 0"),
    (lambda: O.AdaDelta(rho=1.5), "AdaDelta's rho must be in [0, 1]"),
    (lambda: O.Adafactor(epsilon=(-1.0, 1e-3)), "Invalid epsilon parameter at index 0: -1.0; "
     "Adafactor's epsilon[0] must be >= 0 and finite, or None"),
    (lambda: O.Adafactor(epsilon=(None, None)), "Invalid epsilon parameter at index 1: None "
     "(NoneType); Adafactor's epsilon[1] must be a number >= 0 and finite"),
    (lambda: O.Adafactor(epsilon=None), "Adafactor's epsilon must be a tuple of 2 numbers: "
     "epsilon[0] >= 0 and finite, or None, epsilon[1] >= 0 and finite"),
    (lambda: O.Muon(ns_steps=100), "Invalid ns_steps parameter: 100; Muon's ns_steps must be "
     "in [0, 100)"),
    (lambda: O.Muon(ns_coefficients=(3.0, float("nan"), 2.0)), "Invalid ns_coefficients "
     "parameter at index 1: nan; Muon's ns_coefficients[1] must be in (-inf, inf)"),
]


@pytest.mark.parametrize("make, message", BAD, ids=range(len(BAD)))
def test_bad_hyperparameters_are_refused_naming_rule_field_and_range(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


@pytest.mark.parametrize("make", [lambda: O.Adam(None), lambda: O.Adam("0.1"),
                                  lambda: O.AccumGrad(True), lambda: O.Adam(beta=(0.9,)),
                                  lambda: O.MixedPrecision(O.Adam(), dtype=np.int32)])
def test_a_value_of_the_wrong_kind_is_a_type_error_too(make):
    with pytest.raises(TypeError):
        make()
    assert issubclass(InvalidKind, ValueError)  # as torch.optim (and this library) raised


@pytest.mark.parametrize("make", [
    lambda: O.Descent(np.float32(0.5)), lambda: O.Descent(np.array(0.5)), lambda: O.Descent(1),
    lambda: O.Descent(0), lambda: O.AccumGrad(np.int64(3)), lambda: O.ClipNorm(p=float("inf")),
    lambda: O.ClipNorm(p=-float("inf")), lambda: O.ClipNorm(p=0), lambda: O.ClipGrad(0.0),
    lambda: O.Momentum(rho=1.0), lambda: O.Lion(beta=(1.0, 1.0)),
    lambda: O.AdamW(0.1, (0.0, 0.0), lambd=0.1, epsilon=0.0, couple=np.bool_(False)),
    lambda: O.MixedPrecision(O.Adam(), np.float64), lambda: O.MixedPrecision(O.Adam(), "float16"),
    lambda: O.MixedPrecision(O.Adam(), np.dtype("float32")),
    lambda: O.Descent(np.array([0.1, 0.2])),  # a batched learning rate, as jax.vmap makes
    lambda: O.Adafactor(epsilon=(None, 0.0)), lambda: O.Adafactor(epsilon=(np.float32(1e-30), 1)),
])
def test_good_hyperparameters_of_every_kind_are_accepted(make):
    make()


def test_zero_d_arrays_of_each_library_are_checked_by_value():
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    for lib_array in (np.asarray, torch.tensor, jnp.asarray):
        assert O.Descent(lib_array(0.5)).eta == 0.5
        with pytest.raises(ValueError, match="Invalid learning rate: -0.5"):
            O.Descent(lib_array(-0.5))
        with pytest.raises(ValueError, match=r"Invalid beta parameter at index 1: 2.0"):
            O.Adam(beta=(lib_array(0.5), lib_array(2.0)))
    assert O.MixedPrecision(O.Adam(), torch.bfloat16).dtype is torch.bfloat16
    assert O.MixedPrecision(O.Adam(), jnp.bfloat16).dtype is jnp.bfloat16
    with pytest.raises(ValueError, match="must be a floating dtype"):
        O.MixedPrecision(O.Adam(), torch.int32)


def test_adjust_and_adjust_validate_the_new_values_and_write_nothing_on_error():
    model = {"a": np.ones(2), "b": np.ones(2)}
    tree = O.setup(O.OptimiserChain(O.ClipNorm(1.0), O.Adam()), model)
    before = [leaf.rule for leaf in O.select(tree)]
    with pytest.raises(ValueError, match=r"Invalid beta parameter at index 0: 1.5; Adam's"):
        O.adjust_(tree, beta=(1.5, 0.9))
    with pytest.raises(ValueError, match="Invalid omega parameter: -1.0; ClipNorm's omega"):
        O.adjust(tree, omega=-1.0)
    with pytest.raises(ValueError, match="Invalid learning rate: -1.0"):
        O.adjust_(tree, np.float32(-1), where="b")
    with pytest.raises(TypeError, match="Invalid learning rate: '0.1' \\(str\\)"):
        O.adjust_(tree, eta="0.1")
    assert [leaf.rule for leaf in O.select(tree)] == before
    with pytest.raises(ValueError, match="Invalid epsilon parameter: -1.0"):
        O.adjust(O.Adam(), epsilon=-1.0)
    assert O.adjust_(tree, np.float32(0.01))["a"].rule.rules[1].eta == np.float32(0.01)


def _edit_rule_field(path: Any, rule: str, field: str, edit: Any) -> None:
    """Rewrite the checkpoint at ``path`` with ``edit`` applied to the JSON of the field
    ``field`` of every rule named ``rule``."""
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    doc = json.loads(members["checkpoint.json"])
    stack, edited = [doc], 0
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("rule") == rule and isinstance(node.get("fields"), dict):
                node["fields"][field] = edit(node["fields"][field])
                edited += 1
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    assert edited
    members["checkpoint.json"] = json.dumps(doc).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


@pytest.mark.parametrize("rule, field, edit, message", [
    ("Adam", "beta", lambda j: json.loads(json.dumps(j).replace("0.9\"", "1.5\"", 1)),
     r"Invalid beta parameter at index 0: 1.5; Adam's beta\[0\] must be in \[0, 1\)"),
    ("Adam", "epsilon", lambda j: json.loads(json.dumps(j).replace("1e-08", "-1e-08")),
     r"Invalid epsilon parameter: -1e-08; Adam's epsilon must be >= 0"),
    ("AccumGrad", "n", lambda j: True, r"Invalid n parameter: True \(bool\)"),
    ("ClipNorm", "throw", lambda j: "yes", r"Invalid throw parameter: 'yes' \(str\)"),
])
def test_loading_a_checkpoint_validates_its_hyperparameters(tmp_path, rule, field, edit,
                                                            message):
    model = {"w": np.ones(3, np.float32)}
    make = lambda: O.OptimiserChain(O.AccumGrad(2), O.ClipNorm(), O.Adam())  # noqa: E731
    tree = O.setup(make(), model)
    O.save(tmp_path / "opt.ckpt", tree)
    assert O.load(tmp_path / "opt.ckpt", like=tree)["w"].rule == make()
    _edit_rule_field(tmp_path / "opt.ckpt", rule, field, edit)
    with pytest.raises(ValueError, match=message):
        O.load(tmp_path / "opt.ckpt", like=O.setup(make(), model))


def test_traced_values_are_checked_for_what_can_be_known():
    """Under jax.jit a traced value's number is unknown: not checked, but a tuple's
    length (and every concrete field) still is. Rules that JAX rebuilds from their flat
    form are never re-validated, so jitted steps and tree maps keep working."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    model = {"w": jnp.ones(3)}
    tree = O.setup(O.Adam(0.1), model)

    @jax.jit
    def step(tree, model, lr):
        tree = O.adjust(tree, lr, beta=(lr * 9, 0.999))
        return O.update(tree, model, {"w": jnp.ones(3)})

    new, _ = step(tree, model, 0.1)
    assert float(new["w"].rule.eta) == pytest.approx(0.1)

    with pytest.raises(TypeError, match=r"Adam's beta must be a tuple of 2 numbers"):
        jax.jit(lambda t, lr: O.adjust(t, beta=(lr,)))(tree, 0.9)
    with pytest.raises(ValueError, match=r"Invalid epsilon parameter: -1.0"):
        jax.jit(lambda t, lr: O.adjust(t, lr, epsilon=-1.0))(tree, 0.9)
    bent = jax.tree.map(lambda v: -v, tree)  # rebuilt by JAX: no check, by design
    assert float(bent["w"].rule.eta) == pytest.approx(-0.1)


def test_a_users_rule_declares_its_fields_and_an_undeclared_eta_is_still_checked():
    @dataclasses.dataclass(frozen=True)
    class Scaled(O.Rule):
        eta: float = hyperparameter(0.1, "(0, 1]")
        decay: tuple = hyperparameter((0.5, 2.0), "[0, 1)", "(1, inf)")
        free: Any = None

        def apply(self, state, x, dx):
            return state, self.eta * dx

    assert Scaled(free="anything").eta == 0.1
    with pytest.raises(ValueError, match=r"Invalid learning rate: 0.0; Scaled's learning rate "
                                         r"eta must be in \(0, 1\]"):
        Scaled(0.0)
    with pytest.raises(ValueError, match=r"Scaled's decay\[1\] must be > 1 and finite"):
        Scaled(decay=(0.5, 1.0))

    @dataclasses.dataclass(frozen=True)
    class Plain(O.Rule):
        eta: float = 0.1

    with pytest.raises(ValueError, match="Plain's learning rate eta must be >= 0"):
        Plain(-1.0)


def test_hyperparameter_refuses_a_declaration_it_cannot_read():
    with pytest.raises(ValueError, match="cannot read '0, 1' as an interval"):
        hyperparameter(0.5, "0, 1")
    with pytest.raises(ValueError, match="a number needs the interval it lies in"):
        hyperparameter(0.5)
    with pytest.raises(ValueError, match="kind must be one of"):
        hyperparameter(0.5, kind="real")
