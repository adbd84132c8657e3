"""PyTorch's fused paths give the same tensors as the plain path, for every rule and chain."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import optimisers as O  # noqa: E402
from conftest import rules_param, run_fused, spy_runs  # noqa: E402
from optimisers import backends  # noqa: E402
from optimisers.backends import packs  # noqa: E402
from optimisers.fast import fused, torchadam  # noqa: E402

tb = backends.ops("torch")


@pytest.fixture(autouse=True)
def flat_path(request, monkeypatch):
    """The tests here that do not ask for ``native`` check the rule's own ``apply`` over a
    group's flat buffers (bit for bit): torch.optim's Adam is kept out of them."""
    if "native" not in request.fixturenames:
        monkeypatch.setattr(torchadam, "native", lambda *a: None)


@pytest.fixture
def native():
    """torch.optim's functional Adam steps the groups whose formula it computes."""


def make_model(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)

    tied = randn(3, 2)
    return {
        "layers": [{"w": randn(4, 3), "b": randn(3)} for _ in range(4)],
        "tied_a": tied, "tied_b": tied,
        "scalar": randn(), "frozen": randn(5),
        "wide": randn(2, 2, 2),
    }


def grads_for(model, step, g):
    grads = O.fmap(lambda x: torch.randn(x.shape, generator=g, dtype=torch.float64).to(
        x.dtype) if O.isnumeric(x) else None, model, cache=False)
    if step % 3 == 1:
        grads["layers"][1] = None  # no gradient for one layer in some steps
    return grads


def run(rule, steps, inplace, fuse, monkeypatch, dtype=torch.float32, adjust_at=None):
    g = torch.Generator().manual_seed(1)

    def before(tree, step):
        if step == adjust_at:
            O.adjust_(tree, beta=(0.8, 0.99))

    return run_fused(rule, make_model(dtype), lambda m, step: grads_for(m, step, g),
                     steps, inplace, fuse, monkeypatch, before)


def assert_same(a, b, exact=True):
    la, lb = O.fleaves(a), O.fleaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape
            if exact:
                assert torch.equal(x, y), (x, y)
            else:
                eps = torch.finfo(x.dtype).eps
                torch.testing.assert_close(x, y, rtol=8 * eps, atol=eps)
        else:
            assert x == y


@pytest.fixture(params=["concatenated", "chunked"])
def path(request, monkeypatch):
    """Which fused path a group of CPU tensors takes: the rule once over the group's
    concatenation, or piece by piece over each tensor in place (for large tensors; here
    pieces of 2 elements make every tensor large). Yields the list of groups that were
    stepped piece by piece."""
    chunked = []
    if request.param == "chunked":
        monkeypatch.setattr(fused, "CHUNK", 2)
        real = tb.flat

        def flat(x, g, arrays):
            out = real(x, g, arrays)
            chunked.append(out is not None)
            return out

        monkeypatch.setattr(tb, "flat", flat)
    return request.param, chunked


@rules_param()
@pytest.mark.parametrize("inplace", [True, False], ids=["update_", "update"])
def test_fused_equals_plain(rule, inplace, monkeypatch, path):
    tree_f, model_f = run(rule, 7, inplace, True, monkeypatch)
    tree_p, model_p = run(rule, 7, inplace, False, monkeypatch)
    exact = True  # the rule's own operations, over the group's buffers
    if path[0] == "chunked" and inplace and O.fast.fused.fusible(rule)[0]:
        assert any(path[1])  # the piece-by-piece path really ran
    assert_same(model_f, model_p, exact)
    assert model_f["tied_a"] is model_f["tied_b"]
    assert torch.equal(model_f["frozen"], make_model()["frozen"])
    for (_kp, lf), (_, lp) in zip(O.state.leaves(tree_f), O.state.leaves(tree_p)):
        assert_same(lf.state, lp.state, exact)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64,
                                   torch.complex64], ids=str)
@rules_param([O.Adam(0.1), O.OptimiserChain(O.WeightDecay(0.1), O.Momentum(0.1)),
              O.AdamW(0.1, lambd=0.1), O.Lion(0.1)])
