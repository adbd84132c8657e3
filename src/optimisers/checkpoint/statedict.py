"""state_dict and load_state_dict: a state tree as one flat dict, for the checkpointers of
the array libraries (``torch.distributed.checkpoint``, orbax). Each Leaf, once at its first
path, gives ``"<path>.rule"`` (the form :func:`save` writes), ``"<path>.frozen"``,
``"<path>.clock"`` (optional on load) and ``"<path>.state"`` or ``"<path>.state.0"``,
``"<path>.state.2.1"``, ... for each item of a state that is not ``None``. Loading builds the
keys from the tree, never parses them."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.backends.common import mapstate
from optimisers.checkpoint import _codec as codec
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, leaves
from optimisers.rules import Rule

__all__ = ["state_dict", "load_state_dict"]


def state_dict(tree: Any) -> dict:
    """state_dict(tree) -> dict: the state tree as a flat dict keyed by dotted paths.

    Args:
        tree: a state tree from :func:`setup`; a tied Leaf is given once, at its first path.

    Returns:
        A new dict of plain rules, numbers and flags, and the tree's very arrays (sharded
        ones as they are).

    Raises:
        TypeError: ``tree`` is not a state tree, or a rule holds what a checkpoint cannot
            store or an array hyper-parameter of more than one number.
        ValueError: two Leafs would give the same key (a model key holding a dot).

    Example:
        >>> from optimisers import Adam, setup, update_
        >>> model = {"w": np.ones(2)}
        >>> tree, model = update_(setup(Adam(0.1), model), model, {"w": np.ones(2)})
        >>> d = state_dict(tree)
        >>> list(d)
        ['w.rule', 'w.frozen', 'w.clock', 'w.state.0', 'w.state.1', 'w.state.2']
        >>> d["w.state.0"] is tree["w"].state[0], d["w.state.2"], d["w.rule"]["rule"]
        (True, 1.0, 'Adam')
    """
    out: dict = {}
    for kp, leaf in _first_paths(tree):
        items = {"rule": rule_form(leaf.rule, kp), "frozen": bool(leaf.frozen),
                 "clock": int(leaf.clock)}
        mapstate(lambda v, k, items=items: v is None or items.update({k: v.item() if isinstance(
            v, np.generic) else v}), leaf.state, "state")  # NumPy scalars as Python numbers
        for name, value in items.items():
            if (key := _key(kp, name)) in out:
                raise ValueError(f"two Leafs give the state dict key {key!r} (the second at "
                                 f"{kp!r}): a key of the model holds a dot")
            out[key] = value
    return out


def rule_form(rule: Rule, kp: KeyPath = KeyPath()) -> dict:
    """The JSON-able form of ``rule`` that :func:`save` writes, 0-d arrays as numbers."""
    return _Plain().value(rule, kp, "the rule")


def _first_paths(tree: Any) -> Iterator[tuple[KeyPath, Leaf]]:
    firsts: dict[int, tuple[KeyPath, Leaf]] = {}
    for kp, leaf in leaves(tree):
        firsts.setdefault(id(leaf), (kp, leaf))
    return iter(firsts.values())


def _key(kp: KeyPath, name: str) -> str:
    return f"{kp}.{name}" if kp else name


class _Plain(codec.Writer):
    """A Writer that gives each array (a 0-d one of a standard dtype) as its number."""

    def array(self, a: Any, kp: KeyPath, where: str) -> Any:
        arr, name = backends.ops(backends.library(a) or "numpy").host(a, where)
        if arr.shape != () or name not in codec.STANDARD:
            raise TypeError(f"cannot put the rule at {kp!r} in a state dict: a hyper-parameter "
                            f"holds an array of shape {arr.shape} and dtype {name}; give a "
                            f"number")
        return self.value(arr.item(), kp, where)


def load_state_dict(tree: Any, d: Mapping) -> Any:
    """load_state_dict(tree, d) -> tree: the state tree with rules, frozen flags, clocks and
    states from a dict that :func:`state_dict` made (or a checkpointer restored).

    In place, as ``torch.optim``'s: once everything is checked, each state array is written
    from ``d`` (a JAX array replaced; nothing to do for one a checkpointer loaded into), and
    rules (rebuilt from :data:`RULES`), flags and clocks set.

    Args:
        tree: a state tree for the same model: it says what to expect.
        d: the dict, e.g. ``state_dict(tree)`` of a tree trained elsewhere.

    Returns:
        ``tree``, its Leafs updated.

    Raises:
        ValueError: a key is missing or left over, or does not fit ``tree`` (named).
        TypeError: ``tree`` is not a state tree, or ``d`` is not a mapping.

    Example:
        >>> from optimisers import Adam, setup, update_
        >>> model = {"w": np.ones(2)}
        >>> trained, _ = update_(setup(Adam(0.1), model), model, {"w": np.ones(2)})
        >>> fresh = load_state_dict(setup(Adam(), {"w": np.ones(2)}), state_dict(trained))
        >>> fresh["w"].rule.eta, fresh["w"].state[2] == trained["w"].state[2]
        (0.1, True)
    """
    if not isinstance(d, Mapping):
        raise TypeError(f"load_state_dict(tree, d) takes a dict second, got "
                        f"{type(d).__name__}; e.g. load_state_dict(tree, state_dict(other))")
    used: set[str] = set()
    loads = [(leaf, *_read_leaf(leaf, kp, d, used)) for kp, leaf in _first_paths(tree)]
    extra = [k for k in d if k not in used]
    if extra:
        raise ValueError(f"the state dict has keys that the tree lacks: "
                         f"{', '.join(map(repr, extra[:5]))} ({len(extra)} in all); it was "
                         f"made for another model or rule")
    for leaf, rule, frozen, clock, state in loads:
        leaf.rule, leaf.frozen = rule, frozen
        leaf.state = mapstate(lambda v, _: v() if isinstance(v, functools.partial) else v, state)
        if clock is not None:
            leaf.clock = clock
    return tree


def _take(d: Mapping, key: str, used: set, what: str) -> Any:
    if key not in d:
        raise ValueError(f"the state dict has no {key!r}, which the tree needs ({what}); "
                         f"it was made for another model or rule")
    used.add(key)
    return d[key]


def _read_leaf(leaf: Leaf, kp: KeyPath, d: Mapping, used: set) -> tuple:
    """``(rule, frozen, clock, state)`` for one Leaf, all checked; nothing written."""
    key = _key(kp, "rule")
    rule = _rule(_take(d, key, used, f"the rule at {kp!r}"), leaf.rule, kp, key)
    key = _key(kp, "frozen")
    frozen = _take(d, key, used, f"the frozen flag at {kp!r}")
    if not isinstance(frozen, (bool, np.bool_)):
        raise ValueError(f"the state dict's {key!r} is {frozen!r:.40}; a frozen flag is a bool")
    key, clock = _key(kp, "clock"), d.get(_key(kp, "clock"))
    if key in d and (isinstance(clock, (bool, np.bool_)) or not isinstance(
            _take(d, key, used, ""), (int, np.integer)) or clock < 0):
        raise ValueError(f"the state dict's {key!r} is {clock!r:.40}; a clock is a whole "
                         f"number >= 0")
    state = mapstate(lambda v, k: _state(v, d, k, used), leaf.state, _key(kp, "state"))
    return rule, bool(frozen), None if clock is None else int(clock), state


def _rule(form: Any, like: Rule, kp: KeyPath, key: str) -> Rule:
    """The rule from its form, checked against ``like`` before it is built; ``like`` if equal."""
    form = rule_form(form, kp) if isinstance(form, Rule) else form
    reader = codec.Reader(None, None)
    reader.functions = codec.functions(like)
    try:
        rule = reader.value(form, like, kp)
    except codec.Invalid as err:
        raise ValueError(f"the state dict's {key!r} does not fit the tree: {err}") from None
    except (LookupError, AttributeError, TypeError) as err:
        raise ValueError(f"the state dict's {key!r} is not a rule's form ({type(err).__name__}: "
                         f"{err}); state_dict writes it") from None
    try:
        return like if bool(rule == like) else rule
    except (TypeError, ValueError):  # array hyper-parameters compare element by element
        return rule


def _state(like: Any, d: Mapping, key: str, used: set) -> Any:
    """An item of ``like``'s state from ``d``, checked: an array as a write to make later."""
    v = d.get(key) if like is None else _take(d, key, used, "an item of a state")
    if like is None and v is None:
        return used.add(key)
    if backends.library(like) is not None and (  # the same shape and dtype, or a number
            codec.describe(v) == codec.describe(like) or backends.library(v) is None
            and backends.of(like).shape(like) == () and codec.isnumber(v)):
        return functools.partial(_write, like, v)
    if backends.library(like) is None and codec.isnumber(like) and codec.isnumber(v):
        return type(like)(v.item() if hasattr(v, "item") else v)
    if like is not None and backends.library(like) is None and type(v) is type(like):
        return v
    raise ValueError(f"the state dict's {key!r} is {codec.describe(v)}, but the tree holds "
                     f"{codec.describe(like)} there")


def _write(dst: Any, value: Any) -> Any:
    """``dst`` written from ``value`` (in place where it may be); itself if loaded into."""
    xp = backends.of(dst)
    return dst if value is dst else xp.assign(dst, xp.cast(value, dst))
