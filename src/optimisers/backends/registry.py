"""Which backend serves an array: the registry of array libraries, loaded lazily (the one
place outside a library's own backend module that names the libraries)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from optimisers.backends.protocol import Backend

_ROOTS = {"numpy": "numpy", "torch": "torch", "jax": "jax", "jaxlib": "jax"}
_LOADED: dict[str, ModuleType] = {}

LIBRARIES: dict[type, str | None] = {}
""":func:`library`'s answer for each type met so far, for a step's path to read itself."""

BACKENDS: dict[type, ModuleType] = {}
""":func:`of`'s answer for each array type met so far: ``BACKENDS.get(type(x)) or of(x)``."""


def library(x: Any) -> str | None:
    """The name of the backend for the array ``x`` (``"numpy"``, ``"torch"``, ``"jax"``,
    ``"dtensor"``), or ``None`` when ``x`` is not an array of a supported library."""
    cls = type(x)
    if cls in LIBRARIES:
        return LIBRARIES[cls]
    root = _ROOTS.get(cls.__module__.partition(".")[0])
    if root == "numpy" and not issubclass(cls, sys.modules["numpy"].ndarray):
        root = None  # a NumPy scalar (np.float32(1.0)) is a number, not an array
    if root == "torch" and not issubclass(cls, sys.modules["torch"].Tensor):
        root = None  # torch.dtype, torch.device, nn.Module: not arrays
    elif root == "torch" and _isdtensor(cls):
        root = "dtensor"  # a sharded tensor: stepped shard by shard (backends/dtensor.py)
    if root == "jax" and not hasattr(x, "shape") or root == "jax" and isinstance(x, type):
        root = None
    LIBRARIES[cls] = root
    return root


