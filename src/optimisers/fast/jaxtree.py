"""JAX pytrees of ``Leaf`` and of the root of a state tree (:func:`root`), which flattens
into one record per group of Leafs, with the rules and schedules (``fast/jaxrules.py``); and
:func:`fuse`. The registry imports this module with the JAX backend (``registry.extend``).

``Leaf.frozen`` is static. Python numbers in a state (Adam's step count) are flattened as
weakly typed 0-d arrays, as a rule's are. Under ``jax.jit`` XLA fuses each Leaf's plain
``apply`` itself; :func:`fuse` steps a group's Leafs with its rule made once (and Leafs of
one shape whose rule stacks, ``Muon``, by one ``jax.vmap``, ``fast/batched.py``).
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import GetAttrKey

from optimisers.backends import jax as xp
from optimisers.backends import sharding
from optimisers.fast import jaxsplit
from optimisers.fast.jaxrules import dynamic, raw, register_rule, register_subclasses
from optimisers.fast.jaxsplit import aval as _aval
from optimisers.leaf import Leaf, nodes
from optimisers.reduce import given, places
from optimisers.rules import NewValue, call
from optimisers.schedules import Schedule, at

__all__ = ["fuse", "root", "register_rule", "StateDict", "StateList", "StateTuple"]


def fuse(entries: list, found: dict | None = None) -> tuple[list, list]:
    """fuse(entries, found=None) -> ``(left, done)``: step JAX's entries group by group;
    ``done`` holds ``(leaf, new x)``, the Leafs advanced, and nothing is left.

    Leafs that share a rule and a clock (a group of the root's record) make their rule at
    that clock once, with its tree-level totals ``found``; traced, what their steps compute
    from its numbers and their old state numbers alone (Adam's bias corrections, its new
    step count) is computed once (:func:`_split_steps`), so that the traced program grows
    like optax's and the next step reads one step count. Leafs of one shape
    whose rule stacks (``Muon``) step by one ``jax.vmap`` (``fast/batched.py``).

    Example:
        >>> from optimisers import Adam
        >>> from optimisers.gather import Entry
        >>> rule = Adam(0.1)
        >>> leafs = [Leaf(rule, rule.init(jnp.zeros(n))) for n in (2, 3)]
        >>> _, done = fuse([Entry(l, jnp.zeros(l.state[0].shape), [jnp.ones(l.state[0].shape)],
        ...                       ()) for l in leafs])
        >>> [y.tolist() for _, y in done], leafs[0].state[2] is leafs[1].state[2]
        ([[-0.1, -0.1], [-0.1, -0.1, -0.1]], True)
    """
    from optimisers.fast import batched, fused

    ticks: dict = {}
    stacks = [e for e in entries if fused.stackable(e.leaf.rule) and len(e.grads) == 1
              and not places(e.leaf.rule)]
    left, stacked = batched.fuse(stacks) if stacks else ([], [])
    done = []
    for leaf, state, y in stacked:
        leaf.advance(state, ticks)
        done.append((leaf, y))
    groups: dict[tuple, list] = {}
    for e in [e for e in entries if id(e) not in {id(s) for s in stacks}] + left:
        groups.setdefault((id(e.leaf.rule), id(e.leaf.clock)), []).append(e)
    for members in groups.values():
        done.extend(_step_group(members, found, ticks))
    return [], done


def _step_group(members: list, found: dict | None, ticks: dict) -> list:
    """``(leaf, new x)`` of each of ``members`` (one rule, one clock), their Leafs advanced."""
    first = members[0].leaf
    try:
        now = at(first.rule, first.clock)
        now = given(now, found) if found else now
    except (ValueError, TypeError, ArithmeticError) as err:
        raise type(err)(f"{err} (in {first.rule!r} at {members[0].paths[0]!r})") from err
    if _traced([members[0].x]):
        steps = _split_steps(now, members)
    else:
        steps = [_called(now, e) for e in members]
        if len(members) > 1:
            _share(now, members, steps)
    out = []
    for e, (state, d) in zip(members, steps):
        e.leaf.advance(state, ticks)
        if isinstance(d, NewValue):
            out.append((e.leaf, xp.like(d.value, e.x)))
        elif d is not None:
            out.append((e.leaf, xp.subtract(e.x, d, False)))
    return out


def _called(now: Any, e: Any) -> tuple[Any, Any]:
    try:
        return call(now, e.leaf.state, e.x, tuple(e.grads))
    except (ValueError, TypeError, ArithmeticError) as err:
        raise type(err)(f"{err} (in {e.leaf.rule!r} at {e.paths[0]!r})") from err


def _split_steps(now: Any, members: list) -> list:
    """Each traced member's ``(new state, step)``: ``now.apply`` traced once per structure
    and split (:func:`_split`); the part that reads no array runs once for the members of a
    structure whose old numbers are the same objects, and the new numbers made there are
    given to the members of other structures whose old numbers are those too, so that the
    next step reads one set of them."""
    sets: dict[tuple, list] = {}
    for i, e in enumerate(members):
        parts = _parts(e.leaf.state, e.leaf)
        shape = (_aval(e.x), tuple(map(_aval, e.grads)), tuple(map(_aval, parts[3])))
        sets.setdefault((_olds(parts), shape), []).append((i, e, parts))
    steps: list = [None] * len(members)
    firsts: dict[tuple, tuple] = {}
    commons: dict[tuple, list] = {}
    for (olds, _), found in sets.items():
        split, new = _split(now, found[0][1], found[0][2])
        if split is None:
            for i, e, _ in found:
                steps[i] = _called(now, e)
            continue
        common = _common(split, found[0][2][2], commons.setdefault(olds, []))
        for i, e, parts in found:
            outs = split.outputs(common, (parts[3], e.x, e.grads))
            before = firsts.setdefault(olds, (split, outs))
            same = before[0] is split or _alike(before[0].out, split.out)
            steps[i] = _result(split, new, split.given(before[1], outs) if same else outs)
    return steps


def _common(split: Any, numbers: tuple, made: list) -> list:
    """``split``'s common values from ``numbers``: those of an earlier split in ``made``
    (same old numbers) whose common part is the same program, else computed and kept."""
    for other, values in made:
        same = len(other.consts) == len(split.consts) and all(
            map(operator.is_, other.consts, split.consts))
        if same and str(other.common) == str(split.common):
            return values
    values = split.values(*numbers)
    made.append((split, values))
    return values


def _share(now: Any, members: list, steps: list) -> None:
    """Not traced: give each member the first one's new state numbers where the step's
    split says they read no array and the member's old numbers are the first's."""
    first = _parts(members[0].leaf.state, members[0].leaf)
    split, new = _split(now, members[0], first) if any(first[1]) else (None, False)
    if split is None:
        return
    shared, out = jax.tree.flatten(_plain(steps[0]))
    if not _alike(out, split.out):  # stepped otherwise than traced (AccumGrad waiting)
        return
    olds = _olds(first)
    for i in range(1, len(members)):
        if _olds(_parts(members[i].leaf.state, members[i].leaf)) != olds:
            continue
        values, treedef = jax.tree.flatten(_plain(steps[i]))
        if _alike(treedef, out):
            steps[i] = _result(split, new, split.given(shared, values))


def _plain(step: tuple) -> tuple:
    state, d = step
    return state, d.value if isinstance(d, NewValue) else d


def _split(now: Any, e: Any, parts: tuple) -> tuple[Any, bool]:
    """The :func:`~optimisers.fast.jaxsplit.split` of ``now.apply`` from ``e``'s structure,
    its common arguments the state's numbers (``now``'s are the jaxpr's constants), and
    whether the step sets a new value (:class:`NewValue`).

    A rule's state numbers must not depend on the shape of its array (documented on
    :meth:`~optimisers.Rule.init`), which a jaxpr cannot show."""
    treedef, where, numbers, arrays = parts
    kinds = []

    def step(numbers: tuple, arrays: tuple, x: Any, grads: tuple) -> tuple:
        new, d = call(now, _joined(treedef, where, numbers, arrays), x, grads)
        kinds.append(isinstance(d, NewValue))
        return _plain((new, d))

    found = jaxsplit.split(step, (numbers,), (arrays, e.x, tuple(e.grads)))
    return found, bool(kinds and kinds[0])


def _result(split: Any, new: bool, outs: list) -> tuple[Any, Any]:
    state, value = jax.tree.unflatten(split.out, outs)
    return state, NewValue(value) if new else value


def _alike(a: Any, b: Any) -> bool:
    """Whether two tree structures are equal (one whose static data holds arrays is not)."""
    try:
        return bool(a == b)
    except ValueError:
        return False


# --- Leafs and the root: one record of numbers per group of Leafs --------------------------
#
# A Leaf flattens as a record of one member: its rule's numbers (as data) and the precise
# complement 1 - b of each (computed in float64 from a Python float: 1 - float32(0.999) is
# 1.3e-5 off 0.001, relatively, and Adam would drift from optax), its clock, its state. The
# root of a state tree that setup made (a State* container) lays out one such record per
# group of Leafs that share a rule (by value) and a clock and are frozen alike: under jit the
# group's members then read one set of numbers and one clock, so the traced program grows
# like optax's. A Leaf frozen, adjusted or loaded apart falls into another group at the next
# flatten. Rebuilt, a group's members share one rule object and one clock (Leaf.advance
# keeps them shared), and the root keeps the arrays it made from Python numbers.


class _Root:
    """What the State* containers add to a dict, list or tuple: JAX flattens them by group
    (above); ``map_leaves`` and ``load`` keep the class at a tree's root."""

    __state_root__ = True


