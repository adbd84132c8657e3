"""Groups of Leafs (one rule by value, dtype, device, library, non-array state) stepped
together: an elementwise rule's own ``apply`` once over their flat buffers, bit for bit as
array by array. :func:`pack` lays their state out in one buffer at ``setup``; :class:`Stack`
batches what :attr:`~optimisers.Rule.stacks`; torch's Adam groups use ``fast/torchadam.py``.
"""

from __future__ import annotations

import collections
import functools
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
"""Elements per piece when a group of large arrays steps piece by piece, so that the
formula's temporaries stay cache-sized (see ``Group._chunked``)."""

def _memo(compute: Any) -> Any:
    """``compute(rule)`` kept per rule; asked each time for an unhashable one (traced)."""
    known: dict = {}

    def cached(rule: Rule) -> Any:
        try:
            return known[rule]
        except KeyError:
            out = known[rule] = compute(rule)
            return out
        except TypeError:
            return compute(rule)
    return functools.wraps(compute)(cached)


@_memo
def fusible(rule: Rule) -> tuple[bool, bool]:
    """``(elementwise, reads_x)``: whether ``rule`` may run fused, and reads ``x``."""
    parts = [fusible(r) for r in _inner(rule)]
    own = (True, False) if type(rule) is OptimiserChain else (
        type(rule).elementwise, type(rule).reads_x)
    return (own[0] and all(p[0] for p in parts), own[1] or any(p[1] for p in parts))


@_memo
def stackable(rule: Rule) -> bool:
    """Whether a rule that is not elementwise may step a :class:`Stack`.

    Example:
        >>> from optimisers import Adam, ClipNorm, Muon, OptimiserChain, WeightDecay
        >>> [stackable(r) for r in (Muon(), OptimiserChain(WeightDecay(), Muon()),
        ...                         OptimiserChain(ClipNorm(), Muon()), Adam())]
        [True, True, False, False]
    """
    own = type(rule) is OptimiserChain or type(rule).stacks or type(rule).elementwise
    return own and not fusible(rule)[0] and all(
        stackable(r) or fusible(r)[0] for r in _inner(rule))


def _kind(rule: Rule) -> type | None:
    """The group class a rule's Leafs may form, or ``None``."""
    if fusible(rule)[0]:
        return Group
    if stackable(rule):
        return Stack
    inner = rule.direction()
    return Directed if inner is not None and fusible(inner) == (True, False) else None


def _inner(rule: Rule) -> list:
    """The rules a rule holds in its fields (a chain's, EMA's)."""
    if type(rule) is OptimiserChain:
        return list(rule.rules)
    fields = getattr(rule, "__dataclass_fields__", {})
    return [v for v in (getattr(rule, f) for f in fields) if isinstance(v, Rule)]


def _counts(rule: Rule) -> bool:
    """Whether some step of ``rule`` may not be real (:meth:`Rule.stepped` overridden)."""
    passing = (OptimiserChain, EMA, MixedPrecision)
    return any(c.stepped is not Rule.stepped and c not in passing for c in _classes(rule))


def _classes(rule: Rule) -> tuple:
    """The classes of a rule and of the rules it holds."""
    return (type(rule), *(c for r in _inner(rule) for c in _classes(r)))


class Node(tuple):
    """A tuple in a state signature that holds arrays below it (rebuilt per Leaf)."""


ARRAY = object()  # where a state holds an array


def signature(state: Any, out: list) -> Any:
    """The state with its arrays moved into ``out`` and marked; parts without arrays kept."""
    if isinstance(state, tuple):
        n = len(out)
        parts = [signature(s, out) for s in state]
        return Node(parts) if len(out) > n else state
    cls = type(state)  # the registry's table read here: no call per state part per step
    lib = backends.LIBRARIES[cls] if cls in backends.LIBRARIES else backends.library(state)
    if lib is not None:
        out.append(state)
        return ARRAY
    return state


