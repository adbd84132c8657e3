"""state_dict and load_state_dict: a state tree as one flat dict, for the checkpointers of
the array libraries (``torch.distributed.checkpoint``, orbax). Each Leaf, once at its first
path, gives ``"<path>.rule"`` (the form :func:`save` writes), ``"<path>.frozen"``,
``"<path>.clock"`` (optional on load) and ``"<path>.state"`` or ``"<path>.state.0"``,
``"<path>.state.2.1"``, ... for each item of a state that is not ``None``. Loading builds the
keys from the tree, never parses them (by path, ``strict=False``: the paths of the
``"<path>.rule"`` keys)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from optimisers import backends, reduce
from optimisers.backends.common import mapstate
from optimisers.checkpoint import _codec as codec
from optimisers.checkpoint import _migrate as migration
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


def load_state_dict(tree: Any, d: Mapping, strict: bool = True, renames: Any = None,
                    migrate: Callable | None = None) -> Any:
    """load_state_dict(tree, d, strict=True) -> tree: the state tree with rules, frozen flags,
    clocks and states from a dict that :func:`state_dict` made (or a checkpointer restored);
    ``strict=False``: ``(tree, report)``.

    In place, as ``torch.optim``'s: once everything is checked, each state array is written
    from ``d`` (a JAX array replaced; nothing to do for one a checkpointer loaded into), and
    rules (rebuilt from :data:`RULES`), flags and clocks set. ``strict``, ``renames`` and
    ``migrate`` as :func:`load`'s, each Leaf's path in ``d`` the one its ``"<path>.rule"``
    key gives; ``migrate``'s ``old_state`` is rebuilt from the keys (tuples by index, dicts).

    Args:
        tree: a state tree for the same model: it says what to expect.
        d: the dict, e.g. ``state_dict(tree)`` of a tree trained elsewhere.
        strict: False to load by path what fits and report the rest (a ``LoadReport``).
        renames: with ``strict=False``, ``{"old.prefix": "new.prefix"}`` or a function.
        migrate: with ``strict=False``, ``migrate(path, old_rule, old_state, new_rule,
            new_state) -> state`` for a Leaf whose rule changed to one with another state.

    Returns:
        ``tree``, its Leafs updated; with ``strict=False``, ``(tree, report)``.

    Raises:
        ValueError: a key is missing or left over, or does not fit ``tree`` (named); with
            ``strict=False``, a rule changed to one with another state and no ``migrate``.
        TypeError: ``tree`` is not a state tree, ``d`` is not a mapping, or ``renames`` or
            ``migrate`` is of the wrong kind or given with ``strict``.

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
    migration.by_path(strict, renames, migrate)
    used: set[str] = set()
    if not strict:
        try:
            old = {k[:-5]: k[:-5] for k in d if k.endswith(".rule")} | (
                {"": ""} if "rule" in d else {})  # each Leaf's path, as its rule's key gives
            found, report = migration.match(tree, old, renames, lambda kp, leaf, path: (
                leaf, *_read_leaf(leaf, path, d, used, migrate, kp)))
        except migration.Raised as e:  # by the caller's renames or migrate
            raise e.args[0] from None
        return _write_leaves(tree, found.values()), report
    loads = [(leaf, *_read_leaf(leaf, kp, d, used)) for kp, leaf in _first_paths(tree)]
    extra = [k for k in d if k not in used]
    if extra:
        raise ValueError(f"the state dict has keys that the tree lacks: "
                         f"{', '.join(map(repr, extra[:5]))} ({len(extra)} in all); it was "
                         f"made for another model or rule")
    return _write_leaves(tree, loads)


def _write_leaves(tree: Any, loads: Iterable[tuple]) -> Any:
    """``tree``, each Leaf of ``loads`` given its rule, flag, clock and state (written)."""
    for leaf, rule, frozen, clock, state in loads:
        leaf.rule, leaf.frozen = rule, frozen
        leaf.state = mapstate(lambda v, _: v() if isinstance(v, functools.partial) else v, state)
        if clock is not None:
            leaf.clock = clock
    return tree


