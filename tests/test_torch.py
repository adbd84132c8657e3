"""PyTorch models: nn.Module as a node, .grad reading, and agreement with torch.optim."""

from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import optimisers as O  # noqa: E402
from conftest import ALL_RULES, fitting, normal, rules_param  # noqa: E402
from optimisers import backends  # noqa: E402
from optimisers.fast import fused  # noqa: E402


def make_model(seed: int = 0) -> nn.Sequential:
    """A small network with BatchNorm (buffers) and a tied weight (layers 3 and 5)."""
    torch.manual_seed(seed)
    tied_a, tied_b = nn.Linear(8, 8), nn.Linear(8, 8)
    tied_b.weight = tied_a.weight
    return nn.Sequential(nn.Linear(4, 8, bias=False), nn.BatchNorm1d(8), nn.Tanh(), tied_a,
                         nn.Tanh(), tied_b, nn.Tanh(), nn.Linear(8, 2))


def backward(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g)
    for p in model.parameters():
        p.grad = None
    ((model(x) - y) ** 2).mean().backward()


def grads_of(model: nn.Module) -> dict:
    """The gradient tree a user builds from named_parameters (a tied parameter once)."""
    out: dict = {}
    for name, p in model.named_parameters():
        *path, last = name.split(".")
        node = out
        for k in path:
            node = node.setdefault(k, {})
        node[last] = p.grad
    return out


PEERS = [
    (O.Descent(0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    (O.Momentum(0.05, 0.9), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
    (O.Nesterov(0.05, 0.9),
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True)),
    (O.Adam(0.01), lambda ps: torch.optim.Adam(ps, lr=0.01)),
    (O.Adam(0.01, (0.8, 0.99), 1e-6),
     lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6)),
    (O.AdamW(0.01, lambd=0.1), lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1)),
    (O.RMSProp(0.01, 0.9), lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.9)),
    (O.RMSProp(0.01, 0.9, centred=True),
     lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.9, centered=True)),
    (O.Rprop(0.01), lambda ps: torch.optim.Rprop(ps, lr=0.01)),
]


@pytest.mark.parametrize("rule, peer", PEERS, ids=[repr(r) for r, _ in PEERS])
def test_agrees_with_torch_optim(rule, peer):
    ours, theirs = make_model(), make_model()
    opt = peer(theirs.parameters())
    tree = O.setup(rule, ours)
    for step in range(20):
        backward(ours, step)
        backward(theirs, step)
        tree, same = O.update_(tree, ours)
        assert same is ours
        opt.step()
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters(),
                                 strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert ours[3].weight is ours[5].weight


def test_buffers_untouched_and_not_in_tree():
    model = make_model()
    tree = O.setup(O.Adam(0.1), model)
    assert tree["1"]["running_mean"] is None and tree["1"]["num_batches_tracked"] is None
    assert isinstance(tree["1"]["weight"], O.Leaf)
    backward(model, 0)
    before = {k: v.clone() for k, v in model.named_buffers()}
    ids = {k: id(v) for k, v in model.named_buffers()}
    O.update_(tree, model)
    O.update(tree, model, grads_of(model))
    for k, v in model.named_buffers():
        assert id(v) == ids[k]
        assert torch.equal(v, before[k]), k


def test_requires_grad_false_is_not_trained():
    model = nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    tree = O.setup(O.Descent(), model)
    assert tree["bias"] is None and isinstance(tree["weight"], O.Leaf)


def test_update_reads_grad_and_skips_none():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    tree = O.setup(O.Momentum(0.1), model)
    w0, w1 = model[0].weight.detach().clone(), model[1].weight.detach().clone()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    tree, model = O.update_(tree, model)
    torch.testing.assert_close(model[0].weight, w0 - 0.1)
    assert torch.equal(model[1].weight, w1)  # no .grad: untouched
    assert not tree["1"]["weight"].state.any()  # and its state too
    assert model[0].weight.requires_grad and model[0].weight.grad is not None


