"""The state tree: Leaf, setup, and the two update functions.

``setup`` walks the model once, asking ``trainable`` which children to enter, and
returns a tree of :class:`Leaf` objects that mirrors it. ``update`` and ``update_``
never ask ``trainable`` again: a Leaf marks a parameter to train, ``None`` anything else.
Each update runs in two phases: *gather* walks tree, model and gradients together,
validating everything and summing the gradients of tied parameters, and only then
*step* runs each Leaf's rule once. So ``update_`` writes nothing when the input is bad.
"""

from __future__ import annotations

import functools
import itertools
import numbers
import operator
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from optimisers import backends, fused
from optimisers.keypath import KeyPath
from optimisers.rules import NewValue, Rule, call
from optimisers.tree import (
    _ismodule,
    children,
    isleaf,
    ismutable,
    isnumeric,
    ispositional,
    trainable,
)
from optimisers.walk import fmap, mirror, place, substitute, walk

__all__ = ["Leaf", "setup", "update", "update_", "leaves"]


class Leaf:
    """Leaf(rule, state, frozen=False): the optimiser state of one trainable array.

    A small mutable object; its identity encodes sharing: a tied parameter has one
    Leaf, reached from every path to it. ``frozen`` Leafs are skipped by updates
    (see :func:`freeze_`). The ``repr`` shows the state by shape and dtype, never its
    numbers.

    Example:
        >>> import numpy as np
        >>> from optimisers import Adam
        >>> Leaf(Adam(), Adam().init(np.zeros((3, 2), np.float32)))
        Leaf(Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-08), (f32[3, 2], f32[3, 2], (0.9, 0.999)))
    """

    __slots__ = ("rule", "state", "frozen", "_plan")

    def __init__(self, rule: Rule, state: Any, frozen: bool = False) -> None:
        self.rule = rule
        self.state = state
        self.frozen = frozen
        self._plan = None  # set on a tree's first Leaf by update_: see _Plan

    def __repr__(self) -> str:
        frozen = ", frozen=True" if self.frozen else ""
        return f"Leaf({self.rule!r}, {brief(self.state)}{frozen})"


_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
          "complex64": "c64", "complex128": "c128", "int32": "i32", "int64": "i64",
          "bool": "bool"}


def brief(x: Any) -> str:
    """A compact text for a state: arrays as ``f32[3, 2]``, containers element by element."""
    lib = backends.library(x)
    if lib is not None:
        xp = backends.ops(lib)
        name = xp.dtype_name(x)
        return f"{_SHORT.get(name, name)}[{', '.join(map(str, xp.shape(x)))}]"
    if isinstance(x, tuple):
        inner = ", ".join(brief(v) for v in x)
        return f"({inner},)" if len(x) == 1 else f"({inner})"
    if isinstance(x, list):
        return "[" + ", ".join(brief(v) for v in x) + "]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {brief(v)}" for k, v in x.items()) + "}"
    return repr(x)


def setup(rule: Rule, model: Any) -> Any:
    """setup(rule, model) -> tree: the optimiser state tree for ``model``.

    Walks the model once. Each trainable numeric array (by :func:`trainable` and
    :func:`isnumeric`) gets ``Leaf(rule, rule.init(x))``; every other position gets
    ``None``. Keyed nodes become dicts keyed like the model, tuples stay tuples and
    lists lists, so ``tree["layers"][0]["weight"]`` addresses a Leaf. A mutable array
    reached by several paths (a tie) gets one shared Leaf.

    Args:
        rule: the optimisation rule, e.g. ``Adam()``.
        model: any nesting of arrays in tuples, lists, dicts, dataclasses, registered
            classes or ``torch.nn.Module``.

    Returns:
        The state tree, to be passed to :func:`update` / :func:`update_`.

    Raises:
        TypeError: when ``rule`` is not a :class:`Rule`.

    Example:
        >>> import numpy as np
        >>> from optimisers import Descent
        >>> w = np.ones(2)
        >>> tree = setup(Descent(), {"enc": w, "dec": w, "steps": np.arange(3)})
        >>> tree
        {'enc': Leaf(Descent(eta=0.1), None), 'dec': Leaf(Descent(eta=0.1), None), 'steps': None}
        >>> tree["enc"] is tree["dec"]
        True
    """
    if not isinstance(rule, Rule):
        raise TypeError(f"setup(rule, model) takes a Rule first, got {type(rule).__name__}; "
                        f"e.g. setup(Adam(), model)")
    made: list[Leaf] = []

    def make(kp: KeyPath, x: Any) -> Leaf | None:
        if not isnumeric(x):
            return None
        made.append(Leaf(rule, rule.init(x)))
        return made[-1]

    tree = walk(make, model, (), exclude=lambda x: isnumeric(x) or isleaf(x), cache=True,
                build=mirror, keys=trainable, skip=lambda v: None)
    fused.pack(made)
    if not made:
        warnings.warn("setup found no trainable parameter in the model: no floating-point "
                      "array sits at a trainable position", UserWarning, stacklevel=2)
    return tree


