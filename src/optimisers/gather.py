"""Phase one of an update: validate tree, model and gradients together, and sum the
gradients of tied Leafs, before anything is written (``plan.py`` caches what it learned)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from optimisers import backends
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, not_a_tree
from optimisers.tree import children, isnumeric, keys_shown, wrapper_name
from optimisers.walk import enter


def _what(x: Any) -> str:
    lib = backends.library(x)
    if lib is not None:
        xp = backends.ops(lib)
        return f"an array of dtype {xp.dtype_name(x)} and shape {xp.shape(x)}"
    return f"a {type(x).__name__}"


class Entry:
    """One Leaf to step: its parameter, gradients (summed over ties), paths, and the other
    arrays the model holds at its other paths (a tie declared by the tree alone)."""

    __slots__ = ("leaf", "x", "grads", "paths", "others")

    def __init__(self, leaf: Leaf, x: Any, grads: list, kp: KeyPath) -> None:
        self.leaf, self.x, self.grads, self.paths, self.others = leaf, x, grads, [kp], []


def grad_array(g: Any, x: Any, kp: KeyPath) -> Any:
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


def add(plan: dict, leaf: Leaf, x: Any, grads: list, kp: KeyPath) -> None:
    """Add one path's gradients for ``leaf``; a tied Leaf's second path sums them (the first
    path's array is stepped, the result placed at every path)."""
    entry = plan.get(id(leaf))
    if entry is None:
        plan[id(leaf)] = Entry(leaf, x, grads, kp)
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


def gather(tree: Any, model: Any, grads: tuple) -> list[Entry]:
    """The entries of one update, each Leaf to step once, all validated (errors name the
    KeyPath), tied Leafs' gradients summed; frozen or gradient-less Leafs have none."""
    found: dict[int, Entry] = {}
    _gather(tree, model, grads, KeyPath(), found, {})
    return list(found.values())


def pair(tree: Any, model: Any) -> list[Entry]:
    """An entry without gradients for every Leaf, frozen ones too, checked as :func:`gather`
    checks and each state against its parameter (:func:`check_fit`)."""
    entries = gather(tree, model, ())
    for e in entries:
        check_fit(e)
    return entries


def check_fit(e: Entry) -> None:
    """A ValueError when the Leaf's state was not made for its parameter (resized,
    replaced or cast after ``setup``)."""
    found = e.leaf.rule.misfit(e.leaf.state, e.x)
    if found is not None:
        have, need = (f"dtype {v}" if isinstance(v, str) else f"shape {v}" for v in found)
        raise ValueError(
            f"the Leaf at {e.paths[0]!r} holds state of {have}, but the parameter there "
            f"has {need}: it changed after setup. Make the tree again with "
            f"setup(rule, model), or start that part afresh with "
            f"reinit(tree, model, where={str(e.paths[0])!r})")


def _gather(t: Any, x: Any, gs: tuple, kp: KeyPath, plan: dict, inside: dict) -> None:
    """Validate tree, model and gradients together; fill ``plan`` (``gs == ()``: every Leaf)."""
    if t is None:
        return
    if isinstance(t, Leaf):
        if not isnumeric(x):
            raise ValueError(f"the state tree has a Leaf at {kp!r}, but the model has "
                             f"{_what(x)} there; make the tree with setup(rule, model)")
        if gs and gs[0] is None:
            return
        grads = [None if g is None else grad_array(g, x, kp) for g in gs]
        if not t.frozen or not gs:
            add(plan, t, x, grads, kp)
        return
    if not isinstance(t, (dict, tuple, list)):
        raise not_a_tree(t, kp)
    enter(kp, t, inside, "the state tree")
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
                kp + (k,), plan, inside)
    del inside[id(t)]


def nest_dotted(g: Any, model: Any) -> Any:
    """A gradient dict keyed by dotted paths (``named_parameters()``'s) as nested dicts like
    the model; any other gradient (or a key that leads nowhere) as it is."""
    if not isinstance(g, Mapping) or not g:
        return g
    kids = children(model)
    if all(type(k) is not str or k in kids or "." not in k for k in g):
        return g
    out: dict = {}
    ours: set[int] = {id(out)}  # the dicts made here, which may be written
    for key, v in g.items():
        path = _path(model, key) if type(key) is str and key not in kids else None
        _put(out, path or (key,), v, key, ours)
    return out


def _put(node: dict, path: tuple, v: Any, key: Any, ours: set) -> None:
    """Put ``v`` (given under ``key``) at ``path`` below ``node``, merging into copies."""
    for k in path[:-1]:
        sub = node.get(k)
        if sub is None or isinstance(sub, Mapping) and id(sub) not in ours:
            fresh = dict(sub) if sub is not None else {}
            ours.add(id(fresh))
            node[k] = sub = fresh
        elif id(sub) not in ours:
            raise ValueError(f"gradient key {key!r} runs into the gradient given for {k!r}; "
                             f"give each parameter's gradient once")
        node = sub
    last = path[-1]
    if last not in node:
        node[last] = v
    elif isinstance(v, Mapping) and id(node[last]) in ours:
        for k, w in v.items():  # a plain key's mapping, where dotted keys went first
            _put(node[last], (k,), w, key, ours)
    else:
        raise ValueError(f"gradient key {key!r} gives a gradient already given by another "
                         f"key; give each parameter's gradient once")


def _path(model: Any, dotted: str) -> tuple | None:
    """The key path that a dotted name spells in ``model``, or ``None``."""
    path, x = [], model
    for part in dotted.split("."):
        kids = children(x)
        key = part if part in kids else int(part) if part.isdigit() and int(part) in kids \
            else None
        if key is None and part == wrapper_name(x):
            continue  # torch.compile's "_orig_mod.", DDP's "module.": no part of key paths
        if key is None:
            return None
        path.append(key)
        x = kids[key]
    return tuple(path)


DOTGRAD = ()  # as the gradients of _update: each parameter's .grad (see update_)


def module_grads(model: Any) -> Any:
    """The gradient tree of a PyTorch model's ``.grad``s; a TypeError for other models."""
    lib = backends.carries_grads(model)
    if lib is not None:
        return backends.ops(lib).module_grads(model)
    raise TypeError("update_(tree, model, grads) needs the gradients; only a "
                    "torch.nn.Module model may leave them out (its .grad is read)")
