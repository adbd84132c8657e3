"""setup with rules per subset (CONTRACT section 8): patterns or a function of the path."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

import optimisers as O
from optimisers.keypath import KeyPath
from optimisers.state import chooser


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


def test_chooser_is_the_function_setup_asks_for_every_kind_of_rule():
    x, bias = np.ones(2), KeyPath("enc", "bias")
    assert chooser(O.Adam())(bias, x) == O.Adam()
    by_pattern = chooser({"*.bias": None, "enc.*": O.Descent()})
    assert by_pattern(bias, x) is None
    assert by_pattern(KeyPath("enc", "weight"), x) == O.Descent()
    with pytest.raises(ValueError, match=r"no pattern of setup matches .* norm\.scale"):
        by_pattern(KeyPath("norm", "scale"), x)
    assert chooser(lambda kp, a: None)(bias, x) is None
    with pytest.raises(TypeError, match=r"gave a str for enc\.bias"):
        chooser(lambda kp, a: "adam")(bias, x)
    with pytest.raises(TypeError, match="takes a Rule first"):
        chooser(3)


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


# ---------------------------------------------------------------- every path of a tie


def _numpy_array():
    w = np.ones(2)
    return {"a": w, "b": w}, ("a",), ("b",)


def _numpy_shared_dict():
    w = np.ones(2)
    w.flags.writeable = False  # no tie by itself: the shared dict makes the tie
    shared = {"w": w}
    return {"a": shared, "b": shared, "c": np.ones(3)}, ("a", "w"), ("b", "w")


def _torch_parameter():
    nn = pytest.importorskip("torch").nn
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    second.weight = first.weight
    return nn.Sequential(first, nn.Tanh(), second), ("0", "weight"), ("2", "weight")


def _torch_module():
    nn = pytest.importorskip("torch").nn
    layer = nn.Linear(2, 2)
    return nn.Sequential(layer, nn.Tanh(), layer), ("0", "weight"), ("2", "weight")


def _jax_shared_dict():
    jnp = pytest.importorskip("jax.numpy")
    shared = {"w": jnp.ones(2)}
    return {"a": shared, "b": shared}, ("a", "w"), ("b", "w")


def _flax_nnx_param():
    pytest.importorskip("flax")
    jnp = pytest.importorskip("jax.numpy")
    from flax import nnx

    class Tied(nnx.Module):  # a language model's head sharing the embedding's Param
        def __init__(self):
            self.embed = nnx.Param(jnp.ones((4, 3)))
            self.head = nnx.Dict(kernel=self.embed)
            self.norm = nnx.Param(jnp.ones(3))

    return Tied(), ("embed", "value"), ("head", "kernel", "value")


TIES = [_numpy_array, _numpy_shared_dict, _torch_parameter, _torch_module, _jax_shared_dict,
        _flax_nnx_param]


def tie_ids(make):
    return make.__name__.lstrip("_")


@pytest.mark.parametrize("tied", TIES, ids=tie_ids)
def test_setup_asks_every_path_of_a_tie_once(tied):
    model, first, second = tied()
    asked = []
    tree = O.setup(lambda kp, x: asked.append(kp) or O.Adam(), model)
    assert KeyPath(*first) in asked and KeyPath(*second) in asked
    assert len(asked) == len(set(asked))  # each path once
    assert O.getkeypath(tree, first) is O.getkeypath(tree, second)


@pytest.mark.parametrize("tied", TIES, ids=tie_ids)
def test_a_tie_whose_paths_give_unequal_rules_is_refused_naming_both(tied):
    model, first, second = tied()
    both = rf"{re.escape(str(KeyPath(*first)))} and {re.escape(str(KeyPath(*second)))}"
    with pytest.raises(ValueError, match=rf"tied array at {both} would get two rules"):
        O.setup({str(KeyPath(*second)): O.Descent(), "*": O.Adam()}, model)
    with pytest.raises(ValueError, match=rf"tied array at {both} would get two rules, "
                                         rf"Adam\(.*\) and None"):
        O.setup(lambda kp, x: None if kp == KeyPath(*second) else O.Adam(), model)
    with pytest.raises(ValueError, match=rf"tied array at {both} would get two rules, "
                                         rf"None and Adam\(.*\)"):
        O.setup(lambda kp, x: None if kp == KeyPath(*first) else O.Adam(), model)


@pytest.mark.parametrize("tied", TIES, ids=tie_ids)
@pytest.mark.filterwarnings("ignore:setup found no trainable parameter")
def test_a_tie_whose_paths_give_equal_rules_is_one_leaf(tied):
    model, first, second = tied()
    tree = O.setup(lambda kp, x: O.AdamW(0.01, lambd=0.1 if kp != KeyPath(*second) else 0.1),
                   model)
    leaf = O.getkeypath(tree, first)
    assert leaf is O.getkeypath(tree, second) and leaf.rule == O.AdamW(0.01, lambd=0.1)
    tree = O.setup(lambda kp, x: None if kp in (KeyPath(*first), KeyPath(*second))
                   else O.Adam(), model)
    assert O.getkeypath(tree, first) is None and O.getkeypath(tree, second) is None


# ---------------------------------------------------------------- a rule that refuses an array


def _suggested(err: pytest.ExceptionInfo) -> str:
    """The call of setup that a refusal's message suggests."""
    found = re.search(r"e\.g\. (setup\(.*, model\))$", str(err.value))
    assert found, str(err.value)
    return found.group(1)