def test_update_under_no_grad_keeps_params_leaves():
    model = nn.Linear(3, 2)
    tree = O.setup(O.AdamW(0.1, lambd=0.1), model)
    model(torch.ones(1, 3)).sum().backward()
    O.update_(tree, model)
    assert model.weight.is_leaf and model.weight.grad_fn is None
    assert all(s.grad_fn is None and not s.requires_grad
               for s in tree["weight"].state[:2])
    model(torch.ones(1, 3)).sum().backward()  # still trainable


def test_tied_gradient_counted_once():
    """autograd sums a tied weight's gradient already: it must not be summed again."""
    model = make_model()
    w = model[3].weight
    tree = O.setup(O.Descent(1.0), model)
    assert tree["3"]["weight"] is tree["5"]["weight"]
    backward(model, 0)
    expected = w.detach() - w.grad
    O.update_(tree, model)
    torch.testing.assert_close(model[3].weight.detach(), expected)
    assert model[5].weight is w


def test_tied_gradient_counted_once_on_every_step():
    """From the second step update_ reads .grad through its cached plan: the tie must
    still be counted once, a parameter without .grad skipped, and a new .grad seen."""
    model = make_model()
    w = model[3].weight
    tree = O.setup(O.Descent(1.0), model)
    for step in range(4):
        backward(model, step)
        if step == 2:
            model[0].weight.grad = None
        w0, expected = model[0].weight.detach().clone(), w.detach() - w.grad
        O.update_(tree, model)
        torch.testing.assert_close(model[3].weight.detach(), expected)
        if step == 2:
            assert torch.equal(model[0].weight, w0)
        model.zero_grad()


def test_cached_plan_still_needs_grads_for_other_models():
    model = [np.ones(2)]
    tree = O.setup(O.Descent(0.1), model)
    O.update_(tree, model, [np.ones(2)])
    O.update_(tree, model, [np.ones(2)])  # now through the cached plan
    with pytest.raises(TypeError, match="needs the gradients"):
        O.update_(tree, model)


def test_tied_submodule_counted_once():
    lin = nn.Linear(3, 3)
    model = nn.Sequential(lin, nn.Tanh(), lin)
    tree = O.setup(O.Descent(1.0), model)
    assert tree["0"] is tree["2"]
    model(torch.ones(2, 3)).sum().backward()
    expected = lin.weight.detach() - lin.weight.grad
    O.update_(tree, model)
    torch.testing.assert_close(lin.weight.detach(), expected)


def test_module_grads_mirrors_children():
    model = make_model()
    backward(model, 0)
    g = backends.ops("torch").module_grads(model)
    assert g["3"]["weight"] is model[3].weight.grad
    assert g["5"]["weight"] is None  # the tie's second path
    assert g["5"]["bias"] is model[5].bias.grad
    assert g["1"]["running_mean"] is None and g["2"] is None  # Tanh: no children


def test_pure_update_returns_new_module_old_untouched():
    model = make_model()
    tree = O.setup(O.Adam(0.1), model)
    backward(model, 0)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    objects = {k: v for k, v in model.named_parameters()}
    states = {id(leaf): copy.deepcopy(leaf.state) for _, leaf in O.state.leaves(tree)}
    new_tree, new = O.update(tree, model, grads_of(model))
    assert new is not model and new[3] is not model[3] and type(new) is nn.Sequential
    for k, v in model.named_parameters():
        assert v is objects[k] and torch.equal(v, params[k]), k
    for _, leaf in O.state.leaves(tree):
        assert all(torch.equal(a, b) for a, b in zip(leaf.state[:2], states[id(leaf)][:2]))
    for (k, a), (_, b) in zip(new.named_parameters(), model.named_parameters(), strict=True):
        assert isinstance(a, nn.Parameter) and a.requires_grad
        assert not torch.equal(a, b), k
    assert new[3].weight is new[5].weight  # the tie survives
    assert new[1].running_mean is model[1].running_mean  # unchanged parts shared
    backward(new, 1)  # the new module trains
    assert new[0].weight.grad is not None and model[0].weight.grad is not None


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "plain"])
@pytest.mark.parametrize("rule", [O.Adam(0.1), O.Descent(0.1),
                                  O.MixedPrecision(O.Adam(0.1), torch.float64)], ids=repr)
