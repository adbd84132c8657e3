"""A parameter resized or replaced after setup: a clean ValueError naming the path, and
nothing written, on every path (plain, NumPy's and torch's fused groups, JAX eager and
under jit); and reinit to start that part afresh."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import optimisers as O
from optimisers.fast import fused
from optimisers.leaf import leaves

NUMPY_PATHS = ["fused", "chunked", "plain"]


@pytest.fixture(params=NUMPY_PATHS)
def numpy_path(request, monkeypatch):
    if request.param == "chunked":
        monkeypatch.setattr(fused, "CHUNK", 2)
    if request.param == "plain":
        monkeypatch.setattr(fused, "MIN_GROUP", 10**9)
    return request.param


def snapshot(tree, model):
    """Copies of every parameter and state array, to show that nothing was written."""
    arrays = [np.array(x, copy=True) for x in O.fleaves(model) if hasattr(x, "shape")]
    for _, leaf in leaves(tree):
        arrays += [np.array(a, copy=True) for a in O.fleaves(leaf.state) if hasattr(a, "shape")]
    return arrays


def same(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y)
                                    for x, y in zip(a, b))


def numpy_model(n=3, size=300):
    rng = np.random.default_rng(0)
    return {f"p{i}": rng.normal(size=size).astype(np.float32) for i in range(n)}


def grads_of(model):
    return {k: np.full_like(v, 0.5) for k, v in model.items()}


@pytest.mark.parametrize("rule", [O.Adam(0.1), O.Momentum(0.1), O.AdamW(0.1, lambd=0.1)],
                         ids=repr)
@pytest.mark.parametrize("how", ["larger", "smaller", "reshaped"])
def test_numpy_array_replaced_after_setup(rule, how, numpy_path):
    model = numpy_model()
    tree = O.setup(rule, model)
    for _ in range(3):  # the plan and its groups are cached by now
        tree, model = O.update_(tree, model, grads_of(model))
    new = {"larger": np.ones(400, np.float32), "smaller": np.ones(200, np.float32),
           "reshaped": np.ones((3, 100), np.float32)}[how]
    model["p1"] = new
    before = snapshot(tree, model)
    with pytest.raises(ValueError, match=r"Leaf at KeyPath\('p1'\) holds state of shape "
                                         r"\(300,\), but the parameter there has shape"):
        O.update_(tree, model, grads_of(model))
    assert same(before, snapshot(tree, model))
    with pytest.raises(ValueError, match=r"KeyPath\('p1'\)"):
        O.update(tree, model, grads_of(model))
    assert same(before, snapshot(tree, model))


def test_numpy_array_resized_in_place_after_setup(numpy_path):
    model = numpy_model(size=5000)
    tree = O.setup(O.Adam(0.1), model)
    for _ in range(3):
        tree, model = O.update_(tree, model, grads_of(model))
    model["p2"].resize(6000, refcheck=False)  # the same object, its memory moved
    before = snapshot(tree, model)
    with pytest.raises(ValueError, match=r"KeyPath\('p2'\).*\(5000,\).*\(6000,\)"):
        O.update_(tree, model, grads_of(model))
    assert same(before, snapshot(tree, model))


def test_reinit_starts_a_resized_part_afresh(numpy_path):
    model = numpy_model()
    tree = O.setup(O.Adam(0.1), model)
    tree, model = O.update_(tree, model, grads_of(model))
    kept = tree["p0"]
    model["p1"] = np.ones(400, np.float32)
    tree = O.reinit(tree, model, where="p1")
    assert tree["p0"] is kept and tree["p1"].state[0].shape == (400,)
    assert tree["p1"].state[2] == 0.0  # its step count starts again
    tree, model = O.update_(tree, model, grads_of(model))
    fresh = O.update(O.setup(O.Adam(0.1), {"p1": np.ones(400, np.float32)}),
                     {"p1": np.ones(400, np.float32)}, {"p1": np.full(400, 0.5, np.float32)})
    np.testing.assert_array_equal(model["p1"], fresh[1]["p1"])


def test_reinit_keeps_ties_and_frozen_flags():
    w = np.ones(3)
    model = {"a": w, "b": w, "c": np.ones(2)}
    tree = O.freeze_(O.setup(O.Descent(), model), where="c")
    model = {"a": np.ones(5), "b": None, "c": np.ones(4)}
    model["b"] = model["a"]
    new = O.reinit(tree, model)
    assert new["a"] is new["b"] and new["c"].frozen and not new["a"].frozen
    assert tree["a"].state is None and new["a"] is not tree["a"]  # pure


torch = pytest.importorskip("torch")
TORCH_PATHS = ["concatenated", "chunked", "plain"]


@pytest.fixture(params=TORCH_PATHS)
def torch_path(request, monkeypatch):
    if request.param == "chunked":
        monkeypatch.setattr(fused, "CHUNK", 2)
    if request.param == "plain":
        monkeypatch.setattr(fused, "MIN_GROUP", 10**9)
    return request.param


def torch_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16),
                               torch.nn.Linear(16, 4))


def torch_step(tree, model):
    model.zero_grad()
    model(torch.arange(6)).square().sum().backward()
    return O.update_(tree, model)


def torch_snapshot(tree, model):
    arrays = [p.detach().clone() for p in model.parameters()]
    for _, leaf in leaves(tree):
        arrays += [a.clone() for a in O.fleaves(leaf.state) if torch.is_tensor(a)]
    return arrays


def torch_same(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y)
                                    for x, y in zip(a, b))


@pytest.mark.parametrize("how", ["submodule", "data", "set_"])
def test_torch_parameter_replaced_after_setup(how, torch_path):
    model = torch_model()
    tree = O.setup(O.AdamW(0.01, lambd=0.1), model)
    for _ in range(3):
        tree, model = torch_step(tree, model)
    if how == "submodule":  # as resize_token_embeddings does
        model[0] = torch.nn.Embedding(60, 16)
    elif how == "data":
        model[0].weight.data = torch.randn(60, 16)
    else:
        with torch.no_grad():
            model[0].weight.set_(torch.randn(60, 16))
    model.zero_grad()
    model(torch.arange(6)).square().sum().backward()
    before = torch_snapshot(tree, model)
    with pytest.raises(ValueError, match=r"KeyPath\('0', 'weight'\) holds state of shape "
                                         r"\(50, 16\), but the parameter there has shape "
                                         r"\(60, 16\)"):
        O.update_(tree, model)
    assert torch_same(before, torch_snapshot(tree, model))
    tree = O.reinit(tree, model, where="0.*")
    tree, model = torch_step(tree, model)  # steps again after reinit
    assert tree["0"]["weight"].state[0].shape == (60, 16)


def test_torch_memory_replaced_with_same_shape_steps_the_new_memory(torch_path):
    model = torch_model()
    tree = O.setup(O.Adam(0.01), model)
    for _ in range(3):
        tree, model = torch_step(tree, model)
    new = torch.randn(16, 16)
    model[1].weight.data = new.clone()
    twin = torch_model()
    twin.load_state_dict(model.state_dict())
    twin_tree = O.setup(O.Adam(0.01), twin)
    for (_, a), (_, b) in zip(leaves(tree), leaves(twin_tree)):
        b.state = tuple(s.clone() if torch.is_tensor(s) else s for s in a.state)
    tree, model = torch_step(tree, model)
    twin_tree, twin = torch_step(twin_tree, twin)
    assert not torch.equal(model[1].weight, new)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_jax_array_resized_after_setup(jit):
    model = {"a": jnp.ones(300), "b": jnp.ones(300)}
    tree = O.setup(O.Adam(0.1), model)
    step = jax.jit(O.update) if jit else O.update_
    grads = {k: jnp.ones_like(v) for k, v in model.items()}
    tree, model = step(tree, model, grads)
    model = {**model, "b": jnp.ones(301)}
    grads = {k: jnp.ones_like(v) for k, v in model.items()}
    with pytest.raises(ValueError, match=r"KeyPath\('b'\) holds state of shape \(300,\), "
                                         r"but the parameter there has shape \(301,\)"):
        step(tree, model, grads)
    tree = O.reinit(tree, model, where="b")
    tree, model = step(tree, model, grads)
    assert model["b"].shape == (301,)


FUZZ = textwrap.dedent("""
    import sys
    import numpy as np
    import optimisers as O
    from optimisers.leaf import leaves
    lib = sys.argv[1]
    rng = np.random.default_rng(int(sys.argv[2]))
    if lib == "torch":
        import torch
        def arr(n): return torch.tensor(rng.normal(size=n or ()), dtype=torch.float32)
        def copy(a): return a.clone()
        def equal(a, b): return a.shape == b.shape and bool(torch.equal(a, b))
    else:
        def arr(n): return np.asarray(rng.normal(size=n or ()), np.float32)
        def copy(a): return a.copy()
        def equal(a, b): return a.shape == b.shape and np.array_equal(a, b)
    sizes = [0, 5, 64, 300, 5000, 1 << 18]  # 0: a 0-d parameter
    rules = [O.Adam(0.01), O.AdamW(0.01, lambd=0.1), O.Momentum(0.01), O.Lion(0.01),
             O.OptimiserChain(O.ClipGrad(1.0), O.Descent(0.1))]
    for trial in range(12):
        n = int(rng.integers(2, 9))
        model = {f"p{i}": arr(int(rng.choice(sizes))) for i in range(n)}
        tree = O.setup(rules[trial % len(rules)], model)
        errors = 0
        for step in range(8):
            if step > 1 and rng.random() < 0.5:
                k = f"p{int(rng.integers(n))}"
                m = int(rng.choice(sizes))
                r = rng.random()
                if lib == "torch" and r < 0.3:
                    model[k].data = arr(m)  # the same tensor, new memory
                elif lib == "torch" and r < 0.5 and model[k].numel() > 1:
                    model[k].data = model[k].data[: model[k].numel() // 2]  # same address
                elif r < 0.6:
                    model[k] = arr(m).reshape(-1, 1) if m else arr(m)  # another ndim
                else:
                    model[k] = arr(m)
            grads = {k: arr(int(np.prod(v.shape))).reshape(tuple(v.shape)) for k, v in
                     model.items()}
            fits = all(leaf.state is None or all(
                getattr(a, "shape", v.shape) == v.shape for a in O.fleaves(leaf.state))
                for (_, leaf), v in zip(leaves(tree), model.values()))
            params = [copy(v) for v in model.values()]
            states = [copy(a) for _, leaf in leaves(tree) for a in O.fleaves(leaf.state)
                      if hasattr(a, "shape")]
            try:
                tree, model = O.update_(tree, model, grads)
            except ValueError as err:
                assert not fits and "changed after setup" in str(err), err
                assert all(map(equal, params, model.values()))
                after = [a for _, leaf in leaves(tree) for a in O.fleaves(leaf.state)
                         if hasattr(a, "shape")]
                assert all(map(equal, states, after))
                errors += 1
                tree = O.reinit(tree, model)
            else:
                assert fits, "a misfit state was stepped"
    print("ok")
""")


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("seed", [0, 1])
def test_fuzz_random_resizes_never_crash(lib, seed):
    """Random parameters swapped for random other shapes between steps: a clean
    ValueError and nothing written, or a step when the state still fits. In a subprocess,
    so that a crash fails this test instead of killing the suite."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    done = subprocess.run([sys.executable, "-c", FUZZ, lib, str(seed)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


ZERO_D = textwrap.dedent("""
    import sys
    import numpy as np
    import optimisers as O
    lib, n = sys.argv[1], int(sys.argv[2])
    if lib == "torch":
        import torch
        arr, ones = (lambda *s: torch.zeros(s)), torch.ones_like
    elif lib == "jax":
        import jax.numpy as jnp
        arr, ones = (lambda *s: jnp.zeros(s)), jnp.ones_like
    else:
        arr, ones = (lambda *s: np.zeros(s, np.float32)), np.ones_like
    model = {"s": arr(), "w": arr(3), "v": arr(3)}
    tree = O.setup(O.Adam(0.1), model)
    grads = lambda: {k: ones(v) for k, v in model.items()}
    tree, model = O.update_(tree, model, grads())
    model["s"] = arr(n)  # a scalar parameter made a vector
    try:
        O.update_(tree, model, grads())
    except ValueError as err:
        print("ValueError" if "KeyPath('s') holds state of shape ()" in str(err) else err)
""")


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("n", [5, 1000])
def test_a_scalar_parameter_resized_after_setup(lib, n):
    """A 0-d parameter's state is 0-d arrays too: they are state, not numbers, and must fit
    (before, torch's fused Adam wrote past them and corrupted the heap). In a subprocess."""
    done = subprocess.run([sys.executable, "-c", ZERO_D, lib, str(n)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ValueError", (
        done.stdout[-1000:] + done.stderr[-2000:])


@pytest.mark.parametrize("how", ["transpose", "slice"])
def test_torch_view_at_the_same_address_is_noticed(how, torch_path):
    """``p.data = p.data.t()`` or a slice keeps the tensor and its address: the cached
    group must notice the shape or strides, never step it in the old layout."""
    torch.manual_seed(0)
    model = [torch.randn(6, 6) for _ in range(3)]
    tree = O.setup(O.Descent(1.0), model)
    grads = [torch.ones(6, 6) for _ in model]
    for _ in range(2):
        tree, model = O.update_(tree, model, grads)
    if how == "transpose":
        before = model[1].clone()
        model[1].data = model[1].data.t()
        g = torch.arange(36.0).reshape(6, 6)
        tree, model = O.update_(tree, model, [grads[0], g, grads[2]])
        torch.testing.assert_close(model[1], before.t() - g, rtol=0, atol=0)
    else:
        model[1].data = model[1].data[:3]
        with pytest.raises(ValueError, match=r"KeyPath\(1\)"):
            O.update_(tree, model, grads)


@pytest.mark.parametrize("rule", [O.OptimiserChain(O.ClipNorm(1.0), O.Adafactor()),
                                  O.EMA(O.Adafactor()), O.MixedPrecision(O.Adafactor()),
                                  O.EMA(O.OptimiserChain(O.WeightDecay(), O.Adam()))],
                         ids=repr)
def test_composites_ask_their_rules_whether_a_state_fits(rule):
    """A chain, ``EMA`` and ``MixedPrecision`` ask each rule they hold whether its state
    fits (``Rule.misfit``): ``Adafactor``'s factored moments fit a matrix inside them too,
    and a resized parameter is still refused."""
    model = {"w": np.ones((3, 4), np.float32), "b": np.ones(5, np.float32)}
    tree = O.setup(rule, model)
    for _ in range(2):
        tree, model = O.update_(tree, model, grads_of(model))
        tree, model = O.update(tree, model, grads_of(model))
    assert not np.array_equal(model["w"], np.ones((3, 4)))
    model["w"] = np.ones((3, 5), np.float32)
    before = snapshot(tree, model)
    with pytest.raises(ValueError, match=r"Leaf at KeyPath\('w'\) holds state of shape"):
        O.update_(tree, model, grads_of(model))
    assert same(before, snapshot(tree, model))


# ----------------------------------------------------------------------------- empty arrays

LIBS = ["numpy", "torch", "jax", "jax-jit"]


def maker(lib):
    """``(array(shape, dtype name), stepping function, as NumPy)`` of a library."""
    if lib == "numpy":
        return (lambda s, d="float32": np.ones(s, d)), O.update_, np.asarray
    if lib == "torch":
        return ((lambda s, d="float32": torch.ones(s, dtype=getattr(torch, d))), O.update_,
                lambda a: a.float().numpy())
    step = jax.jit(O.update) if lib == "jax-jit" else O.update
    return (lambda s, d="float32": jnp.ones(s, d)), step, lambda a: np.asarray(a, np.float32)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0, 0)], ids=str)
