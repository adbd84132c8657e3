"""The tree protocol: a node's children and how to rebuild it; other classes by :func:`register`."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import operator
import types
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

from optimisers import backends

__all__ = [
    "children", "rebuild", "rebuild_", "register", "functor", "trainable", "isnumeric", "isleaf",
    "ismutable", "maywrite", "ispositional", "Node", "register_node",
]

T = TypeVar("T")


class Node(NamedTuple):
    """Node(children=None, rebuild=None, ...): how the tree protocol treats the instances
    of a class given to :func:`register_node`; ``None`` fields do what the type would.

    ``children(x) -> dict``; ``rebuild(x, new_children) -> a new node``, ``x`` untouched;
    ``trainable(x, kids) -> keys`` (``None``: all); ``getter(x) -> get(node, key)``;
    ``wrapper(x) ->`` the key of the node ``x`` wraps, left out of paths; ``assign(x,
    new_children) -> whether x`` (a cell made to be written) took them; ``mutable``:
    whether identity means a tie (``None``: by type)."""

    children: Callable[[Any], dict] | None = None
    rebuild: Callable[[Any, Mapping], Any] | None = None
    trainable: Callable[[Any, dict], tuple | None] | None = None
    getter: Callable[[Any], Callable[[Any, Any], Any]] | None = None
    wrapper: Callable[[Any], str | None] | None = None
    assign: Callable[[Any, Mapping], bool] | None = None
    mutable: bool | None = None


# cls -> its Node, looked up along the MRO (cached in _FOUND, emptied on each change)
_REGISTRY: dict[type, Node] = {}
_FOUND: dict[type, Node | None] = {}


def _node(cls: type) -> Node | None:
    """The Node registered for ``cls`` or its nearest base (backends register theirs first)."""
    found = _FOUND.get(cls, False)
    if found is False:
        backends.register_nodes(cls)
        found = _FOUND[cls] = next((_REGISTRY[b] for b in cls.__mro__ if b in _REGISTRY), None)
    return found


def _isnamedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def children(x: Any) -> dict:
    """children(x) -> dict mapping each child's key to the child; empty for a leaf.

    Tuples and lists have keys ``0..n-1``; mappings their own keys; namedtuples,
    dataclasses and registered classes their field names; a ``torch.nn.Module`` its
    parameters, buffers and submodules. Anything else is a leaf.

    Example:
        >>> children((10, [20])), children({"w": 1.0, "b": 2.0}), children(3.0)
        ({0: 10, 1: [20]}, {'w': 1.0, 'b': 2.0}, {})
    """
    if isinstance(x, (str, bytes)) or x is None:
        return {}
    node = _node(type(x))
    if node is not None and node.children is not None:
        return node.children(x)
    if isinstance(x, tuple):
        return x._asdict() if _isnamedtuple(x) else dict(enumerate(x))
    if isinstance(x, list):
        return dict(enumerate(x))
    if isinstance(x, Mapping):
        return dict(x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
    return {}


def isleaf(x: Any) -> bool:
    """isleaf(x) -> True when ``x`` has no children (the default ``exclude`` of fmap).

    Example:
        >>> isleaf(1.0), isleaf([1.0]), isleaf([])
        (True, False, True)
    """
    return not children(x)


def child_getter(x: Any) -> Any:
    """child_getter(x) -> ``get(node, key)``, reading one child of a node of ``x``'s type."""
    if isinstance(x, (Mapping, list)) or ispositional(x):
        return operator.getitem
    node = _node(type(x))
    if node is not None and node.getter is not None:
        return node.getter(x)
    return getattr


def wrapper_name(x: Any) -> str | None:
    """wrapper_name(x) -> the attribute a transparent wrapper holds its node under
    (DDP's ``"module"``), left out of key paths; ``None`` for any other node."""
    node = _node(type(x))
    return node.wrapper(x) if node is not None and node.wrapper is not None else None


def ispositional(x: Any) -> bool:
    """ispositional(x) -> True for plain tuples and lists (a state tree keeps them so)."""
    if not isinstance(x, (tuple, list)) or _isnamedtuple(x):
        return False
    node = _node(type(x))
    return node is None or node.children is None