def test_fused_equals_plain_in_other_dtypes(rule, dtype, monkeypatch, path):
    _, model_f = run(rule, 4, True, True, monkeypatch, dtype)
    _, model_p = run(rule, 4, True, False, monkeypatch, dtype)
    # complex: torch's own sgn and division round differently in their vectorised body
    # and their scalar tail, so even the plain path depends on where an element sits
    assert_same(model_f, model_p, exact=not dtype.is_complex)


@rules_param([O.Adam(0.05), O.AdamW(0.05, lambd=0.1), O.AdamW(0.05, lambd=0.01, couple=False)])
def test_fused_follows_adjusted_betas(rule, monkeypatch):
    """Bias corrections ``1 - b^t`` with betas changed mid-run: the fused
    group steps as the plain path does, bit for bit."""
    tree_f, model_f = run(rule, 8, True, True, monkeypatch, adjust_at=3)
    tree_p, model_p = run(rule, 8, True, False, monkeypatch, adjust_at=3)
    assert_same(model_f, model_p)
    for (_kp, lf), (_, lp) in zip(O.state.leaves(tree_f), O.state.leaves(tree_p)):
        assert_same(lf.state, lp.state)


def test_non_contiguous_parameters_take_the_concatenating_path(monkeypatch):
    def once(fuse):
        with monkeypatch.context() as m:
            if not fuse:
                m.setattr(fused, "MIN_GROUP", 10**9)
            g = torch.Generator().manual_seed(4)
            model = [torch.randn(3, 4, generator=g).t(), torch.randn(5, generator=g)]
            grads = [torch.randn(3, 4, generator=g).t(), torch.randn(5, generator=g)]
            tree = O.setup(O.Adam(0.1), model)
            for _ in range(3):
                tree, model = O.update_(tree, model, grads)
            return tree, model

    (_, model_f), (_, model_p) = once(True), once(False)
    assert_same(model_f, model_p)  # bit for bit: our own formula, concatenated
    assert not model_f[0].is_contiguous()


def test_non_contiguous_gradients_in_a_group(monkeypatch):
    out = []
    for fuse in (True, False):
        with monkeypatch.context() as m:
            if not fuse:
                m.setattr(fused, "MIN_GROUP", 10**9)
            model = [torch.ones(3, 4), torch.ones(5)]
            tree = O.setup(O.Adam(0.1), model)
            g = torch.arange(12.0).reshape(4, 3)
            for _ in range(3):
                tree, model = O.update_(tree, model, [g.t(), torch.ones(5)])
            out.append(model)
    assert_same(out[0], out[1])


@pytest.mark.parametrize("rule", [O.Adam(), O.Momentum(), O.OptimiserChain(O.ClipGrad(),
                                                                          O.Nesterov())],
                         ids=repr)
def test_fused_path_is_taken_and_groups_are_reused(rule, monkeypatch):
    runs = spy_runs(monkeypatch)
    model = {f"p{i}": torch.ones(8) for i in range(50)}
    tree = O.setup(rule, model)
    g = {k: torch.ones(8) for k in model}
    for _ in range(3):
        tree, model = O.update_(tree, model, g)
    assert [n for _, n in runs] == [50, 50, 50]
    assert runs[1][0] == runs[2][0]  # the group found in step 2 is kept for step 3


