"""Multi-array fast paths: one rule application over a whole group of arrays.

An elementwise rule's step of one element depends only on that element's parameter,
gradient and state and on scalars equal across the group, so its own ``apply`` run once
over a group's flat buffers gives bit for bit what it gives array by array (tests prove
it rule by rule). A group is the Leafs stepped in one update that share a rule (by
value), a dtype, a device, a library and their non-array state; :func:`pack` lays their
state out in one buffer with per-Leaf views at ``setup``, and ``update_``'s plan keeps a
:class:`Group` and checks it by identity at the next step. A rule that
:attr:`~optimisers.Rule.stacks` (``Muon``) runs once over its Leafs of one shape stacked
(:class:`Stack`). On torch, Adam and AdamW groups step through torch.optim's own
functional Adam (``fast/torchadam.py``). JAX groups its entries itself: XLA fuses the
plain path under ``jax.jit``, and ``fast/batched.py`` vmaps what stacks.
"""

from __future__ import annotations

import collections
import itertools
import operator
from typing import Any

from optimisers import backends
from optimisers.gather import Entry
from optimisers.reduce import given, places
from optimisers.rules import EMA, MixedPrecision, NewValue, OptimiserChain, Rule, ngrads
from optimisers.schedules import at, timed
from optimisers.tree import keys_shown

__all__ = ["fusible", "stackable", "step_groups", "pack", "Group", "Stack", "MIN_GROUP", "Node",
           "ARRAY", "signature"]

MIN_GROUP = 2
"""Fewer arrays than this in a group take the plain path: nothing to gain."""

CHUNK = 1 << 18
"""Elements per piece when a group of large arrays is stepped piece by piece by its
rule's own ``apply``. A group of ``16 * CHUNK`` elements or more in all, whose arrays
average ``CHUNK // 16`` or more, steps so: over one concatenation of its size, each
operation of the formula would make (and fault in) a temporary as large as the group."""

_FUSIBLE: dict[Rule, tuple[bool, bool]] = {}


def fusible(rule: Rule) -> tuple[bool, bool]:
    """``(elementwise, reads_x)`` for a rule: whether it may run fused, and whether it
    needs the parameter's values (else only its dtype)."""
    try:
        return _FUSIBLE[rule]
    except (KeyError, TypeError):
        pass
    parts = [fusible(r) for r in _inner(rule)]
    own = (True, False) if type(rule) is OptimiserChain else (
        type(rule).elementwise, type(rule).reads_x)
    out = (own[0] and all(p[0] for p in parts), own[1] or any(p[1] for p in parts))
    try:
        _FUSIBLE[rule] = out
    except TypeError:  # an unhashable field (a JAX tracer under jit): asked each time
        pass
    return out


_STACKABLE: dict[Rule, bool] = {}


def stackable(rule: Rule) -> bool:
    """Whether a rule that is not elementwise may step a :class:`Stack`: it
    :attr:`~optimisers.Rule.stacks`, or is a chain (or holds rules) each of which stacks or
    is elementwise.

    Example:
        >>> from optimisers import Adam, ClipNorm, Muon, OptimiserChain, WeightDecay
        >>> [stackable(r) for r in (Muon(), OptimiserChain(WeightDecay(), Muon()),
        ...                         OptimiserChain(ClipNorm(), Muon()), Adam())]
        [True, True, False, False]
    """
    try:
        return _STACKABLE[rule]
    except (KeyError, TypeError):
        pass
    own = type(rule) is OptimiserChain or type(rule).stacks or type(rule).elementwise
    out = own and not fusible(rule)[0] and all(
        stackable(r) or fusible(r)[0] for r in _inner(rule))
    try:
        _STACKABLE[rule] = out
    except TypeError:  # an unhashable field (a JAX tracer under jit): asked each time
        pass
    return out


def _kind(rule: Rule) -> type | None:
    """The group a rule's Leafs may form: :class:`Group`, :class:`Stack`,
    :class:`Directed`, or none."""
    if fusible(rule)[0]:
        return Group
    if stackable(rule):
        return Stack
    inner = rule.direction()
    return Directed if inner is not None and fusible(inner) == (True, False) else None


def _inner(rule: Rule) -> list:
    """The rules a rule holds in its fields (a chain's, EMA's): it is elementwise only
    where they all are."""
    if type(rule) is OptimiserChain:
        return list(rule.rules)
    fields = getattr(rule, "__dataclass_fields__", {})
    return [v for v in (getattr(rule, f) for f in fields) if isinstance(v, Rule)]


