"""Moving a run from torch.optim and back (``optimisers.backends.torchoptim``): a few steps
of torch.optim, then the same next steps with ``update_`` from :func:`from_torch`, and
with torch.optim again from :func:`to_torch`, two param groups of their own rates and
decays each; the refusals name the option or rule."""

from __future__ import annotations

import copy

import pytest

import optimisers as O

torch = pytest.importorskip("torch")
from optimisers.backends.torchoptim import from_torch, to_torch  # noqa: E402

optim = torch.optim
CASES = [
    (optim.Adam, {"lr": 0.01}, {"lr": 0.03, "weight_decay": 0.1}),
    (optim.AdamW, {"lr": 0.01}, {"lr": 0.02, "betas": (0.8, 0.99), "weight_decay": 0.2}),
    (optim.SGD, {"lr": 0.05, "momentum": 0.9}, {"lr": 0.02, "weight_decay": 0.1}),
    (optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True},
     {"lr": 0.1, "momentum": 0.5, "weight_decay": 0.01}),
    (optim.Adagrad, {"lr": 0.1}, {"lr": 0.05, "eps": 1e-6, "weight_decay": 0.1}),
    (optim.RMSprop, {"lr": 0.01}, {"lr": 0.005, "centered": True, "momentum": 0.9,
                                   "weight_decay": 0.1}),
]
IDS = [f"{k.__name__}-{'-'.join(f'{n}={v}' for n, v in b.items())}" for k, a, b in CASES]


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _backward(net, i):
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g)
    net.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()


def _torch_steps(net, opt, steps, start=0):
    for i in range(start, start + steps):
        _backward(net, i)
        opt.step()


def _our_steps(tree, net, steps, start=0):
    for i in range(start, start + steps):
        _backward(net, i)
        tree, net = O.update_(tree, net)
    return tree


def _close(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("kind, first, second", CASES, ids=IDS)
def test_the_next_steps_are_torchs_after_from_torch_and_after_to_torch(kind, first, second):
    net = _net()
    opt = kind([{"params": net[0].parameters(), **first},
                {"params": net[2].parameters(), **second}])
    _torch_steps(net, opt, 3)
    ours, theirs = copy.deepcopy((net, opt))
    tree = from_torch(theirs, ours)
    clocks = {leaf.clock for leaf in O.select(tree)}
    assert clocks == {0 if kind is optim.SGD else 3}  # (SGD keeps no count)
    assert tree["0"]["weight"].rule != tree["2"]["weight"].rule
    before = copy.deepcopy(theirs.state_dict()["state"])
    _torch_steps(net, opt, 4, 3)
    tree = _our_steps(tree, ours, 4, 3)
    _close(net, ours)
    after = theirs.state_dict()["state"]  # copied, not shared: torch's left as it was
    assert all(torch.equal(v, after[i][k]) for i in before for k, v in before[i].items()
               if v is not None)

    twin, twin_tree = copy.deepcopy((ours, tree))
    back = to_torch(tree, ours)
    assert type(back) is kind
    assert [g["lr"] for g in back.param_groups] == [first["lr"], second["lr"]]
    _torch_steps(ours, back, 4, 7)
    _our_steps(twin_tree, twin, 4, 7)
    _close(ours, twin)


@pytest.mark.parametrize("rule", [O.Momentum(0.05, 0.9), O.Nesterov(0.05, 0.8)], ids=repr)
def test_to_torch_converts_a_velocity_that_holds_the_rate(rule):
    net = _net()
    tree = _our_steps(O.setup(rule, net), net, 3)
    twin, twin_tree = copy.deepcopy((net, tree))
    opt = to_torch(tree, net)
    assert opt.param_groups[0]["nesterov"] is isinstance(rule, O.Nesterov)
    _torch_steps(net, opt, 4, 3)
    _our_steps(twin_tree, twin, 4, 3)
    _close(net, twin)


def test_a_parameter_in_no_group_is_left_untrained():
    net = _net()
    tree = from_torch(optim.Adam(net[0].parameters()), net)
    assert tree["2"]["weight"] is None and tree["0"]["weight"].state[2] == 0.0


def test_a_parameter_frozen_after_the_optimiser_was_made_is_left_out():
    net = _net()
    opt = optim.Adam(net.parameters(), lr=0.01)
    net[0].bias.requires_grad_(False)  # torch.optim skips it from now on
    tree = from_torch(opt, net)
    assert tree["0"]["bias"] is None and tree["0"]["weight"].rule == O.Adam(0.01)


@pytest.mark.parametrize("kind, option", [
    (optim.Adam, {"amsgrad": True}), (optim.AdamW, {"maximize": True}),
    (optim.SGD, {"dampening": 0.1, "momentum": 0.9}), (optim.Adagrad, {"lr_decay": 0.01})],
    ids=lambda v: getattr(v, "__name__", None) or next(iter(v)))
def test_an_option_of_another_formula_is_refused_by_name(kind, option):
    net = _net()
    with pytest.raises(ValueError, match=f"{kind.__name__}'s {next(iter(option))}="):
        from_torch(kind(net.parameters(), lr=0.1, **option), net)


def test_another_class_or_model_is_refused():
    net = _net()
    with pytest.raises(TypeError, match="got NAdam"):
        from_torch(optim.NAdam(net.parameters()), net)
    with pytest.raises(ValueError, match="2 tensors of the optimiser's param groups"):
        from_torch(optim.SGD([*_net()[2].parameters(), net[0].bias], 0.1), net)


@pytest.mark.parametrize("rules, match", [
    (O.Lion(), "no torch.optim class computes Lion"),
    (O.OptimiserChain(O.WeightDecay(0.1), O.AdamW(lambd=0.1)), "no torch.optim class"),
    (O.AdamW(couple=False), "no torch.optim class"),
    ({"0.*": O.Adam(), "*": O.Descent()}, r"classes \['Adam', 'SGD'\]"),
    (O.Adam(O.Cosine(0.1, steps=10)), "scheduled"),
], ids=["Lion", "decay-twice", "uncoupled", "two-classes", "schedule"])
def test_to_torch_refuses_what_torch_cannot_compute(rules, match):
    net = _net()
    with pytest.raises(ValueError, match=match):
        to_torch(O.setup(rules, net), net)
    tree = O.freeze_(O.setup(O.Adam(), net), "2")
    with pytest.raises(ValueError, match=r"KeyPath\('2', 'weight'\) is frozen"):
        to_torch(tree, net)
