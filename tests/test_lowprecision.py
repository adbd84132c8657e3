"""LowPrecision: a rule's array state stored in a narrower dtype, its arithmetic the rule's
own in the parameter's dtype, rounded on store (issue 29, item 1)."""

import copy

import ml_dtypes
import numpy as np
import pytest

import optimisers as O

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy

LIBS = ["numpy", "torch", "jax"]
NARROW = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def to(lib: str, a: np.ndarray):
    """``a`` as ``lib``'s array (bfloat16 and float16 kept)."""
    if lib == "numpy":
        return a.copy()
    if lib == "torch":
        if a.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(a.copy())
    return jnp.asarray(a)


def host(a) -> np.ndarray:
    """A library's array as NumPy, in its own dtype (bfloat16 through ml_dtypes)."""
    if isinstance(a, torch.Tensor):
        if a.dtype == torch.bfloat16:
            return a.float().numpy().astype(ml_dtypes.bfloat16)
        return a.detach().numpy().copy()
    return np.asarray(a)


def arrays_of(state) -> list:
    return [a for a in (state if isinstance(state, tuple) else (state,))
            if hasattr(a, "shape") and len(a.shape)]


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("inner", [O.Adam(0.01), O.AdamW(0.01, lambd=0.1), O.Lion(0.01)],
                         ids=repr)
def test_each_step_is_the_rules_own_on_the_state_read_back_then_rounded(lib, dtype, inner):
    """Three steps: each equals the wrapped rule's ``apply`` on the stored state read
    back in float32, bit for bit, and the new state is that rule's rounded to ``dtype``
    (to nearest): nothing else runs between the rule and the stored state."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    rule = O.LowPrecision(inner, dtype)
    state = rule.init(to(lib, x))
    n = len(arrays_of(inner.init(to(lib, x))))
    assert [host(a).dtype for a in arrays_of(state)] == [np.dtype(NARROW[dtype])] * n

    def widened(a):
        return to(lib, host(a).astype(np.float32)) if hasattr(a, "shape") and len(
            a.shape) else a

    for _ in range(3):
        g = rng.standard_normal(x.shape).astype(np.float32)
        wide = tuple(map(widened, state)) if isinstance(state, tuple) else widened(state)
        want_state, want_d = inner.apply(wide, to(lib, x), to(lib, g))
        state, d = rule.apply(state, to(lib, x), to(lib, g))
        np.testing.assert_array_equal(host(d), host(want_d))
        for got, want in zip(arrays_of(state), arrays_of(want_state)):
            assert host(got).dtype == np.dtype(NARROW[dtype])
            np.testing.assert_array_equal(host(got), host(want).astype(NARROW[dtype]))
        x = x - host(d)


@pytest.mark.parametrize("lib", LIBS)
def test_bytes_of_state_per_parameter(lib):
    """Adam's state, measured from the arrays a tree holds: 8 bytes a parameter in
    float32, 4 in bfloat16, 6 with the first moment alone narrow."""
    model = {"w": to(lib, np.ones((64, 32), np.float32)), "b": to(lib, np.ones(32, np.float32))}

    def per_param(rule) -> float:
        tree = O.setup(rule, model)
        states = [a for leaf in (tree["w"], tree["b"]) for a in arrays_of(leaf.state)]
        return sum(host(a).nbytes for a in states) / (64 * 32 + 32)

    assert per_param(O.Adam()) == 8.0
    assert per_param(O.LowPrecision(O.Adam())) == 4.0
    assert per_param(O.LowPrecision(O.Adam(), ("bfloat16", None))) == 6.0


@pytest.mark.parametrize("lib", LIBS)
def test_trains_as_float32_state_within_bfloat16_rounding(lib):
    """300 steps of a least-squares fit: at every step, the loss with bfloat16 state is
    within 2% (of the way down) of the loss with float32 state."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 8)).astype(np.float32)
    y = (a @ rng.standard_normal(8) + 0.1 * rng.standard_normal(64)).astype(np.float32)

    def fit(rule) -> np.ndarray:
        w = np.zeros(8, np.float32)
        tree = O.setup(rule, {"w": to(lib, w)})
        model, losses = {"w": to(lib, w)}, []
        for _ in range(300):
            r = a @ host(model["w"]).astype(np.float32) - y
            losses.append(float(r @ r / 64))
            tree, model = O.update(tree, model, {"w": to(lib, (a.T @ r / 64).astype(np.float32))})
        return np.array(losses)

    full, low = fit(O.Adam(0.05)), fit(O.LowPrecision(O.Adam(0.05)))
    assert full[-1] < 0.01 * full[0]
    assert np.abs(low - full).max() <= 0.02 * (full[0] - full[-1])