def _counts(rule: Rule) -> bool:
    """Whether some step of ``rule`` may not be real (:meth:`Rule.stepped` overridden below
    the composites that only pass the question on): the clock must then ask."""
    passing = (OptimiserChain, EMA, MixedPrecision)
    return any(c.stepped is not Rule.stepped and c not in passing for c in _classes(rule))


def _classes(rule: Rule) -> tuple:
    """The classes of a rule and of the rules it holds: its step's structure."""
    return (type(rule), *(c for r in _inner(rule) for c in _classes(r)))


class Node(tuple):
    """A tuple in a state signature that holds arrays below it (rebuilt per Leaf)."""


ARRAY = object()  # where a state holds an array


def signature(state: Any, out: list) -> Any:
    """The state with its arrays collected into ``out`` and replaced by a mark.

    Parts without arrays are returned as they are, the very same objects, so that
    Leafs restated from one signature share them (and identity then shows equality).
    """
    if isinstance(state, tuple):
        n = len(out)
        parts = [signature(s, out) for s in state]
        return Node(parts) if len(out) > n else state
    if backends.library(state) is not None:
        out.append(state)
        return ARRAY
    return state


def _states(sig: Any, arrays: list) -> list:
    """The state with signature ``sig`` (:func:`_fill`) for each list of ``arrays``: for a
    flat state whose arrays come first (``Adam``'s ``(m, v, t)``), in C-level maps."""
    if type(sig) is Node and Node not in map(type, sig):
        k = sum(s is ARRAY for s in sig)
        tail = tuple(sig[k:])
        if ARRAY not in tail:
            return list(map(tuple.__add__, map(tuple, arrays), itertools.repeat(tail)))
    return [_fill(sig, iter(a)) for a in arrays]


def _fill(sig: Any, arrays: Any) -> Any:
    """The state with signature ``sig``, its arrays taken in order from the iterator."""
    if sig is ARRAY:
        return next(arrays)
    if type(sig) is Node:
        return tuple(_fill(s, arrays) for s in sig)
    return sig


def _counted(sig: Node, inner: bool) -> Node:
    """Adam's state signature (``inner``: the second of a chain's) one step on."""
    if inner:
        return Node((sig[0], _counted(sig[1], False)))
    return Node((*sig[:-1], sig[-1] + 1))


