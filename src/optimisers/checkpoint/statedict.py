"""state_dict and load_state_dict: a state tree as one flat dict, for the checkpointing of
the array libraries (``torch.distributed.checkpoint``, orbax), which save a model's
arrays each process its own part, reshard them on load, and load into the arrays given.

Each Leaf (once, at its first path in walk order, as ties are stored) gives the keys

- ``"<path>.rule"``: the rule in the JSON-able form that :func:`~optimisers.save` writes
  (``{"rule": "Adam", "fields": {...}}``), a plain value;
- ``"<path>.frozen"``: its frozen flag;
- ``"<path>.clock"``: the steps its rule has taken (an ``int``; read as optional, a dict
  without it leaving the Leaf's clock as it is);
- ``"<path>.state"``, or ``"<path>.state.0"``, ``"<path>.state.2.1"``, ... for each item of
  a state of tuples, lists and dicts: the library's own arrays as they are (PyTorch's
  ``DTensor``, JAX's sharded arrays: never gathered) and numbers as plain Python values.

``<path>`` is the dotted key path (``layers.0.weight``); a state item that is ``None`` has
no key. The tree that loads a dict says what to expect: keys are built from it, never
parsed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.checkpoint._format import Invalid
from optimisers.checkpoint._read import Reader, functions
from optimisers.checkpoint._write import Writer
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, leaves
from optimisers.rules import Rule

__all__ = ["state_dict", "load_state_dict"]


def state_dict(tree: Any) -> dict:
    """state_dict(tree) -> dict: the state tree as a flat dict keyed by dotted paths.

    Arrays stay the library's own, the very objects of the tree (sharded ones as they
    are, so that ``torch.distributed.checkpoint.save`` writes each process's part, and
    ``load`` writes into them in place); rules, numbers and frozen flags are plain values
    (the keys: :mod:`optimisers.checkpoint.statedict`). A tied Leaf is given once, at its
    first path.

    Args:
        tree: a state tree from :func:`setup`.

    Returns:
        A new dict; its arrays are the tree's own.

    Raises:
        TypeError: ``tree`` is not a state tree, or a rule holds something that a
            checkpoint cannot store (see :func:`save`), or an array hyper-parameter that
            is not a single number.
        ValueError: two Leafs would give the same key (a dict key holding a dot).

    Example:
        >>> import numpy as np
        >>> from optimisers import Adam, setup, update_
        >>> model = {"w": np.ones(2)}
        >>> tree, model = update_(setup(Adam(0.1), model), model, {"w": np.ones(2)})
        >>> d = state_dict(tree)
        >>> list(d)
        ['w.rule', 'w.frozen', 'w.clock', 'w.state.0', 'w.state.1', 'w.state.2']
        >>> d["w.state.0"] is tree["w"].state[0], d["w.state.2"], d["w.frozen"], d["w.clock"]
        (True, 1.0, False, 1)
        >>> d["w.rule"]["rule"], d["w.rule"]["fields"]["eta"]
        ('Adam', {'float': '0.1'})
    """
    out: dict = {}
    for kp, leaf in _first_paths(tree):
        for key, value in _entries(leaf, kp):
            if key in out:
                raise ValueError(f"two Leafs give the state dict key {key!r} (the second at "
                                 f"{kp!r}): a key of the model holds a dot")
            out[key] = value
    return out


def _first_paths(tree: Any) -> Iterator[tuple[KeyPath, Leaf]]:
    """Each Leaf of the tree once, with its first path in walk order."""
    seen: set[int] = set()
    for kp, leaf in leaves(tree):
        if id(leaf) not in seen:
            seen.add(id(leaf))
            yield kp, leaf


def _key(kp: KeyPath, name: str) -> str:
    return f"{kp}.{name}" if kp else name


def _entries(leaf: Leaf, kp: KeyPath) -> Iterator[tuple[str, Any]]:
    yield _key(kp, "rule"), rule_form(leaf.rule, kp)
    yield _key(kp, "frozen"), bool(leaf.frozen)
    yield _key(kp, "clock"), int(leaf.clock)
    yield from _items(leaf.state, _key(kp, "state"))


def _items(v: Any, key: str) -> Iterator[tuple[str, Any]]:
    """The ``(key, value)`` of each item of a state: arrays as they are, NumPy scalars as
    Python numbers, nothing for ``None``."""
    if isinstance(v, (tuple, list)):
        for i, item in enumerate(v):
            yield from _items(item, f"{key}.{i}")
    elif isinstance(v, dict):
        for k, item in v.items():
            yield from _items(item, f"{key}.{k}")
    elif isinstance(v, np.generic):
        yield key, v.item()
    elif v is not None:
        yield key, v


def rule_form(rule: Rule, kp: KeyPath = KeyPath()) -> dict:
    """rule_form(rule) -> the rule as the plain, JSON-able value that :func:`save` writes
    (a hyper-parameter held in a 0-d array, as ``jax.jit`` leaves them, as its number).

    Raises:
        TypeError: the rule holds what a checkpoint cannot store, or an array of more than
            one number.

    Example:
        >>> from optimisers import Descent
        >>> rule_form(Descent(0.5))
        {'rule': 'Descent', 'fields': {'eta': {'float': '0.5'}}}
    """
    writer = Writer()
    form = writer.value(rule, kp, "the rule")
    return _numbers(form, writer.arrays, kp) if writer.arrays else form


def _numbers(j: Any, arrays: list, kp: KeyPath) -> Any:
    """The JSON form with each array record replaced by its single number."""
    if isinstance(j, list):
        return [_numbers(v, arrays, kp) for v in j]
    if not isinstance(j, dict):
        return j
    if "array" not in j:
        return {k: _numbers(v, arrays, kp) for k, v in j.items()}
    a = arrays[j["array"]]
    if a.shape != () or "bits" in j:
        raise TypeError(f"cannot put the rule at {kp!r} in a state dict: a hyper-parameter "
                        f"holds an array of shape {a.shape} and dtype {j['dtype']}; give a "
                        f"number")
    v = a.item()
    if isinstance(v, float):
        return {"float": repr(v)}
    if isinstance(v, complex):
        return {"complex": [repr(v.real), repr(v.imag)]}
    return v


def load_state_dict(tree: Any, d: Mapping) -> Any:
    """load_state_dict(tree, d) -> tree: the state tree with rules, frozen flags and
    states from a dict that :func:`state_dict` made (or a checkpointer restored).

    In place, as ``torch.optim``'s: each state array of ``tree`` is written from ``d``
    where it may be (nothing to do for one that ``torch.distributed.checkpoint.load``
    already loaded into), a JAX array replaced; numbers, rules (rebuilt from the registry
    :data:`RULES`, never from a name imported at the dict's wish), frozen flags and clocks
    are set on each Leaf. Everything is checked before anything is written.

    Args:
        tree: a state tree for the same model, from :func:`setup`: it says what keys,
            rule classes, shapes and dtypes to expect.
        d: the dict, e.g. ``state_dict(tree)`` of a tree trained elsewhere.

    Returns:
        ``tree``, its Leafs updated.

    Raises:
        ValueError: a key is missing or left over, or an entry does not match ``tree``
            (rule class, array shape or dtype, kind of value); the message names the key.
        TypeError: ``tree`` is not a state tree.

    Example:
        >>> import numpy as np
        >>> from optimisers import Adam, setup, update_
        >>> model = {"w": np.ones(2)}
        >>> trained, _ = update_(setup(Adam(0.1), model), model, {"w": np.ones(2)})
        >>> fresh = load_state_dict(setup(Adam(), {"w": np.ones(2)}), state_dict(trained))
        >>> fresh["w"].rule, fresh["w"].state[2] == trained["w"].state[2]
        (Adam(eta=0.1, beta=(0.9, 0.999), epsilon=1e-08), True)
    """
    if not isinstance(d, Mapping):
        raise TypeError(f"load_state_dict(tree, d) takes a dict second, got "
                        f"{type(d).__name__}; e.g. load_state_dict(tree, state_dict(other))")
    used: set[str] = set()
    loads = [_read_leaf(leaf, kp, d, used) for kp, leaf in _first_paths(tree)]
    extra = [k for k in d if k not in used]
    if extra:
        raise ValueError(f"the state dict has keys that the tree lacks: "
                         f"{', '.join(map(repr, extra[:5]))} ({len(extra)} in all); it was "
                         f"made for another model or rule")
    for leaf, rule, frozen, clock, state in loads:
        leaf.rule, leaf.frozen, leaf.state = rule, frozen, _written(state)
        if clock is not None:
            leaf.clock = clock
    return tree


class _Pending:
    """An array of the tree to be written from the dict's value, once all is checked."""

    __slots__ = ("dst", "value")

    def __init__(self, dst: Any, value: Any) -> None:
        self.dst, self.value = dst, value

    def write(self) -> Any:
        if self.value is self.dst:  # loaded into in place already (a checkpointer's load)
            return self.dst
        xp = backends.of(self.dst)
        return xp.assign(self.dst, xp.cast(self.value, self.dst))


def _written(state: Any) -> Any:
    """The state with each pending array written (in place where it may be)."""
    if isinstance(state, _Pending):
        return state.write()
    if isinstance(state, dict):
        return {k: _written(v) for k, v in state.items()}
    if isinstance(state, (tuple, list)):
        return _rebuilt(state, [_written(v) for v in state])
    return state


def _rebuilt(like: Any, items: list) -> Any:
    if isinstance(like, list):
        return items
    return type(like)._make(items) if hasattr(type(like), "_make") else tuple(items)


def _take(d: Mapping, key: str, used: set, what: str) -> Any:
    if key not in d:
        raise ValueError(f"the state dict has no {key!r}, which the tree needs ({what}); "
                         f"it was made for another model or rule")
    used.add(key)
    return d[key]


def _read_leaf(leaf: Leaf, kp: KeyPath, d: Mapping, used: set) -> tuple:
    """``(leaf, rule, frozen, clock, state)`` for one Leaf, all checked; nothing written."""
    key = _key(kp, "rule")
    rule = _rule(_take(d, key, used, f"the rule at {kp!r}"), leaf.rule, kp, key)
    key = _key(kp, "frozen")
    frozen = _take(d, key, used, f"the frozen flag at {kp!r}")
    if not isinstance(frozen, (bool, np.bool_)):
        raise ValueError(f"the state dict's {key!r} is {frozen!r:.40}; a frozen flag is a bool")
    state = _state(leaf.state, d, _key(kp, "state"), used)
    return leaf, rule, bool(frozen), _clock(kp, d, used), state


def _rule(form: Any, like: Rule, kp: KeyPath, key: str) -> Rule:
    """The rule from its form, by the checkpoint's own reader: its class (and those inside
    it) compared with ``like``'s before it is built; ``like`` itself when equal."""
    form = rule_form(form, kp) if isinstance(form, Rule) else _tag_first(form)
    reader = Reader.__new__(Reader)  # the checkpoint's reader of values: of rules, not files
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


def _tag_first(form: Any) -> Any:
    """A rule's form with each ``{"rule": ..., "fields": ...}`` (and schedule's) tag first
    again, as the reader takes it: a checkpointer may give dicts back with sorted keys."""
    if isinstance(form, list):
        return [_tag_first(v) for v in form]
    if not isinstance(form, dict):
        return form
    first = [k for k in ("rule", "schedule") if k in form]
    return {k: _tag_first(form[k]) for k in (*first, *(k for k in form if k not in first))}


def _clock(kp: KeyPath, d: Mapping, used: set) -> int | None:
    key = _key(kp, "clock")
    if key not in d:
        return None
    used.add(key)
    v = d[key]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ValueError(f"the state dict's {key!r} is {v!r:.40}; a clock is a whole number "
                         f">= 0")
    return int(v)


def _state(like: Any, d: Mapping, key: str, used: set) -> Any:
    """``like``'s state with each item from ``d`` (arrays as :class:`_Pending` writes),
    each checked against ``like``'s."""
    if isinstance(like, (tuple, list)):
        return _rebuilt(like, [_state(v, d, f"{key}.{i}", used) for i, v in enumerate(like)])
    if isinstance(like, dict):
        return {k: _state(v, d, f"{key}.{k}", used) for k, v in like.items()}
    if like is None:
        if d.get(key) is not None:
            raise ValueError(f"the state dict's {key!r} is {_shown(d[key])}, but the tree "
                             f"holds None there")
        used.add(key)
        return None
    v = _take(d, key, used, "an item of a state")
    if backends.library(like) is not None:
        return _Pending(like, _array_like(like, v, key))
    return _plain_like(like, v, key)


def _shown(v: Any) -> str:
    lib = backends.library(v)
    if lib is not None:
        xp = backends.ops(lib)
        return f"an array of shape {xp.shape(v)} and dtype {xp.dtype_name(v)}"
    return f"the {type(v).__name__} {v!r:.40}"


def _array_like(like: Any, v: Any, key: str) -> Any:
    """``v`` checked to stand for the array ``like``: an array of its shape and dtype, or a
    number for a 0-d one."""
    xp = backends.of(like)
    lib = backends.library(v)
    if lib is None:
        if xp.shape(like) == () and _isnumber(v):
            return v
    elif (backends.ops(lib).shape(v), backends.ops(lib).dtype_name(v)) == (
            xp.shape(like), xp.dtype_name(like)):
        return v
    raise ValueError(f"the state dict's {key!r} is {_shown(v)}, but the tree holds an array "
                     f"of shape {xp.shape(like)} and dtype {xp.dtype_name(like)} there")


def _isnumber(v: Any) -> bool:
    return isinstance(v, (int, float, complex, np.number)) and not isinstance(v, bool)


def _plain_like(like: Any, v: Any, key: str) -> Any:
    """``v`` as a value of ``like``'s type: a number from a number or a 0-d array (a
    checkpointer may give either), anything else only of the very type."""
    if _isnumber(like) and not isinstance(v, bool) and (
            _isnumber(v) or backends.library(v) is not None and tuple(v.shape) == ()):
        return type(like)(v.item() if hasattr(v, "item") else v)
    if type(v) is type(like):
        return v
    raise ValueError(f"the state dict's {key!r} is {_shown(v)}, but the tree holds "
                     f"{_shown(like)} there")
