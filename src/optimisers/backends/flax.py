"""flax: nnx Modules and Variables as nodes of the tree protocol (a module of its data
attributes, keyed as ``nnx.grad`` keys its ``State``; a Variable of its ``"value"``, trainable
when an ``nnx.Param``), and a warning for linen's variables. Imports flax only when asked."""

from __future__ import annotations

import copy
import functools
import sys
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["children", "child", "rebuild", "assign", "trainable", "check_trainable",
           "register_nodes"]

_VALUE = "value"  # the one child of a Variable
_LINEN_STATE = ("batch_stats", "cache")  # linen collections that are not parameters
_KIND: dict[type, str | None] = {}  # type -> "module", "variable" or None


def _kind(x: Any) -> str | None:
    cls = type(x)
    if cls in _KIND:
        return _KIND[cls]
    nnx = sys.modules.get("flax.nnx")
    kind = None if nnx is None else "variable" if issubclass(cls, nnx.Variable) else (
        "module" if issubclass(cls, nnx.Pytree) else None)
    if nnx is not None or not cls.__module__.startswith("flax."):
        _KIND[cls] = kind  # (a flax type met before flax.nnx was imported is asked again)
    return kind


def children(x: Any) -> dict:
    """children(x) -> a Variable's ``{"value": value}``, or a module's data attributes, sorted."""
    if _kind(x) == "variable":
        return {_VALUE: x.get_value()}
    kids = {_key(x, name): v for name, v in vars(x).items() if _isdata(x, name)}
    return {k: kids[k] for k in sorted(kids)}


def child(x: Any, key: Any) -> Any:
    """child(x, key) -> ``children(x)[key]`` (not ``getattr``: it fails on ``nnx.List``)."""
    if _kind(x) == "variable":
        if key != _VALUE:
            raise KeyError(key)
        return x.get_value()
    return vars(x)[str(key)]


def _isdata(x: Any, name: str) -> bool:
    if name.startswith("_pytree__"):
        return False  # (Module(pytree=False): every other attribute counts)
    return not type(x)._pytree__is_pytree or bool(vars(x)["_pytree__nodes"].get(name, False))


def _key(x: Any, name: str) -> Any:
    return int(name) if type(x)._pytree__has_int_keys and name.isdigit() else name


def rebuild(x: Any, new_children: Mapping) -> Any:
    """rebuild(x, new_children) -> a copy of ``x`` (a module's without ``__init__``, with a
    fresh nnx state, as ``jax.tree.unflatten`` makes it)."""
    if _kind(x) == "variable":
        return x.copy(new_children[_VALUE]) if new_children else x
    y = copy.copy(x)  # its __dict__ copied, without nnx's __setattr__ or __init__
    state = vars(x)["_pytree__state"]
    vars(y)["_pytree__state"] = type(state)(state.initializing, state.is_setup)
    for k, v in new_children.items():
        vars(y)[str(k)] = v
    return y


def assign(x: Any, new_children: Mapping) -> bool:
    """assign(x, new_children) -> whether ``x`` is a Variable (then holding the new value)."""
    if _kind(x) != "variable":
        return False
    if new_children:
        x.set_value(new_children[_VALUE])
    return True


def trainable(x: Any, kids: dict) -> tuple | None:
    """trainable(x, kids) -> an ``nnx.Param``'s value, a module's children but bare arrays."""
    kind = _kind(x)
    if kind == "variable":
        return (_VALUE,) if isinstance(x, sys.modules["flax.nnx"].Param) else ()
    if kind == "module":
        from optimisers.backends import library

        return tuple(k for k, v in kids.items() if library(v) is None)
    return None


def check_trainable(x: Any, kids: dict) -> None:
    """check_trainable(x, kids): warn of a linen ``variables`` dict (its batch_stats trained)."""
    found = [c for c in _LINEN_STATE if c in kids]
    if isinstance(x, Mapping) and "params" in kids and found:
        warnings.warn(f"this looks like a flax.linen variables dict (collections 'params' and "
                      f"{found[0]!r}): all of it would be trained, the {found[0]} too. Pass "
                      f"variables['params'] instead, e.g. setup(rule, variables['params']), "
                      f"and keep the other collections for model.apply", UserWarning, stacklevel=5)


def register_nodes() -> None:
    """register_nodes(): nnx's Modules and Variables as nodes, once ``flax.nnx`` is imported."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None:
        _register(nnx)


@functools.cache  # once
def _register(nnx: Any) -> None:
    from optimisers.tree import Node, register_node

    node = Node(children=children, rebuild=rebuild, trainable=trainable,
                getter=lambda x: child, assign=assign)  # (getattr warns for a Variable)
    register_node(nnx.Variable, node)
    register_node(nnx.Pytree, node)
    if hasattr(nnx, "Dict"):
        register_node(nnx.Dict, Node(trainable=trainable))
