"""Phase one of an update: gather.

Walks the state tree, the model and the gradient trees together, validating everything
(every error names its KeyPath) and summing the gradients that reach a tied Leaf by
several paths, before anything is written. :class:`_Plan` keeps what one such walk
learned about a (tree, model) pair, so that the next ``update_`` of a training loop
checks it by identity instead of walking again.
"""

from __future__ import annotations

import functools
import itertools
import numbers
import operator
import sys
from collections.abc import Mapping
from typing import Any

from optimisers import backends
from optimisers.fused import in_group
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, _not_a_tree, writes
from optimisers.tree import _ismodule, children, isnumeric, ispositional, keys_shown


def _what(x: Any) -> str:
    lib = backends.library(x)
    if lib is not None:
        xp = backends.ops(lib)
        return f"an array of dtype {xp.dtype_name(x)} and shape {xp.shape(x)}"
    return f"a {type(x).__name__}"


class _Entry:
    """One Leaf to step: its parameter, the gradients (summed over ties), its paths, and
    the other arrays that the model holds at other paths to it (a tie declared by the
    tree alone: the result must reach them too)."""

    __slots__ = ("leaf", "x", "grads", "paths", "others")

    def __init__(self, leaf: Leaf, x: Any, grads: list, kp: KeyPath) -> None:
        self.leaf, self.x, self.grads, self.paths, self.others = leaf, x, grads, [kp], []


def _grad_array(g: Any, x: Any, kp: KeyPath) -> Any:
    """Check one gradient against its parameter and cast it to the parameter's dtype."""
    xp = backends.of(x)
    lib = backends.library(g)
    if lib is None:
        if children(g) or isinstance(g, Mapping):
            raise ValueError(f"gradient at {kp!r} is a {type(g).__name__} with children, but "
                             f"the parameter there is {_what(x)}: the gradient tree's "
                             f"structure does not match the model")
        kind = "number" if isinstance(g, numbers.Number) else type(g).__name__
        raise TypeError(f"gradient at {kp!r} is a {kind}, but an array of shape "
                        f"{xp.shape(x)} is needed there")
    gxp = backends.ops(lib)
    if not gxp.isnumber(g):
        raise TypeError(f"gradient at {kp!r} has dtype {gxp.dtype_name(g)}, which is not a "
                        f"number type")
    if gxp.shape(g) != xp.shape(x):
        raise ValueError(f"gradient at {kp!r} has shape {gxp.shape(g)} but the parameter has "
                         f"shape {xp.shape(x)}")
    return xp.cast(g, x)


def _grad_children(g: Any, kids: dict, x: Any, kp: KeyPath) -> Mapping | None:
    """The children of a gradient node, checked against the model's children ``kids``."""
    if g is None:
        return None
    gk = g if isinstance(g, Mapping) else children(g)
    if not gk and not isinstance(g, Mapping):
        raise ValueError(f"gradient at {kp!r} is {_what(g)}, but the model has a "
                         f"{type(x).__name__} with keys [{keys_shown(kids)}] there: the gradient "
                         f"tree's structure does not match the model")
    extra = [k for k in gk if k not in kids]
    if extra:
        raise ValueError(f"gradient at {kp!r} has key {extra[0]!r}, which the model lacks; "
                         f"the model's keys there are [{keys_shown(kids)}]")
    if not isinstance(g, Mapping) and len(gk) != len(kids):
        raise ValueError(f"gradient at {kp!r} has {len(gk)} children but the model has "
                         f"{len(kids)}; pass a dict to give gradients for some of them")
    return gk


def _add(plan: dict, leaf: Leaf, x: Any, grads: list, kp: KeyPath) -> None:
    """Add one path's gradients for ``leaf``: a second path to a tied Leaf sums them.

    The tree is trusted: a Leaf reached by several paths is a tie even where the model
    holds different (equal-shaped) arrays there, as a tree built by hand may say; the
    first path's array is stepped and the result placed at every path."""
    entry = plan.get(id(leaf))
    if entry is None:
        plan[id(leaf)] = _Entry(leaf, x, grads, kp)
        return
    if entry.x is not x:
        xp = backends.of(entry.x)
        if backends.library(x) != backends.library(entry.x) or xp.shape(x) != xp.shape(entry.x):
            raise ValueError(f"the Leaf at {kp!r} is shared with {entry.paths[0]!r} (a tie), "
                             f"but the model holds {_what(x)} there and {_what(entry.x)} at "
                             f"{entry.paths[0]!r}; make the tree again with setup(rule, model)")
        if all(o is not x for o in entry.others):
            entry.others.append(x)
        grads = [None if g is None else xp.cast(g, entry.x) for g in grads]
    entry.grads = [a if b is None else b if a is None else backends.of(x).add(a, b)
                   for a, b in zip(entry.grads, grads)]
    entry.paths.append(kp)