class Group:
    """Leafs stepped together: their rule, state signature, arrays, and parameters."""

    stacked = False  # (a Stack's arrays are matrices: never cut into pieces)

    __slots__ = ("rule", "sig", "leaves", "arrays", "xs", "write", "states", "xp", "uses_x",
                 "large", "subtract", "prints", "t", "timed", "now", "reduced",
                 "counts", "clocks", "owner", "params", "ngrads", "views", "steps",
                 "native")

    def __init__(self, rule: Rule, sig: Any, members: list, write: bool) -> None:
        self.rule, self.sig, self.write = rule, sig, write
        self.leaves = [e.leaf for e, _ in members]
        # the clock each member was left at; the members' one clock where they agree (always
        # for a rule with a schedule: its groups are made so), and the rule at it, evaluated
        # once per step where a schedule is in the rule's fields
        self.clocks = [leaf.clock for leaf in self.leaves]
        first = self.clocks[0]
        self.t = first if all(c == first for c in self.clocks) else None
        self.timed, self.reduced = timed(rule), bool(places(rule))
        self.now = at(rule, self.t)
        self.counts = _counts(rule)  # whether it must ask which steps were real
        self.arrays = [arrays for _, arrays in members]
        self.xs = [e.x for e, _ in members]
        # the Leafs' own rule and parameters (a Directed group steps others: see there)
        self.owner, self.params = rule, self.xs
        self.states: list = []  # the state objects this group last gave its Leafs
        self.xp = backends.of(self.xs[0])
        self.uses_x = fusible(rule)[1]
        self.ngrads = int(min(ngrads(rule), 1))  # whether apply takes the gradient (once)
        self.views: list = []  # per state slot: (its parts, their one packed buffer)
        self.large: bool | None = None  # mostly large arrays: stepped piece by piece
        self.subtract: Any = None  # the backend's x -= d over all xs (made when needed)
        self.steps: Any = None  # the step of the last piecewise run (see _over)
        self.prints = self.xp.footprints(self.params)  # what these assume of their memory
        self.native = None  # torch.optim's own Adam, where it computes this rule's formula
        if write and type(self) is Group and backends.library(self.xs[0]) == "torch":
            from optimisers.fast import torchadam
            self.native = torchadam.native(rule, sig, self.xs, self.arrays)

    def moved(self) -> bool:
        """Whether a parameter's memory changed since the group was made (``p.data = ...``,
        an array resized in place): its views no longer fit, so it must not
        run again."""
        return self.xp.footprints(self.params) != self.prints

    def holds(self, entries: list) -> bool:
        """Whether ``entries`` (in member order) can step as this group now: the same
        parameters and rule, and each Leaf still holding the very state object this group
        gave it last time (so the same arrays, and the one shared non-array state) and the
        clock it set."""
        rule = self.owner
        return bool(self.states) and len(entries) == len(self.leaves) and all(
            e is not None and e.leaf is leaf and e.x is x and leaf.rule is rule
            and leaf.state is st and leaf.clock is c
            for e, leaf, x, st, c in zip(entries, self.leaves, self.params, self.states,
                                         self.clocks)
        ) and not self.moved()

    def run(self, grads: list, new: dict, found: dict | None = None) -> None:
        """One fused step: the rule's ``apply`` on cache-sized pieces of large arrays, else
        on the concatenation of all (the packed state itself, where it is packed), written
        back. The rule is taken at the group's clock, with the totals ``found`` of its
        tree-level rules (``reduce.py``)."""
        if self.timed or self.reduced:
            now = at(self.rule, self.t)
            self.now = given(now, found) if self.reduced and found else now
        if self.native is not None and self.native.step(self.now, grads):
            sig = _counted(self.sig, self.native.clip)
            self._restate(sig, self.native.states(sig))
        elif not self._chunked(grads):
            self._joined(grads, new)

    def _shaped(self, flat: Any, like: Any) -> Any:
        """How ``apply`` sees a concatenation of arrays like ``like``: as it is."""
        return flat

    def _flat(self, a: Any) -> Any:
        """An array that ``apply`` gave, as the concatenation it stands for."""
        return a

    def _joined(self, grads: list, new: dict) -> None:
        """The rule applied once to the concatenation of the group's arrays."""
        xp = self.xp
        g = self._shaped(xp.flatcat(grads), self.xs[0])
        x = self._shaped(xp.flatcat(self.xs), self.xs[0]) if self.uses_x else g
        slots = list(zip(*self.arrays))  # per state array: one per member
        joined = self._buffers(slots)
        views = [self._shaped(flat, parts[0]) for (flat, _), parts in zip(joined, slots)]
        state, d = self._over(views, x, g)
        out: list = []
        newsig = signature(state, out)
        for k, (parts, (_, isview), view, now) in enumerate(zip(slots, joined, views, out)):
            if now is not view or not isview:  # the state was a copy, or the rule made a
                made = xp.scatter(self._flat(now), parts)  # new one: write it back into
                if made is not None:       # the parts, or (immutable arrays) take new parts
                    for arrays, part in zip(self.arrays, made):
                        arrays[k] = part
        self._restate(newsig)
        if d is None:
            return
        if isinstance(d, NewValue):
            self._place(self._flat(d.value), new)
            return
        d = self._flat(d)
        if self.write:
            if self.subtract is None:
                self.subtract = xp.subtractor(self.xs)
            self.subtract(d)
        else:
            for leaf, y in zip(self.leaves, xp.split_like(d, self.xs)):
                new[id(leaf)] = y

    def _over(self, views: list, x: Any, g: Any) -> tuple[Any, Any]:
        """The rule over the concatenations: piece by piece (as :meth:`_chunked` steps
        large arrays) where the backend views them flat (``xp.flat``), so that its
        temporaries stay cache-sized and are recycled, else at once. The pieces' steps
        are gathered into one array."""
        flat = None if self.stacked or self.xp.size(g) <= CHUNK else self.xp.flat(x, g, views)
        if flat is None:
            return self._apply(_fill(self.sig, iter(views)), x, g)
        x, g, flats = flat
        xp, n, pieces, d = self.xp, len(g), [], None
        kept = self.steps if self.steps is not None and xp.size(self.steps) == n else None
        for a in range(0, n, CHUNK):
            parts = [f[a:a + CHUNK] for f in flats]
            newsig, d = self._piece(parts, x[a:a + CHUNK], g[a:a + CHUNK])
            if d is None:
                continue
            step = d.value if isinstance(d, NewValue) else d
            if kept is not None and step.dtype == kept.dtype:
                xp.assign(kept[a:a + CHUNK], step)  # into the last run's step: no new array
                continue
            if kept is not None:
                pieces, kept = [kept[:a]], None
            pieces.append(step)
        if pieces:
            kept = self.steps = xp.flatcat(pieces)
        return _fill(newsig, iter(views)), (
            None if d is None else NewValue(kept) if isinstance(d, NewValue) else kept)

    def _piece(self, parts: list, x: Any, g: Any) -> tuple[Any, Any]:
        """The rule on one piece: its new state written into ``parts`` (flat views);
        the new signature and the step."""
        state, d = self._apply(_fill(self.sig, iter(parts)), x, g)
        out: list = []
        newsig = signature(state, out)
        for part, now in zip(parts, out):
            if now is not part:
                self.xp.assign(part, now)
        return newsig, d

    def _apply(self, state: Any, x: Any, g: Any) -> tuple[Any, Any]:
        """The rule at this step's clock applied, given the gradient if it takes one."""
        return self.now.apply(state, x, *(g,)[:self.ngrads])

    def _buffers(self, slots: list) -> list:
        """``xp.joined`` of each state slot's parts, the packed buffers found last step
        reused while the parts are the very same views (they keep their buffer alive)."""
        cached = self.views
        if len(cached) == len(slots) and all(
                len(parts) == len(old) and all(map(operator.is_, parts, old))
                for parts, (old, _) in zip(slots, cached)):
            return [hit for _, hit in cached]
        joined = [self.xp.joined(parts) for parts in slots]
        self.views = ([(parts, hit) for parts, hit in zip(slots, joined)]
                      if all(isview for _, isview in joined) else [])
        return joined

    def _place(self, value: Any, new: dict) -> None:
        """The parameters become the consecutive segments of ``value`` (a step that is a
        :class:`NewValue`): written in place where they may be, else new arrays."""
        xp = self.xp
        made = xp.scatter(value, self.xs) if self.write else xp.split(
            value, list(itertools.accumulate(map(xp.size, self.xs))), self.xs)
        for leaf, x, y in zip(self.leaves, self.xs, made or ()):
            new[id(leaf)] = xp.like(y, x)

    def _chunked(self, grads: list) -> bool:
        """In place, for groups of large arrays: the rule on cache-sized pieces of each
        array in turn, so that its temporaries stay in cache. ``False`` where the group
        is small, or mostly small arrays (concatenating them is better) or the backend cannot view
        its arrays flat (``xp.flat``)."""
        xp = self.xp
        if not self.write:
            return False
        if self.large is None:
            sizes = [xp.size(x) for x in self.xs]
            total = sum(sizes)
            self.large = total >= 16 * CHUNK and 16 * total >= CHUNK * len(sizes)
        if not self.large:
            return False
        members = [xp.flat(x, g, arrays) for x, g, arrays in zip(self.xs, grads, self.arrays)]
        if any(m is None for m in members):
            return False
        pieces = [(x[a:a + CHUNK], g[a:a + CHUNK], [s[a:a + CHUNK] for s in states])
                  for x, g, states in members for a in range(0, len(x), CHUNK)]
        self._restate(self._pieces(pieces))
        return True

    def _pieces(self, pieces: list) -> Any:
        """Step ``(x, g, state parts)`` pieces in place; return the new signature."""
        xp, newsig = self.xp, None
        for x, g, parts in pieces:
            newsig, d = self._piece(parts, x, g)
            if isinstance(d, NewValue):
                xp.assign(x, d.value)
            elif d is not None:
                xp.subtract(x, d, True)
        return newsig

    def _restate(self, newsig: Any, states: list | None = None) -> None:
        """Give each Leaf its new state (``states``, else made from ``newsig``), and the
        clock one more where the step was real (:meth:`~optimisers.Leaf.advance`, for the
        whole group at once)."""
        self.states = states if states is not None else _states(newsig, self.arrays)
        real = not self.counts or self.rule.stepped(newsig)
        if self.t is None:  # clocks that differ: each its own (rules without a schedule)
            self.clocks = [c + 1 for c in self.clocks] if real else self.clocks
        elif real:
            self.t += 1
            self.clocks = [self.t] * len(self.leaves)
        leaves = self.leaves  # (each attribute set in one C-level map)
        collections.deque(map(setattr, leaves, itertools.repeat("state"), self.states), 0)
        collections.deque(map(setattr, leaves, itertools.repeat("clock"), self.clocks), 0)
        self.sig = newsig