def leaves(tree: Any, kp: KeyPath = KeyPath()) -> Iterator[tuple[KeyPath, Leaf]]:
    """Every ``(KeyPath, Leaf)`` of a state tree in walk order (a tied Leaf once per path).

    Raises:
        TypeError: when the tree holds an array or other object that ``setup`` never
            puts there (a model passed where the state tree belongs).

    Example:
        >>> import numpy as np
        >>> from optimisers import Descent
        >>> [str(kp) for kp, _ in leaves(setup(Descent(), {"a": [np.ones(1)]}))]
        ['a.0']
    """
    if isinstance(tree, Leaf):
        yield kp, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from leaves(v, kp + (k,))
    elif isinstance(tree, (tuple, list)):
        for k, v in enumerate(tree):
            yield from leaves(v, kp + (k,))
    elif tree is not None:
        raise _not_a_tree(tree, kp)


def _not_a_tree(t: Any, kp: KeyPath) -> TypeError:
    found = "an array" if backends.library(t) else f"a {type(t).__name__}"
    return TypeError(f"expected a state tree from setup(rule, model), but found {found} at "
                     f"{kp!r}; pass the state tree first: update(tree, model, grads)")


def _what(x: Any) -> str:
    lib = backends.library(x)
    if lib is not None:
        xp = backends.ops(lib)
        return f"an array of dtype {xp.dtype_name(x)} and shape {xp.shape(x)}"
    return f"a {type(x).__name__}"


class _Entry:
    """One Leaf to step: its parameter, the gradients (summed over ties), its paths."""

    __slots__ = ("leaf", "x", "grads", "paths")

    def __init__(self, leaf: Leaf, x: Any, grads: list, kp: KeyPath) -> None:
        self.leaf, self.x, self.grads, self.paths = leaf, x, grads, [kp]


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
                         f"{type(x).__name__} with keys {list(kids)} there: the gradient "
                         f"tree's structure does not match the model")
    extra = [k for k in gk if k not in kids]
    if extra:
        raise ValueError(f"gradient at {kp!r} has key {extra[0]!r}, which the model lacks; "
                         f"the model's keys there are {list(kids)}")
    if not isinstance(g, Mapping) and len(gk) != len(kids):
        raise ValueError(f"gradient at {kp!r} has {len(gk)} children but the model has "
                         f"{len(kids)}; pass a dict to give gradients for some of them")
    return gk


def _add(plan: dict, leaf: Leaf, x: Any, grads: list, kp: KeyPath) -> None:
    """Add one path's gradients for ``leaf``: a second path to a tied Leaf sums them."""
    entry = plan.get(id(leaf))
    if entry is None:
        plan[id(leaf)] = _Entry(leaf, x, grads, kp)
    elif entry.x is not x:
        raise ValueError(f"the Leaf at {kp!r} is shared with {entry.paths[0]!r}, but the "
                         f"model holds different arrays there: the tie is lost; make the "
                         f"tree again with setup(rule, model)")
    else:
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
        raise ValueError(f"the state tree at {kp!r} has keys {list(keys)}, but the model has "
                         f"{_what(x) if not kids else list(kids)} there; make the tree with "
                         f"setup(rule, model) for this model")
    gks = [_grad_children(g, kids, x, kp) for g in gs]
    for k in keys:
        _gather(t[k], kids[k], tuple(None if gk is None else gk.get(k) for gk in gks),
                kp + (k,), plan)


