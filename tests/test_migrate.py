"""Checkpoints that migrate: ``load``/``load_state_dict`` with ``strict=False`` load by path
what fits a model that gained, lost or renamed layers, report the rest, and carry state
across compatible rules (or through ``migrate=``); ``strict=True`` stays as it was."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import optimisers as O
from optimisers.leaf import leaves


def gpt(blocks: int, norm: str = "ln_f", wpe: bool = True, vocab: int = 11) -> dict:
    """A GPT-like model of NumPy arrays: embeddings tied to the head, blocks, a final norm."""
    rng = np.random.default_rng(blocks)
    wte = rng.normal(size=(vocab, 4))

    def block():
        return {"attn": {"qkv": rng.normal(size=(4, 12)), "proj": rng.normal(size=(4, 4))},
                "mlp": {"fc": rng.normal(size=(4, 16)), "proj": rng.normal(size=(16, 4))}}

    model = {"wte": wte, "h": [block() for _ in range(blocks)],
             norm: {"g": np.ones(4), "b": np.zeros(4)}, "lm_head": wte}
    return model | ({"wpe": rng.normal(size=(8, 4))} if wpe else {})


def grads(model: dict, step: int, old_name=lambda path: path) -> dict:
    """Gradients that depend on the step and the (old) path only, not on the model."""
    return O.fmap_with_path(lambda kp, x: np.random.default_rng(
        [step, zlib.crc32(old_name(str(kp)).encode())]).normal(size=x.shape), model)


def train(tree, model, steps, old_name=lambda path: path):
    for step in steps:
        tree, model = O.update_(tree, model, grads(model, step, old_name))
    return tree, model


def grown(old: dict) -> dict:
    """The old model one block bigger, its ``ln_f`` renamed ``norm_f``, without ``wpe``."""
    new = gpt(3, norm="norm_f", wpe=False)
    new["wte"][...] = old["wte"]
    for mine, theirs in zip(new["h"], old["h"]):  # block 2 is new
        O.fmap(lambda a, b: a.__setitem__(..., b), mine, theirs)
    O.fmap(lambda a, b: a.__setitem__(..., b), new["norm_f"], old["ln_f"])
    return new


def to_old(path: str) -> str:
    return path.replace("norm_f", "ln_f")


def paths_of(tree) -> list[str]:
    return [str(kp) for kp, _ in leaves(tree)]


def flat(s) -> list:
    return [s] if not isinstance(s, tuple) else [x for v in s for x in flat(v)]


def equal_states(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(flat(a), flat(b), strict=True))


@pytest.fixture
def saved(tmp_path):
    """A GPT-like model trained 3 steps with Adam, its state saved: (path, tree, model)."""
    model = gpt(2)
    tree, model = train(O.setup(O.Adam(0.01), model), model, range(3))
    O.save(path := tmp_path / "opt.ckpt", tree)
    return path, tree, model


@pytest.mark.parametrize("via", ["load", "load_state_dict"])
def test_a_model_with_a_layer_added_one_renamed_one_removed_resumes(saved, via):
    path, tree, model = saved
    new = grown(model)
    like = O.setup(O.Adam(), new)
    back, report = O.load(path, like, strict=False, renames={"ln_f": "norm_f"}) if (
        via == "load") else O.load_state_dict(like, O.state_dict(tree), strict=False,
                                              renames={"ln_f": "norm_f"})
    assert report.missing == tuple(p for p in paths_of(back) if p.startswith("h.2."))
    assert report.unexpected == ("wpe",) and report.mismatched == {}
    assert set(report.matched) == set(paths_of(back)) - {"lm_head"} - set(report.missing)
    assert back["wte"] is back["lm_head"]  # the tie kept
    before = {str(kp): leaf for kp, leaf in leaves(tree)}
    for kp, leaf in leaves(back):
        if str(kp) in report.matched:
            old = before[to_old(str(kp))]
            assert equal_states(leaf.state, old.state) and leaf.clock == old.clock == 3
            assert leaf.rule == O.Adam(0.01)
        elif str(kp) in report.missing:
            assert leaf.clock == 0 and not np.any(leaf.state[0])  # fresh
    # steps after the resume are those of the training never interrupted, layer by layer
    _, ran = train(tree, model, range(3, 6))
    _, resumed = train(back, new, range(3, 6), to_old)
    for name in ("wte", "lm_head"):
        assert np.array_equal(resumed[name], ran[name])
    assert all(O.fmap(lambda a, b: bool(np.array_equal(a, b)), resumed["h"][i], ran["h"][i])
               for i in (0, 1))
    assert np.array_equal(resumed["norm_f"]["g"], ran["ln_f"]["g"])


def test_like_is_not_changed_and_missing_leafs_are_copies(saved):
    path, _, model = saved
    like = O.setup(O.Adam(), new := grown(model))
    before = [leaf.state[0].copy() for _, leaf in leaves(like)]
    back, _ = O.load(path, like, strict=False)
    assert back["h"][2]["mlp"]["fc"].state[0] is not like["h"][2]["mlp"]["fc"].state[0]
    O.update_(back, new, grads(new, 0))
    assert all(np.array_equal(b, leaf.state[0])
               for b, (_, leaf) in zip(before, leaves(like)))


def test_a_shape_that_changed_is_reported_and_keeps_the_fresh_state(saved):
    path, tree, model = saved
    back, report = O.load(path, O.setup(O.Adam(), gpt(2, vocab=13)), strict=False)
    assert list(report.mismatched) == ["wte"] and "shape (11, 4)" in report.mismatched["wte"]
    assert back["wte"].clock == 0 and back["wte"] is back["lm_head"]
    assert back["h"][1]["attn"]["qkv"].clock == 3


@pytest.mark.parametrize("rule", [O.AdamW(0.02, lambd=0.1), O.NAdam(), O.RAdam()],
                         ids=lambda r: type(r).__name__)
def test_adam_loads_into_the_rules_of_the_same_state(saved, rule):
    path, tree, model = saved
    back, report = O.load(path, O.setup(rule, model), strict=False)
    assert not (report.missing or report.unexpected or report.mismatched)
    leaf = back["h"][0]["mlp"]["fc"]
    assert leaf.rule == rule and leaf.clock == 3  # the new rule, the old state and clock
    assert equal_states(leaf.state, tree["h"][0]["mlp"]["fc"].state)
    O.update_(back, model, grads(model, 3))


def test_a_chain_loads_into_the_same_chain_of_a_compatible_rule(tmp_path):
    model = {"w": np.ones(3)}
    tree, model = train(O.setup(O.OptimiserChain(O.ClipGrad(), O.Adam()), model), model, [0])
    O.save(path := tmp_path / "c.ckpt", tree)
    back, _ = O.load(path, O.setup(O.OptimiserChain(O.ClipGrad(), O.AdamW()), model),
                     strict=False)
    assert equal_states(back["w"].state, tree["w"].state)


@pytest.mark.parametrize("rule", [O.Lion(), O.AdaBelief(), O.AMSGrad(),
                                  O.OptimiserChain(O.ClipGrad(), O.Adam())],
                         ids=lambda r: type(r).__name__)
def test_a_rule_of_another_state_is_refused_naming_the_path(saved, rule):
    path, tree, model = saved
    match = r"rule saved at KeyPath\('wte'\) is Adam, like's is \w+.*pass migrate="
    with pytest.raises(ValueError, match=match):
        O.load(path, O.setup(rule, model), strict=False)
    with pytest.raises(ValueError, match=match):
        O.load_state_dict(O.setup(rule, model), O.state_dict(tree), strict=False)


@pytest.mark.parametrize("via", ["load", "load_state_dict"])
def test_migrate_converts_a_state(saved, via):
    path, tree, model = saved
    calls = []

    def momentum(path, old_rule, old_state, new_rule, new_state):
        calls.append((path, old_rule, new_rule))
        return old_state[0]  # Adam's m as Lion's momentum

    like = O.setup(O.Lion(), model)
    back, report = O.load(path, like, strict=False, migrate=momentum) if via == "load" else (
        O.load_state_dict(like, O.state_dict(tree), strict=False, migrate=momentum))
    assert len(report.matched) == len(calls) == len(paths_of(tree)) - 1  # the tie once
    assert calls[0] == ("wte", O.Adam(0.01), O.Lion())
    proj = back["h"][1]["attn"]["proj"]
    assert np.array_equal(proj.state, tree["h"][1]["attn"]["proj"].state[0])
    assert back["wte"].rule == O.Lion() and back["wte"].clock == 3
    O.update_(back, model, grads(model, 3))


def test_a_migrated_state_holds_no_array_of_the_state_dict(saved):
    path, tree, model = saved
    back, _ = O.load_state_dict(O.setup(O.Lion(), model), O.state_dict(tree), strict=False,
                                migrate=lambda path, old_rule, old_state, *new: old_state[0])
    before = tree["wte"].state[0].copy()
    O.update_(back, model, grads(model, 3))
    assert np.array_equal(tree["wte"].state[0], before)


def test_what_migrate_returns_is_checked_and_what_it_raises_passes(saved):
    path, _, model = saved
    with pytest.raises(ValueError, match="migrate returned a state at KeyPath.'wte'. that is "
                                         "not like the fresh state of Lion"):
        O.load(path, O.setup(O.Lion(), model), strict=False, migrate=lambda *a: a[2])

    def fails(*args):
        raise KeyError("no conversion")

    with pytest.raises(KeyError, match="no conversion"):
        O.load(path, O.setup(O.Lion(), model), strict=False, migrate=fails)
    with pytest.raises(KeyError, match="no conversion"):
        O.load_state_dict(O.setup(O.Lion(), model), O.state_dict(O.load(path, O.setup(
            O.Adam(), model))), strict=False, migrate=fails)


def test_renames_by_function_and_dropping(saved):
    path, _, model = saved
    new = grown(model)
    back, report = O.load(path, O.setup(O.Adam(), new), strict=False,
                          renames=lambda p: None if p == "wpe" else p.replace("ln_f", "norm_f"))
    assert report.unexpected == () and back["norm_f"]["g"].clock == 3
    _, report = O.load(path, O.setup(O.Adam(), new), strict=False,
                       renames={"h.1": None, "ln_f": "norm_f"})  # dropped: not unexpected
    assert report.unexpected == ("wpe",) and len(report.missing) == 8
    with pytest.raises(ValueError, match="renames maps both 'h.0.attn.qkv' and 'h.1.attn.qkv' to "
                                         "'h.0.attn.qkv'"):
        O.load(path, O.setup(O.Adam(), new), strict=False, renames={"h.1": "h.0"})


def test_renames_by_glob(saved):
    path, tree, model = saved
    new = {"wte": model["wte"], "blocks": model["h"], "norm_f": model["ln_f"],
           "lm_head": model["wte"], "wpe": model["wpe"]}
    for renames in ({"h.*": "blocks.*", "ln_*": "norm_*"}, {"h": "blocks", "*.g": "norm_f.g",
                                                            "*.b": "norm_f.b"}):
        back, report = O.load(path, O.setup(O.Adam(), new), strict=False, renames=renames)
        assert report.missing == report.unexpected == () and report.mismatched == {}
        assert equal_states(back["blocks"][1]["mlp"]["fc"].state, tree["h"][1]["mlp"]["fc"].state)
        assert back["norm_f"]["g"].clock == tree["ln_f"]["g"].clock > 0
    with pytest.raises(ValueError, match="each '.' of the new path takes what a '.' of the old"):
        O.load(path, O.setup(O.Adam(), new), strict=False, renames={"h": "blocks.*"})
    with pytest.raises(TypeError, match="renames= maps dotted paths to dotted paths"):
        O.load_state_dict(O.setup(O.Adam(), new), {}, strict=False, renames={("h",): "blocks"})


def test_strict_stays_the_default(saved):
    path, tree, model = saved
    with pytest.raises(ValueError, match="does not match like"):
        O.load(path, O.setup(O.Adam(), grown(model)))
    with pytest.raises(ValueError, match="does not match like at KeyPath.'wte'.: the file has "
                                         "the rule Adam, like has AdamW"):
        O.load(path, O.setup(O.AdamW(), model))
    with pytest.raises(ValueError, match="keys that the tree lacks|has no"):
        O.load_state_dict(O.setup(O.Adam(), grown(model)), O.state_dict(tree))
    with pytest.raises(TypeError, match="pass strict=False"):
        O.load(path, O.setup(O.Adam(), model), renames={"a": "b"})
    with pytest.raises(TypeError, match="pass strict=False"):
        O.load_state_dict(O.setup(O.Adam(), model), O.state_dict(tree), migrate=print)
    with pytest.raises(TypeError, match="renames= takes a dict"):
        O.load(path, O.setup(O.Adam(), model), strict=False, renames=["ln_f", "norm_f"])
    with pytest.raises(ValueError, match="renames.'wte'. gave KeyPath"):
        O.load(path, O.setup(O.Adam(), model), strict=False, renames=lambda p: O.KeyPath(p))
    assert O.load(path, O.setup(O.Adam(), model))["wte"].clock == 3


def test_a_torch_module_that_grew_resumes(tmp_path):
    torch = pytest.importorskip("torch")
    nn = torch.nn

    def net(blocks, norm):
        torch.manual_seed(0)
        return nn.ModuleDict({"h": nn.ModuleList(nn.Linear(4, 4) for _ in range(blocks)),
                              norm: nn.LayerNorm(4)})

    old = net(2, "ln_f")
    tree = O.setup(O.Adam(0.01), old)
    for p in old.parameters():
        p.grad = torch.ones_like(p)
    O.update_(tree, old)
    O.save(path := tmp_path / "t.ckpt", tree)
    new = net(3, "norm")
    back, report = O.load(path, O.setup(O.Adam(), new), strict=False, renames={"ln_f": "norm"})
    assert report.missing == ("h.2.weight", "h.2.bias") and report.unexpected == ()
    assert torch.equal(back["norm"]["weight"].state[0], tree["ln_f"]["weight"].state[0])
    for p in new.parameters():
        p.grad = torch.ones_like(p)
    O.update_(back, new)
    assert back["h"]["0"]["weight"].clock == 2 and back["h"]["2"]["weight"].clock == 1