def test_lamb_directed_group_is_reused_and_remade_when_a_parameter_moves():
    """A ``Directed`` group (LAMB) found in one step is kept for the next: what it checks
    of the memory is its parameters' (not its zeros'); ``p.data = ...`` makes it anew,
    and the steps stay the plain path's."""
    model = [torch.ones(8) * (i + 1) for i in range(4)]
    plain = [p.clone() for p in model]
    tree, tree_p = O.setup(O.LAMB(0.1), model), O.setup(O.LAMB(0.1), plain)
    found = []
    for step in range(4):
        if step == 3:
            model[1].data, plain[1].data = model[1].data.clone(), plain[1].data.clone()
        g = [torch.full((8,), 0.5 + step) for _ in model]
        O.update_(tree, model, g)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fused, "MIN_GROUP", 10**9)
            O.update_(tree_p, plain, g)
        (group,) = O.state.plan_of(tree).groups
        found.append(group)
    assert isinstance(found[0], fused.Directed)
    assert found[1] is found[2] and found[3] is not found[2]
    for a, b in zip(model, plain):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_module_with_grad_is_fused(monkeypatch):
    runs = spy_runs(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(10)))
    plain = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(10)))
    plain.load_state_dict(model.state_dict())
    tree, tree_p = O.setup(O.Adam(0.01), model), O.setup(O.Adam(0.01), plain)
    x = torch.randn(3, 4)
    for _ in range(3):
        for m in (model, plain):
            m.zero_grad()
            m(x).square().sum().backward()
        O.update_(tree, model)
        with monkeypatch.context() as mp:
            mp.setattr(fused, "MIN_GROUP", 10**9)
            O.update_(tree_p, plain)
    assert [n for _, n in runs] == [20, 20, 20]  # weights and biases: one group
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-7)
        assert a.is_leaf and a.requires_grad


def test_setup_packs_state_contiguously():
    model = [torch.ones(3), torch.ones(2, 2), torch.ones(1, dtype=torch.float64)]
    tree = O.setup(O.Adam(), model)
    (m0, v0, _), (m1, _, _) = tree[0].state, tree[1].state
    assert m0._base is not None and m0._base is m1._base
    flat, isview = tb.joined((m0, m1))
    assert isview and flat._base is m0._base and flat.numel() == 7
    assert flat.data_ptr() == m0.data_ptr() and m1.data_ptr() == m0.data_ptr() + 12
    places = {m0.data_ptr() % 4096, v0.data_ptr() % 4096}  # apart in a 4 KiB page
    assert len(places) == 2 and places <= set(packs.SLOTS)
    assert not tb.joined((m1, m0))[1]  # not in the buffer's order: a concatenation
    assert tree[2].state[0]._base is None  # alone in its dtype: not packed
    new_tree, _ = O.update(tree, model, [torch.ones_like(x) for x in model])
    n0, n1 = new_tree[0].state[0], new_tree[1].state[0]
    assert n0._base is n1._base and n0._base is not m0._base  # a pure update keeps it
    assert torch.equal(m0, torch.zeros(3))  # and leaves the old state alone


def test_state_replaced_by_hand_is_respected():
    model = {f"p{i}": torch.ones(4, dtype=torch.float64) for i in range(3)}
    tree = O.setup(O.Momentum(0.1, 0.5), model)
    g = {k: torch.ones(4, dtype=torch.float64) for k in model}
    tree, model = O.update_(tree, model, g)
    tree, model = O.update_(tree, model, g)  # the group is now known
    tree["p1"].state = torch.full((4,), 10.0, dtype=torch.float64)  # not a packed view
    tree, model = O.update_(tree, model, g)
    torch.testing.assert_close(tree["p1"].state, torch.full((4,), 5.1, dtype=torch.float64))
    torch.testing.assert_close(tree["p0"].state, torch.full((4,), 0.175, dtype=torch.float64))
    torch.testing.assert_close(model["p1"], torch.full((4,), 1 - 0.1 - 0.15 - 5.1,
                                                       dtype=torch.float64))


def test_packed_buffers_are_freed():
    import gc
    import weakref

    gc.collect()
    before = len(tb._PACKS._records)
    model = [torch.ones(3), torch.ones(2)]
    tree = O.setup(O.Adam(), model)
    buf = weakref.ref(tree[0].state[0]._base)
    assert len(tb._PACKS._records) == before + 2  # m and v
    del tree
    gc.collect()
    assert buf() is None and len(tb._PACKS._records) == before


def test_many_small_tensors_of_random_sizes(monkeypatch):
    def once(fuse, rule):
        with monkeypatch.context() as m:
            if not fuse:
                m.setattr(fused, "MIN_GROUP", 10**9)
            g = torch.Generator().manual_seed(5)
            model = [torch.randn(int(torch.randint(1, 20, (1,), generator=g)), generator=g)
                     for _ in range(150)]
            tree = O.setup(rule, model)
            for _ in range(4):
                tree, model = O.update_(tree, model, [torch.randn(x.shape, generator=g)
                                                      for x in model])
            return model

    for rule in (O.Nesterov(0.1), O.OptimiserChain(O.ClipGrad(0.5), O.SignDecay(0.1),
                                                   O.RMSProp(0.1))):
        assert_same(once(True, rule), once(False, rule))
    assert_same(once(True, O.Adam(0.1)), once(False, O.Adam(0.1)))