def test_where_adjust_freeze_save_load_and_state_dict(tmp_path):
    """bfloat16 state for one subset only (a ``where=`` mapping); ``adjust`` reaches the
    wrapped rule's numbers and may change the stored dtype; a frozen Leaf keeps its state;
    ``save``/``load`` and ``state_dict`` keep the stored dtype and the steps go on the same."""
    rng = np.random.default_rng(2)
    model = {"emb": rng.standard_normal((10, 4)).astype(np.float32),
             "out": rng.standard_normal(4).astype(np.float32)}
    tree = O.setup({"emb": O.LowPrecision(O.Adam(0.01)), "*": O.Adam(0.01)}, model)
    assert [a.dtype for a in arrays_of(tree["emb"].state)] == [ml_dtypes.bfloat16] * 2
    assert [a.dtype for a in arrays_of(tree["out"].state)] == [np.float32] * 2
    grads = {k: np.ones_like(v) for k, v in model.items()}
    tree, model = O.update_(tree, model, grads)
    tree = O.adjust(tree, eta=0.5)
    assert tree["emb"].rule == O.LowPrecision(O.Adam(0.5))
    before = host(model["emb"]).copy()
    tree, model = O.update_(tree, model, grads)
    assert np.abs(model["emb"] - before).max() > 0.4  # the new eta stepped it
    O.save(tmp_path / "ckpt", tree)
    back = O.load(tmp_path / "ckpt", tree)
    assert [a.dtype for a in arrays_of(back["emb"].state)] == [ml_dtypes.bfloat16] * 2
    assert back["emb"].rule == tree["emb"].rule
    flat = O.state_dict(tree)
    assert {str(v.dtype) for k, v in flat.items()
            if k.startswith("emb") and getattr(v, "ndim", 0)} == {"bfloat16"}
    m2 = copy.deepcopy(model)
    t1, m1 = O.update_(tree, model, grads)
    t2, m2 = O.update_(back, m2, grads)
    np.testing.assert_array_equal(m1["emb"], m2["emb"])
    O.freeze_(t1["emb"])
    kept = [host(a).copy() for a in arrays_of(t1["emb"].state)]
    t1, m1 = O.update_(t1, m1, grads)
    for a, b in zip(arrays_of(t1["emb"].state), kept):
        np.testing.assert_array_equal(host(a), b)
    t1 = O.adjust(O.thaw_(t1) or t1, dtype="float16")
    t1, m1 = O.update_(t1, m1, grads)
    assert [a.dtype for a in arrays_of(t1["emb"].state)] == [np.float16] * 2


def test_under_jit_equals_numpy_and_keeps_the_dtype():
    """Jitted and donated on JAX, the stored state stays bfloat16 and the parameters follow
    NumPy's eager steps (ml_dtypes' bfloat16) to float32 rounding."""
    rng = np.random.default_rng(3)
    model = {"a": rng.standard_normal((8, 3)).astype(np.float32),
             "b": rng.standard_normal(3).astype(np.float32)}
    rule = O.OptimiserChain(O.ClipGlobalNorm(1.0), O.LowPrecision(O.AdamW(0.01, lambd=0.1)))
    tn, mn = O.setup(rule, copy.deepcopy(model)), copy.deepcopy(model)
    mj = jax.tree.map(jnp.asarray, model)
    tj = O.setup(rule, mj)
    step = jax.jit(O.update, donate_argnums=(0, 1))
    for s in range(4):
        g = {k: np.sin(v * (s + 1)).astype(np.float32) for k, v in model.items()}
        tn, mn = O.update_(tn, mn, g)
        tj, mj = step(tj, mj, jax.tree.map(jnp.asarray, g))
    for k in model:
        np.testing.assert_allclose(np.asarray(mj[k]), mn[k], rtol=1e-5, atol=1e-6)
        stored = {a.dtype for a in jax.tree.leaves(tj[k].state) if a.ndim}
        assert stored == {np.dtype(ml_dtypes.bfloat16)}


