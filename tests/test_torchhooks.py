"""The step inside ``backward`` on PyTorch (issue 29, item 5): bit for bit ``update_``'s
steps, each gradient freed as soon as its parameter stepped."""

import sys
from pathlib import Path

import pytest

import optimisers as O

torch = pytest.importorskip("torch")
from optimisers.backends.torchhooks import step_in_backward  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def twins(tied: bool = False) -> tuple:
    torch.manual_seed(0)

    def make():
        inner = torch.nn.Linear(16, 16)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), inner,
                                   torch.nn.Tanh(), inner if tied else torch.nn.Linear(16, 16),
                                   torch.nn.Tanh(), torch.nn.Linear(16, 8))

    a, b = make(), make()
    b.load_state_dict(a.state_dict())
    return a, b


RULES = [O.AdamW(1e-2, lambd=0.1), O.Adam(O.Cosine(1e-2, 1e-3, 10)), O.Lion(1e-3),
         O.OptimiserChain(O.AccumGrad(2), O.Adam(1e-2)), O.LowPrecision(O.Adam(1e-2)),
         O.OptimiserChain(O.ClipNorm(1.0), O.Momentum(1e-2))]


@pytest.mark.parametrize("rule", RULES, ids=repr)
@pytest.mark.parametrize("tied", [False, True])
def test_steps_equal_update_bit_for_bit_and_free_the_gradients(rule, tied):
    """Five backward passes: with the hooks each parameter ends where ``backward`` then
    ``update_`` puts it, bit for bit (a tied weight stepped once, on its summed gradient;
    AccumGrad stepping on every second pass), and no gradient is left."""
    plain, hooked = twins(tied)
    t1, t2 = O.setup(rule, plain), O.setup(rule, hooked)
    hooks = step_in_backward(t2, hooked)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    for _ in range(5):
        plain(x).pow(2).sum().backward()
        O.update_(t1, plain)
        plain.zero_grad(set_to_none=True)
        hooked(x).pow(2).sum().backward()
        for (name, a), b in zip(plain.named_parameters(), hooked.parameters()):
            assert torch.equal(a, b), name
            assert b.grad is None
    assert O.summary(t1) == O.summary(t2)
    hooks.remove()
    hooked(x).sum().backward()
    assert all(p.grad is not None for p in hooked.parameters())


@pytest.mark.parametrize("tree_rule", [O.ClipGlobalNorm(1.0), O.SkipNonFinite()], ids=repr)
def test_a_rule_that_needs_every_gradient_is_refused_naming_it_and_the_path(tree_rule):
    _, net = twins()
    tree = O.setup({"6.*": O.OptimiserChain(tree_rule, O.Adam()), "*": O.Adam()}, net)
    with pytest.raises(ValueError, match=r"cannot step KeyPath\('6', 'weight'\) alone: its "
                                         rf"rule .* holds {type(tree_rule).__name__}"):
        step_in_backward(tree, net)
    assert all(not p._post_accumulate_grad_hooks for p in net.parameters()
               if getattr(p, "_post_accumulate_grad_hooks", None) is not None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_peak_memory_drops_by_about_the_gradients():
    """Six 1024 x 1024 layers (24 MiB of gradients): the peak resident set over three
    steps drops by at least the gradients less the largest one (20 MiB) and a margin."""
    import backward_memory

    found = backward_memory.main(6, 1024)
    assert found["drop (MiB)"] >= 0.7 * found["gradients (MiB)"], found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_setup_holds_at_most_one_state_slot_twice():
    """AdamW's state on six 1024 x 1024 layers is 48 MiB (two slots of 24): laying the
    slots out in one buffer each, ``setup`` raises the peak by the state and at most one
    slot more (72 MiB; it was 96, every slot held twice), with a margin."""
    import backward_memory

    assert backward_memory.setup_peak(6, 1024) <= 48 + 24 + 8