def rebuild(x: T, new_children: Mapping) -> T:
    """rebuild(x, new_children) -> a node like ``x`` with the given children replaced (the
    others kept); ``x`` is never mutated, a dataclass or registered class copied, never
    re-initialised.

    Raises:
        ValueError: when a key is not one of ``x``'s children.

    Example:
        >>> rebuild((1, 2, 3), {1: 20}), rebuild({"w": 1.0, "b": 2.0}, {"b": 0.0})
        ((1, 20, 3), {'w': 1.0, 'b': 0.0})
    """
    old = children(x)
    unknown = [k for k in new_children if k not in old]
    if unknown:
        raise ValueError(f"cannot rebuild {type(x).__name__}: it has no child {unknown[0]!r}; "
                         f"its keys are {list(old)}")
    if not new_children:
        return x
    node = _node(type(x))
    if node is not None and node.rebuild is not None:
        return node.rebuild(x, new_children)
    if isinstance(x, tuple):
        vals = [new_children.get(k, v) for k, v in old.items()]
        return type(x)(*vals) if _isnamedtuple(x) else type(x)(vals)
    if isinstance(x, Mapping) and not isinstance(x, list):
        return _rebuild_mapping(x, old, new_children)
    return _copied(x, new_children, operator.setitem if isinstance(x, list) else None)


def _copied(x: Any, new_children: Mapping, put: Callable | None = None) -> Any:
    """A copy of ``x`` (never re-initialised) with some attributes (or items) set."""
    y = copy.copy(x)
    for k, v in new_children.items():
        (put or object.__setattr__)(y, k, v)
    return y


def _rebuild_mapping(x: Mapping, old: dict, new_children: Mapping) -> Mapping:
    """A Mapping like ``x``: a dict subclass's copy written, any other built from its items."""
    items = {k: new_children.get(k, v) for k, v in old.items()}
    if type(x) is dict:
        return items
    with contextlib.suppress(TypeError, ValueError):  # (an immutable dict: constructed below)
        if isinstance(x, dict) and (y := copy.copy(x)) is not x:
            for k, v in new_children.items():
                y[k] = v
            return y
    try:
        return type(x)(items)
    except TypeError as err:
        raise TypeError(f"cannot rebuild a {type(x).__name__}: a Mapping other than a dict "
                        f"is rebuilt as {type(x).__name__}(dict_of_items), which failed "
                        f"({err}); give it a constructor taking a mapping") from err


def rebuild_(x: T, new_children: Mapping) -> T:
    """rebuild_(x, new_children) -> ``x`` itself, written, where it is a cell made to be
    written (a flax ``nnx.Variable``), else :func:`rebuild`'s new node."""
    node = _node(type(x))
    if node is not None and node.assign is not None and node.assign(x, new_children):
        return x
    return rebuild(x, new_children)


def register(cls: type, children: Iterable[str] | None = None,
             trainable: Iterable[str] | None = None) -> type:
    """register(cls, children=None, trainable=None) -> cls, now a node of the tree protocol.

    Args:
        cls: the class whose instances become nodes.
        children: the attribute names that are children; ``None`` means all instance
            attributes (``vars(x)``).
        trainable: the names of the children an optimiser may train; ``None``: all.

    Example:
        >>> class Affine:
        ...     def __init__(self, w, b):
        ...         self.w, self.b = w, b
        >>> _ = register(Affine, trainable=("w",))
        >>> children(Affine(1.0, 2.0)), trainable(Affine(1.0, 2.0))
        ({'w': 1.0, 'b': 2.0}, ('w',))
    """
    names, train = (None if v is None else tuple(v) for v in (children, trainable))
    if names is not None and train is not None and not set(train) <= set(names):
        raise ValueError(f"trainable {train} names children that {cls.__name__} lacks; "
                         f"its children are {names}")
    return register_node(cls, Node(
        children=lambda x: {n: getattr(x, n) for n in (vars(x) if names is None else names)},
        rebuild=_copied, trainable=lambda x, kids: train, mutable=True))


def register_node(cls: type, node: Node) -> type:
    """register_node(cls, node) -> cls, its instances (and subclasses') read through ``node``."""
    _REGISTRY[cls] = node
    _FOUND.clear()
    return cls


def functor(cls: type | None = None, *, children: Iterable[str] | None = None,
            trainable: Iterable[str] | None = None) -> Any:
    """@functor or @functor(children=..., trainable=...): :func:`register` as a decorator.

    Example:
        >>> @functor(trainable=("beta", "gamma"))
        ... class Norm:
        ...     def __init__(self, n):
        ...         self.beta, self.gamma, self.mu = [0.0] * n, [1.0] * n, [0.0] * n
        >>> trainable(Norm(2))
        ('beta', 'gamma')
    """
    if cls is None:
        return lambda c: register(c, children, trainable)
    return register(cls, children, trainable)


