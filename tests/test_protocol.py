"""Every backend provides the declared interface (``backends/protocol.py``): each name of
its protocols, with a signature that accepts the protocol's calls, and its capabilities
declared as booleans; ``norm``, ``clip``, ``abs2`` and ``eps`` are the shared ones of
``common.py``, giving the same values in every library."""

from __future__ import annotations

import collections
import functools
import importlib
import inspect

import numpy as np
import pytest

from optimisers import backends
from optimisers.backends import common, registry
from optimisers.backends.protocol import (
    Backend,
    Carrying,
    Checking,
    Fusing,
    Grouping,
    Nodes,
    Registering,
    Sharding,
)

# which protocols each backend module provides besides Backend's capabilities
PROVIDES = {
    "numpy": (Backend, Grouping),
    "torch": (Backend, Grouping, Carrying, Nodes),
    "jax": (Backend, Fusing, Registering),
    "flax": (Nodes, Checking),
    "equinox": (Nodes,),
    "dtensor": (Backend, Grouping, Sharding),
}
NEEDS = {"torch": "torch", "jax": "jax", "flax": "flax.nnx", "equinox": "equinox",
         "dtensor": "torch.distributed.tensor"}
CAPABILITIES = {"CONCATENATES": Grouping, "FUSES_ITSELF": Fusing}


EXTENDED = (Fusing, Registering)  # provided by the module extending the backend (registry)


def _load(lib, protocol=None):
    if lib in NEEDS:
        pytest.importorskip(NEEDS[lib])
    mod = importlib.import_module(f"optimisers.backends.{lib}")
    return registry.extension(lib) if protocol in EXTENDED else mod


def functions(protocol) -> dict:
    """The functions a protocol declares, by name."""
    return {n: v for n, v in vars(protocol).items()
            if inspect.isfunction(v) and not n.startswith("_")}


def constants(protocol) -> list:
    return [n for n in getattr(protocol, "__annotations__", {}) if n.isupper()]


def _accepts(declared, got) -> str | None:
    """Why ``got`` cannot be called as ``declared`` is declared (``None``: it can): the
    declaration's parameters without defaults passed by position, those with defaults by
    name, ``*values`` with two values."""
    try:
        sig = inspect.signature(got)
    except (TypeError, ValueError):  # a builtin without a signature (torch.sqrt): called below
        return None if callable(got) else "not callable"
    args, kwargs = [], {}
    for p in list(inspect.signature(declared).parameters.values())[1:]:  # past self
        if p.kind is p.VAR_POSITIONAL:
            args += [object(), object()]
        elif p.default is p.empty:
            args.append(object())
        else:
            kwargs[p.name] = p.default
    try:
        sig.bind(*args, **kwargs)
    except TypeError as err:
        return f"{sig} cannot be called as {inspect.signature(declared)} declares: {err}"
    return None


CASES = [(lib, proto.__name__, name) for lib, protos in PROVIDES.items()
         for proto in protos for name in functions(proto)]


@pytest.mark.parametrize(("lib", "protocol", "name"), CASES,
                         ids=[f"{lib}-{name}" for lib, _, name in CASES])
def test_backend_provides_each_declared_function(lib, protocol, name):
    mod = _load(lib, globals()[protocol])
    declared = functions(globals()[protocol])[name]
    assert hasattr(mod, name), f"backends.{lib} lacks {protocol}.{name}"
    why = _accepts(declared, getattr(mod, name))
    assert why is None, f"backends.{lib}.{name}: {why}"


@pytest.mark.parametrize("lib", [lib for lib, p in PROVIDES.items() if Backend in p])
def test_capabilities_are_declared_booleans_that_match_the_functions(lib):
    mod = _load(lib)
    assert constants(Backend) == list(CAPABILITIES)
    for name, protocol in CAPABILITIES.items():
        value = getattr(mod, name)
        assert type(value) is bool, f"backends.{lib}.{name} is {value!r}, not a bool"
        assert value == (protocol in PROVIDES[lib]), f"backends.{lib}.{name} is {value}"


def test_registry_tables_agree_with_the_protocols():
    def given(protocol):
        return {lib for lib, protos in PROVIDES.items() if protocol in protos}

    assert set(registry._NODE_BACKENDS.values()) == given(Nodes)
    assert set(registry._CARRIERS) == given(Carrying)
    assert set(registry._CHECKERS) == given(Checking)
    assert set(registry._EAGER) == given(Registering)
    assert set(registry._SHARDED) == given(Sharding)