def test_refuses_what_is_not_a_floating_dtype():
    for bad in ("int8", (), (None, 3), None):
        with pytest.raises(TypeError, match="LowPrecision's dtype must be a floating dtype"):
            O.LowPrecision(O.Adam(), bad)
    assert repr(O.LowPrecision(O.Adam(), (np.float16, None))) == (
        "LowPrecision(rule=Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-08), "
        "dtype=('float16', None))")


# --- stochastic rounding of bfloat16 parameters (issue 29, item 3) ---------------------------

def bf16(lib: str, a: np.ndarray):
    if lib == "numpy":
        return a.astype(ml_dtypes.bfloat16)
    return torch.from_numpy(a).to(torch.bfloat16) if lib == "torch" else jnp.asarray(
        a, jnp.bfloat16)


def as_f32(a) -> np.ndarray:
    return a.float().numpy() if isinstance(a, torch.Tensor) else np.asarray(a, np.float32)


@pytest.mark.parametrize("lib", LIBS)
def test_stochastic_rounding_is_unbiased(lib):
    """Values 0.3 of the way between bfloat16 neighbours: each rounds to one of its two
    neighbours, and over 40 steps the mean of the rounded values is the values' mean (to 4
    standard errors), where rounding to nearest is off by over 100 of them."""
    from optimisers import backends
    xp = backends.ops(lib)
    rng = np.random.default_rng(4)
    x = (1 + (rng.integers(0, 128, 5000) + 0.3) * 2.0**-7).astype(np.float32)
    arr = {"numpy": x, "torch": torch.from_numpy(x), "jax": jnp.asarray(x)}[lib]
    down = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    outs = np.stack([as_f32(xp.stochastic_bfloat16(arr, t)) for t in range(40)])
    assert np.all((outs == down) | (outs == down + 2.0**-7))
    spacing = 2.0**-7 / 2  # (the standard deviation of one rounding is at most half of it)
    error = spacing / np.sqrt(outs.size)
    assert abs(outs.mean() - x.mean()) < 4 * error
    nearest = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert abs(nearest.mean() - x.mean()) > 100 * error


@pytest.mark.parametrize("lib", LIBS)
def test_a_bfloat16_run_with_stochastic_rounding_tracks_float32(lib):
    """Steps of 1e-4 on bfloat16 weights at 1.0 (spacing 2^-7): rounded to nearest they
    never move; with ``StochasticRounding`` and no master copy they follow the float32 run
    (under jit on JAX)."""
    def run(rule, dtype=None):
        w = np.ones(4000, np.float32)
        model = {"w": bf16(lib, w) if dtype is None else to(lib, w)}
        tree = O.setup(rule, model)
        step = jax.jit(O.update) if lib == "jax" else O.update
        for _ in range(300):
            g = np.ones(4000, np.float32)
            tree, model = step(tree, model, {"w": bf16(lib, g) if dtype is None else to(lib, g)})
        return as_f32(model["w"]).mean()

    full = run(O.Descent(1e-4), np.float32)
    assert run(O.Descent(1e-4)) == 1.0  # stalled
    assert abs(run(O.StochasticRounding(O.Descent(1e-4))) - full) < 1e-3
    assert abs(full - 0.97) < 1e-5