def test_pure_update_keeps_requires_grad(rule, fuse, monkeypatch):
    """update of leaf tensors that require grad returns leaf tensors that do, so the next
    backward() reaches them; a Parameter stays one; a tensor that did not, does not."""
    if not fuse:
        monkeypatch.setattr(fused, "MIN_GROUP", 10**9)
    torch.manual_seed(0)
    model = {"w": torch.randn(3, 2, requires_grad=True), "b": torch.zeros(2, requires_grad=True),
             "p": nn.Parameter(torch.ones(2)), "fixed": torch.ones(2)}
    tree = O.setup(rule, model)
    for _ in range(2):
        loss = ((torch.ones(4, 3) @ model["w"] + model["b"]) * model["p"] * model["fixed"]).sum()
        grads = dict(zip(model, torch.autograd.grad(loss, list(model.values())[:3])))
        tree, model = O.update(tree, model, grads)
        assert [type(v) for v in model.values()] == [torch.Tensor, torch.Tensor, nn.Parameter,
                                                      torch.Tensor]
        assert [v.requires_grad for v in model.values()] == [True, True, True, False]
        assert all(v.is_leaf for v in model.values())


def test_rebuild_module_does_not_mutate():
    lin = nn.Linear(2, 2)
    w = lin.weight
    new = O.rebuild(lin, {"weight": torch.zeros(2, 2)})
    assert lin.weight is w and isinstance(new.weight, nn.Parameter)
    assert new.weight.requires_grad and not new.weight.any()
    assert O.children(new).keys() == O.children(lin).keys()
    new.register_forward_hook(lambda *a: None)
    assert not lin._forward_hooks


def test_fmap_over_module_keeps_ties_and_parameters():
    model = make_model()
    new = O.fmap(lambda a: a.detach() * 0 if O.isnumeric(a) else a, model)
    assert new is not model and new[3].weight is new[5].weight
    assert isinstance(new[3].weight, nn.Parameter) and new[3].weight.requires_grad
    assert not isinstance(new[1].running_mean, nn.Parameter)
    assert not new[0].weight.any() and model[0].weight.any()


def test_rebuild_keeps_autograd_graph():
    lin = nn.Linear(2, 1)
    v = torch.ones(1, 2, requires_grad=True)
    new = O.rebuild(lin, {"weight": v * 3})  # differentiable: not cut into a Parameter
    new(torch.ones(1, 2)).sum().backward()
    assert torch.equal(v.grad, torch.full((1, 2), 3.0))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rule", [O.Adam(0.01), O.Momentum(0.01), O.RMSProp(0.01),
                                  O.MixedPrecision(O.Adam(0.01), np.float32)], ids=repr)
def test_low_precision_keeps_dtype(dtype, rule):
    dt = getattr(torch, dtype)
    model = nn.Linear(4, 3).to(dt)
    tree = O.setup(rule, model)
    w0 = model.weight.detach().clone()
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        tree, model = O.update_(tree, model)
        assert model.weight.dtype == dt and model.bias.dtype == dt
    assert (model.weight < w0).all()
    if isinstance(rule, O.MixedPrecision):
        assert tree["weight"].state[0].dtype == torch.float32
    _, new = O.update(tree, model, {"weight": torch.ones(3, 4, dtype=torch.float32)})
    assert new.weight.dtype == dt


@rules_param(ALL_RULES)
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_every_rule_matches_numpy(rule, dtype):
    """Complex too: every rule treats a complex parameter alike in every library."""
    rng = np.random.default_rng(0)
    w = normal(rng, (3, 4), dtype)
    gs = [normal(rng, (3, 4), dtype) for _ in range(5)]
    mn, mt = {"w": w.copy()}, {"w": torch.tensor(w)}
    tn, tt = O.setup(fitting(rule), mn), O.setup(fitting(rule), mt)
    for g in gs:
        tn, mn = O.update_(tn, mn, {"w": g})
        tt, mt = O.update_(tt, mt, {"w": torch.tensor(g)})
    np.testing.assert_allclose(mt["w"].numpy(), mn["w"], rtol=1e-5, atol=2e-5)