def test_a_protocol_declares_every_function_the_backends_share():
    """No name is shared by the three array backends without being declared: the
    interface is the whole of what they have in common (private names, imports of
    modules and type aliases aside)."""
    mods = [_load(lib) for lib in ("numpy", "torch", "jax")]
    declared = set().union(*(functions(p) for p in PROVIDES["torch"] + PROVIDES["jax"]))

    def public(mod):
        return {n for n, v in vars(mod).items() if not n.startswith("_") and callable(v)
                and not inspect.ismodule(v) and not inspect.isclass(v)}

    shared = set.intersection(*(public(m) for m in mods)) - {"annotations"}
    assert shared <= declared, f"shared but not declared: {sorted(shared - declared)}"


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_the_shared_functions_are_written_once_per_backend(lib):
    """Each of ``abs2``, ``clip``, ``norm`` and ``eps`` is ``common.py``'s bound to the
    backend or the backend's own function; NumPy's and PyTorch's ``abs2`` and ``eps``, on
    every step's path, are their own (a step stays in the backend's file)."""
    mod = _load(lib)
    for name in ("abs2", "clip", "norm", "eps"):
        fn = getattr(mod, name)
        if isinstance(fn, functools.partial):
            assert fn.func is getattr(common, name) and fn.args == (mod,), name
        else:
            assert inspect.isfunction(fn) and fn.__module__ == mod.__name__, name
    for name in ("abs2", "eps") if lib in ("numpy", "torch") else ():
        assert getattr(mod, name).__module__ == mod.__name__, name


def _convert(lib):
    if lib == "numpy":
        return np.asarray
    if lib == "torch":
        torch = pytest.importorskip("torch")
        return torch.from_numpy
    jnp = pytest.importorskip("jax.numpy")
    return jnp.asarray


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("dtype", [np.float32, np.complex64], ids=["real", "complex"])
def test_shared_functions_agree_across_libraries(lib, dtype):
    xp = _load(lib)
    g0 = (np.array([3, -4, 0.5, 0, 2.5], dtype) * (1 + 1j if dtype == np.complex64 else 1))
    g = _convert(lib)(g0.copy())
    host = np.asarray
    np.testing.assert_allclose(host(xp.abs2(g)), np.abs(g0) ** 2, rtol=1e-6)
    clipped = host(xp.clip(g, -1.0, 1.0))
    np.testing.assert_array_equal(clipped.real, np.clip(g0.real, -1, 1))
    np.testing.assert_array_equal(np.imag(clipped), np.clip(g0.imag, -1, 1))
    for p, want in [(2.0, np.linalg.norm(g0)), (1.0, np.abs(g0).sum()), (0, 4.0),
                    (np.inf, np.abs(g0).max()), (-np.inf, 0.0)]:
        np.testing.assert_allclose(float(xp.norm(g, p)), want, rtol=1e-6)
    empty = _convert(lib)(np.zeros(0, np.float32))
    assert float(xp.norm(empty, np.inf)) == 0.0 and float(xp.norm(empty, -np.inf)) == np.inf