def test_stochastic_rounding_resumes_bit_for_bit(tmp_path):
    """The generator is seeded by the step count kept in the state: a run saved and loaded
    half-way ends where the run without the break ends."""
    rule = O.StochasticRounding(O.LowPrecision(O.AdamW(1e-3, lambd=0.1)))
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    grads = [rng.standard_normal((16, 8)).astype(np.float32) for _ in range(6)]
    model = {"w": bf16("torch", w)}
    tree = O.setup(rule, model)
    other = {"w": model["w"].clone()}
    for i, g in enumerate(grads):
        tree, model = O.update_(tree, model, {"w": bf16("torch", g)})
        if i == 2:
            O.save(tmp_path / "half", tree)
            torch.save(model["w"], tmp_path / "w.pt")
    back = O.load(tmp_path / "half", O.setup(rule, other))
    other = {"w": torch.load(tmp_path / "w.pt")}
    for g in grads[3:]:
        back, other = O.update_(back, other, {"w": bf16("torch", g)})
    assert torch.equal(model["w"], other["w"])
    assert tree["w"].state[0] == 6 and back["w"].state[0] == 6


def test_stochastic_rounding_refuses_a_parameter_that_is_not_bfloat16():
    with pytest.raises(ValueError, match="at w: StochasticRounding rounds to bfloat16; this "
                                         "parameter is float32"):
        O.setup(O.StochasticRounding(O.Adam()), {"w": np.ones(3, np.float32)})


# --- 8-bit blockwise state (issue 29, item 2) -------------------------------------------------

def test_the_dynamic_code_is_sorted_signed_and_reaches_small_values():
    from optimisers.rules.lowprecision import dynamic_code
    code = dynamic_code()
    assert len(code) == 256 and list(code) == sorted(code) and 0.0 in code
    assert code[-1] == 1.0 and code[0] == -1.0
    assert min(abs(v) for v in code if v) < 1e-6  # seven decades


@pytest.mark.parametrize("lib", LIBS)
def test_codes_round_trip_to_the_nearest_code_over_each_blocks_largest(lib):
    """Each element decodes to its block's largest magnitude times the code value nearest
    to its share of it; a block of zeros stays zeros; the padding of the last block is
    cut off again."""
    from optimisers import backends
    from optimisers.rules.lowprecision import dynamic_code
    xp, code = backends.ops(lib), np.array(dynamic_code(), np.float32)
    rng = np.random.default_rng(6)
    a = (rng.standard_normal((37, 11)) * np.logspace(-4, 2, 37)[:, None]).astype(np.float32)
    a[:3] = 0.0
    codes, scale = xp.quantise(to(lib, a), 64, dynamic_code())
    codes, scale = host(codes), host(scale)
    assert codes.dtype == np.uint8 and codes.shape == (7, 64) and scale.shape == (7,)
    flat = np.pad(a.reshape(-1), (0, 7 * 64 - a.size)).reshape(7, 64)
    np.testing.assert_array_equal(scale, np.abs(flat).max(axis=1))
    share = flat / np.where(scale == 0, 1, scale)[:, None]
    nearest = np.abs(code[None, None, :] - share[..., None]).min(axis=-1)
    np.testing.assert_allclose(np.abs(code[codes] - share), nearest, atol=1e-7)
    back = host(xp.dequantise(to(lib, codes) if lib != "torch" else torch.from_numpy(codes),
                              to(lib, scale), dynamic_code(), a.shape, "float32"))
    assert back.shape == a.shape and np.all(back[:3] == 0)
    np.testing.assert_allclose(back, (code[codes] * scale[:, None]).reshape(-1)[:a.size]
                               .reshape(a.shape), rtol=1e-6)