def trainable(x: Any) -> tuple:
    """trainable(x) -> the keys of ``x``'s children that an optimiser may train.

    By default all keys. A class declares a subset with :func:`register` /
    :func:`functor`, or ``__trainable__`` (the key names, or a method returning them). A
    legacy ``__trainable__`` returning child *values* is converted by identity, with a
    ``DeprecationWarning``. An ``nn.Module`` trains its parameters that have
    ``requires_grad`` and its submodules, never its buffers.

    Example:
        >>> class BatchNorm:
        ...     __trainable__ = ("beta", "gamma")
        ...     def __init__(self):
        ...         self.beta = self.mu = (0.0,)   # one object, two names
        ...         self.gamma = (1.0,)
        >>> _ = register(BatchNorm)
        >>> trainable(BatchNorm())
        ('beta', 'gamma')
    """
    kids = children(x)
    if getattr(type(x), "__trainable__", None) is not None:
        declared = x.__trainable__
        return _as_keys(x, kids, tuple(declared() if callable(declared) else declared))
    node = _node(type(x))
    found = node.trainable(x, kids) if node is not None and node.trainable is not None else None
    if found is not None:
        return found
    backends.check_trainable(x, kids)  # (flax warns for a linen variables dict)
    return tuple(kids)


def keys_shown(keys: Iterable, most: int = 8, show: Callable[[Any], str] = repr) -> str:
    """keys_shown(keys, most=8) -> the first ``most`` keys, then how many in all, as text."""
    keys = list(keys)
    more = f", ... ({len(keys)} in all)" if len(keys) > most else ""
    return ", ".join(show(k) for k in keys[:most]) + more


def _as_keys(x: Any, kids: dict, declared: tuple) -> tuple:
    with contextlib.suppress(TypeError):  # (an unhashable item: a value, not a key)
        if all(item in kids for item in declared):
            return declared
    warnings.warn(f"__trainable__ of {type(x).__name__} returned child values; return the "
                  f"child keys instead (one of [{keys_shown(kids)}]): values are matched by "
                  f"identity, which confuses two children holding the same object",
                  DeprecationWarning, stacklevel=3)
    ids = {id(item) for item in declared}
    return tuple(k for k, v in kids.items() if id(v) in ids)


def isnumeric(x: Any) -> bool:
    """isnumeric(x) -> True for a floating or complex array of NumPy, PyTorch or JAX (0-d
    too), never for integer and boolean arrays or scalars.

    Example:
        >>> isnumeric(np.zeros(3)), isnumeric(np.zeros(3, int)), isnumeric(1.0)
        (True, False, False)
    """
    lib = backends.library(x)
    return lib is not None and backends.ops(lib).isfloating(x)


def maywrite(x: Any) -> bool:
    """maywrite(x) -> True when the array ``x`` may be overwritten in place: writable NumPy
    arrays and PyTorch tensors, not JAX and read-only NumPy arrays.

    Example:
        >>> a = np.zeros(2)
        >>> maywrite(a), maywrite(a.view()), a.setflags(write=False), maywrite(a)
        (True, True, None, False)
    """
    lib = backends.library(x)
    return lib is not None and backends.ops(lib).maywrite(x)


_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), type, frozenset, range,
              types.FunctionType, types.BuiltinFunctionType, types.MethodType,
              types.ModuleType, type(Ellipsis))


def ismutable(x: Any) -> bool:
    """ismutable(x) -> whether ``x`` can change after creation, so that identity means a tie.

    Writable arrays, lists, dicts and ordinary objects are; JAX arrays, read-only NumPy
    arrays, tuples, numbers, strings and frozen dataclasses holding nothing mutable are not.

    Example:
        >>> ismutable(np.zeros(2)), ismutable((1, 2)), ismutable([1, 2])
        (True, False, True)
    """
    lib = backends.library(x)
    if lib is not None:
        return backends.ops(lib).maywrite(x)
    if isinstance(x, _IMMUTABLE):
        return False
    node = _node(type(x))
    if node is not None and node.mutable is not None:
        return node.mutable
    if isinstance(x, (tuple, types.MappingProxyType)):
        return False
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        params = getattr(type(x), "__dataclass_params__", None)
        if params is not None and params.frozen:
            return any(ismutable(c) for c in children(x).values())
    return True

