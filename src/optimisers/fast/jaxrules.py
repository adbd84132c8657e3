"""JAX pytrees of the rules and schedules (``fast/jaxtree.py`` registers them with ``Leaf``
and the state tree's roots).

A rule's hyper-parameters (its ``float`` fields, and ``tuple`` fields such as ``beta``) are
pytree *children*, so ``adjust`` of a learning rate passes new data to a jitted update
without re-tracing it; its other fields (``bool``, ``int``, dtypes, and fields declared
with ``metadata={"static": True}``) are static auxiliary data, and nested rules are
children. A schedule's numbers are all children, ints included. Python numbers among the
children are flattened as weakly typed 0-d arrays, so they are data under
``equinox.filter_jit`` too.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import GetAttrKey

from optimisers.schedules import Schedule

__all__ = ["dynamic", "raw", "register_rule", "register_subclasses"]

_REGISTERED: set[type] = set()


_DATA_TYPES = ("float", "tuple", "Rule", "Array")


def _isdata(field: dataclasses.Field) -> bool:
    """Whether a rule's field travels as pytree data (a child) rather than static aux.

    Decided by the field's declaration alone, never by its value (``jax.tree.map`` may
    put anything at a leaf, and the structure must not change): ``float``, ``tuple``
    (such as ``beta``, or a chain's rules) and ``Rule`` fields are data; ``bool``,
    ``int`` and anything else (``Any``: a dtype) are static, as is a field declared with
    ``dataclasses.field(metadata={"static": True})``; one declared with ``{"data": True}``
    is data (a traced value of any type).
    """
    if field.metadata.get("static"):
        return False
    if field.metadata.get("data"):
        return True
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    return any(t in kind for t in _DATA_TYPES)


@functools.cache
def _layout(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The names of ``cls``'s data fields and of its static fields (``None``: not a
    dataclass, so the rule is static as a whole). A schedule's fields are all data but its
    flags (declared ``static``): its formula never branches in Python on its numbers, ints
    included, so an ``adjust`` to other numbers never re-traces."""
    if not dataclasses.is_dataclass(cls):
        return None
    fields = dataclasses.fields(cls)
    data = (lambda f: not f.metadata.get("static")) if issubclass(cls, Schedule) else _isdata
    return (tuple(f.name for f in fields if data(f)),
            tuple(f.name for f in fields if not data(f)))


_AS_IS: set[type] = set()


def dynamic(v: Any) -> Any:
    """A Python number (in tuples too) as a weakly typed 0-d JAX array: traced data under
    ``equinox.filter_jit`` too, which would make it static and re-trace when it changes."""
    if type(v) in _AS_IS or getattr(_RAW, "on", False):  # arrays and tracers: kept fast
        return v
    if type(v) is tuple:  # a state, or beta: arrays inline, no call for them
        new = tuple([e if type(e) in _AS_IS else dynamic(e) for e in v])
        return v if all(map(operator.is_, new, v)) else new  # (kept: nothing to make)
    if isinstance(v, jax.Array):
        _AS_IS.add(type(v))
        return v
    if isinstance(v, (bool, np.bool_)):
        return v
    if isinstance(v, (float, np.floating)):
        return jnp.asarray(float(v))
    if isinstance(v, (int, np.integer)):
        return jnp.asarray(int(v))
    return v


def _split(rule: Any) -> tuple[tuple, list, tuple]:
    cls = type(rule)
    layout = _layout(cls)
    if layout is None:
        return (), [], (("", rule),)
    data, static = layout
    return (data, [dynamic(getattr(rule, n)) for n in data],
            tuple((n, getattr(rule, n)) for n in static))


def _flatten_rule(rule: Any) -> tuple[list, tuple]:
    names, kids, static = _split(rule)
    return kids, (names, static)


def _flatten_rule_with_keys(rule: Any) -> tuple[list, tuple]:
    names, kids, static = _split(rule)
    return [(GetAttrKey(n), v) for n, v in zip(names, kids)], (names, static)


def _unflatten_rule(cls: type, aux: tuple, kids: Any) -> Any:
    names, static = aux
    if static and static[0][0] == "":
        return static[0][1]  # not a dataclass: the rule itself was the aux data
    rule = object.__new__(cls)  # never re-run __init__/__post_init__ on traced values
    fields = getattr(rule, "__dict__", None)
    if fields is not None:  # a frozen dataclass: its fields set as object.__setattr__ would
        fields.update(zip(names, kids))
        fields.update(static)
        return rule
    for n, v in (*zip(names, kids), *static):  # __slots__
        object.__setattr__(rule, n, v)
    return rule


def register_rule(cls: type) -> None:
    """register_rule(cls) -> None: the rule or schedule class ``cls`` as a JAX pytree (once),
    rebuilt without re-running its checks on traced numbers.

    Example:
        >>> from optimisers import Adam, Linear
        >>> register_rule(Linear)  # done already: each class registers itself when defined
        >>> [str(v.dtype) for v in jax.tree.leaves(Linear(1.0, 0.0, 10))]
        ['float32', 'float32', 'int32']
        >>> len(jax.tree.leaves(Adam()))  # eta, beta (two), epsilon
        4
    """
    if cls in _REGISTERED:
        return
    _REGISTERED.add(cls)
    jax.tree_util.register_pytree_with_keys(
        cls, _flatten_rule_with_keys, functools.partial(_unflatten_rule, cls), _flatten_rule)


_RAW = threading.local()


def raw(rule: Any) -> tuple[list, Any]:
    """raw(rule) -> the rule's pytree leaves as they are (Python numbers kept) and its
    treedef.

    Example:
        >>> from optimisers import Descent
        >>> raw(Descent(0.5))[0]
        [0.5]
    """
    _RAW.on = True
    try:
        return jax.tree.flatten(rule)
    finally:
        _RAW.on = False


def register_subclasses(base: type) -> None:
    """register_subclasses(base) -> None: :func:`register_rule` every subclass of ``base``
    defined so far, at any depth.

    Example:
        >>> from optimisers.rules import Rule
        >>> register_subclasses(Rule)  # done already, as JAX was first seen
    """
    todo = list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        register_rule(cls)
        todo.extend(cls.__subclasses__())