@pytest.mark.parametrize("lib", LIBS)
def test_8bit_state_bytes_and_small_arrays_kept(lib):
    """Adam's state as 8-bit blocks of 256: 2.03 bytes a parameter on a 64 x 128 weight
    (measured from the arrays held); an array under ``min_size`` keeps float32 state."""
    model = {"w": to(lib, np.ones((64, 128), np.float32)), "b": to(lib, np.ones(32, np.float32))}
    tree = O.setup(O.Quantised(O.Adam()), model)
    held = [a for a in jax.tree.leaves(tuple(tree["w"].state)) if hasattr(a, "shape")]
    assert sum(host(a).nbytes for a in held) / (64 * 128) == pytest.approx(2.03125)
    assert [str(host(a).dtype) for a in arrays_of(tree["b"].state)] == ["float32"] * 2


@pytest.mark.parametrize("lib", LIBS)
def test_8bit_state_trains_as_float32_state(lib):
    """A least-squares fit on a 64 x 64 weight (4,096 numbers, one array of 16 blocks), 300
    steps of Adam: with 8-bit state the loss follows float32 state's within 3% of the way
    down at every step, on every library."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((128, 64)).astype(np.float32)
    w_true = rng.standard_normal((64, 64)).astype(np.float32)
    y = a @ w_true + 0.1 * rng.standard_normal((128, 64)).astype(np.float32)

    def fit(rule) -> np.ndarray:
        model, losses = {"w": to(lib, np.zeros((64, 64), np.float32))}, []
        tree = O.setup(rule, model)
        for _ in range(300):
            r = a @ host(model["w"]) - y
            losses.append(float((r * r).mean()))
            tree, model = O.update(tree, model, {"w": to(lib, (a.T @ r / 128).astype(
                np.float32))})
        return np.array(losses)

    full, low = fit(O.Adam(0.05)), fit(O.Quantised(O.Adam(0.05)))
    assert full[-1] < 0.05 * full[0]
    assert np.abs(low - full).max() <= 0.03 * (full[0] - full[-1])


def test_8bit_state_under_jit_saved_and_loaded(tmp_path):
    """Jitted and donated, the state stays uint8 codes and float32 scales, and the steps
    follow NumPy's eager ones; save/load keeps the blocks and the next step is the same."""
    rng = np.random.default_rng(8)
    model = {"w": rng.standard_normal((64, 80)).astype(np.float32)}
    rule = O.Quantised(O.AdamW(0.01, lambd=0.1))
    tn, mn = O.setup(rule, copy.deepcopy(model)), copy.deepcopy(model)
    mj = jax.tree.map(jnp.asarray, model)
    tj = O.setup(rule, mj)
    step = jax.jit(O.update, donate_argnums=(0, 1))
    for s in range(3):
        g = {"w": np.sin(model["w"] * (s + 1)).astype(np.float32)}
        tn, mn = O.update_(tn, mn, g)
        tj, mj = step(tj, mj, {"w": jnp.asarray(g["w"])})
    np.testing.assert_allclose(np.asarray(mj["w"]), mn["w"], rtol=1e-5, atol=1e-6)
    blocks = tj["w"].state[0]
    assert blocks.codes.dtype == jnp.uint8 and blocks.scale.dtype == jnp.float32
    O.save(tmp_path / "q", tn)
    back = O.load(tmp_path / "q", tn)
    assert type(back["w"].state[0]).__name__ == "Blocks"
    g = {"w": np.cos(model["w"]).astype(np.float32)}
    m1, m2 = copy.deepcopy(mn), copy.deepcopy(mn)
    O.update_(tn, m1, g)
    O.update_(back, m2, g)
    np.testing.assert_array_equal(m1["w"], m2["w"])


@pytest.mark.parametrize("lib", LIBS)
def test_a_0d_parameters_narrow_state_saves_and_loads(lib, tmp_path):
    """A 0-d parameter's bfloat16 state (stored as its bits, a dtype NumPy lacks) keeps its
    shape through save/load (it came back 1-d: the property test found it)."""
    model = {"w": to(lib, np.ones((), np.float32))}
    tree = O.setup(O.LowPrecision(O.Adam(0.05)), model)
    tree, model = O.update(tree, model, {"w": to(lib, np.ones((), np.float32))})
    O.save(tmp_path / "c", tree)
    back = O.load(tmp_path / "c", tree)
    for a, b in zip(arrays_of(back["w"].state) or back["w"].state[:2], tree["w"].state[:2]):
        assert tuple(a.shape) == () and host(a) == host(b)