class Stack(Group):
    """Leafs of one shape whose rule :attr:`~optimisers.Rule.stacks` (``Muon``): their
    parameters, gradients and state arrays, each concatenation viewed as a stack
    ``(n, *shape)``, go through one ``apply``, so that each matrix product of the rule is
    one batched product; the new state and step are written back as :class:`Group`
    writes them. :func:`pack` lays each state array out as one such stack already.

    Example:
        >>> import numpy as np
        >>> from optimisers import Muon, setup, update_
        >>> from optimisers.state import plan_of
        >>> model = [np.ones((3, 2)) for _ in range(4)]
        >>> tree = setup(Muon(), model)
        >>> _ = update_(tree, model, [np.eye(3, 2)] * 4)
        >>> [(type(g).__name__, len(g.leaves)) for g in plan_of(tree).groups]
        [('Stack', 4)]
    """

    __slots__ = ()
    stacked = True

    def _chunked(self, grads: list) -> bool:
        return False

    def _shaped(self, flat: Any, like: Any) -> Any:
        return flat.reshape(len(self.xs), *like.shape)

    def _flat(self, a: Any) -> Any:
        return a.reshape(-1)


class Directed(Group):
    """Leafs whose rule steps along an elementwise :meth:`~optimisers.Rule.direction`
    scaled per array (``LAMB``: Adam's direction times a trust ratio). The direction runs
    as a :class:`Group` does on zeros
    standing for the parameters, which it does not read: each then holds exactly minus
    the direction's step ``a`` (``0 - a``); each parameter then takes
    ``rule.scaled(x, a)``, as the rule's own ``apply`` composes them.

    Example:
        >>> import numpy as np
        >>> from optimisers import LAMB, setup, update_
        >>> from optimisers.state import plan_of
        >>> model = [np.ones(3) for _ in range(4)]
        >>> tree = setup(LAMB(0.1), model)
        >>> _ = update_(tree, model, [np.ones(3)] * 4)
        >>> [(type(g).__name__, len(g.leaves)) for g in plan_of(tree).groups]
        [('Directed', 4)]
    """

    __slots__ = ("scratch",)

    def __init__(self, rule: Rule, sig: Any, members: list, write: bool) -> None:
        xp = backends.of(members[0][0].x)
        self.scratch = [xp.zeros_like(e.x) for e, _ in members]
        inner = [(Entry(e.leaf, s, e.grads, e.paths[0]), arrays)
                 for (e, arrays), s in zip(members, self.scratch)]
        super().__init__(rule.direction(), sig, inner, write)
        self.owner, self.params = rule, [e.x for e, _ in members]
        self.prints = xp.footprints(self.params)  # (the parameters', not the zeros')

    def run(self, grads: list, new: dict, found: dict | None = None) -> None:
        """The direction into the zeros, then each parameter's scaled step."""
        xp = self.xp
        now = at(self.owner, self.t)  # (at the clock before this step)
        if self.write:  # (out of place, the direction leaves the zeros as they are)
            for s in self.scratch:
                xp.assign(s, 0)
        minus: dict = {}
        super().run(grads, minus)
        for leaf, x, s in zip(self.leaves, self.params, self.scratch):
            y = xp.subtract(x, now.scaled(x, -minus.get(id(leaf), s)), self.write)
            if y is not x:
                new[id(leaf)] = y


