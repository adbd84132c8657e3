"""The steady-state cache of ``update_``: what one gather learned about a (tree, model)
pair (edges, arrays, fused groups), checked by identity at the next step and reused."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Mapping
from typing import Any

from optimisers import backends
from optimisers.fast.fused import in_group
from optimisers.gather import DOTGRAD, Entry, add, grad_array
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf
from optimisers.reduce import group_totals
from optimisers.tree import child_getter, children

__all__ = ["Plan", "first_leaf"]


_DTYPE, _SHAPE_DTYPE = operator.attrgetter("dtype"), operator.attrgetter("shape", "dtype")
_STATE, _CLOCK, _RULE, _FROZEN = map(operator.attrgetter, ("state", "clock", "rule", "frozen"))
_GRAD, _LEAF = operator.attrgetter("grad"), operator.attrgetter("is_leaf")


def first_leaf(t: Any) -> Leaf | None:
    """first_leaf(tree) -> the first Leaf of a state tree in walk order, or ``None``."""
    stack = [iter((t,))]  # (its own loop: a steady update_ stays out of leaf.py's walk)
    while stack:
        for t in stack[-1]:
            if isinstance(t, Leaf):
                return t
            if isinstance(t, (dict, tuple, list)):
                stack.append(iter(t.values() if isinstance(t, dict) else t))
                break
        else:
            stack.pop()
    return None


class Plan:
    """What a gather learned about one (tree, model) pair; any change found sends the step
    back to the validating gather."""

    __slots__ = ("tree", "model", "edges", "sizes", "prog", "slots", "specs", "tied",
                 "groups", "group", "firsts", "columns", "dotted", "nograd", "xs")

    def __init__(self, tree: Any, model: Any) -> None:
        self.tree, self.model = tree, model
        self.dotted = False  # gradients came as dicts of dotted names (state nests them)
        self.nograd = backends.registry.nograd_maker()  # torch.no_grad, where torch is
        self.groups: list = []  # the fused groups of the last step (see fused.Group)
        self.group = None  # the one group of every Leaf, if that is what the last step ran
        self.edges: list = []  # (fetch, keys, children, by ==) per node of tree and model
        self.sizes: list = []  # (container, len) for containers that may grow
        self.slots: list = []  # (leaf, x, keypath) per path to a Leaf, in walk order
        self.prog = self._compile(tree, model, KeyPath())
        self.xs = [x for _, x, _ in self.slots]
        self.specs = [(backends.of(x).gradtype(x), x.shape, x.dtype) for x in self.xs]
        self.columns = ([t for t, _, _ in self.specs], [(s, d) for _, s, d in self.specs],
                        [d for _, _, d in self.specs])  # types, (shape, dtype)s, dtypes
        self.tied = len({id(leaf) for leaf, _, _ in self.slots}) < len(self.slots)
        # update_(tree, module): which slots read a .grad (the first path to each tensor)
        self.firsts = None
        if backends.carries_grads(model) is not None:
            seen: set[int] = set()
            self.firsts = [id(x) not in seen and not seen.add(id(x)) for x in self.xs]
            self.firsts = True if all(self.firsts) else self.firsts  # (no tensor twice)

    def _compile(self, t: Any, x: Any, kp: KeyPath) -> Any:
        if isinstance(t, Leaf):
            self.slots.append((t, x, kp))
            return len(self.slots) - 1
        kids, get = children(x), child_getter(x)
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
        span = leaf_slots[0] if leaf_slots and leaf_slots == list(
            range(leaf_slots[0], leaf_slots[0] + len(leaf_slots))) else None
        whole = span is not None and positional and leaf_keys == list(range(len(kids)))
        many = len(leaf_keys) > 1
        items = operator.itemgetter(*leaf_keys) if many else None
        pick = (items if get is operator.getitem else
                operator.attrgetter(*leaf_keys) if many and get is getattr and all(
                    isinstance(k, str) and "." not in k for k in leaf_keys) else None)
        return (type(x), get, tuple(leaf_keys), tuple(leaf_slots), tuple(nodes),
                frozenset(kids), positional, len(kids), span if whole else None,
                pick, items, span)

    def _edges(self, node: Any, get: Any, keys: tuple, kids: list) -> None:
        """Note ``node``'s children at ``keys`` (all Leafs or ``None``: compared by ``==``)."""
        by_eq = all(k is None or isinstance(k, Leaf) for k in kids)
        bulk = getattr(get, "many", None)  # all children at once (a module's parameters)
        if bulk is not None:
            bulk = bulk(node, keys)
        elif get is operator.getitem and len(keys) > 1:  # (a dict's: by one call)
            bulk = functools.partial(operator.itemgetter(*keys), node)
        if isinstance(node, (list, tuple)) and keys == tuple(range(len(node))):
            self.edges.append((None, node, tuple(kids) if by_eq and isinstance(
                node, tuple) else kids, by_eq))
        elif bulk is not None:
            self.edges.append((bulk, None, tuple(kids), by_eq))
        else:
            self.edges.append((node.__getitem__ if get is operator.getitem
                               else functools.partial(get, node), keys, kids, by_eq))

    def learn(self, groups: list) -> None:
        """Keep the fused groups of the last step; note a single group of every Leaf."""
        self.groups = groups
        one = groups[0] if len(groups) == 1 else None
        self.group = one if (
            one is not None and one.write and not self.tied and not one.rule.raises()
            and len(one.leaves) == len(self.slots)
            and all(map(operator.is_, one.leaves, (leaf for leaf, _, _ in self.slots)))
        ) else None

    def whole(self, per_tree: list, dotgrad: bool = False) -> bool:
        """Step the single group of every Leaf if nothing changed; ``False`` (nothing done).
        ``dotgrad``: the gradients were read from the tensors' ``.grad``."""
        group = self.group
        if group is None or len(per_tree) != 1:
            return False
        gs, leaves = per_tree[0], group.leaves
        txs, specs, dtypes = self.columns
        if (not all(map(operator.is_, map(type, gs), txs))  # a None too: never a grad type
                or (list(map(_DTYPE, gs)) != dtypes if dotgrad  # (torch checks a .grad's
                    else list(map(_SHAPE_DTYPE, gs)) != specs)  # size; moved() each tensor's)
                or len(group.states) != len(leaves)  # each Leaf as the group left it:
                or not all(map(operator.is_, map(_STATE, leaves), group.states))
                or not all(map(operator.is_, map(_CLOCK, leaves), group.clocks))
                or not all(map(operator.is_, map(_RULE, leaves), itertools.repeat(group.rule)))
                or any(map(_FROZEN, leaves)) or group.moved()):
            return False
        with self.nograd():  # (the maker kept: no call into the registry per step)
            try:
                found = None  # a tree-level rule's totals, over the group (its one scope)
                if group.reduced:
                    found = group_totals(group.rule, group.t, gs, group.states,
                                         [kp for _, _, kp in self.slots])
                    if found is None:
                        return False
                group.run(gs, {}, found)
            except (ValueError, TypeError, ArithmeticError) as err:
                err.add_note(in_group([kp for _, _, kp in self.slots], group.rule))
                raise
        return True

    def read(self, tree: Any, model: Any, grads: tuple) -> list | None:
        """Each gradient tree's gradients by slot, or ``None`` when anything differs."""
        if tree is not self.tree or model is not self.model or not self._unchanged():
            return None
        if grads is DOTGRAD:
            if self.firsts is None:
                return None
            if self.firsts is True and all(map(_LEAF, self.xs)):  # (one C call a column)
                return [list(map(_GRAD, self.xs))]
            return [[x.grad if first and x.is_leaf else None
                     for x, first in zip(self.xs, self.firsts)]]
        per_tree = []
        for g in grads:
            out = [None] * len(self.slots)
            if type(self.prog) is int:
                out[0] = g
            elif not _read(self.prog, g, out):
                return None
            per_tree.append(out)
        return per_tree

    def _unchanged(self) -> bool:
        """Whether every node of the tree and the model still has the children it had."""
        try:
            for fetch, keys, kids, by_eq in self.edges:
                now = keys if fetch is None else fetch() if keys is None else map(fetch, keys)
                if by_eq:
                    same = (now if fetch is None or keys is None else list(now)) == kids
                else:
                    same = all(map(operator.is_, now, kids))
                if not same:
                    return False
        except (KeyError, IndexError, AttributeError, ValueError, TypeError, RuntimeError):
            return False
        return all(len(c) == n for c, n in self.sizes)

    def entries(self, per_tree: list) -> list:
        """The entries of a step, from each gradient tree's gradients listed by slot."""
        if len(per_tree) == 1 and not self.tied:  # the common case, kept tight
            entries = []
            for (leaf, x, kp), (tx, _, _), g in zip(self.slots, self.specs, per_tree[0]):
                if g is None:
                    continue
                if type(g) is not tx or g.shape != x.shape or g.dtype != x.dtype:
                    g = grad_array(g, x, kp)  # (x's own: it may have changed in place)
                if not leaf.frozen:
                    entries.append(Entry(leaf, x, [g], kp))
            return entries
        plan: dict[int, Entry] = {}
        for i, ((leaf, x, kp), (tx, _, _)) in enumerate(zip(self.slots, self.specs)):
            gs = [out[i] for out in per_tree]
            if gs[0] is None:
                continue
            gs = [g if g is None or type(g) is tx and g.shape == x.shape and g.dtype == x.dtype
                  else grad_array(g, x, kp) for g in gs]
            if not leaf.frozen:
                add(plan, leaf, x, gs, kp)
        return list(plan.values())