def _gather(t: Any, x: Any, gs: tuple, kp: KeyPath, plan: dict) -> None:
    """Phase one: validate tree, model and gradients together; fill ``plan``."""
    if t is None:
        return
    if isinstance(t, Leaf):
        if not isnumeric(x):
            raise ValueError(f"the state tree has a Leaf at {kp!r}, but the model has "
                             f"{_what(x)} there; make the tree with setup(rule, model)")
        if gs[0] is None:
            return
        grads = [None if g is None else _grad_array(g, x, kp) for g in gs]
        if not t.frozen:
            _add(plan, t, x, grads, kp)
        return
    if type(t) not in (dict, tuple, list):
        raise _not_a_tree(t, kp)
    kids = children(x)
    keys = tuple(t) if isinstance(t, dict) else tuple(range(len(t)))
    if set(keys) != set(kids) or len(keys) != len(kids):
        model_has = _what(x) if not kids else f"[{keys_shown(kids)}]"
        raise ValueError(f"the state tree at {kp!r} has keys [{keys_shown(keys)}], but the model "
                         f"has {model_has} there; make the tree with setup(rule, model) for "
                         f"this model")
    gks = [_grad_children(g, kids, x, kp) for g in gs]
    for k in keys:
        _gather(t[k], kids[k], tuple(None if gk is None else gk.get(k) for gk in gks),
                kp + (k,), plan)


_SHAPE, _DTYPE = operator.attrgetter("shape"), operator.attrgetter("dtype")


_FROZEN, _RULE, _STATE = (operator.attrgetter(a) for a in ("frozen", "rule", "state"))


def _first_leaf(t: Any) -> Leaf | None:
    while not isinstance(t, Leaf):
        if isinstance(t, dict):
            t = next((v for v in t.values() if v is not None), None)
        elif isinstance(t, (tuple, list)):
            t = next((v for v in t if v is not None), None)
        else:
            return None
    return t


def _getter(x: Any) -> Any:
    """How to read a child of ``x`` by key, for nodes of ``x``'s type."""
    if isinstance(x, (Mapping, list)) or ispositional(x):
        return operator.getitem
    if _ismodule(x):
        return backends.ops("torch").child_getter(x)
    if sys.modules.get("flax") is not None and backends.ops("flax").isnode(x):
        return backends.ops("flax").child  # (getattr warns for a Variable's value)
    return getattr