def _host(v) -> np.ndarray:
    """Any library's array as float32 NumPy (a bfloat16 one too)."""
    return v.float().numpy() if type(v).__module__.startswith("torch") else np.asarray(
        v).astype(np.float32)


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_matrix_functions_agree_across_libraries(lib):
    """transpose, matmul, matmul_add, vector_norm, mean, over the last axes of a stack;
    lerp, scaled_sum; to_bfloat16 rounds as torch does; machine_epsilon is finfo's."""
    torch = pytest.importorskip("torch")
    xp, conv = _load(lib), _convert(lib)
    rng = np.random.default_rng(0)
    a0, b0, c0 = (rng.normal(size=s).astype(np.float32) for s in [(2, 3, 4), (2, 4, 5), (2, 3, 5)])
    a, b, c = conv(a0.copy()), conv(b0.copy()), conv(c0.copy())
    np.testing.assert_array_equal(_host(xp.transpose(a)), a0.swapaxes(-1, -2))
    np.testing.assert_allclose(_host(xp.matmul(a, b)), a0 @ b0, rtol=1e-5)
    np.testing.assert_allclose(_host(xp.matmul_add(c, a, b, 0.5, -2.0)),
                               0.5 * c0 - 2.0 * (a0 @ b0), rtol=1e-5, atol=1e-6)
    for one in range(2):  # each matrix of a stack gets what it gets alone
        np.testing.assert_array_equal(_host(xp.matmul_add(c[one], a[one], b[one], 0.5, -2.0)),
                                      _host(xp.matmul_add(c, a, b, 0.5, -2.0))[one])
    norms = _host(xp.vector_norm(a, (-2, -1)))
    np.testing.assert_allclose(norms, np.sqrt((a0**2).sum(axis=(-2, -1), keepdims=True)),
                               rtol=1e-6)
    np.testing.assert_allclose(_host(xp.mean(a, (-1,))), a0.mean(-1, keepdims=True), rtol=1e-6)
    w, two = xp.hyper(a, 0.25, 2.0)
    np.testing.assert_allclose(_host(xp.lerp(a, c[..., :4], w)), a0 + 0.25 * (c0[..., :4] - a0),
                               rtol=1e-6, atol=1e-7)
    into = conv(a0.copy())
    got = xp.lerp(into, c[..., :4], w, inplace=True)
    assert (got is into) == (lib != "jax")  # written in place where arrays may be written
    np.testing.assert_allclose(_host(got), a0 + 0.25 * (c0[..., :4] - a0), rtol=1e-6, atol=1e-7)
    low = xp.to_bfloat16(c[..., :4])
    summed = xp.scaled_sum(two, a, w, low)  # a bfloat16 y widened exactly: float32 out
    np.testing.assert_allclose(_host(summed), 2 * a0 + 0.25 * _host(low), rtol=1e-6, atol=1e-7)
    assert _host(summed).dtype == np.float32 and "float32" in str(summed.dtype)
    x0 = (rng.normal(size=1000) * 10.0 ** rng.integers(-30, 30, 1000)).astype(np.float32)
    want = torch.from_numpy(x0).bfloat16().float().numpy()
    np.testing.assert_array_equal(_host(xp.to_bfloat16(conv(x0.copy()))), want)
    low = xp.to_bfloat16(a)  # bfloat16 products: summed in float32, rounded once
    rounded = torch.from_numpy(_host(low) @ _host(low).swapaxes(-1, -2)).bfloat16().float()
    np.testing.assert_array_equal(_host(xp.to_bfloat16(xp.matmul(low, xp.transpose(low)))),
                                  rounded.numpy())
    for dtype, eps in [(np.float16, 2.0**-10), (np.float32, 2.0**-23), (np.complex64, 2.0**-23)]:
        assert xp.machine_epsilon(conv(np.zeros(2, dtype))) == eps


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_eps_is_floored_for_float16_only(lib):
    xp = _load(lib)
    half = _convert(lib)(np.zeros(2, np.float16))
    single = _convert(lib)(np.zeros(2, np.float32))
    # as the backend's own hyper-parameters (torch's stay Python floats)
    assert float(xp.eps(half, 1e-8)) == float(xp.hyper(half, common.FLOAT16_EPS)[0])
    assert float(xp.eps(half, 0.0)) == 0.0
    assert float(xp.eps(half, 1e-3)) == float(xp.hyper(half, 1e-3)[0])
    assert float(xp.eps(single, 1e-8)) == float(xp.hyper(single, 1e-8)[0]) != 1e-7


def test_eps_floors_a_traced_epsilon_too():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    xp = _load("jax")
    half = jnp.zeros(2, jnp.float16)
    got = jax.jit(lambda e: xp.eps(half, e))(jnp.asarray([1e-8, 0.0, 1e-3]))
    want = np.array([common.FLOAT16_EPS, 0.0, 1e-3], np.float16)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_mapstate_gives_each_item_its_dotted_key_and_rebuilds_the_containers():
    Moments = collections.namedtuple("Moments", "m v")
    state = (Moments(1, [2, 3]), {"t": 4}, None)
    got = common.mapstate(lambda v, k: (k, v), state, "w.state")
    assert got == (Moments(("w.state.0.0", 1), [("w.state.0.1.0", 2), ("w.state.0.1.1", 3)]),
                   {"t": ("w.state.1.t", 4)}, ("w.state.2", None))
    assert type(got[0]) is Moments and type(got[0].v) is list
    assert common.mapstate(lambda v, k: (k, v), 5) == ("", 5)


def test_of_returns_a_backend():
    xp = backends.of(np.zeros(1))
    assert xp.CONCATENATES and not xp.FUSES_ITSELF