def _isdtensor(cls: type) -> bool:
    """Whether ``cls`` is torch's ``DTensor``, importing nothing."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and issubclass(cls, module.DTensor)


_EXTENSIONS: dict[str, str] = {}  # library -> the module above backends/ that extends it


def extend(lib: str, module: str) -> None:
    """extend(lib, module): import ``module`` once the backend of ``lib`` is loaded (now, if
    it is), so that a layer above ``backends/`` extends it without being imported here."""
    _EXTENSIONS[lib] = module
    if lib in _LOADED:
        importlib.import_module(module)


def extension(lib: Any) -> ModuleType | None:
    """extension(lib) -> the module extending the loaded backend of ``lib`` (:func:`extend`).

    Example:
        >>> extension("nosuchlibrary") is None
        True
    """
    name = _EXTENSIONS.get(lib)
    return sys.modules.get(name) if name is not None and lib in _LOADED else None


def ops(lib: str) -> ModuleType:
    """The backend module for the library named ``lib``."""
    if lib in _LOADED:
        return _LOADED[lib]
    mod = _LOADED[lib] = importlib.import_module(f"optimisers.backends.{lib}")
    if lib in _EXTENSIONS:
        importlib.import_module(_EXTENSIONS[lib])
    return mod


def of(x: Any) -> Backend:
    """of(x) -> the backend module for the array ``x``, kept in :data:`BACKENDS` by type.

    Example:
        >>> of(np.zeros(1)).__name__, BACKENDS[np.ndarray] is of(np.zeros(1))
        ('optimisers.backends.numpy', True)
    """
    if type(x) in BACKENDS:
        return BACKENDS[type(x)]
    lib = library(x)
    if lib is None:
        raise TypeError(f"expected an array of NumPy, PyTorch or JAX, got {type(x).__name__}")
    mod = BACKENDS[type(x)] = ops(lib)
    return mod


def nograd() -> contextlib.AbstractContextManager:
    """``torch.no_grad()`` when PyTorch is loaded, else a context that does nothing."""
    return nograd_maker()()


def nograd_maker() -> Any:
    """nograd_maker() -> ``torch.no_grad`` when PyTorch is loaded, else ``nullcontext``."""
    torch = sys.modules.get("torch")
    return torch.no_grad if torch is not None else contextlib.nullcontext


COMPILERS: list = []
"""``(compiling, untraced)`` of each graph compiler loaded (``torch.compile``): while
``compiling()``, ``update`` and ``update_`` run as ``untraced(update)`` (a graph break),
so that the Python numbers of a step are not frozen into guards and constants."""


_SHARDED = ("dtensor",)  # backends of arrays split across processes (protocol.Sharding)


def on_whole(apply: Callable) -> Callable:
    """on_whole(apply) -> a rule's ``apply`` that sees whole arrays (Muon's matrices): split
    ones (``DTensor``s) gathered, each process keeping its part (the backend's ``gathered``).

    Example:
        >>> class Rule:
        ...     @on_whole
        ...     def apply(self, state, x, dx):
        ...         return state, dx / np.linalg.norm(dx)
        >>> Rule().apply(None, np.zeros(2), np.array([3.0, 4.0]))[1]
        array([0.6, 0.8])
    """
    @functools.wraps(apply)
    def whole(rule: Any, state: Any, x: Any, *grads: Any) -> tuple[Any, Any]:
        lib = library(x)
        if lib not in _SHARDED:
            return apply(rule, state, x, *grads)
        return ops(lib).gathered(functools.partial(apply, rule), state, x, *grads)

    return whole


def istraced(v: Any) -> bool:
    """Whether ``v`` is a JAX tracer (a value unknown until run, under ``jax.jit``)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(v, jax.core.Tracer)


def dtype_library(v: Any) -> str | None:
    """dtype_library(v) -> ``"torch"`` or ``"jax"`` for a dtype object of theirs, else
    ``None`` (NumPy's dtypes too); imports nothing."""
    root = _ROOTS.get(type(v).__module__.partition(".")[0])
    if root == "torch" and type(v).__name__ == "dtype":
        return root
    if root == "jax" and isinstance(v, type) and hasattr(v, "dtype"):
        return root
    return None


_DTYPE_MODULES = {"torch": "torch", "jax": "jax.numpy"}  # library -> the module of its dtypes


def dtype_module(lib: Any) -> ModuleType | None:
    """dtype_module(lib) -> the module of ``lib``'s dtypes (``torch``, ``jax.numpy``) or None;
    LookupError for one not imported yet (this imports none)."""
    name = _DTYPE_MODULES.get(lib) if isinstance(lib, str) else None
    if name is None:
        return None
    module = sys.modules.get(name)
    if module is None:
        raise LookupError(f"this process has not imported {lib}")
    return module


_CARRIERS = ("torch",)  # libraries whose parameters carry their gradients (.grad)


def carries_grads(model: Any) -> str | None:
    """carries_grads(model) -> ``"torch"`` when ``model``'s parameters carry ``.grad``."""
    for lib in _CARRIERS:
        if lib in sys.modules and ops(lib).hasmodule(model):
            return lib
    return None


_NODE_BACKENDS = {"torch": "torch", "flax": "flax", "equinox": "equinox"}  # root -> backend


def register_nodes(cls: type) -> None:
    """register_nodes(cls): the backend of each library ``cls`` (or a base) comes from
    registers its model classes with the tree protocol (``protocol.Nodes``)."""
    for lib in dict.fromkeys(_NODE_BACKENDS.get((getattr(base, "__module__", None) or "")
                                                .partition(".")[0]) for base in cls.__mro__):
        if lib is not None:
            ops(lib).register_nodes()


_CHECKERS = ("flax",)  # libraries whose backend checks a node trained whole


def check_trainable(x: Any, kids: dict) -> None:
    """check_trainable(x, kids): backends warn where training ``x`` whole is a mistake
    (flax: a linen ``variables`` dict)."""
    for lib in _CHECKERS:
        if lib in sys.modules:
            ops(lib).check_trainable(x, kids)


_EAGER = ("jax",)  # backends registering this package's types (Leaf, rules) with their library


def rule_defined(cls: type) -> None:
    """rule_defined(cls): loaded backends register the new rule or schedule class (JAX: a
    pytree)."""
    for lib in _EAGER:
        loaded = extension(lib)
        if loaded is not None:
            loaded.register_rule(cls)


def load_imported() -> None:
    """Load the imported libraries' backends that register before any array (JAX: pytrees)."""
    for lib in _EAGER:
        if lib in sys.modules:
            ops(lib)