class _Plan:
    """What a slow gather learned about one (tree, model) pair, checked and reused.

    ``update_`` on the same tree and model, the usual training loop, then costs a few
    identity checks per node and per array instead of a walk through the tree protocol:
    the tree and model edges are compared by identity (so any replaced child, added key
    or new array sends the step back to the slow, fully validating gather, which also
    gives the precise errors), and gradients are read by precomputed keys.
    """

    __slots__ = ("tree", "model", "edges", "sizes", "prog", "slots", "specs", "tied",
                 "groups", "group", "firsts", "columns", "seen")

    def __init__(self, tree: Any, model: Any) -> None:
        self.tree, self.model = tree, model
        self.groups: list = []  # the fused groups of the last step (see fused.Group)
        self.group = None  # the one group of every Leaf, if that is what the last step ran
        self.seen = -1  # leaf.writes() after this plan's last step
        self.edges: list = []  # (fetch, keys, children) per node of tree and model
        self.sizes: list = []  # (container, len) for containers that may grow
        self.slots: list = []  # (leaf, x, keypath) per path to a Leaf, in walk order
        self.prog = self._compile(tree, model, KeyPath())
        self.specs = [(backends.of(x).gradtype(x), x.shape, x.dtype)
                      for _, x, _ in self.slots]
        self.columns = tuple(map(list, zip(*self.specs))) if self.specs else ([], [], [])
        self.tied = len({id(leaf) for leaf, _, _ in self.slots}) < len(self.slots)
        # For update_(tree, module): which slots read a parameter's .grad, as
        # module_grads does (the first path to each tensor); None for other models.
        self.firsts = None
        if "torch" in sys.modules and backends.ops("torch").hasmodule(model):
            seen: set[int] = set()
            self.firsts = [id(x) not in seen and not seen.add(id(x))
                           for _, x, _ in self.slots]

    def _compile(self, t: Any, x: Any, kp: KeyPath) -> Any:
        if isinstance(t, Leaf):
            self.slots.append((t, x, kp))
            return len(self.slots) - 1
        kids, get = children(x), _getter(x)
        self.sizes.append((t, len(t)))
        if isinstance(x, (dict, list)):
            self.sizes.append((x, len(x)))
        keys = tuple(t) if isinstance(t, dict) else tuple(range(len(t)))
        used = tuple(k for k in keys if t[k] is not None)
        self._edges(t, operator.getitem, keys, [t[k] for k in keys])
        self._edges(x, get, used, [kids[k] for k in used])
        leaf_keys, leaf_slots, nodes = [], [], []
        for k in used:
            sub = self._compile(t[k], kids[k], kp + (k,))
            if type(sub) is int:
                leaf_keys.append(k)
                leaf_slots.append(sub)
            else:
                nodes.append((k, sub))
        positional = isinstance(x, (tuple, list))
        # a list or tuple of arrays, each a Leaf: its gradients land in out[lo:lo + n]
        span = leaf_slots[0] if leaf_slots and leaf_slots == list(
            range(leaf_slots[0], leaf_slots[0] + len(leaf_slots))) else None
        whole = span is not None and positional and leaf_keys == list(range(len(kids)))
        # the leaf gradients of a node read by one C call: from a gradient of the model's
        # own type, and from a dict
        many = len(leaf_keys) > 1
        items = operator.itemgetter(*leaf_keys) if many else None
        pick = (items if get is operator.getitem else
                operator.attrgetter(*leaf_keys) if many and get is getattr and all(
                    isinstance(k, str) and "." not in k for k in leaf_keys) else None)
        return (type(x), get, tuple(leaf_keys), tuple(leaf_slots), tuple(nodes),
                frozenset(kids), positional, len(kids), span if whole else None,
                pick, items, span)

    def _edges(self, node: Any, get: Any, keys: tuple, kids: list) -> None:
        """Note ``node``'s children at ``keys``; a whole list or tuple is compared as it
        is (its length is checked with :attr:`sizes`), without a lookup per key."""
        if isinstance(node, (list, tuple)) and keys == tuple(range(len(node))):
            self.edges.append((None, node, kids))
        else:
            self.edges.append((node.__getitem__ if get is operator.getitem
                               else functools.partial(get, node), keys, kids))

    def learn(self, groups: list) -> None:
        """Keep the fused groups of the last step; note a single group of every Leaf."""
        self.groups = groups
        self.seen = writes()  # every Leaf is as this step left it (see whole)
        one = groups[0] if len(groups) == 1 else None
        self.group = one if (
            one is not None and one.write and not self.tied and not one.rule.raises()
            and len(one.leaves) == len(self.slots)
            and all(map(operator.is_, one.leaves, (leaf for leaf, _, _ in self.slots)))
        ) else None

    def whole(self, per_tree: list) -> bool:
        """Step the single group of every Leaf (see :meth:`learn`) when each has a plain
        gradient and its Leaf is as the group left it; ``False`` (nothing done) if not."""
        group = self.group
        if group is None or len(per_tree) != 1:
            return False
        gs, leaves = per_tree[0], group.leaves
        txs, shapes, dtypes = self.columns
        # the checks of entries() and fused.Group.holds, a column at a time; the Leafs'
        # only when some Leaf was written since this plan's last step
        if (not all(map(operator.is_, map(type, gs), txs))  # a None too: never a grad type
                or list(map(_SHAPE, gs)) != shapes or list(map(_DTYPE, gs)) != dtypes
                or group.moved()
                or self.seen != writes() and (
                    any(map(_FROZEN, leaves))
                    or not all(map(operator.is_, map(_RULE, leaves),
                                   itertools.repeat(group.rule)))
                    or not all(map(operator.is_, map(_STATE, leaves), group.states)))):
            return False
        with backends.nograd():
            try:
                group.run(gs, {})
            except (ValueError, TypeError, ArithmeticError) as err:
                err.add_note(in_group([kp for _, _, kp in self.slots], group.rule))
                raise
        self.seen = writes()
        return True

    def read(self, tree: Any, model: Any, grads: tuple) -> list | None:
        """Each gradient tree's gradients listed by slot, or ``None`` when anything
        differs from what was learned."""
        if tree is not self.tree or model is not self.model:
            return None
        try:
            for fetch, keys, kids in self.edges:
                if not all(map(operator.is_, keys if fetch is None else map(fetch, keys),
                               kids)):
                    return None
        except (KeyError, IndexError, AttributeError):  # a child was removed
            return None
        for c, n in self.sizes:
            if len(c) != n:
                return None
        if grads is _DOTGRAD:
            if self.firsts is None:
                return None
            return [[x.grad if first and x.is_leaf else None
                     for (_, x, _), first in zip(self.slots, self.firsts)]]
        per_tree = []
        for g in grads:
            out = [None] * len(self.slots)
            if type(self.prog) is int:
                out[0] = g
            elif not _read(self.prog, g, out):
                return None
            per_tree.append(out)
        return per_tree

    def entries(self, per_tree: list) -> list:
        """The entries of a step, from each gradient tree's gradients listed by slot."""
        if len(per_tree) == 1 and not self.tied:  # the common case, kept tight
            entries = []
            for (leaf, x, kp), (tx, sx, dx), g in zip(self.slots, self.specs, per_tree[0]):
                if g is None:
                    continue
                if type(g) is not tx or g.shape != sx or g.dtype != dx:
                    g = _grad_array(g, x, kp)
                if not leaf.frozen:
                    entries.append(_Entry(leaf, x, [g], kp))
            return entries
        plan: dict[int, _Entry] = {}
        for i, ((leaf, x, kp), (tx, sx, dx)) in enumerate(zip(self.slots, self.specs)):
            gs = [out[i] for out in per_tree]
            if gs[0] is None:
                continue
            gs = [g if g is None or type(g) is tx and g.shape == sx and g.dtype == dx
                  else _grad_array(g, x, kp) for g in gs]
            if not leaf.frozen:
                _add(plan, leaf, x, gs, kp)
        return list(plan.values())