def test_numpy_and_torch_agree_through_fused_paths():
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(6)]
    gs = [[rng.normal(size=(5, 3)).astype(np.float32) for _ in xs] for _ in range(5)]
    mn, mt = [x.copy() for x in xs], [torch.tensor(x) for x in xs]
    tn, tt = O.setup(O.Nesterov(0.1), mn), O.setup(O.Nesterov(0.1), mt)
    for g in gs:
        tn, mn = O.update_(tn, mn, g)
        tt, mt = O.update_(tt, mt, [torch.tensor(a) for a in g])
    for a, b in zip(mn, mt):
        np.testing.assert_allclose(b.numpy(), a, rtol=1e-6, atol=1e-7)


# --- Adam and AdamW through torch.optim's functional Adam (fast/torchadam.py) -------------

NATIVE_RULES = [
    O.Adam(0.01), O.AdamW(0.01, lambd=0.1), O.AdamW(0.02), O.AdamW(0.01, couple=False),
    O.Adam(O.Cosine(0.02, 0.001, 5), beta=(0.8, 0.99)),
    O.OptimiserChain(O.ClipGlobalNorm(1.0), O.AdamW(0.01, lambd=0.1)),
    O.OptimiserChain(O.ClipGlobalNorm(100.0), O.Adam(O.Linear(0.01, 0.001, 6))),
]


def stepped(rule, steps, dtype=torch.float32, use_native=True, seed=3, module=False):
    """``steps`` of ``update_`` on a list of tensors (or an ``nn.Module`` reading ``.grad``)
    with fresh gradients; ``use_native=False`` keeps torch.optim out (the rule's own
    ``apply`` over the group's flat buffers)."""
    with pytest.MonkeyPatch.context() as mp:
        if not use_native:
            mp.setattr(torchadam, "native", lambda *a: None)
        g = torch.Generator().manual_seed(seed)
        shapes = [(6, 5), (5,), (3, 2, 2), (7,)]
        if module:
            torch.manual_seed(seed)
            model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Linear(6, 3)).to(dtype)
        else:
            model = [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
        tree = O.setup(rule, model)
        for _ in range(steps):
            params = list(model.parameters()) if module else model
            gs = [torch.randn(p.shape, generator=g, dtype=dtype) * 3 for p in params]
            if module:
                for p, gr in zip(params, gs):
                    p.grad = gr
                O.update_(tree, model)
            else:
                O.update_(tree, model, gs)
        return tree, [p.detach() for p in (model.parameters() if module else model)]


def assert_close_states(ta, tb_):
    for (_, la), (_, lb) in zip(O.state.leaves(ta), O.state.leaves(tb_), strict=True):
        sa, sb = O.fleaves(la.state), O.fleaves(lb.state)
        for a, b in zip(sa, sb, strict=True):
            if isinstance(a, torch.Tensor):
                # (a moment near 0 by cancellation: rounding relative to its scale)
                scale = float(b.abs().max())
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * scale)
            else:
                assert a == b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("rule", NATIVE_RULES, ids=repr)
