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
                                         "(0, inf]"),
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
    (lambda: O.Descent(np.array([0.1, -0.1])), "Descent's learning rate eta must be a number "
     ">= 0 and finite: one number (a scalar, or a 0-d array), not an array of shape (2,)"),
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
    lambda: O.ClipNorm(p=0.5), lambda: O.ClipGrad(0.0),
    lambda: O.Momentum(rho=1.0), lambda: O.Lion(beta=(1.0, 1.0)),
    lambda: O.AdamW(0.1, (0.0, 0.0), lambd=0.1, epsilon=0.0, couple=np.bool_(False)),
    lambda: O.MixedPrecision(O.Adam(), np.float64), lambda: O.MixedPrecision(O.Adam(), "float16"),
    lambda: O.MixedPrecision(O.Adam(), np.dtype("float32")),
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


def _numeric_fields() -> list:
    """``(rule class, field, index)`` for every number that a rule of the library holds: each
    element of a tuple field apart (``index`` None for a field of one number)."""
    found = []
    for cls in O.RULES.values():
        if not cls.__module__.startswith("optimisers.") or not dataclasses.is_dataclass(cls):
            continue
        for f in dataclasses.fields(cls):
            allowed = f.metadata.get("allowed")
            if allowed is None or allowed.kind not in ("number", "whole"):
                continue
            within = allowed.within
            indices = range(len(within)) if isinstance(within, tuple) else [None]
            found.extend((cls, f.name, i) for i in indices)
    return found


NUMERIC_FIELDS = _numeric_fields()