def _read(prog: tuple, g: Any, out: list) -> bool:
    """Read the gradients of a compiled node into ``out``; ``False`` if ``g`` looks
    unlike what was learned (the slow gather then says exactly what is wrong)."""
    if g is None:
        return True
    cls, get, leaf_keys, leaf_slots, nodes, known, positional, n, lo, pick, items, span = prog
    if lo is not None and type(g) is cls:  # a list or tuple of arrays, as learned
        if len(g) != n:
            return False
        out[lo:lo + n] = g
        return True
    if isinstance(g, Mapping):
        if not g.keys() <= known:
            return False
        fetch = g.get
        try:
            values = items(g) if items is not None else map(fetch, leaf_keys)
        except KeyError:  # a key left out: no gradient there
            values = map(fetch, leaf_keys)
    elif type(g) is not cls or positional and len(g) != n:
        return False
    else:
        fetch = g.__getitem__ if get is operator.getitem else functools.partial(get, g)
        values = pick(g) if pick is not None else map(fetch, leaf_keys)
    if span is not None:
        out[span:span + len(leaf_keys)] = values
    else:
        for slot, v in zip(leaf_slots, values):
            out[slot] = v
    for k, sub in nodes:
        if not _read(sub, fetch(k), out):
            return False
    return True


def nest_dotted(g: Any, model: Any) -> Any:
    """A gradient dict keyed by dotted paths, as PyTorch users hold them
    (``{name: p.grad for name, p in module.named_parameters()}``), as the nested dicts
    that mirror the model; any other gradient as it is.

    Keys that are children of ``model`` stay as they are; a dotted key is followed down
    the model's children, a part naming a child key exactly or, for a positional
    child, by its number. A key that leads nowhere is left for the gather's error.

    Example:
        >>> import numpy as np
        >>> model = {"enc": [np.ones(2), np.ones(3)], "b": np.ones(1)}
        >>> nest_dotted({"enc.1": 0.5, "b": 1.0}, model)
        {'enc': {1: 0.5}, 'b': 1.0}
    """
    if not isinstance(g, Mapping) or not g:
        return g
    kids = children(model)
    if all(type(k) is not str or k in kids or "." not in k for k in g):
        return g
    out: dict = {}
    for key, v in g.items():
        path = _path(model, key) if type(key) is str and key not in kids else None
        if path is None:
            out[key] = v
            continue
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ValueError(f"gradient key {key!r} runs into another gradient given "
                                 f"for {k!r}; give each parameter's gradient once")
        node[path[-1]] = v
    return out


def _path(model: Any, dotted: str) -> tuple | None:
    """The key path that a dotted name spells in ``model``, or ``None``."""
    path, x = [], model
    for part in dotted.split("."):
        kids = children(x)
        key = part if part in kids else int(part) if part.isdigit() and int(part) in kids \
            else None
        if key is None and _ismodule(x) and part == backends.ops("torch").wrapper_name(x):
            continue  # torch.compile's "_orig_mod.", DDP's "module.": no part of key paths
        if key is None:
            return None
        path.append(key)
        x = kids[key]
    return tuple(path)


_DOTGRAD = ()  # as the gradients of _update: each parameter's .grad (see update_)


def _module_grads(model: Any) -> Any:
    """The gradient tree of a PyTorch model's ``.grad``s; a TypeError for other models."""
    if "torch" in sys.modules and backends.ops("torch").hasmodule(model):
        return backends.ops("torch").module_grads(model)
    raise TypeError("update_(tree, model, grads) needs the gradients; only a "
                    "torch.nn.Module model may leave them out (its .grad is read)")
