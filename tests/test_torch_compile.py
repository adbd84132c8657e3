"""torch.compile and the other module wrappers: transparent as nodes, and a compiled
training step that calls update_."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
# torch's own DDP and inductor modules call a deprecated torch.jit API on import
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
nn = torch.nn

import optimisers as O  # noqa: E402
from optimisers import backends  # noqa: E402
from test_torch import backward  # noqa: E402


def make_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2))


def structure(tree):
    """Each path of the tree with its Leaf's state as text: equal trees, equal lists."""
    return [(str(kp), repr(leaf)) for kp, leaf in O.state.leaves(tree)]


def plain_grads(model: nn.Module) -> dict:
    """A gradient tree keyed by the plain module's child names."""
    return {k: {n: p.grad for n, p in m.named_parameters()} for k, m in model.named_children()
            if any(True for _ in m.parameters())}


def test_compiled_module_has_the_plain_modules_tree(tmp_path):
    plain = make_model()
    compiled = torch.compile(plain)
    assert list(O.children(compiled)) == ["0", "1", "2", "3"]
    assert O.trainable(compiled) == O.trainable(plain)
    tree, ref = O.setup(O.Adam(), compiled), O.setup(O.Adam(), plain)
    assert structure(tree) == structure(ref)
    assert tree["0"]["weight"].state[0].shape == (8, 4)
    assert len(O.select(tree, "0.*")) == len(O.select(ref, "0.*")) == 2
    O.freeze_(tree, where="3.*")
    assert tree["3"]["bias"].frozen and not tree["0"]["bias"].frozen
    O.save(tmp_path / "c.ckpt", tree)  # a checkpoint of one loads as the other's
    back = O.load(tmp_path / "c.ckpt", like=O.setup(O.Adam(), plain))
    assert structure(back) == structure(tree)