def _with(cls: type, name: str, index: int | None, value: Any) -> Any:
    """A rule of class ``cls`` (its defaults; an Adam inside a wrapper) with ``value`` as the
    field ``name`` (as its element ``index`` of a tuple)."""
    needs = {f.name for f in dataclasses.fields(cls)
             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    base = cls(**{"rule": O.Adam()} if "rule" in needs else {})
    if index is not None:
        value = tuple(value if i == index else v
                      for i, v in enumerate(getattr(base, name)))
    return dataclasses.replace(base, **{name: value})


def _a_value(cls: type, name: str, index: int | None) -> Any:
    """The field's default, or for a default of None, the least value it allows."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    default = f.default if index is None else f.default[index]
    if default is not None:
        return default
    within = f.metadata["allowed"].within
    low = (within if index is None else within[index]).low
    return int(low) if f.metadata["allowed"].kind == "whole" else low


@pytest.mark.parametrize("cls, name, index", NUMERIC_FIELDS,
                         ids=[f"{c.__name__}.{n}{'' if i is None else f'[{i}]'}"
                              for c, n, i in NUMERIC_FIELDS])
def test_every_numeric_field_of_every_rule_takes_numpy_scalars_and_0d_arrays(cls, name, index):
    """Python numbers, NumPy scalars of every real dtype and 0-d arrays of NumPy, PyTorch
    and JAX are numbers, stored as the Python number they hold; bools, strings, complex
    numbers, arrays of any other shape and ints beyond a float's range are refused at
    construction, naming the rule and the field."""
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    allowed = next(f for f in dataclasses.fields(cls) if f.name == name).metadata["allowed"]
    whole = allowed.kind == "whole"
    within = allowed.within if index is None else allowed.within[index]
    v = _a_value(cls, name, index)
    python = _with(cls, name, index, v)
    if whole:
        good = [np.int64(v), *([np.uint8(v)] if v < 256 else []), np.int32(v),
                np.asarray(v), torch.tensor(v), jnp.asarray(v)]  # (uint8: where it holds v)
    else:
        good = [np.float64(v), np.float32(v), np.float16(v), np.longdouble(v), np.asarray(v),
                np.asarray(v, np.float32), torch.tensor(v), torch.tensor(v, dtype=torch.bfloat16),
                jnp.asarray(v), jnp.asarray(v, jnp.bfloat16)]
        if float(v).is_integer():
            good += [int(v), np.int64(v), torch.tensor(int(v)), jnp.asarray(int(v))]
        # (0.999 in bfloat16 is 1.0, refused for Adam's beta[1]: as it should be)
        good = [g for g in good if float(g) in within]
    for given in good:
        stored = getattr(_with(cls, name, index, given), name)
        stored = stored if index is None else stored[index]
        held = given.item() if hasattr(given, "item") else given
        assert type(stored) is (int if isinstance(held, int) else float), given
        if isinstance(given, torch.Tensor):  # the same number in the given dtype
            assert torch.tensor(stored, dtype=given.dtype) == given, given
        else:
            assert np.asarray(stored).astype(np.asarray(given).dtype) == given, given
    assert _with(cls, name, index, np.float64(v) if not whole else np.int64(v)) == python
    field = ("learning rate eta" if name == "eta" else name) + (
        "" if index is None else f"[{index}]")
    bad = [True, np.bool_(True), torch.tensor(True), str(v), complex(v, 1), np.complex64(v),
           np.array([v, v]), np.array([v]), torch.tensor([v, v]), jnp.asarray([v, v]), 10**400,
           -10**400]
    if whole:
        bad += [float(v), np.float64(v), jnp.asarray(float(v))]
    for given in bad:
        with pytest.raises(ValueError, match=re.escape(f"{cls.__name__}'s {field} must be")):
            _with(cls, name, index, given)


def test_numpy_floats_are_numbers_and_step_as_python_floats():
    """``Adam(np.float64(0.1))`` is ``Adam(0.1)`` (it was refused as "not a number"): equal,
    hashed alike, and stepping a float32 parameter in float32 as the Python float does."""
    assert O.Adam(np.float64(0.1)) == O.Adam(0.1)
    assert hash(O.Adam(np.float64(0.1))) == hash(O.Adam(0.1))
    assert O.ClipNorm(np.float64(1.0)) == O.ClipNorm(1.0)
    assert O.ClipNorm(1.0, np.float64(2)) == O.ClipNorm(1.0, 2.0)
    assert repr(O.Adam(np.float64(0.1), (np.float32(0.8), np.array(0.25)))) == (
        "Adam(eta=0.1, beta=(0.8, 0.25), epsilon=1e-08)")  # float32 0.8 reads 0.8, as shown
    models = [{"w": np.linspace(-1, 1, 5, dtype=np.float32)} for _ in range(2)]
    trees = [O.setup(rule, m) for rule, m in zip([O.Adam(np.float64(0.1)), O.Adam(0.1)], models)]
    for tree, model in zip(trees, models):
        for _ in range(3):
            O.update_(tree, model, {"w": np.full(5, 0.5, np.float32)})
    assert models[0]["w"].dtype == np.float32
    np.testing.assert_array_equal(models[0]["w"], models[1]["w"])


def test_an_array_of_numbers_is_refused_naming_the_field_and_nothing_is_written():
    """A 1-D ``eta`` once broadcast as a per-element rate; now refused, by ``adjust_`` too."""
    with pytest.raises(ValueError, match=r"Adam's learning rate eta must be a number >= 0 and "
                                         r"finite: one number .*not an array of shape \(3,\)"):
        O.Adam(np.array([0.1, 0.2, 0.3]))
    tree = O.setup(O.Adam(), {"w": np.ones(3)})
    with pytest.raises(ValueError, match=r"Adam's beta\[0\] must be a number in \[0, 1\): one"):
        O.adjust_(tree, beta=(np.full(3, 0.9), 0.999))
    assert tree["w"].rule == O.Adam()


def test_an_int_too_large_for_a_float_is_refused_at_construction():
    with pytest.raises(ValueError, match="Invalid learning rate: an int of 401 digits, too "
                                         "large for a float; Adam's learning rate eta must be"):
        O.Adam(eta=10**400)
    with pytest.raises(ValueError, match="Muon's ns_coefficients\\[0\\] must be in"):
        O.Muon(ns_coefficients=(10**400, -4.775, 2.0315))
    tree = O.setup(O.Descent(), {"w": np.ones(2)})
    with pytest.raises(ValueError, match="too large for a float"):
        O.adjust_(tree, 10**400)
    assert O.Adam(eta=10**300).eta == 10**300  # a large int a float holds stays the int


def test_a_concrete_jax_number_given_to_adjust_does_not_retrace_the_step():
    """A concrete JAX number (``jnp.float32(0.003)``, a 0-d array) given to ``adjust`` is
    stored as the Python number it holds: the tree keeps the structure ``setup`` gave it,
    so the jitted step is not traced again; a traced number stays traced (a schedule
    inside the step)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from conftest import counted

    f, traces = counted(O.update)
    step = jax.jit(f)
    model, grads = {"w": jnp.ones(3)}, {"w": jnp.full(3, 0.5)}
    tree = O.setup(O.Adam(0.01), model)
    tree, model = step(tree, model, grads)
    for eta in (jnp.float32(0.003), jnp.asarray(0.002), np.float64(0.001)):
        tree = O.adjust(tree, eta, beta=(jnp.float32(0.8), 0.99))
        assert type(tree["w"].rule.eta) is float
        tree, model = step(tree, model, grads)
    assert len(traces) == 1
    assert tree["w"].rule == O.Adam(0.001, (0.8, 0.99))
    inside = jax.jit(lambda t, lr: O.adjust(t, lr).rule.eta)(tree["w"], 0.5)
    assert float(inside) == 0.5


@pytest.mark.parametrize("p", [0, 0.0, -1, -2.5, -float("inf"), float("nan")])
def test_clip_norm_takes_p_in_0_inf_as_clip_global_norm_does(p):
    """``ClipNorm`` took ``p=0`` (a count of non-zeros) and ``p=-1`` (which does not clip);
    it takes ``p`` in ``(0, inf]``, as ``ClipGlobalNorm`` does."""
    for rule in (O.ClipNorm, O.ClipGlobalNorm):
        with pytest.raises(ValueError, match=re.escape(f"{rule.__name__}'s p must be in (0, inf]")):
            rule(1.0, p)
    tree = O.setup(O.ClipNorm(1.0), {"w": np.ones(2)})
    with pytest.raises(ValueError, match=r"ClipNorm's p must be in \(0, inf\]"):
        O.adjust_(tree, p=p)
    assert tree["w"].rule == O.ClipNorm(1.0)


def test_clip_norm_clips_to_the_same_norm_as_clip_global_norm_for_every_allowed_p():
    g = np.array([3.0, -4.0, 0.5])
    for p in (0.5, 1, 1.5, 2, float("inf")):
        one = O.ClipNorm(1.0, p).apply(None, np.zeros(3), g)[1]
        everything = O.ClipGlobalNorm(1.0, p).apply(None, np.zeros(3), g)[1]
        np.testing.assert_allclose(one, everything, rtol=1e-12)
        assert np.linalg.norm(one, p) == pytest.approx(1.0)


def test_rmsprop_refuses_rho_1_whose_steps_are_eta_over_epsilon():
    """``RMSProp(rho=1.0)`` never learns its mean square (``q`` stays 0): every step was
    ``eta*g/epsilon``. Refused, as ``torch.optim.Adam`` refuses the same decay at 1."""
    with pytest.raises(ValueError, match=r"Invalid rho parameter: 1.0; RMSProp's rho must be "
                                         r"in \[0, 1\)"):
        O.RMSProp(rho=1.0)
    with pytest.raises(ValueError, match=r"RMSProp's rho must be in \[0, 1\)"):
        O.adjust_(O.setup(O.RMSProp(), {"w": np.ones(2)}), rho=1)
    assert O.RMSProp(rho=0.0).rho == 0.0 and O.RMSProp(rho=0.9999).rho == 0.9999


def test_momentum_and_nesterov_take_rho_1_as_torch_sgd_takes_momentum_1():
    """Allowed, documented: ``torch.optim.SGD`` checks only ``momentum >= 0``; with
    ``rho = 1`` the velocity sums every gradient, and the steps are torch's."""
    torch = pytest.importorskip("torch")
    for rule, nesterov in ((O.Momentum(0.1, 1.0), False), (O.Nesterov(0.1, 1.0), True)):
        assert "``rho = 1`` is allowed" in type(rule).__doc__
        x = np.array([1.0, -2.0])
        tree, model = O.setup(rule, {"w": x.copy()}), {"w": x.copy()}
        w = torch.tensor(x.copy(), requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1, momentum=1.0, nesterov=nesterov)
        for k in range(4):
            g = np.array([0.5, -1.0]) * (k + 1)
            O.update_(tree, model, {"w": g})
            w.grad = torch.tensor(g)
            opt.step()
            np.testing.assert_allclose(model["w"], w.detach().numpy(), rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match=r"Momentum's rho must be in \[0, 1\]"):
        O.Momentum(rho=1.01)


def test_skip_non_finite_limit_is_a_whole_number_of_any_library_and_0_raises_at_once():
    """``limit`` is declared as every field is (a NumPy int is a whole number: it was
    refused); ``limit=0`` is allowed: the first non-finite gradient raises, nothing written."""
    assert O.SkipNonFinite(np.int64(2)) == O.SkipNonFinite(2)
    assert type(O.SkipNonFinite(np.int64(2)).limit) is int
    for bad in (-1, 1.5, True, np.float64(2.0), "2"):
        with pytest.raises(ValueError, match="SkipNonFinite's limit must be"):
            O.SkipNonFinite(bad)
    model = {"w": np.ones(2)}
    tree = O.setup(O.OptimiserChain(O.SkipNonFinite(0), O.Descent(0.5)), model)
    with pytest.raises(FloatingPointError, match="after 0 consecutive skipped steps"):
        O.update_(tree, model, {"w": np.array([np.nan, 1.0])})
    np.testing.assert_array_equal(model["w"], np.ones(2))
    assert tree["w"].state[0] == 0
    O.update_(tree, model, {"w": np.ones(2)})
    np.testing.assert_array_equal(model["w"], np.full(2, 0.5))