def _read(prog: tuple, g: Any, out: list) -> bool:
    """Read the gradients of a compiled node into ``out``; ``False`` if ``g`` differs."""
    if g is None:
        return True
    cls, get, leaf_keys, leaf_slots, nodes, known, positional, n, lo, pick, items, span = prog
    if lo is not None and type(g) is cls:  # a list or tuple of arrays, as learned
        if len(g) != n:
            return False
        out[lo:lo + n] = g
        return True
    found = _values(prog, g)
    if found is None:
        return False
    fetch, values = found
    if span is not None:
        out[span:span + len(leaf_keys)] = values
    else:
        for slot, v in zip(leaf_slots, values):
            out[slot] = v
    for k, sub in nodes:
        if not _read(sub, fetch(k), out):
            return False
    return True


def _values(prog: tuple, g: Any) -> tuple | None:
    """``(fetch, values)`` for ``g``'s children and leaf keys; ``None`` if ``g`` differs."""
    cls, get, leaf_keys, _, _, known, positional, n, _, pick, items, _ = prog
    if isinstance(g, Mapping):
        if not g.keys() <= known:
            return None
        try:
            return g.get, items(g) if items is not None else map(g.get, leaf_keys)
        except KeyError:  # a key left out: no gradient there
            return g.get, map(g.get, leaf_keys)
    if type(g) is not cls or positional and len(g) != n:
        return None
    fetch = g.__getitem__ if get is operator.getitem else functools.partial(get, g)
    return fetch, pick(g) if pick is not None else map(fetch, leaf_keys)