class StateDict(_Root, dict):
    """The root of a JAX state tree that is a dict (see :func:`root`)."""


class StateList(_Root, list):
    """The root of a JAX state tree that is a list (see :func:`root`)."""


class StateTuple(_Root, tuple):
    """The root of a JAX state tree that is a tuple (see :func:`root`)."""


_ROOTS = {dict: StateDict, list: StateList, tuple: StateTuple}


def root(tree: Any) -> Any:
    """root(tree) -> ``tree`` with its root container of the class that JAX flattens into one
    record per group of Leafs (``setup`` calls it on JAX trees); equal to ``tree``.

    Example:
        >>> from optimisers import Descent
        >>> tree = root({"w": Leaf(Descent(0.5), None)})
        >>> type(tree).__name__, tree, len(jax.tree.leaves(tree))
        ('StateDict', {'w': Leaf(Descent(eta=0.5), None)}, 3)
    """
    cls = _ROOTS.get(type(tree))
    return tree if cls is None else cls(tree)


def _skeleton(tree: Any) -> tuple[Any, list]:
    """``(skeleton, leafs)``: the tree's containers as nested ``(class, keys, children)``,
    each Leaf as its index in ``leafs`` (a tied Leaf once), ``None`` as itself."""
    leafs: list = []
    index: dict[int, int] = {}

    def walk(t: Any) -> Any:
        if isinstance(t, dict):
            return type(t), tuple(t), tuple(map(walk, t.values()))
        if isinstance(t, (tuple, list)):
            return type(t), None, tuple(map(walk, t))
        if t is None:
            return None
        if not isinstance(t, Leaf):
            list(nodes(tree))  # raises, naming the key path
        i = index.get(id(t))
        if i is None:
            i = index[id(t)] = len(leafs)
            leafs.append(t)
        return i

    return walk(tree), leafs