def _numpy_net() -> dict:
    rng = np.random.default_rng(0)
    return {"fc": {"weight": rng.normal(size=(4, 3)), "bias": np.zeros(4)},
            "ln": {"weight": np.ones(4), "bias": np.zeros(4)},
            "out": {"weight": rng.normal(size=(1, 4))}, "weight": np.ones(2)}


@pytest.mark.parametrize("rule", [
    O.Muon(0.02), O.OptimiserChain(O.ClipNorm(1.0), O.Muon(O.Cosine(0.02, steps=10))),
    {"*.weight": O.Muon(0.02), "*": O.AdamW()},  # the old message's advice
], ids=["Muon", "chain", "mapping"])
def test_muons_suggested_setup_runs_and_trains_every_matrix_with_the_users_rule(rule):
    model = _numpy_net()
    with pytest.raises(ValueError, match=r"cannot train the array at (fc\.bias|ln\.weight): ") as e:
        O.setup(rule, model)
    code = _suggested(e)
    assert "OptimiserChain()" not in code
    tree = eval(code, {**vars(O), "model": model})  # the very text of the message
    muon = rule if isinstance(rule, O.Rule) else rule["*.weight"]
    for path in ("fc.weight", "out.weight"):
        assert O.getkeypath(tree, O.KeyPath(*path.split("."))).rule == muon
    for path in ("fc.bias", "ln.weight", "ln.bias", "weight"):
        assert O.getkeypath(tree, O.KeyPath(*path.split("."))).rule == O.AdamW()
    before = copy.deepcopy(model)
    grads = {k: {n: np.ones_like(v) for n, v in d.items()} if isinstance(d, dict)
             else np.ones_like(d) for k, d in model.items()}
    O.update_(tree, model, grads)
    assert all((model[k]["weight"] != before[k]["weight"]).all() for k in ("fc", "ln", "out"))


def test_a_function_that_gives_muon_for_a_vector_is_told_to_give_another_rule():
    with pytest.raises(ValueError, match=r"cannot train the array at fc\.bias: .* return "
                                         r"another rule \(AdamW\(\), say\) for fc\.bias"):
        O.setup(lambda kp, x: O.Muon(), _numpy_net())


def test_the_suggestion_for_a_mixed_precision_muon_is_code_that_runs():
    """The suggested call quotes the user's rule by its ``repr``: a dtype in it is written
    by name (``dtype='float32'``), which is code, not ``<class 'numpy.float32'>``."""
    rule = O.MixedPrecision(O.Muon(0.02))
    model = {k: v.astype(np.float16) if isinstance(v, np.ndarray) else
             {n: a.astype(np.float16) for n, a in v.items()} for k, v in _numpy_net().items()}
    with pytest.raises(ValueError, match=r"cannot train the array at") as e:
        O.setup(rule, model)
    code = _suggested(e)
    assert "dtype='float32'" in code and "<class" not in code
    tree = eval(code, {**vars(O), "model": model})  # the very text of the message
    assert repr(tree["fc"]["weight"].rule) == repr(rule)
    assert tree["fc"]["bias"].rule == O.AdamW()
    before = copy.deepcopy(model)
    grads = O.fmap(np.ones_like, model)
    O.update_(tree, model, grads)
    assert (model["fc"]["weight"] != before["fc"]["weight"]).all()
    assert tree["fc"]["weight"].state[0].dtype == np.float32