def _step(entries: list, inplace: bool, known: list | None = None) -> tuple[dict, list]:
    """Phase two: run each Leaf's rule once, groups of them fused where possible; return
    the new arrays made out of place."""
    # Rules that may raise (ClipNorm on a non-finite norm) run first, on copies of their
    # state, so that an error leaves everything as it was; their results land below.
    risky = [e for e in entries if e.leaf.rule.raises()]
    if inplace and risky:
        copy = _copier()
        done = {id(e.leaf): _apply(e, fmap(copy, e.leaf.state)) for e in risky}
    else:
        done = {}
    try:
        rest, new, groups = fused.step_groups(entries, inplace, known)
    except (ValueError, TypeError, ArithmeticError) as err:
        raise type(err)(f"{err} (in a fused group of Leafs)") from err
    for e in rest:
        leaf, x = e.leaf, e.x
        leaf.state, d = done[id(leaf)] if id(leaf) in done else _apply(e, leaf.state)
        if isinstance(d, NewValue):
            y = backends.of(x).assign(x, d.value) if inplace else d.value
        elif d is not None:
            y = backends.of(x).subtract(x, d, inplace)
        else:
            continue
        if y is not x:
            new[id(leaf)] = y
    return new, groups


def _apply(e: _Entry, state: Any) -> tuple[Any, Any]:
    """``(new_state, step)`` of one entry's rule; an error names the entry's path."""
    try:
        return call(e.leaf.rule, state, e.x, tuple(e.grads))
    except (ValueError, TypeError, ArithmeticError) as err:
        raise type(err)(f"{err} (in {e.leaf.rule!r} at {e.paths[0]!r})") from err


def _update(tree: Any, model: Any, grads: tuple, inplace: bool) -> tuple[Any, Any]:
    first = _first_leaf(tree) if inplace else None
    known = first._plan if first is not None else None
    per_tree = known.read(tree, model, grads) if known is not None else None
    if per_tree is not None and known.whole(per_tree):
        return tree, model  # the usual training loop: one fused group, all checked
    entries = known.entries(per_tree) if per_tree is not None else None
    if entries is None:
        if grads is _DOTGRAD:
            grads = (_module_grads(model),)
        plan: dict[int, _Entry] = {}
        _gather(tree, model, grads, KeyPath(), plan)
        entries = list(plan.values())
    with backends.nograd():  # PyTorch: no autograd graph through the step
        new, groups = _step(entries, inplace, known.groups if known is not None else None)
    if not new:
        if first is not None and (known is None or known.tree is not tree
                                  or known.model is not model):
            known = first._plan = _Plan(tree, model)  # the next step reuses what it learned
        if known is not None:
            known.learn(groups)
        return tree, model
    model = place(tree, model, lambda leaf, x: new.get(id(leaf), x))
    # A mutable array updated here may also sit where no Leaf is (a non-trainable
    # child): update_ changes it there too, being in place, so update must as well.
    moved = {id(e.x): new[id(e.leaf)] for e in entries
             if id(e.leaf) in new and ismutable(e.x)}
    return tree, substitute(model, moved) if moved else model


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
        return _module_child
    return getattr


def _module_child(m: Any, k: str) -> Any:
    """``children(m)[k]`` for a ``torch.nn.Module``, without building all its children."""
    for found in (m._modules, m._buffers, m._parameters):  # the precedence of children
        if k in found:
            return found[k]
    raise KeyError(k)