@pytest.mark.parametrize("lib", LIBS)
def test_8bit_state_adjusted_to_another_block(lib):
    """``adjust(tree, block=64)`` keeps the state: the next step reads the 256-blocks back
    (the same step as without the adjust) and stores 64-blocks; a state whose blocks do not
    cover the parameter is still refused, naming the path."""
    x = np.linspace(-1, 1, 300, dtype=np.float32)
    model, g = {"w": to(lib, x)}, {"w": to(lib, np.cos(7 * x))}
    tree = O.setup(O.Quantised(O.Adam(0.1), min_size=1), model)
    tree, model = O.update(tree, model, g)
    adjusted, new = O.update(O.adjust(tree, block=64), model, g)
    assert tuple(adjusted["w"].state[0].codes.shape) == (5, 64)
    np.testing.assert_array_equal(host(new["w"]), host(O.update(tree, model, g)[1]["w"]))
    with pytest.raises(ValueError, match="KeyPath"):
        O.update(adjusted, {"w": to(lib, np.ones(600, np.float32))},
                 {"w": to(lib, np.ones(600, np.float32))})


@pytest.mark.parametrize("first", [O.SkipNonFinite(), O.AccumGrad(2)], ids=repr)
def test_8bit_state_after_a_traced_skip_in_a_chain(first):
    """After a rule that may not step (SkipNonFinite, AccumGrad), a jitted chain keeps the
    Quantised state's Blocks (the old or new state chosen by ``where``): the steps equal
    NumPy's eager ones, a NaN gradient skipped."""
    rule = O.OptimiserChain(first, O.Quantised(O.Adam(0.1), block=16, min_size=1))
    x = np.linspace(-1, 1, 300, dtype=np.float32)
    grads = [np.cos(k * x) for k in range(1, 6)]
    grads[2][3] = np.nan if isinstance(first, O.SkipNonFinite) else grads[2][3]
    tn, mn = O.setup(rule, {"w": x.copy()}), {"w": x.copy()}
    tj, mj = O.setup(rule, {"w": jnp.asarray(x)}), {"w": jnp.asarray(x)}
    step = jax.jit(O.update)
    for g in grads:
        tn, mn = O.update_(tn, mn, {"w": g})
        tj, mj = step(tj, mj, {"w": jnp.asarray(g)})
    assert type(tj["w"].state[1][0]).__name__ == "Blocks"
    np.testing.assert_allclose(np.asarray(mj["w"]), mn["w"], rtol=1e-5, atol=1e-5)


def test_stochastic_rounding_is_refused_inside_a_chain_and_wraps_one():
    """As MixedPrecision, StochasticRounding sets the parameter after the whole step: inside a
    chain a later rule, or a traced skip (SkipNonFinite, AccumGrad under jit), was given its
    new value as a step and failed; the chain refuses it, naming the way that works, which
    steps under jit and skips a NaN gradient."""
    with pytest.raises(ValueError, match=r"StochasticRounding\(OptimiserChain"):
        O.OptimiserChain(O.SkipNonFinite(), O.StochasticRounding(O.Adam()))
    rule = O.StochasticRounding(O.OptimiserChain(O.SkipNonFinite(), O.Adam(1e-3)))
    model = {"w": jnp.ones(64, jnp.bfloat16)}
    tree, step = O.setup(rule, model), jax.jit(O.update)
    tree, model = step(tree, model, {"w": jnp.ones(64, jnp.bfloat16)})
    tree, after = step(tree, model, {"w": jnp.full(64, jnp.nan, jnp.bfloat16)})
    assert float(model["w"].astype(jnp.float32).mean()) < 1
    np.testing.assert_array_equal(np.asarray(after["w"]), np.asarray(model["w"]))