def step_groups(entries: list, inplace: bool, known: list | None = None,
                found: dict | None = None) -> tuple[list, dict, list]:
    """Run the fusible entries group by group.

    ``known`` groups (from an earlier step) are tried first, checked by identity; the
    other entries are grouped afresh. Returns the entries left for the plain path, the
    new arrays made out of place (keyed by ``id(leaf)``), and the groups that ran.
    """
    new: dict[int, Any] = {}
    ran: list[Group] = []
    if known:
        entries = _run_known(known, entries, new, ran, found)
    fresh, rest, calls = _sort(entries, inplace)
    for (kind, rule, sig, *_, write), members in fresh.items():
        if len(members) < MIN_GROUP:
            rest.extend(e for e, _ in members)
            continue
        group = kind(rule, sig, members, write)
        _run(group, [e for e, _ in members], new, found)
        ran.append(group)
    for xp, batch in calls.items():
        left, done = xp.fuse(batch)
        rest.extend(left)
        for leaf, y in done:  # (advanced by the backend)
            new[id(leaf)] = y
    return rest, new, ran


def _run_known(known: list, entries: list, new: dict, ran: list, found: dict | None
               ) -> list:
    """Run each of the ``known`` groups that still holds its entries; the entries left."""
    byleaf = {id(e.leaf): e for e in entries}
    for group in known:
        members = [byleaf.get(id(leaf)) for leaf in group.leaves]
        if group.holds(members):
            _run(group, members, new, found)
            ran.append(group)
            for leaf in group.leaves:
                del byleaf[id(leaf)]
    return list(byleaf.values())