def _take(d: Mapping, key: str, used: set, what: str) -> Any:
    if key not in d:
        raise codec.Mismatch(f"the state dict has no {key!r}, which the tree needs ({what}); "
                             f"it was made for another model or rule")
    used.add(key)
    return d[key]


def _read_leaf(leaf: Leaf, kp: Any, d: Mapping, used: set, migrate: Any = migration.STRICT,
               new: KeyPath | None = None) -> tuple:
    """``(rule, frozen, clock, state)`` for one Leaf, all checked, from the keys of ``kp``
    (loading by path: the old path, ``new`` the Leaf's); nothing written."""
    key = _key(kp, "rule")
    rule = _rule(_take(d, key, used, f"the rule at {kp!r}"), leaf.rule, kp, key, migrate, new)
    key = _key(kp, "frozen")
    frozen = _take(d, key, used, f"the frozen flag at {kp!r}")
    if not isinstance(frozen, (bool, np.bool_)):
        raise ValueError(f"the state dict's {key!r} is {frozen!r:.40}; a frozen flag is a bool")
    key, clock = _key(kp, "clock"), d.get(_key(kp, "clock"))
    if key in d and (isinstance(clock, (bool, np.bool_)) or not isinstance(
            _take(d, key, used, ""), (int, np.integer)) or clock < 0):
        raise ValueError(f"the state dict's {key!r} is {clock!r:.40}; a clock is a whole "
                         f"number >= 0")
    clock, key = None if clock is None else int(clock), _key(kp, "state")
    if rule is leaf.rule or codec.classes(rule) == codec.classes(leaf.rule):
        return rule, bool(frozen), clock, mapstate(lambda v, k: _state(v, d, k, used),
                                                   leaf.state, key)
    copy = reduce.copier()  # the old rule: its state (copied: not d's) converted to leaf's
    old = {tuple(k[len(key) + 1:].split(".")) if k != key else (): copy(v) for k, v in d.items()
           if k == key or k.startswith(key + ".")}
    return leaf.rule, bool(frozen), clock, migration.migrated(
        migrate, new, rule, _nested(old), leaf.rule, migration.copied(leaf.state, copy))


def _nested(items: dict[tuple, Any]) -> Any:
    """A state from its items by their keys' parts: tuples by index (None where none), dicts."""
    if not items or () in items:
        return items.get(())
    heads: dict[str, dict] = {}
    for k, v in items.items():
        heads.setdefault(k[0], {})[k[1:]] = v
    if all(h.isdigit() for h in heads):
        return tuple(_nested(heads.get(str(i), {})) for i in range(1 + max(map(int, heads))))
    return {h: _nested(v) for h, v in heads.items()}


def _rule(form: Any, like: Rule, kp: KeyPath, key: str, migrate: Any = migration.STRICT,
          new: KeyPath | None = None) -> Rule:
    """The rule from its form, checked against ``like`` before it is built; ``like`` if equal.
    Loading by path, ``like`` where its classes keep the state, else the form's (to convert)."""
    form = rule_form(form, kp) if isinstance(form, Rule) else form
    reader = codec.Reader(None, None)
    reader.functions = codec.functions(like)
    try:
        old, now = (codec.classes(form, kp), codec.classes(like)) if (
            migrate is not migration.STRICT) else (None, None)
        if old != now:
            if migration.keeps_state(new, old, now, migrate):
                return like
            like = codec.FREE
        rule = reader.value(form, like, kp)
    except codec.Invalid as err:
        raise type(err)(f"the state dict's {key!r} does not fit the tree: {err}") from None
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
    raise codec.Mismatch(f"the state dict's {key!r} is {codec.describe(v)}, but the tree "
                         f"holds {codec.describe(like)} there")


def _write(dst: Any, value: Any) -> Any:
    """``dst`` written from ``value`` (in place where it may be); itself if loaded into."""
    xp = backends.of(dst)
    return dst if value is dst else xp.assign(dst, xp.cast(value, dst))