@pytest.mark.parametrize("made_from", ["plain", "compiled"])
def test_trees_move_between_plain_and_compiled_modules(made_from):
    """A tree made from either steps the other, with gradients given or read from .grad:
    the same numbers as the plain module alone."""
    ref, ours = make_model(), make_model()
    compiled = torch.compile(ours)
    rule = O.AdamW(0.01, lambd=0.1)
    tref = O.setup(rule, ref)
    tree = O.setup(rule, ours if made_from == "plain" else compiled)
    for step in range(4):
        backward(ref, step)
        backward(ours, step)
        tref, _ = O.update_(tref, ref)
        model = compiled if made_from == "plain" else ours
        grads = plain_grads(ours) if step % 2 else None
        tree, same = O.update_(tree, model, grads) if grads else O.update_(tree, model)
        assert same is model
    for (name, a), (_, b) in zip(ref.named_parameters(), ours.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_compiled_module_steps_by_the_cached_plan(monkeypatch):
    """After the first step, update_ of a compiled module walks nothing again: the plan
    learned from the first step reads the wrapped module's children directly."""
    from optimisers import state

    walks = []
    gather = state.gather
    monkeypatch.setattr(state, "gather", lambda *a: walks.append(1) or gather(*a))
    plain = make_model()
    compiled = torch.compile(plain)
    tree = O.setup(O.Adam(), compiled)
    for p in plain.parameters():
        p.grad = torch.ones_like(p)
    for _ in range(4):
        O.update_(tree, compiled)
    assert len(walks) == 1


@pytest.mark.parametrize("wrap", ["compiled", "plain"])
def test_flat_gradient_dicts_of_wrapped_names(wrap):
    """{name: p.grad for name, p in m.named_parameters()}: of the compiled module (names
    begin with '_orig_mod.') or of the plain one, both for the compiled module."""
    ref, ours = make_model(), make_model()
    compiled = torch.compile(ours)
    tref, tree = O.setup(O.AdamW(0.01, lambd=0.1), ref), O.setup(O.AdamW(0.01, lambd=0.1),
                                                                  compiled)
    named = compiled if wrap == "compiled" else ours
    assert next(iter(dict(named.named_parameters()))).startswith(
        "_orig_mod." if wrap == "compiled" else "0.")
    for step in range(3):
        backward(ref, step)
        backward(ours, step)
        tref, _ = O.update_(tref, ref)
        tree, _ = O.update_(tree, compiled, {k: p.grad for k, p in named.named_parameters()})
    for a, b in zip(ref.parameters(), ours.parameters(), strict=True):
        assert torch.equal(a, b)


def test_pure_update_of_a_compiled_module_returns_a_compiled_module():
    plain = make_model()
    compiled = torch.compile(plain)
    before = {k: v.detach().clone() for k, v in plain.named_parameters()}
    tree = O.setup(O.Descent(0.5), compiled)
    backward(plain, 0)
    _, new = O.update(tree, compiled, plain_grads(plain))
    assert type(new) is type(compiled) and new is not compiled
    inner = backends.ops("torch").unwrapped(new)
    assert inner is not plain and type(inner) is nn.Sequential
    for k, v in plain.named_parameters():  # the old module untouched
        assert torch.equal(v, before[k]), k
    torch.testing.assert_close(inner[0].weight, before["0.weight"] - 0.5 * plain[0].weight.grad)
    assert isinstance(inner[0].weight, nn.Parameter) and inner[0].weight.requires_grad
    assert new.dynamo_ctx is compiled.dynamo_ctx  # compiled as the old one was


def test_data_parallel_is_transparent():
    plain = make_model()
    wrapped = nn.DataParallel(plain)
    assert list(O.children(wrapped)) == list(O.children(plain))
    tree = O.setup(O.Descent(0.1), wrapped)
    assert structure(tree) == structure(O.setup(O.Descent(0.1), plain))
    backward(plain, 0)
    _, new = O.update(tree, wrapped, plain_grads(plain))
    assert type(new) is nn.DataParallel and new.module is not plain
    assert not torch.equal(new.module[0].weight, plain[0].weight)


def test_distributed_data_parallel_is_transparent(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}",
                            rank=0, world_size=1)
    try:
        ref, ours = make_model(), make_model()
        ddp = nn.parallel.DistributedDataParallel(ours)
        assert list(O.children(ddp)) == ["0", "1", "2", "3"]
        tree, tref = O.setup(O.Adam(0.01), ddp), O.setup(O.Adam(0.01), ref)
        assert structure(tree) == structure(tref)
        for step in range(3):
            backward(ddp, step)  # through the wrapper: its reducer fills .grad
            backward(ref, step)
            tree, same = O.update_(tree, ddp)
            tref, _ = O.update_(tref, ref)
            assert same is ddp
        for a, b in zip(ref.parameters(), ours.parameters(), strict=True):
            torch.testing.assert_close(a, b)
        backward(ddp, 3)  # and with its parameters' names, which begin with 'module.'
        backward(ref, 3)
        O.update_(tree, ddp, {k: p.grad for k, p in ddp.named_parameters()})
        O.update_(tref, ref, {k: p.grad for k, p in ref.named_parameters()})
        for a, b in zip(ref.parameters(), ours.parameters(), strict=True):
            torch.testing.assert_close(a, b)
        with pytest.raises(TypeError, match="DistributedDataParallel.*update_"):
            O.update(tree, ddp, plain_grads(ours))
    finally:
        dist.destroy_process_group()


def _step(model, tree, x, y):
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    O.update_(tree, model)
    for p in model.parameters():
        p.grad = None
    return loss.detach()


def test_compiled_training_step_calling_update_():
    """A step compiled by the default inductor backend runs update_ as Python between its
    graphs: the same numbers as eager, and no recompiling as Adam's bias corrections move."""
    from torch._dynamo.testing import CompileCounterWithBackend

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
    eager, ours = (nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)) for _ in "ab")
    ours.load_state_dict(eager.state_dict())
    teager, tours = O.setup(O.Adam(0.01), eager), O.setup(O.Adam(0.01), ours)
    counter = CompileCounterWithBackend("inductor")
    step = torch.compile(_step, backend=counter)
    frames = []
    for _ in range(4):
        torch.testing.assert_close(step(ours, tours, x, y), _step(eager, teager, x, y))
        frames.append(counter.frame_count)
    assert frames[-1] == frames[1]  # compiled once (the graphs before and after update_)
    for a, b in zip(eager.parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(a, b)  # compiled forward and backward: to rounding
    torch._dynamo.reset()