class _Plan:
    """What a slow gather learned about one (tree, model) pair, checked and reused.

    ``update_`` on the same tree and model, the usual training loop, then costs a few
    identity checks per node and per array instead of a walk through the tree protocol:
    the tree and model edges are compared by identity (so any replaced child, added key
    or new array sends the step back to the slow, fully validating gather, which also
    gives the precise errors), and gradients are read by precomputed keys.
    """

    __slots__ = ("tree", "model", "edges", "sizes", "prog", "slots", "specs", "tied",
                 "groups", "group", "firsts", "columns")

    def __init__(self, tree: Any, model: Any) -> None:
        self.tree, self.model = tree, model
        self.groups: list = []  # the fused groups of the last step (see fused.Group)
        self.group = None  # the one group of every Leaf, if that is what the last step ran
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
        self.edges.append((t.__getitem__, keys, [t[k] for k in keys]))
        self.edges.append((x.__getitem__ if get is operator.getitem
                           else functools.partial(get, x), used, [kids[k] for k in used]))
        leaf_keys, leaf_slots, nodes = [], [], []
        for k in used:
            sub = self._compile(t[k], kids[k], kp + (k,))
            if type(sub) is int:
                leaf_keys.append(k)
                leaf_slots.append(sub)
            else:
                nodes.append((k, sub))
        return (type(x), get, tuple(leaf_keys), tuple(leaf_slots), tuple(nodes),
                frozenset(kids), isinstance(x, (tuple, list)), len(kids))

    def learn(self, groups: list) -> None:
        """Keep the fused groups of the last step; note a single group of every Leaf."""
        self.groups = groups
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
        # the checks of entries() and fused.Group.holds, a column at a time
        if (any(map(operator.is_, gs, itertools.repeat(None)))
                or not all(map(operator.is_, map(type, gs), txs))
                or list(map(_SHAPE, gs)) != shapes or list(map(_DTYPE, gs)) != dtypes
                or any(map(_FROZEN, leaves))
                or not all(map(operator.is_, map(_RULE, leaves), itertools.repeat(group.rule)))
                or not all(map(operator.is_, map(_STATE, leaves), group.states))):
            return False
        with backends.nograd():
            try:
                group.run(gs, {})
            except (ValueError, TypeError, ArithmeticError) as err:
                raise type(err)(f"{err} (in a fused group of Leafs)") from err
        return True

    def read(self, tree: Any, model: Any, grads: tuple) -> list | None:
        """Each gradient tree's gradients listed by slot, or ``None`` when anything
        differs from what was learned."""
        if tree is not self.tree or model is not self.model:
            return None
        try:
            for fetch, keys, kids in self.edges:
                if not all(map(operator.is_, map(fetch, keys), kids)):
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
    cls, get, leaf_keys, leaf_slots, nodes, known, positional, n = prog
    if isinstance(g, Mapping):
        if not g.keys() <= known:
            return False
        fetch = g.get
    elif type(g) is not cls or positional and len(g) != n:
        return False
    elif get is operator.getitem:
        fetch = g.__getitem__
    else:
        fetch = functools.partial(get, g)
    for slot, v in zip(leaf_slots, map(fetch, leaf_keys)):
        out[slot] = v
    for k, sub in nodes:
        if not _read(sub, fetch(k), out):
            return False
    return True


def _copier() -> Any:
    """A function copying writable arrays (packed state stays packed), leaving the rest."""
    copiers: dict[str, Any] = {}

    def copy(a: Any) -> Any:
        lib = backends.library(a)
        if lib is None:
            return a
        if lib not in copiers:
            xp = backends.ops(lib)
            copiers[lib] = xp.copier() if hasattr(xp, "copier") else (
                lambda a: xp.copy(a) if xp.maywrite(a) else a)
        return copiers[lib](a)

    return copy


def copy_tree(tree: Any) -> Any:
    """A state tree whose Leafs and writable state arrays are fresh copies; sharing kept,
    and state packed by :func:`fused.pack` stays packed."""
    memo: dict[int, Leaf] = {}
    copy = _copier()

    def leaf(t: Leaf) -> Leaf:
        if id(t) not in memo:
            memo[id(t)] = Leaf(t.rule, fmap(copy, t.state), t.frozen)
        return memo[id(t)]

    return _map_leaves(leaf, tree)