@pytest.mark.parametrize("rule", [O.Adafactor(), O.Adafactor(0.1, lambd=0.1), O.Muon(0.1),
                                  O.OptimiserChain(O.WeightDecay(), O.Muon(0.1))], ids=repr)
def test_a_matrix_of_no_elements_takes_an_empty_step(lib, shape, rule):
    """Adafactor said such a parameter "changed after setup" (its init sliced a row and a
    column that an empty axis does not have); Muon divided by its 0 columns
    (ZeroDivisionError) and torch could not stack it (RuntimeError). Now each steps, alone
    and in a stack of its kind, with nothing to do: no NaN in the state, no warning, and
    the other parameters step as they would without it."""
    import warnings

    arr, step, host = maker(lib)
    model = {"e": arr(shape), "stack": [arr(shape) for _ in range(3)], "w": arr((3, 4))}
    alone = {"w": arr((3, 4))}
    tree, tree_alone = O.setup(rule, model), O.setup(rule, alone)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (NumPy's 0/0, mean of nothing)
        for _ in range(3):
            tree, model = step(tree, model, {"e": arr(shape), "stack": [arr(shape)] * 3,
                                             "w": arr((3, 4))})
            tree_alone, alone = step(tree_alone, alone, {"w": arr((3, 4))})
    assert [tuple(a.shape) for a in (model["e"], *model["stack"])] == [shape] * 4
    for _, leaf in leaves(tree):
        assert all(np.isfinite(host(a)).all() for a in O.fleaves(leaf.state)
                   if hasattr(a, "shape"))
    np.testing.assert_array_equal(host(model["w"]), host(alone["w"]))
    assert not np.array_equal(host(model["w"]), np.ones((3, 4)))


# ----------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
@pytest.mark.parametrize("rule", [O.Adam(0.1), O.Adafactor(), O.Muon(0.1),
                                  O.EMA(O.Momentum(0.1))], ids=repr)
def test_a_parameter_cast_after_setup_is_refused_naming_its_path(lib, dtype, rule):
    """A float32 parameter made float16, bfloat16 or float64 after setup was stepped with
    its float32 state (mixed precisions, silently): refused as a resize is, naming the path
    and both dtypes, nothing written; reinit starts it afresh."""
    arr, step, host = maker(lib)
    if lib == "numpy" and dtype == "bfloat16":
        pytest.skip("NumPy has no bfloat16")
    if lib.startswith("jax") and dtype == "float64" and not jax.config.jax_enable_x64:
        pytest.skip("JAX makes float32 of float64 without jax_enable_x64")
    model = {"w": arr((3, 4)), "b": arr((3, 4))}
    tree = O.setup(rule, model)
    for _ in range(3):
        tree, model = step(tree, model, {"w": arr((3, 4)), "b": arr((3, 4))})
    model = {**model, "b": arr((3, 4), dtype)}
    grads = {"w": arr((3, 4)), "b": arr((3, 4), dtype)}
    before = [host(a) for a in O.fleaves((model, tree)) if hasattr(a, "shape")]
    with pytest.raises(ValueError, match=rf"the Leaf at KeyPath\('b'\) holds state of dtype "
                                         rf"float32, but the parameter there has dtype "
                                         rf"{dtype}: it changed after setup"):
        step(tree, model, grads)
    after = [host(a) for a in O.fleaves((model, tree)) if hasattr(a, "shape")]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    tree = O.reinit(tree, model, where="b")
    tree, model = step(tree, model, grads)
    assert str(model["b"].dtype).endswith(dtype)


def test_a_cast_is_noticed_on_every_numpy_path(numpy_path):
    """The fused groups' cached plan notices a parameter replaced by one of another dtype."""
    model = numpy_model()
    tree = O.setup(O.Adam(0.1), model)
    for _ in range(3):
        tree, model = O.update_(tree, model, grads_of(model))
    model["p1"] = model["p1"].astype(np.float64)
    before = snapshot(tree, model)
    with pytest.raises(ValueError, match=r"KeyPath\('p1'\) holds state of dtype float32, "
                                         r"but the parameter there has dtype float64"):
        O.update_(tree, model, grads_of(model))
    assert same(before, snapshot(tree, model))


@pytest.mark.parametrize("how", ["data", "half"])
def test_a_torch_parameter_cast_after_setup_is_refused(how, torch_path):
    """``p.data = p.data.half()`` keeps the tensor (and so the cached plan's identity
    checks), ``model.half()`` too: the step is refused before anything is written."""
    model = torch_model()
    tree = O.setup(O.AdamW(0.01, lambd=0.1), model)
    for _ in range(3):
        tree, model = torch_step(tree, model)
    if how == "data":
        model[1].weight.data = model[1].weight.data.half()
    else:
        model.half()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = torch_snapshot(tree, model)
    with pytest.raises(ValueError, match=r"KeyPath\('\d', 'weight'\) holds state of dtype "
                                         r"float32, but the parameter there has dtype "
                                         r"float16"):
        O.update_(tree, model)
    assert torch_same(before, torch_snapshot(tree, model))


@pytest.mark.parametrize("lib", LIBS)
def test_mixed_precision_trains_a_parameter_cast_after_setup(lib):
    """MixedPrecision's master copy keeps its own dtype: a parameter cast after setup trains
    on through it, written back in its new dtype (the rule it runs is asked about the
    master copy, the parameter it steps)."""
    arr, step, host = maker(lib)
    model = {"w": arr((3, 4))}
    tree = O.setup(O.MixedPrecision(O.Adam(0.1)), model)
    tree, model = step(tree, model, {"w": arr((3, 4))})
    model = {"w": arr((3, 4), "float16")}
    tree, model = step(tree, model, {"w": arr((3, 4), "float16")})
    assert str(model["w"].dtype).endswith("float16")
    np.testing.assert_allclose(host(model["w"]), host(tree["w"].state[0]), rtol=1e-3)


def test_the_dtype_check_makes_no_names_for_state_of_the_parameters_dtype(monkeypatch):
    """Every step that is not the plan's one whole group (a tree-level rule's, here) asks
    each Leaf's rule for a misfit: state of the parameter's own dtype passes without
    reading dtype names, which cost more than the shape test (a 2,000-array chain's step
    took twice as long)."""
    from optimisers.backends import numpy as numpy_backend

    model = numpy_model(n=4)
    tree = O.setup(O.OptimiserChain(O.ClipGlobalNorm(1.0), O.AdamW(0.1)), model)
    tree, model = O.update_(tree, model, grads_of(model))
    named = []
    real = numpy_backend.dtype_name
    monkeypatch.setattr(numpy_backend, "dtype_name", lambda x: named.append(x) or real(x))
    tree, model = O.update_(tree, model, grads_of(model))
    assert named == []
    model["p1"] = model["p1"].astype(np.float64)  # and a cast is still named
    with pytest.raises(ValueError, match=r"KeyPath\('p1'\) holds state of dtype float32, "
                                         r"but the parameter there has dtype float64"):
        O.update_(tree, model, grads_of(model))