def test_numpy_gradients_for_torch_params():
    model = [torch.ones(2)]
    tree = O.setup(O.Descent(0.5), model)
    tree, model = O.update_(tree, model, [np.array([1.0, 2.0])])
    assert torch.equal(model[0], torch.tensor([0.5, 0.0]))


def test_plain_tensors_requiring_grad_read_grad():
    w = torch.ones(3, requires_grad=True)
    (w * torch.arange(3.0)).sum().backward()
    tree = O.setup(O.Descent(1.0), {"w": w})
    O.update_(tree, {"w": w})
    assert torch.equal(w.detach(), torch.tensor([1.0, 0.0, -1.0]))


def test_a_parameter_resized_through_data_is_refused_after_steady_steps():
    m = torch.nn.Linear(3, 2)
    tree = O.setup(O.Adam(1e-3), m)
    for _ in range(2):  # (the second step reads .grad through the steady-state plan)
        m.weight.grad, m.bias.grad = torch.ones(2, 3), torch.ones(2)
        O.update_(tree, m)
    m.weight.data, m.weight.grad = torch.zeros(4, 3), torch.ones(4, 3)
    with pytest.raises(ValueError, match="shape"):
        O.update_(tree, m)


def test_complex_parameters_descend():
    w = torch.zeros(2, dtype=torch.complex64)
    target = torch.tensor([1 + 2j, -1j], dtype=torch.complex64)
    tree = O.setup(O.Adam(0.1), [w])
    for _ in range(100):
        g = w - target  # the Wirtinger gradient of |w - target|^2 / 2
        tree, _ = O.update_(tree, [w], [g])
    assert (w - target).abs().max() < 0.05


def test_clipnorm_throws_on_torch():
    tree = O.setup(O.ClipNorm(1.0), [torch.zeros(2)])
    with pytest.raises(FloatingPointError, match="norm"):
        O.update(tree, [torch.zeros(2)], [torch.tensor([float("inf"), 0.0])])


def test_import_loads_neither_torch_nor_jax():
    code = ("import optimisers, sys; "
            "assert 'torch' not in sys.modules and 'jax' not in sys.modules, "
            "[m for m in sys.modules if m.split('.')[0] in ('torch', 'jax')]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_restructured_tensors_are_private():
    """re(v)'s tensors share memory with neither v nor each other: updating one in place
    (as update_ does) changes nothing else. A tied weight comes back as one tensor."""
    model = make_model()
    flat, re = O.destructure(model)
    v = flat.detach().clone()
    new = re(v)
    assert new[3].weight is new[5].weight
    before = {k: p.detach().clone() for k, p in new.named_parameters()}
    with torch.no_grad():
        new[0].weight.add_(1.0)
    assert torch.equal(v, flat.detach())
    for k, p in new.named_parameters():
        assert torch.equal(p, before[k] + (1.0 if k == "0.weight" else 0.0)), k
    tree = O.setup(O.Descent(0.1), new)
    O.update_(tree, new, {"0": {"weight": torch.ones_like(new[0].weight)}})
    assert torch.equal(v, flat.detach())


def test_restructure_complex_vector_into_real_parameters():
    """A complex vector (one parameter is complex) gives real parameters contiguous and
    real-valued, as they were."""
    model = {"a": torch.ones(3, dtype=torch.complex64), "b": torch.arange(4.0).reshape(2, 2)}
    flat, re = O.destructure(model)
    assert flat.dtype == torch.complex64
    new = re(flat * 2)
    assert new["b"].dtype == torch.float32 and new["b"].is_contiguous()
    assert torch.equal(new["b"], model["b"] * 2)
    assert torch.equal(new["a"], model["a"] * 2)