@pytest.mark.parametrize("lib", LIBS)
def test_a_skipped_step_leaves_8bit_state_as_it_was(lib):
    """Quantised around a chain that skips non-finite steps: ten NaN gradients in a row
    leave the codes and scales as they were (coding what was decoded gives the same codes,
    a block's largest element negative too; its scale shrank 0.7% a step before)."""
    rule = O.Quantised(O.OptimiserChain(O.SkipNonFinite(), O.Adam(0.1)), block=16,
                       min_size=1)
    rng = np.random.default_rng(10)
    x = to(lib, rng.standard_normal(64).astype(np.float32))
    state, _ = rule.apply(rule.init(x), x, to(lib, -np.abs(rng.standard_normal(64)).astype(
        np.float32)))
    before = [host(a).copy() for a in jax.tree.leaves(tuple(state[1][:2]))]
    nan = np.full(64, np.nan, np.float32)
    for _ in range(10):
        state, d = rule.apply(state, x, to(lib, nan))
    for a, b in zip(jax.tree.leaves(tuple(state[1][:2])), before):
        np.testing.assert_array_equal(host(a), b)


def test_a_rule_on_the_parameter_is_refused_inside_the_narrowing_wrappers():
    """MixedPrecision, StochasticRounding and EMA keep the parameter (or its average) in
    their state, which LowPrecision and Quantised would narrow: refused, naming the order
    that works; StochasticRounding computes in float32 or float64 only."""
    for wrapper in (O.LowPrecision, O.Quantised):
        for inner in (O.MixedPrecision(O.Adam()), O.StochasticRounding(O.Adam()),
                      O.EMA(O.Adam())):
            name = type(inner).__name__
            with pytest.raises(ValueError, match=rf"write {name}\({wrapper.__name__}\(rule"):
                wrapper(inner)
    O.MixedPrecision(O.LowPrecision(O.Adam()))  # (the order that works)
    with pytest.raises(ValueError, match="float32 or float64, not bfloat16"):
        O.StochasticRounding(O.Adam(), "bfloat16")


@pytest.mark.parametrize("lib", LIBS)
def test_stochastic_rounding_draws_apart_for_arrays_of_one_shape(lib):
    """Two arrays of one shape rounded at one step: their rounding noises (up or not, less
    its chance) are uncorrelated (|r| < 0.05 over 50,000 elements; it was 0.50 when the bits
    came from the step count alone), and each stays unbiased."""
    from optimisers import backends
    xp = backends.ops(lib)
    rng = np.random.default_rng(11)
    a, b = ((1 + rng.random(50000) * 0.5).astype(np.float32) for _ in range(2))

    def noise(v: np.ndarray) -> np.ndarray:
        arr = {"numpy": v, "torch": torch.from_numpy(v), "jax": jnp.asarray(v)}[lib]
        down = (v.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        return (as_f32(xp.stochastic_bfloat16(arr, 7)) > down) - (v - down) / 2.0**-7

    na, nb = noise(a), noise(b)
    assert abs(np.corrcoef(na, nb)[0, 1]) < 0.05
    assert abs(na.mean()) < 4 * 0.5 / np.sqrt(na.size)


def test_numpy_bfloat16_parameters_train_as_torchs():
    """NumPy arrays of ml_dtypes' bfloat16 are parameters: MixedPrecision keeps their float32
    copy, and 20 steps agree with torch's to one bfloat16 spacing."""
    rng = np.random.default_rng(3)
    w, grads = rng.standard_normal(256), rng.standard_normal((20, 256))

    def run(lib):
        model = {"w": bf16(lib, w.astype(np.float32))}
        tree = O.setup(O.MixedPrecision(O.Adam(0.01)), model)
        for g in grads:
            tree, model = O.update_(tree, model, {"w": bf16(lib, g.astype(np.float32))})
        assert O.summary(tree).startswith("path")  # a Leaf: a parameter, not skipped
        return as_f32(model["w"])

    ours, theirs = run("numpy"), run("torch")
    assert (ours != w.astype(np.float32)).mean() > 0.9
    np.testing.assert_allclose(ours, theirs, rtol=2**-7, atol=0)