def _map_leaves(f: Any, t: Any, kp: KeyPath = KeyPath()) -> Any:
    """The state tree with ``f(leaf)`` in place of each Leaf; anything but a Leaf, None or
    a plain dict, tuple or list (a model passed as the tree) is a TypeError."""
    if isinstance(t, Leaf):
        return f(t)
    if type(t) is dict:
        return {k: _map_leaves(f, v, kp + (k,)) for k, v in t.items()}
    if type(t) in (tuple, list):
        return type(t)(_map_leaves(f, v, kp + (i,)) for i, v in enumerate(t))
    if t is None:
        return t
    raise _not_a_tree(t, kp)


def update(tree: Any, model: Any, grads: Any, *higher: Any) -> tuple[Any, Any]:
    """update(tree, model, grads) -> (tree, model): one optimisation step, pure.

    Neither the old tree nor the old model, nor any array in them, is changed: the
    returned tree and model are new (unchanged parts are shared). ``grads`` mirrors the
    model: the same container types, a ``dict`` keyed by child names for any node, or an
    object of the model's own class (what ``jax.grad`` returns). ``None``, or a key
    missing from a dict, means "no gradient here": those Leafs keep their state.
    Gradients reaching one tied Leaf by several paths are summed, the rule runs once,
    and the new array is placed at every path.

    Args:
        tree: the state tree from :func:`setup`.
        model: the model the tree was made for.
        grads: the gradient of the loss with respect to ``model``.
        *higher: further gradient trees for rules whose ``apply`` takes them.

    Returns:
        ``(new_tree, new_model)``.

    Raises:
        ValueError: a gradient's shape or the gradient tree's structure does not match
            the model, or the tree does not match the model; the message names the path.
        TypeError: a gradient is not an array, or a model was passed as the tree.

    Example:
        >>> import numpy as np
        >>> from optimisers import Descent
        >>> model = {"w": np.array([1.0, 2.0]), "n": 3}
        >>> tree = setup(Descent(0.1), model)
        >>> tree, new = update(tree, model, {"w": np.array([10.0, 0.0])})
        >>> new["w"], model["w"]
        (array([0., 2.]), array([1., 2.]))
    """
    return _update(copy_tree(tree), model, (grads, *higher), inplace=False)


_NOGRAD = object()


def update_(tree: Any, model: Any, grads: Any = _NOGRAD, *higher: Any) -> tuple[Any, Any]:
    """update_(tree, model, grads) -> (tree, model): one optimisation step, in place.

    Like :func:`update`, but arrays that may be written (NumPy, PyTorch) are updated in
    place, and the Leafs' states are mutated; JAX arrays are replaced. Use the returned
    model. Everything is validated before anything is written: after an error, model and
    tree are as they were. For a ``torch.nn.Module``, ``grads`` may be left out: each
    parameter's ``.grad`` is used.

    Example:
        >>> import numpy as np
        >>> from optimisers import Momentum
        >>> model = [np.array([1.0, 2.0])]
        >>> tree = setup(Momentum(0.1), model)
        >>> tree, same = update_(tree, model, [np.array([1.0, 1.0])])
        >>> model[0], same is model
        (array([0.9, 1.9]), True)
    """
    if grads is _NOGRAD:
        return _update(tree, model, _DOTGRAD, inplace=True)
    return _update(tree, model, (grads, *higher), inplace=True)


_DOTGRAD = ()  # as the gradients of _update: each parameter's .grad (see update_)


def _module_grads(model: Any) -> Any:
    """The gradient tree of a PyTorch model's ``.grad``s; a TypeError for other models."""
    if "torch" in sys.modules and backends.ops("torch").hasmodule(model):
        return backends.ops("torch").module_grads(model)
    raise TypeError("update_(tree, model, grads) needs the gradients; only a "
                    "torch.nn.Module model may leave them out (its .grad is read)")