def test_native_adam_equals_the_plain_path_to_rounding(rule, dtype, native):
    tree_n, xs_n = stepped(rule, 6, dtype)
    tree_p, xs_p = stepped(rule, 6, dtype, use_native=False)
    (group,) = O.state.plan_of(tree_n).groups
    assert isinstance(group.native, torchadam.Native)
    assert O.state.plan_of(tree_p).groups[0].native is None
    for a, b in zip(xs_n, xs_p, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert_close_states(tree_n, tree_p)
    leaf = next(iter(O.state.leaves(tree_n)))[1]
    count = leaf.state[1][2] if isinstance(rule, O.OptimiserChain) else leaf.state[2]
    assert type(count) is float and count == 6.0  # the state is Adam.init's, a float count


def test_native_adam_on_a_module_reading_grad(native):
    rule = O.OptimiserChain(O.ClipGlobalNorm(1.0), O.AdamW(0.01, lambd=0.1))
    tree_n, xs_n = stepped(rule, 4, module=True)
    _, xs_p = stepped(rule, 4, module=True, use_native=False)
    assert O.state.plan_of(tree_n).groups[0].native is not None
    for a, b in zip(xs_n, xs_p, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_clip_keeps_the_norm_on_the_device_and_the_gradients_unchanged(native):
    xs = [torch.ones(4), torch.ones(3)]
    tree = O.setup(O.OptimiserChain(O.ClipGlobalNorm(1.0), O.AdamW(0.1, lambd=0.1)), xs)
    gs = [torch.full((4,), 3.0), torch.full((3,), 4.0)]
    for _ in range(2):
        O.update_(tree, xs, gs)
    assert torch.equal(gs[0], torch.full((4,), 3.0)) and torch.equal(gs[1], torch.full((3,), 4.0))
    factor = O.state.plan_of(tree).groups[0].now.rules[0].factor
    assert isinstance(factor, torch.Tensor)  # no float(): no wait for the device
    torch.testing.assert_close(factor, torch.tensor(84 ** -0.5))  # 1 / the norm


def test_unclipped_steps_equal_the_plain_path_and_keep_the_gradients(native):
    rule = O.OptimiserChain(O.ClipGlobalNorm(1e6), O.AdamW(0.01, lambd=0.1))  # never clips
    tree_n, xs_n = stepped(rule, 4)
    tree_p, xs_p = stepped(rule, 4, use_native=False)
    assert O.state.plan_of(tree_n).groups[0].native is not None
    for a, b in zip(xs_n, xs_p, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert_close_states(tree_n, tree_p)
    xs = [torch.ones(4), torch.ones(3)]
    gs = [torch.full((4,), 3.0), torch.full((3,), 4.0)]
    tree = O.setup(rule, xs)
    O.update_(tree, xs, gs)
    assert torch.equal(gs[0], torch.full((4,), 3.0)) and torch.equal(gs[1], torch.full((3,), 4.0))


@pytest.mark.parametrize("rule", [
    O.AdamW(0.01, lambd=0.1, couple=False),  # eta*a + lambd*x: not torch's formula
    O.AMSGrad(0.01), O.NAdam(0.01), O.RAdam(0.01),
    O.OptimiserChain(O.ClipGlobalNorm(1.0, 1.0), O.Adam(0.01)),  # another norm
    O.OptimiserChain(O.ClipGrad(1.0), O.Adam(0.01)),
], ids=repr)
def test_other_formulas_stay_on_the_plain_path(rule, native):
    tree_n, xs_n = stepped(rule, 3)
    tree_p, xs_p = stepped(rule, 3, use_native=False)
    assert all(g.native is None for g in O.state.plan_of(tree_n).groups)
    for a, b in zip(xs_n, xs_p, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.complex64], ids=str)
def test_other_dtypes_stay_on_the_plain_path(dtype, native):
    xs = [torch.ones(3, dtype=dtype), torch.ones(2, dtype=dtype)]
    tree = O.setup(O.Adam(0.1), xs)
    O.update_(tree, xs, [torch.ones_like(x) for x in xs])
    assert O.state.plan_of(tree).groups[0].native is None


@pytest.mark.parametrize("rule", NATIVE_RULES[1::2], ids=repr)
def test_native_adam_resumes_bit_for_bit(rule, native, tmp_path):
    """Saved after 3 steps, loaded, 3 more: the same bits as 6 steps without a stop."""
    _, whole = stepped(rule, 6)
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(s, generator=g) for s in [(6, 5), (5,), (3, 2, 2), (7,)]]
    tree = O.setup(rule, xs)
    for step in range(6):
        if step == 3:
            O.save(tmp_path / "t.zip", tree)
            tree = O.load(tmp_path / "t.zip", like=O.setup(rule, xs))
        O.update_(tree, xs, [torch.randn(x.shape, generator=g) * 3 for x in xs])
    for a, b in zip(xs, whole, strict=True):
        assert torch.equal(a, b)


def test_native_group_is_remade_after_the_state_is_edited(native):
    xs = [torch.ones(3), torch.ones(2)]
    tree = O.setup(O.Adam(0.1), xs)
    gs = [torch.ones(3), torch.ones(2)]
    O.update_(tree, xs, gs)
    O.update_(tree, xs, gs)
    first = O.state.plan_of(tree).groups[0]
    m, v, _ = tree[0].state
    tree[0].state = (m, v, 0.0)  # the count set back by hand
    tree[1].state = (tree[1].state[0], tree[1].state[1], 0.0)
    O.update_(tree, xs, gs)
    now = O.state.plan_of(tree).groups[0]
    assert now is not first and now.native is not None and tree[0].state[2] == 1.0


@pytest.mark.parametrize("rule", [O.Adam(0.01), O.OptimiserChain(O.ClipGlobalNorm(1.0),
                                                                  O.AdamW(0.01, lambd=0.1))],
                         ids=repr)
@pytest.mark.parametrize("shapes", [[(5,)] * 70, [(2, 3), (4,)] * 40], ids=["vectors", "mixed"])
def test_many_small_tensors_step_over_flat_buffers(rule, shapes, native):
    def run(use_native):
        with pytest.MonkeyPatch.context() as mp:
            if not use_native:
                mp.setattr(torchadam, "native", lambda *a: None)
            g = torch.Generator().manual_seed(7)
            xs = [torch.randn(s, generator=g) for s in shapes]
            tree = O.setup(rule, xs)
            for _ in range(4):
                O.update_(tree, xs, [torch.randn(s, generator=g) for s in shapes])
            return tree, xs

    (tree_n, xs_n), (tree_p, xs_p) = run(True), run(False)
    assert O.state.plan_of(tree_n).groups[0].native.flat is not None
    for a, b in zip(xs_n, xs_p, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert_close_states(tree_n, tree_p)


def test_module_parameters_read_at_once_notice_a_replaced_parameter(native):
    """The steady-state plan reads a module's parameters in one call: a parameter
    replaced, or its name taken by a buffer's place, is noticed as before."""
    m = torch.nn.Module()
    m.a, m.b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    tree = O.setup(O.Adam(0.1), m)
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    O.update_(tree, m)
    O.update_(tree, m)
    old = m.b
    m.b = torch.nn.Parameter(torch.zeros(2))
    m.b.grad = torch.ones(2)
    O.update_(tree, m)
    assert torch.equal(old.detach(), torch.full((2,), 0.8)) and float(m.b.detach()[0]) < 0
    del m.b
    m.register_buffer("b", torch.zeros(2))  # a buffer: never trained, as on the slow path
    a = m.a.detach().clone()
    O.update_(tree, m)
    assert torch.equal(m.b, torch.zeros(2)) and float(m.a.detach()[0]) < float(a[0])


@pytest.mark.parametrize("rule", NATIVE_RULES[:1] + NATIVE_RULES[-2:], ids=repr)
@pytest.mark.parametrize("where", ["gradient", "parameter"])
def test_native_adam_with_a_transposed_tensor_equals_the_plain_path(rule, where, native):
    """torch's kernel walks memory in order: a transposed gradient is laid out as its
    parameter first, and a transposed parameter keeps the rule's own apply."""
    def run(use_native):
        with pytest.MonkeyPatch.context() as mp:
            if not use_native:
                mp.setattr(torchadam, "native", lambda *a: None)
            g = torch.Generator().manual_seed(1)
            xs = [torch.randn(6, 5, generator=g).t() if where == "parameter" else
                  torch.randn(5, 6, generator=g), torch.randn(4, generator=g)]
            tree = O.setup(rule, xs)
            for _ in range(3):
                O.update_(tree, xs, [torch.randn(6, 5, generator=g).t(),
                                     torch.randn(4, generator=g)])
            return xs, O.state.plan_of(tree).groups[0].native

    (xs_n, nat), (xs_p, _) = run(True), run(False)
    assert (nat is None) == (where == "parameter")
    for a, b in zip(xs_n, xs_p, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
