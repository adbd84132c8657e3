"""state_dict and load_state_dict: a state tree as one flat dict, for the checkpointers of
the array libraries (``torch.distributed.checkpoint``, orbax).

Each Leaf, once at its first path, gives ``"<path>.rule"`` (the form :func:`save` writes),
``"<path>.frozen"``, ``"<path>.clock"`` (optional on load) and ``"<path>.state"`` or
``"<path>.state.0"``, ``"<path>.state.2.1"``, ... for each item of a state that is not
``None``. Loading builds the keys from the tree, never parses them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.checkpoint._codec import STANDARD, Invalid, Reader, Writer, functions
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, leaves
from optimisers.rules import Rule

__all__ = ["state_dict", "load_state_dict"]


def state_dict(tree: Any) -> dict:
    """state_dict(tree) -> dict: the state tree as a flat dict keyed by dotted paths.

    Arrays are the tree's very objects (sharded ones as they are); rules, numbers and flags
    plain values. A tied Leaf is given once, at its first path.

    Args:
        tree: a state tree from :func:`setup`.

    Returns:
        A new dict; its arrays are the tree's own.

    Raises:
        TypeError: ``tree`` is not a state tree, or a rule holds what a checkpoint cannot
            store or an array hyper-parameter of more than one number.
        ValueError: two Leafs would give the same key (a model key holding a dot).

    Example:
        >>> import numpy as np
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
        items = [("rule", rule_form(leaf.rule, kp)), ("frozen", bool(leaf.frozen)),
                 ("clock", int(leaf.clock))]
        _map(lambda v, k, items=items: v is None or items.append((k, v.item() if isinstance(
            v, np.generic) else v)), leaf.state, "state")  # NumPy scalars as Python numbers
        for name, value in items:
            key = _key(kp, name)
            if key in out:
                raise ValueError(f"two Leafs give the state dict key {key!r} (the second at "
                                 f"{kp!r}): a key of the model holds a dot")
            out[key] = value
    return out


def rule_form(rule: Rule, kp: KeyPath = KeyPath()) -> dict:
    """rule_form(rule) -> the plain, JSON-able form of ``rule`` that :func:`save` writes (a
    hyper-parameter in a 0-d array, as ``jax.jit`` leaves them, as its number).

    Args:
        rule: a rule.
        kp: its path, for messages.

    Returns:
        ``{"rule": <class name>, "fields": {...}}``.

    Raises:
        TypeError: the rule holds what a checkpoint cannot store, or an array hyper-parameter
            of more than one number.

    Example:
        >>> from optimisers import Descent
        >>> rule_form(Descent(0.5))
        {'rule': 'Descent', 'fields': {'eta': {'float': '0.5'}}}
    """
    return _Plain().value(rule, kp, "the rule")


def _first_paths(tree: Any) -> Iterator[tuple[KeyPath, Leaf]]:
    seen: set[int] = set()
    for kp, leaf in leaves(tree):
        if id(leaf) not in seen:
            seen.add(id(leaf))
            yield kp, leaf


def _key(kp: KeyPath, name: str) -> str:
    return f"{kp}.{name}" if kp else name


class _Plain(Writer):
    """A :class:`Writer` that gives each array (a 0-d one of a standard dtype) as its number."""

    def array(self, a: Any, kp: KeyPath, where: str) -> Any:
        arr, name = backends.ops(backends.library(a) or "numpy").host(a, where)
        if arr.shape != () or name not in STANDARD:
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
        >>> import numpy as np
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
        leaf.state = _map(lambda v, _: v() if isinstance(v, _Write) else v, state, "")
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
    key, clock = _key(kp, "clock"), None
    if key in d:
        clock = _take(d, key, used, "")
        if isinstance(clock, (bool, np.bool_)) or not isinstance(clock, (int, np.integer)) \
                or clock < 0:
            raise ValueError(f"the state dict's {key!r} is {clock!r:.40}; a clock is a whole "
                             f"number >= 0")
        clock = int(clock)
    state = _map(lambda v, k: _state(v, d, k, used), leaf.state, _key(kp, "state"))
    return rule, bool(frozen), clock, state


def _rule(form: Any, like: Rule, kp: KeyPath, key: str) -> Rule:
    """The rule from its form, by the checkpoint's reader: its classes compared with
    ``like``'s before it is built; ``like`` itself when equal."""
    form = rule_form(form, kp) if isinstance(form, Rule) else form
    reader = Reader(None, None)
    reader.functions = functions(like)
    try:
        rule = reader.value(form, like, kp)
    except Invalid as err:
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
    if like is None:
        if d.get(key) is not None:
            raise ValueError(f"the state dict's {key!r} is {_shown(d[key])}, but the tree "
                             f"holds None there")
        used.add(key)
        return None
    v = _take(d, key, used, "an item of a state")
    if backends.library(like) is not None:
        xp, lib = backends.of(like), backends.library(v)
        if lib is None and xp.shape(like) == () and _isnumber(v) or lib is not None and (
                backends.ops(lib).shape(v), backends.ops(lib).dtype_name(v)) == (
                xp.shape(like), xp.dtype_name(like)):
            return _Write(like, v)
        raise ValueError(f"the state dict's {key!r} is {_shown(v)}, but the tree holds an "
                         f"array of shape {xp.shape(like)} and dtype {xp.dtype_name(like)} "
                         f"there")
    if _isnumber(like) and not isinstance(v, bool) and (
            _isnumber(v) or backends.library(v) is not None and tuple(v.shape) == ()):
        return type(like)(v.item() if hasattr(v, "item") else v)
    if type(v) is type(like):
        return v
    raise ValueError(f"the state dict's {key!r} is {_shown(v)}, but the tree holds "
                     f"{_shown(like)} there")


class _Write:
    """An array of the tree to write from the dict's value (in place where it may be)."""

    def __init__(self, dst: Any, value: Any) -> None:
        self.dst, self.value = dst, value

    def __call__(self, *_: Any) -> Any:
        if self.value is self.dst:  # loaded into in place already (a checkpointer's load)
            return self.dst
        xp = backends.of(self.dst)
        return xp.assign(self.dst, xp.cast(self.value, self.dst))


def _map(f: Any, x: Any, key: str) -> Any:
    """``f(item, key)`` for each item of a state, its tuples, lists and dicts rebuilt."""
    if not isinstance(x, (tuple, list, dict)):
        return f(x, key)
    items = {k: _map(f, v, f"{key}.{k}") for k, v in (
        x.items() if isinstance(x, dict) else enumerate(x))}
    if isinstance(x, dict) or isinstance(x, list):
        return items if isinstance(x, dict) else list(items.values())
    return type(x)._make(items.values()) if hasattr(type(x), "_make") else tuple(
        items.values())


def _shown(v: Any) -> str:
    lib = backends.library(v)
    if lib is not None:
        xp = backends.ops(lib)
        return f"an array of shape {xp.shape(v)} and dtype {xp.dtype_name(v)}"
    return f"the {type(v).__name__} {v!r:.40}"


def _isnumber(v: Any) -> bool:
    return isinstance(v, (int, float, complex, np.number)) and not isinstance(v, bool)