def _sort(entries: list, inplace: bool) -> tuple[dict, list, dict]:
    """``(fresh, rest, calls)``: the entries by the group they may form (with their state
    arrays), those for the plain path, and those for backends that step whole groups as
    one call (JAX), by backend."""
    fresh: dict[tuple, list] = {}
    rest: list = []
    calls: dict[Any, list] = {}
    for e in entries:
        rule, x = e.leaf.rule, e.x
        lib = backends.library(x)
        xp = backends.ops(lib) if lib is not None else None
        kind = _kind(rule) if len(e.grads) == 1 and xp is not None else None
        if kind is None or not (xp.FUSES_ITSELF or xp.CONCATENATES) or (
                xp.FUSES_ITSELF and places(rule)):
            rest.append(e)
        elif xp.FUSES_ITSELF:
            calls.setdefault(xp, []).append(e)
        else:
            arrays: list = []
            sig = signature(e.leaf.state, arrays)
            key = (kind, rule, sig, e.leaf.clock if timed(rule) else None, type(x), x.dtype,
                   xp.device(x), xp.shape(x) if kind is Stack else None,
                   inplace and xp.maywrite(x))
            try:
                fresh.setdefault(key, []).append((e, arrays))
            except TypeError:  # an unhashable scalar in the state: no group
                rest.append(e)
    return fresh, rest, calls


def _run(group: Group, members: list, new: dict, found: dict | None) -> None:
    """``group.run`` on its members' gradients; an error names the members' paths."""
    try:
        group.run([e.grads[0] for e in members], new, found)
    except (ValueError, TypeError, ArithmeticError) as err:
        err.add_note(in_group([e.paths[0] for e in members], group.owner))
        raise


def in_group(paths: list, rule: Rule) -> str:
    """Where an error inside a fused group happened: the rule and its Leafs' paths."""
    return (f"while stepping {rule!r} fused over {len(paths)} Leafs: "
            f"{keys_shown(paths, most=6, show=str)}")


def pack(leaves: list) -> None:
    """Lay out the state arrays of Leafs that would be fused together in one buffer each,
    with per-Leaf views, so that a fused step finds each group's state contiguous (and a
    :class:`Stack`'s, of one shape, a stack)."""
    groups: dict[tuple, list] = {}
    for leaf in leaves:
        kind = _kind(leaf.rule)
        if kind is None:
            continue
        arrays: list = []
        sig = signature(leaf.state, arrays)
        lib = backends.library(arrays[0]) if arrays else None
        xp = backends.ops(lib) if lib is not None else None
        if xp is None or not xp.CONCATENATES or not all(
                backends.library(a) == lib and xp.maywrite(a) for a in arrays):
            continue
        key = (leaf.rule, sig, xp.device(arrays[0]), tuple(a.dtype for a in arrays),
               tuple(xp.shape(a) for a in arrays) if kind is Stack else None)
        try:
            groups.setdefault(key, []).append((leaf, arrays))
        except TypeError:
            continue
    for (_, sig, *_), members in groups.items():
        if len(members) < MIN_GROUP:
            continue
        xp = backends.of(members[0][1][0])
        views = [xp.packed(parts) for parts in zip(*(arrays for _, arrays in members))]
        for i, (leaf, _) in enumerate(members):
            leaf.state = _fill(sig, iter(v[i] for v in views))