def _states(sig: Any, arrays: list) -> list:
    """The state with signature ``sig`` (:func:`_fill`) for each list of ``arrays``."""
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
        self.clocks = [leaf.clock for leaf in self.leaves]
        first = self.clocks[0]
        self.t = first if all(c == first for c in self.clocks) else None
        self.timed, self.reduced = timed(rule), bool(places(rule))
        self.now = at(rule, self.t)
        self.counts = _counts(rule)
        self.arrays = [arrays for _, arrays in members]
        self.xs = [e.x for e, _ in members]
        self.owner, self.params = rule, self.xs
        self.states: list = []  # the state objects this group last gave its Leafs
        self.xp = backends.of(self.xs[0])
        self.uses_x = fusible(rule)[1]
        self.ngrads = int(min(ngrads(rule), 1))  # whether apply takes the gradient (once)
        self.views: list = []  # per state slot: (its parts, their one packed buffer)
        self.large: bool | None = None  # mostly large arrays: stepped piece by piece
        self.subtract = self.steps = self.native = None  # made when needed
        self.prints = self.xp.footprints(self.params)
        if write and type(self) is Group and backends.library(self.xs[0]) == "torch":
            from optimisers.fast import torchadam
            self.native = torchadam.native(rule, sig, self.xs, self.arrays)

    def moved(self) -> bool:
        """Whether a parameter's memory changed since the group was made."""
        if self.native is not None:
            return self.native.moved(self.params)
        return self.xp.footprints(self.params) != self.prints

    def holds(self, entries: list) -> bool:
        """Whether ``entries`` (in member order) can step as this group: each Leaf, array,
        rule, state object and clock the very one this group left."""
        rule = self.owner
        return bool(self.states) and len(entries) == len(self.leaves) and all(
            e is not None and e.leaf is leaf and e.x is x and leaf.rule is rule
            and leaf.state is st and leaf.clock is c
            for e, leaf, x, st, c in zip(entries, self.leaves, self.params, self.states,
                                         self.clocks)
        ) and not self.moved()

    def run(self, grads: list, new: dict, found: dict | None = None) -> None:
        """One fused step at the group's clock, given the totals ``found`` (``reduce.py``)."""
        if self.timed or self.reduced:
            now = at(self.rule, self.t)
            self.now = given(now, found) if self.reduced and found else now
        if self.native is not None and self.native.step(self.now, grads):
            sig = _counted(self.sig, self.native.clip)
            self._restate(sig, self.native.states(sig))
        elif not self._chunked(grads):
            self._joined(grads, new)

    def _shaped(self, flat: Any, like: Any) -> Any:
        """How ``apply`` sees a concatenation of arrays like ``like``."""
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
            if now is not view or not isview:  # write back, or (read-only) take new parts
                made = xp.scatter(self._flat(now), parts)
                if made is not None:
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
        """The rule over the concatenations, piece by piece where ``xp.flat`` allows."""
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
        """The rule on one piece, its state written into ``parts``: ``(signature, step)``."""
        state, d = self._apply(_fill(self.sig, iter(parts)), x, g)
        out: list = []
        newsig = signature(state, out)
        for part, now in zip(parts, out):
            if now is not part:
                self.xp.assign(part, now)
        return newsig, d

    def _apply(self, state: Any, x: Any, g: Any) -> tuple[Any, Any]:
        """The rule at this step's clock applied."""
        return self.now.apply(state, x, *(g,)[:self.ngrads])

    def _buffers(self, slots: list) -> list:
        """``xp.joined`` of each state slot's parts, reused while they are the same views."""
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
        """The parameters become the consecutive segments of ``value`` (a NewValue)."""
        xp = self.xp
        made = xp.scatter(value, self.xs) if self.write else xp.split(
            value, list(itertools.accumulate(map(xp.size, self.xs))), self.xs)
        for leaf, x, y in zip(self.leaves, self.xs, made or ()):
            new[id(leaf)] = xp.like(y, x)

    def _chunked(self, grads: list) -> bool:
        """In place, the rule on cache-sized pieces of each large array; ``False`` if not."""
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
        newsig = None
        for x, g, states in members:
            for a in range(0, len(x), CHUNK):
                piece = x[a:a + CHUNK]
                newsig, d = self._piece([s[a:a + CHUNK] for s in states], piece, g[a:a + CHUNK])
                if isinstance(d, NewValue):
                    xp.assign(piece, d.value)
                elif d is not None:
                    xp.subtract(piece, d, True)
        self._restate(newsig)
        return True

    def _restate(self, newsig: Any, states: list | None = None) -> None:
        """Give each Leaf its new state and, where the step was real, its clock one more."""
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
    """Leafs of one shape whose rule :attr:`~optimisers.Rule.stacks` (``Muon``), stepped by
    one ``apply`` over their arrays viewed as stacks ``(n, *shape)``."""

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
    scaled per array (``LAMB``): the direction runs as a :class:`Group` on zeros standing
    for the parameters, then each parameter takes ``rule.scaled(x, a)``."""

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
    """Run the fusible entries group by group, ``known`` groups first: the entries left
    for the plain path, the new arrays made out of place by ``id(leaf)``, the groups run."""
    new: dict[int, Any] = {}
    ran: list[Group] = []
    if known:
        entries = _run_known(known, entries, new, ran, found)
    fresh, rest, calls = _sort(entries, inplace)
    for (kind, rule, sig, *_, write), members in fresh.items():
        alone = len(members) < MIN_GROUP  # (a group still where torch's kernel steps it:
        group = kind(rule, sig, members, write) if not alone or (  # the same numbers as in
            write and kind is Group and _native(rule, members[0][0].x)) else None  # many)
        if group is None or alone and group.native is None:
            rest.extend(e for e, _ in members)
            continue
        _run(group, [e for e, _ in members], new, found)
        ran.append(group)
    for lib, batch in calls.items():
        left, done = backends.registry.extension(lib).fuse(batch, found)
        rest.extend(left)
        for leaf, y in done:  # (advanced by the backend)
            new[id(leaf)] = y
    return rest, new, ran


def _native(rule: Rule, x: Any) -> bool:
    """Whether torch's Adam may step ``rule`` on ``x`` (``fast/torchadam.py``)."""
    if backends.library(x) != "torch":
        return False
    from optimisers.fast import torchadam
    return torchadam.takes(rule)


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
    """``(fresh, rest, calls)``: entries by group key, for the plain path, and by backend
    for backends that step whole groups as one call (JAX)."""
    fresh: dict[tuple, list] = {}
    rest: list = []
    calls: dict[Any, list] = {}
    for e in entries:
        rule, x = e.leaf.rule, e.x
        lib = backends.library(x)
        xp = backends.ops(lib) if lib is not None else None
        kind = _kind(rule) if len(e.grads) == 1 and xp is not None else None
        if xp is not None and xp.FUSES_ITSELF:
            calls.setdefault(lib, []).append(e)
        elif kind is None or not xp.CONCATENATES:
            rest.append(e)
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
    """Lay out the state arrays of Leafs that would be fused together in one buffer each."""
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
        for k in range(len(members[0][1])):  # a slot at a time, each Leaf's old array let
            views = xp.packed(tuple(arrays[k] for _, arrays in members))  # go at once: at
            for (leaf, arrays), view in zip(members, views):  # most one slot's arrays
                arrays[k] = view  # held twice
                leaf.state = _fill(sig, iter(arrays))