def _build(skeleton: Any, leafs: list) -> Any:
    if skeleton is None or type(skeleton) is int:
        return None if skeleton is None else leafs[skeleton]
    cls, keys, kids = skeleton
    kids = [_build(k, leafs) for k in kids]
    if keys is not None:
        return cls(zip(keys, kids))
    return cls._make(kids) if hasattr(cls, "_make") else cls(kids)


def _key(v: Any) -> Any:
    return (type(v), v) if type(v) in (float, int, bool) else id(v)


def _shortest(v: Any) -> float:
    """A concrete 0-d array as the Python float that setup was given (the shortest decimal
    that is the same number in its dtype)."""
    return float(str(np.asarray(v)[()]))


def _complement(v: Any) -> Any:
    if type(v) is float:
        return 1.0 - v
    dtype = getattr(v, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        return None
    if not isinstance(v, jax.core.Tracer) and v.shape == ():
        return 1.0 - _shortest(v)
    return xp.complement(v)


def _record(rule: Any, state: Any, made: tuple | None) -> tuple[tuple, tuple, Any]:
    """``(numbers, complements, treedef)`` of a rule: its numbers as arrays (placed beside
    ``state``'s); ``made``: the root's arrays of its last flatten and of this one."""
    kept = made[0].get(id(rule)) if made is not None else None
    if kept is None or kept[0] is not rule:
        values, treedef = raw(rule)
        comps = [_complement(v) for v in values]
        new = [dynamic(v) for v in (*values, *comps) if v is not None]
        placed = iter(new if _traced(new) else sharding.beside(state, new))
        numbers = tuple(next(placed) for _ in values)
        kept = (rule, numbers, tuple(c if c is None else next(placed) for c in comps), treedef)
    if made is not None:
        made[1][id(rule)] = kept
    return kept[1:]


def _traced(values: list) -> bool:
    return any([isinstance(v, jax.core.Tracer) for v in values])


def _arrays(v: Any, state: Any, made: tuple | None, key: Any, owner: Any = None) -> Any:
    """``v`` (a clock, a state's numbers) with its Python numbers as arrays placed beside
    ``state``'s, kept by the root under ``key`` while ``owner`` (``v`` itself by default)
    is the same object."""
    owner = v if owner is None else owner
    kept = made[0].get(key) if made is not None else None
    if kept is None or kept[0] is not owner:
        out = dynamic(v)
        if out is not v and not _traced(jax.tree.leaves(out)):
            values, treedef = jax.tree.flatten(out)
            out = jax.tree.unflatten(treedef, sharding.beside(state, values))
        kept = (owner, out)
    if made is not None and kept[1] is not v:
        made[1][key] = kept
    return kept[1]


def _rebuild(treedef: Any, numbers: tuple, comps: tuple) -> Any:
    """The rule from its record. Traced, its numbers remember their complements; concrete
    (a jitted call's output), a :class:`_Pending` rule, made when first read."""
    if not _traced(numbers):
        return _Pending(treedef, numbers, comps)
    for v, c in zip(numbers, comps):
        if c is not None and isinstance(v, jax.core.Tracer):
            xp.remember(v, c)
    return jax.tree.unflatten(treedef, numbers)


class _Pending:
    """A rule that JAX rebuilt from concrete arrays, its record kept: made, its weakly typed
    0-d numbers read back as the Python numbers they were given as, when first read; a
    training loop passing the tree back to a jitted step never waits for the device."""

    __slots__ = ("treedef", "numbers", "comps", "rule")

    def __init__(self, treedef: Any, numbers: tuple, comps: tuple) -> None:
        self.treedef, self.numbers, self.comps, self.rule = treedef, numbers, comps, None

    def made(self) -> Any:
        if self.rule is None:
            numbers = list(self.numbers)
            python = [i for i, v in enumerate(numbers) if _isnumber(v)]
            for i, v in zip(python, jax.device_get([numbers[i] for i in python])):
                numbers[i] = float(str(v)) if v.dtype.kind == "f" else v.item()
            self.rule = jax.tree.unflatten(self.treedef, numbers)
        return self.rule


_SLOT = Leaf.__dict__["rule"]  # a Leaf's own slots, under _Rebuilt's properties
_STATE = Leaf.__dict__["state"]
_LAZY = object()  # a _Rebuilt's state not made yet


class _Rebuilt(Leaf):
    """A Leaf that JAX rebuilt: its rule, a :class:`_Pending`, made when first read; its
    state made from its group's record (``kids``, it the ``at``-th member) when first read,
    so that a training loop's jitted steps make no tuple per Leaf; the layout of its state's
    numbers as its record gave it (``layout``, see :func:`_parts`) while its state is the
    one it was built with (``laid``)."""

    __slots__ = ("layout", "laid", "kids", "at")

    def __init__(self, rule: Any, state: Any, frozen: bool = False, clock: Any = 0,
                 layout: tuple | None = None, kids: tuple = (), at: int = 0) -> None:
        self.rule, self.frozen, self.clock = rule, frozen, clock
        _STATE.__set__(self, state)
        self.layout, self.laid, self.kids, self.at = layout, state, kids, at

    def _rule(self) -> Any:
        rule = _SLOT.__get__(self, Leaf)
        return rule.made() if type(rule) is _Pending else rule

    def _state(self) -> Any:
        state = _STATE.__get__(self, Leaf)
        if state is _LAZY:
            state_def, where = self.layout
            k = len(where) - sum(where)
            arrays = self.kids[4][self.at * k:(self.at + 1) * k]
            state = _joined(state_def, where, self.kids[3], arrays)
            _STATE.__set__(self, state)
            self.laid = state
        return state

    rule = property(_rule, _SLOT.__set__, doc="The Leaf's rule.")
    state = property(_state, _STATE.__set__, doc="The Leaf's state.")

    def __reduce__(self) -> tuple:
        return Leaf, (self.rule, self.state, self.frozen, self.clock)


def _isnumber(v: Any) -> bool:
    """A Python number, or a weakly typed 0-d array (one that went through JAX): a
    hyper-parameter, or a counter in a state (Adam's step count), never an array's own."""
    if isinstance(v, (int, float, np.number)):
        return True
    aval = getattr(v, "aval", None)
    return aval is not None and aval.shape == () and getattr(aval, "weak_type", False)


def _parts(state: Any, leaf: Any = None) -> tuple[Any, tuple, tuple, tuple]:
    """``(treedef, where, numbers, arrays)``: a state's leaves split into its numbers
    (:func:`_isnumber`) and the rest; ``where`` says which is which, as the ``leaf``'s
    record said where ``state`` is the one it was built with (whatever ``jax.tree.map``
    put there, the structure stays)."""
    layout = getattr(leaf, "layout", None)
    if layout is not None and leaf.laid is state:
        treedef, where = layout
        values = treedef.flatten_up_to(state)
    else:
        values, treedef = jax.tree.flatten(state)
        where = tuple(map(_isnumber, values))
    return (treedef, where, tuple(itertools.compress(values, where)),
            tuple(itertools.compress(values, map(operator.not_, where))))


def _olds(parts: tuple) -> tuple:
    """What two states must have alike to share their numbers: the structure, where the
    numbers are, and the numbers themselves (Python numbers by value, arrays by identity)."""
    return parts[0], parts[1], tuple(map(_key, parts[2]))


def _joined(treedef: Any, where: tuple, numbers: tuple, arrays: tuple) -> Any:
    numbers, arrays = iter(numbers), iter(arrays)
    return jax.tree.unflatten(treedef, [next(numbers) if w else next(arrays) for w in where])


_RECORD = tuple(GetAttrKey(k) for k in ("rule", "complements", "clock", "counters", "states"))


def _group(leafs: list, states: list, made: tuple | None, key: Any) -> tuple[tuple, tuple]:
    """``(children, layout)`` of a group's record: its rule's numbers and their complements,
    its clock, its members' state numbers (one for all), the members' state arrays in one tuple;
    ``states``: the members' states split by :func:`_parts`."""
    first = leafs[0]
    raw = _SLOT.__get__(first, Leaf)
    if type(raw) is _Pending:
        numbers, comps, treedef = raw.numbers, raw.comps, raw.treedef
    else:
        numbers, comps, treedef = _record(raw, first.state, made)
    clock = _arrays(first.clock, first.state, made, ("clock", key))
    counters = _arrays(states[0][2], first.state, made, ("counters", key), first.state)
    layout = (first.frozen, treedef, states[0][0], states[0][1])
    arrays = tuple(itertools.chain.from_iterable(s[3] for s in states))
    return (numbers, comps, clock, counters, arrays), layout


def _flatten_leaf(leaf: Leaf) -> tuple:
    """A Leaf outside a root (a tree that setup did not make, a Leaf alone): its record,
    its state whole; rebuilt, a plain Leaf (its rule read back at once)."""
    numbers, comps, treedef = _record(leaf.rule, leaf.state, None)
    clock = _arrays(leaf.clock, leaf.state, None, None)
    return (numbers, comps, clock, _arrays(leaf.state, leaf.state, None, None)), (
        leaf.frozen, treedef)


def _flatten_leaf_with_keys(leaf: Leaf) -> tuple:
    children, aux = _flatten_leaf(leaf)
    return list(zip((*_RECORD[:3], GetAttrKey("state")), children)), aux


def _unflatten_leaf(aux: tuple, children: Any) -> Leaf:
    numbers, comps, clock, state = children
    rule = _rebuild(aux[1], numbers, comps)
    return Leaf(rule.made() if type(rule) is _Pending else rule, state, aux[0], clock)


def _groups(leafs: list, parts: list) -> dict:
    """The Leafs' indices by group: frozen alike, one rule by value (its Python numbers by
    value, anything else by identity), one clock, their states' numbers alike; ``parts``
    gets each Leaf's state split by :func:`_parts`."""
    keys: dict[int, Any] = {}
    groups: dict[tuple, list] = {}
    for i, leaf in enumerate(leafs):
        rule = _SLOT.__get__(leaf, Leaf)
        key = keys.get(id(rule))
        if key is None:
            values, treedef = raw(rule) if type(rule) is not _Pending else ((), id(rule))
            key = (treedef, tuple(map(_key, values)))
            try:
                hash(key)
            except TypeError:  # an unhashable static field: the rule by identity
                key = id(rule)
            keys[id(rule)] = key
        parts.append(_parts(leaf.state, leaf))
        groups.setdefault((leaf.frozen, key, _key(leaf.clock), *_olds(parts[-1])),
                          []).append(i)
    return groups


def _flatten_root(tree: Any) -> tuple:
    kept = tree.__dict__.pop("_flat", None)  # (not kept once changed: nor its old arrays)
    if kept is not None and _unchanged(tree, *kept[1:]):
        tree._flat = kept
        return kept[0], kept[1]
    skeleton, leafs = _skeleton(tree)
    made = (getattr(tree, "_made", {}), {})
    children, layout = [], []
    parts: list = []
    for members in _groups(leafs, parts).values():
        kids, group = _group([leafs[i] for i in members], [parts[i] for i in members], made,
                             id(leafs[members[0]]))
        children.append(kids)
        layout.append((group, tuple(members)))
    tree._made = made[1]
    return xp.apart(children), (skeleton, tuple(layout), len(leafs))


def _flatten_root_with_keys(tree: Any) -> tuple:
    children, aux = _flatten_root(tree)
    return [(GetAttrKey(f"group{i}"), c) for i, c in enumerate(children)], aux


def _unflatten_root(aux: tuple, children: Any) -> Any:
    skeleton, layout, n = aux
    leafs: list = [None] * n
    made: dict = {}
    marks = []
    for (group, members), kids in zip(layout, children):
        rule = _rebuild(group[1], kids[0], kids[1])
        if type(rule) is not _Pending:
            made[id(rule)] = (rule, kids[0], kids[1], group[1])
        laid = group[2:]
        for j, i in enumerate(members):
            leafs[i] = _Rebuilt(rule, _LAZY, group[0], kids[2], laid, kids, j)
        marks.append((members, rule, group[0], kids[2]))
    tree = _build(skeleton, leafs)
    tree._made = made
    tree._flat = (children, aux, leafs, marks)
    return tree


def _unchanged(tree: Any, aux: tuple, leafs: list, marks: list) -> bool:
    """Whether a root that :func:`_unflatten_root` built holds the Leafs it was built with,
    where it put them, each with the state, rule, flag and clock it was given: then its
    flatten is the children it was built from (a training loop's next jitted step makes no
    record anew, and no garbage)."""
    for members, rule, frozen, clock in marks:
        for i in members:
            leaf = leafs[i]
            if (_STATE.__get__(leaf, Leaf) is not leaf.laid
                    or _SLOT.__get__(leaf, Leaf) is not rule
                    or leaf.frozen is not frozen or leaf.clock is not clock):
                return False
    return _same(aux[0], tree, leafs)


def _same(skeleton: Any, t: Any, leafs: list) -> bool:
    """Whether ``t`` has the containers, keys and Leafs of ``skeleton`` (:func:`_skeleton`)."""
    if skeleton is None or type(skeleton) is int:
        return t is (None if skeleton is None else leafs[skeleton])
    cls, keys, kids = skeleton
    if type(t) is not cls or len(t) != len(kids):
        return False
    if keys is not None:
        if not all(map(operator.eq, t, keys)):
            return False
        t = t.values()
    return all(_same(k, v, leafs) for k, v in zip(kids, t))


def _register_all() -> None:
    from optimisers.rules import Rule

    for cls in (Leaf, _Rebuilt):  # (a group's member taken out alone flattens as a Leaf)
        jax.tree_util.register_pytree_with_keys(
            cls, _flatten_leaf_with_keys, _unflatten_leaf, _flatten_leaf)
    for cls in _ROOTS.values():
        jax.tree_util.register_pytree_with_keys(
            cls, _flatten_root_with_keys, _unflatten_root, _flatten_root)
    register_subclasses(Rule)
    register_subclasses(Schedule)


_register_all()
