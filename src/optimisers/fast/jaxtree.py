"""JAX pytrees of this package's types: ``Leaf`` (as :class:`PackedLeaf`), every rule
and every schedule; and the JAX backend's functions that concern them (``settle``,
``complement``, ``fuse``, ``register_rule``, ``register_schedule``), which :func:`install`
adds to ``backends/jax.py`` (the registry imports this module once that backend is
loaded: ``backends/`` imports nothing above it).

A rule's hyper-parameters (its ``float`` fields, and ``tuple`` fields such as ``beta``) are
pytree *children*, so ``adjust`` of a learning rate passes new data to a jitted update
without re-tracing it; its other fields (``bool``, ``int``, dtypes, and fields declared
with ``metadata={"static": True}``) are static auxiliary data, and nested rules are
children. ``Leaf.frozen`` is static. Python numbers among the children (hyper-parameters,
and counters such as Adam's step count in a state) are flattened as weakly typed 0-d
arrays, so they are data under ``equinox.filter_jit`` too. A Leaf flattens with those
numbers packed into one array (see "Leaf: its numbers packed" below), made once by
``setup`` (:func:`settle`) and kept by the Leafs that a jitted call returns.

Under ``jax.jit`` XLA fuses each Leaf's plain ``apply`` itself; :func:`fuse` steps only the
Leafs of one shape whose rule stacks (``Muon``), by one ``jax.vmap`` (``fast/batched.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import threading
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import GetAttrKey

from optimisers.backends import jax as xp
from optimisers.backends import sharding
from optimisers.leaf import Leaf


def settle(leaf: Any) -> Any:
    """``leaf`` as a :class:`PackedLeaf`, its flat form for JAX made once (see :func:`_pack`).

    A jitted step takes the state tree as an argument and flattens it at every call. Made
    here, a tree straight from ``setup`` costs a call what any tree does, instead of
    turning its Python numbers into arrays each time (six per Adam Leaf; the cost is in
    benchmarks/README.md). And it is of the type that a jitted call
    returns, so that the call after the first does not trace again.
    """
    settled = PackedLeaf(leaf.rule, leaf.state, leaf.frozen, leaf.clock)
    packed, traced = _pack(settled.rule, settled.state, settled.clock)
    if not traced:
        settled.packed = packed
    return settled


def fuse(entries: list) -> tuple[list, list]:
    """Step the Leafs of one shape whose rule stacks (``Muon``) by one ``jax.vmap`` of its
    ``apply`` (``fast/batched.py``); every other entry is left to the plain path, whose
    ``jnp`` operations XLA fuses under ``jax.jit``. Returns the entries left and
    ``(leaf, new_x)`` for the others, their Leafs advanced."""
    from optimisers.fast import batched, fused

    stacks = [e for e in entries if not fused.fusible(e.leaf.rule)[0]]
    if not stacks:
        return entries, []
    more, stacked = batched.fuse(stacks)
    for leaf, state, _ in stacked:
        leaf.advance(state)
    elementwise = [e for e in entries if fused.fusible(e.leaf.rule)[0]]
    return elementwise + more, [(leaf, y) for leaf, _, y in stacked]


# --- pytree registration of Leaf and the rules ---------------------------------------------

_REGISTERED: set[type] = set()


_DATA_TYPES = ("float", "tuple", "Rule", "Array")


def _isdata(field: dataclasses.Field) -> bool:
    """Whether a rule's field travels as pytree data (a child) rather than static aux.

    Decided by the field's declaration alone, never by its value (``jax.tree.map`` may
    put anything at a leaf, and the structure must not change): ``float``, ``tuple``
    (such as ``beta``, or a chain's rules) and ``Rule`` fields are data; ``bool``,
    ``int`` and anything else (``Any``: a dtype) are static, as is a field declared with
    ``dataclasses.field(metadata={"static": True})``.
    """
    if field.metadata.get("static"):
        return False
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    return any(t in kind for t in _DATA_TYPES)


@functools.cache
def _layout(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The names of ``cls``'s data fields and of its static fields (``None``: not a
    dataclass, so the rule is static as a whole)."""
    if not dataclasses.is_dataclass(cls):
        return None
    fields = dataclasses.fields(cls)
    return (tuple(f.name for f in fields if _isdata(f)),
            tuple(f.name for f in fields if not _isdata(f)))


@functools.cache
def _getters(cls: type) -> tuple[Any, Any]:
    """Functions reading a rule's data fields and its static fields, each as a tuple in one
    call (a JAX step flattens every Leaf's rule each time it is called)."""
    data, static = _layout(cls)

    def getter(names: tuple) -> Any:
        if len(names) == 1:
            return lambda r, n=names[0]: (getattr(r, n),)
        return operator.attrgetter(*names) if names else lambda r: ()

    return getter(data), getter(static)


_AS_IS: set[type] = set()
_PACKING = threading.local()


def _dynamic(v: Any) -> Any:
    """A Python number (in tuples too) as a weakly typed 0-d JAX array, so that it is
    traced data everywhere: ``jax.jit`` treats a Python float so anyway, but
    ``equinox.filter_jit`` would make it static and re-trace whenever it changes (as a
    step count does at every step)."""
    if type(v) in _AS_IS:  # arrays and tracers: the common case, kept fast
        return v
    if type(v) is tuple:  # a state, or beta: arrays inline, no call for them
        return tuple([e if type(e) in _AS_IS else _dynamic(e) for e in v])
    if isinstance(v, jax.Array):
        _AS_IS.add(type(v))
        return v
    if isinstance(v, (bool, np.bool_)):
        return v
    if isinstance(v, (float, np.floating)):  # kept a number while _pack gathers them
        return float(v) if getattr(_PACKING, "on", False) else jnp.asarray(float(v))
    if isinstance(v, (int, np.integer)):
        return jnp.asarray(int(v))
    return v


def _split(rule: Any) -> tuple[tuple, list, tuple]:
    cls = type(rule)
    layout = _layout(cls)
    if layout is None:
        return (), [], (("", rule),)
    data, static = layout
    kids, statics = _getters(cls)
    return (data, [v if type(v) in _AS_IS else _dynamic(v) for v in kids(rule)],
            tuple(zip(static, statics(rule))))


def _flatten_rule(rule: Any) -> tuple[list, tuple]:
    names, kids, static = _split(rule)
    return kids, (names, static)


def _flatten_rule_with_keys(rule: Any) -> tuple[list, tuple]:
    names, kids, static = _split(rule)
    return [(GetAttrKey(n), v) for n, v in zip(names, kids)], (names, static)


def _unflatten_rule(cls: type, aux: tuple, kids: Any) -> Any:
    names, static = aux
    if static and static[0][0] == "":
        return static[0][1]  # not a dataclass: the rule itself was the aux data
    rule = object.__new__(cls)  # never re-run __init__/__post_init__ on traced values
    fields = getattr(rule, "__dict__", None)
    if fields is not None:  # a frozen dataclass: its fields set as object.__setattr__ would
        fields.update(zip(names, kids))
        fields.update(static)
        return rule
    for n, v in (*zip(names, kids), *static):  # __slots__
        object.__setattr__(rule, n, v)
    return rule


def register_rule(cls: type) -> None:
    """Register the rule class ``cls`` as a JAX pytree (once)."""
    if cls in _REGISTERED:
        return
    _REGISTERED.add(cls)
    jax.tree_util.register_pytree_with_keys(
        cls, _flatten_rule_with_keys, functools.partial(_unflatten_rule, cls), _flatten_rule)


# --- Leaf: its numbers packed in one array -------------------------------------------------
#
# Each array that a jitted function takes or returns costs XLA on the CPU a few microseconds
# per call, and its compile time grows faster than linearly with their number. A Leaf's
# hyper-parameters and counters are many such arrays: an Adam Leaf has five (eta, b1, b2,
# eps and its step count, a float) beside its two moments. So a Leaf flattens with its
# weakly typed floating 0-d values packed into one 1-D array: an Adam Leaf is then 3
# arrays, not 7.
# (What it saves on shape B: benchmarks/README.md.)
# A Leaf rebuilt by JAX (the output of a jitted call) keeps that flat form and unpacks it
# only when its rule or state is first read (PackedLeaf), so a training loop that passes
# the tree back in never unpacks it outside the trace. Read, a packed Leaf gives Python
# numbers; traced, 0-d arrays; batched by ``jax.vmap`` (the pack is then ``(..., n)``),
# one array per number with the batch in front.

_NUMBERS = GetAttrKey("numbers")


class _Spec:
    """How a Leaf flattens: the pytree structure of its ``(rule, state, clock)``, and which leaves
    of that structure travel packed (``packs``; ``n`` of them, none when fewer than two).

    Specs are interned: two Leafs of one structure share their spec, so treedefs compare
    by identity first.
    """

    __slots__ = ("treedef", "packs", "n", "rule_n", "_hash", "_keys")

    def __init__(self, treedef: Any, packs: tuple) -> None:
        self.treedef, self.packs, self.n = treedef, packs, sum(packs)
        # the rule's numbers come first, and travel with their complements
        self.rule_n = sum(packs[:treedef.children()[0].num_leaves]) if self.n else 0
        self._hash = hash((treedef, packs))
        self._keys = None

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is _Spec and self.packs == other.packs
                                 and self.treedef == other.treedef)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"<{self.n} numbers packed of {self.treedef}>"

    def unpack(self, children: list) -> tuple:
        """``(rule, state, clock)`` from a flat form's children; traced numbers come with their
        complements (see :func:`complement`)."""
        if not self.n:
            return jax.tree.unflatten(self.treedef, children)
        values = _unstack(children[0], self.n + self.rule_n)
        if isinstance(children[0], jax.core.Tracer):
            for v, c in zip(values[:self.rule_n], values[self.n:]):
                _remember(v, c)
        numbers, rest = iter(values[:self.n]), iter(children[1:])
        return jax.tree.unflatten(self.treedef, [next(numbers) if w else next(rest)
                                                 for w in self.packs])

    def keys(self) -> list:
        """The key of each child, for ``jax.tree_util`` paths (``numbers``, then the rest's
        own paths, such as ``state[0]``)."""
        if self._keys is None:
            dummy = jax.tree.unflatten(self.treedef, [0] * len(self.packs))
            paths = [jax.tree_util.keystr(p) for p, _ in
                     jax.tree_util.tree_flatten_with_path(dummy)[0]]
            names = {"[0]": "rule", "[1]": "state", "[2]": "clock"}
            rest = [GetAttrKey(names[p[:3]] + p[3:]) for p, w in zip(paths, self.packs) if not w]
            self._keys = [_NUMBERS, *rest] if self.n else rest
        return self._keys


_SPECS: dict[tuple, _Spec] = {}
_STACK = jax.jit(lambda *numbers: jnp.stack(numbers))


def _packable(v: Any, dtype: Any) -> bool:
    if type(v) is float:  # weakly typed, of the default dtype, once JAX takes it
        return True
    aval = getattr(v, "aval", None)  # JAX arrays and tracers
    return (aval is not None and aval.shape == () and aval.weak_type
            and aval.dtype == dtype)


def _pack(rule: Any, state: Any, clock: Any) -> tuple[tuple, bool]:
    """``(flat form, traced)``: the flat form ``(spec, *children)`` of a Leaf's rule,
    state and clock (an integer: never packed), and whether a value in it is traced (then
    it is not to be kept)."""
    _PACKING.on = True  # Python numbers go into the pack as they are: no array each
    try:
        flat, treedef = jax.tree.flatten((rule, _dynamic(state), clock))
    finally:
        _PACKING.on = False
    dtype = jax.dtypes.canonicalize_dtype(np.float64)  # float32 unless x64: all alike
    packs = tuple([_packable(v, dtype) for v in flat])
    if sum(packs) < 2:
        packs = (False,) * len(flat)
    key = (treedef, packs)
    spec = _SPECS.get(key) or _SPECS.setdefault(key, _Spec(treedef, packs))
    numbers = [v for v, w in zip(flat, packs) if w]
    rest = [_dynamic(v) for v, w in zip(flat, packs) if not w]  # a lone number: an array
    traced = any([isinstance(v, jax.core.Tracer) for v in flat])
    if numbers:
        numbers += [complement(v) for v in numbers[:spec.rule_n]]
        rest.insert(0, jnp.stack(numbers) if traced else _STACK(*numbers))
    if not traced:  # the numbers and clock replicated where the state is sharded
        rest = sharding.beside(state, rest)
    return (spec, *rest), traced


class _Lazy:
    """The value of a PackedLeaf's rule and state not yet unpacked from its flat form."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<not unpacked>"

    def __reduce__(self) -> str:
        return "_LAZY"  # copies (and deep copies) are the one object


_LAZY = _Lazy()
# the record's own slots, behind PackedLeaf's properties
_RULE, _STATE, _CLOCK = Leaf.rule, Leaf.state, Leaf.clock


def _unpacked(slot: Any, doc: str) -> property:
    """A PackedLeaf's field kept in the Leaf's ``slot``: unpacked when first read; set, the
    flat form goes stale (the other field is unpacked first, so it stays)."""
    def get(leaf: PackedLeaf) -> Any:
        value = slot.__get__(leaf, PackedLeaf)
        if value is _LAZY:
            leaf.unpack()
            value = slot.__get__(leaf, PackedLeaf)
        return value

    def set_(leaf: PackedLeaf, value: Any) -> None:
        if leaf.packed is not None:
            leaf.unpack()
            leaf.packed = None
        slot.__set__(leaf, value)

    return property(get, set_, doc=doc)


class PackedLeaf(Leaf):
    """PackedLeaf(rule, state, frozen=False, clock=0, packed=None): a Leaf with JAX arrays, holding
    its flat form for JAX, ``packed = (spec, *children)`` (see :func:`_pack`).

    ``setup`` makes JAX's Leafs so (:func:`settle`), and JAX rebuilds every Leaf so (the
    output of a jitted call): then ``rule`` and ``state`` are unpacked from the flat form
    only when first read, so that a training loop passing the tree back in never unpacks
    it outside the trace. Setting either drops the flat form; the next flatten makes it
    again. A Leaf made from a Leaf keeps its type (``type(leaf)(rule, state, frozen, clock)``):
    JAX compares trees' node types, and a jitted call given a plain ``Leaf`` where it was
    given a PackedLeaf would trace again.

    Example:
        >>> from optimisers import Descent
        >>> leaf = jax.tree.map(lambda v: v * 2, settle(Leaf(Descent(0.25), None)))
        >>> type(leaf).__name__, leaf
        ('PackedLeaf', Leaf(Descent(eta=0.5), None))
    """

    __slots__ = ("packed",)

    def __init__(self, rule: Any, state: Any, frozen: bool = False, clock: Any = 0,
                 packed: tuple | None = None) -> None:
        _RULE.__set__(self, rule)
        _STATE.__set__(self, state)
        _CLOCK.__set__(self, clock)
        self.frozen, self.packed = frozen, packed

    rule = _unpacked(_RULE, "The Leaf's rule.")
    state = _unpacked(_STATE, "The rule's state for this Leaf's array.")
    clock = _unpacked(_CLOCK, "The steps the rule has taken here.")

    def unpack(self) -> None:
        """Unpack ``rule``, ``state`` and ``clock`` from the flat form (nothing when they
        are at hand)."""
        if _RULE.__get__(self, PackedLeaf) is _LAZY:
            spec, *children = self.packed
            rule, state, clock = spec.unpack(children)
            _RULE.__set__(self, rule)
            _STATE.__set__(self, state)
            _CLOCK.__set__(self, clock)


# --- complements: 1 - b as precise as optax's and the torch backend's -----------------------
#
# Rules use 1 - b (Adam's 1 - beta2, RMSProp's 1 - rho). Computed from b in float32, as a
# traced hyper-parameter is, it is off by up to half an ulp of b: 1 - float32(0.999) is
# 1.3e-5 away from 0.001 relative, and Adam drifted from optax.adam. So a Leaf's pack also
# carries the complement of each number of its rule (hyper-parameters: not the state's
# counters, which change at every step), computed from the Python float, and under jit the
# complement of a number that came from a pack is that packed one.

_COMPLEMENTS: dict[int, tuple[Any, Any]] = {}


def _remember(v: Any, c: Any) -> None:
    """Note that ``c`` is the precise complement of the traced number ``v`` (as long as
    ``v`` lives)."""
    key = id(v)
    _COMPLEMENTS[key] = (weakref.ref(v, lambda _: _COMPLEMENTS.pop(key, None)), c)


def complement(v: Any) -> Any:
    """``1 - v``: in float64 for a Python number, the packed complement for a traced
    number that came from a Leaf's pack, else computed in ``v``'s dtype."""
    if type(v) is float:
        return 1.0 - v
    kept = _COMPLEMENTS.get(id(v))
    if kept is not None and kept[0]() is v:
        return kept[1]
    return 1 - v


def _unstack(packed: Any, n: int) -> list:
    shape = getattr(packed, "shape", None)
    if not shape or shape[-1] != n:
        return [packed] * n  # something else that jax.tree.map put there: at each place
    if isinstance(packed, jax.core.Tracer) or len(shape) > 1:  # traced, or batched (vmap)
        packed = jnp.asarray(packed)
        return [jax.lax.index_in_dim(packed, i, axis=-1, keepdims=False) for i in range(n)]
    host = np.asarray(packed)  # Python numbers, as setup gave them: weakly typed too
    if host.dtype == np.float32:  # each the shortest decimal that is the same float32
        return [float(str(v)) for v in host]
    return host.tolist()


def _flatten_leaf(leaf: Any) -> tuple:
    packed = leaf.packed if type(leaf) is PackedLeaf else None
    if packed is None:
        packed, traced = _pack(leaf.rule, leaf.state, leaf.clock)
        if not traced and type(leaf) is PackedLeaf:
            leaf.packed = packed
    return packed[1:], (packed[0], leaf.frozen)


def _flatten_leaf_with_keys(leaf: Any) -> tuple:
    children, aux = _flatten_leaf(leaf)
    return list(zip(aux[0].keys(), children)), aux


def _unflatten_leaf(aux: tuple, children: Any) -> PackedLeaf:
    return PackedLeaf(_LAZY, _LAZY, aux[1], _LAZY, (aux[0], *children))


def _register_all() -> None:
    from optimisers.rules import Rule

    for cls in (Leaf, PackedLeaf):  # a plain Leaf too, made by hand: rebuilt as a PackedLeaf
        if cls not in _REGISTERED:
            _REGISTERED.add(cls)
            jax.tree_util.register_pytree_with_keys(
                cls, _flatten_leaf_with_keys, _unflatten_leaf, _flatten_leaf)
    _register_subclasses(Rule, register_rule)


def _register_subclasses(base: type, register: Any) -> None:
    """``register`` every subclass of ``base`` defined so far, at any depth."""
    todo = list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        register(cls)
        todo.extend(cls.__subclasses__())



# --- schedules: pytrees whose every number is a leaf ---------------------------------------
#
# A schedule's numbers (start, end, steps, boundaries...) are all children, ints included:
# its formula never branches in Python on them, so that an ``adjust`` to a schedule of the
# same class with other numbers never re-traces. Only flags (``Exponential.staircase``,
# declared ``static``) and ``Function``'s function are static. Nested schedules
# (``Warmup.schedule``, ``Join.schedules``) are children, and flatten in turn. Rebuilt from
# concrete values (a jitted step's output, read), a step count comes back a Python int as
# it went in, never a 0-d array (its floats come back so from the Leaf's pack).


@functools.cache
def _schedule_layout(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    fields = dataclasses.fields(cls)
    return (tuple(f.name for f in fields if not f.metadata.get("static")),
            tuple(f.name for f in fields if f.metadata.get("static")))


def _flatten_schedule(s: Any) -> tuple[list, tuple]:
    data, static = _schedule_layout(type(s))
    return ([_dynamic(getattr(s, n)) for n in data],
            (data, tuple((n, getattr(s, n)) for n in static)))


def _flatten_schedule_with_keys(s: Any) -> tuple[list, tuple]:
    kids, aux = _flatten_schedule(s)
    return [(GetAttrKey(n), v) for n, v in zip(aux[0], kids)], aux


def _unflatten_schedule(cls: type, aux: tuple, kids: Any) -> Any:
    return _unflatten_rule(cls, aux, [_count(v) for v in kids])


def _count(v: Any) -> Any:
    """A weakly typed concrete 0-d integer array (a Python int that went through JAX) as that
    int again; in a tuple too (``Join.boundaries``); anything else as it is."""
    if type(v) is tuple:
        return tuple(map(_count, v))
    if (isinstance(v, jax.Array) and not isinstance(v, jax.core.Tracer) and v.shape == ()
            and v.weak_type and v.dtype.kind in "iu"):
        return int(v)
    return v


def register_schedule(cls: type) -> None:
    """register_schedule(cls) -> None: the schedule class ``cls`` as a JAX pytree (once),
    rebuilt as rules are, without re-running its checks on traced numbers.

    Example:
        >>> from optimisers import Linear
        >>> register_schedule(Linear)  # done already: each schedule class registers itself
        >>> [str(v.dtype) for v in jax.tree.leaves(Linear(1.0, 0.0, 10))]
        ['float32', 'float32', 'int32']
    """
    if cls in _REGISTERED:
        return
    _REGISTERED.add(cls)  # (its fields are read at its first flattening: once a dataclass)
    jax.tree_util.register_pytree_with_keys(
        cls, _flatten_schedule_with_keys, functools.partial(_unflatten_schedule, cls),
        _flatten_schedule)


def _register_schedules() -> None:
    from optimisers.schedules import Schedule

    _register_subclasses(Schedule, register_schedule)


def install() -> None:
    """install() -> None: add this module's functions to the JAX backend (once), and
    register every rule and schedule class defined so far as a JAX pytree.

    Example:
        >>> install()  # done already when this module was imported
        >>> xp.settle is settle
        True
    """
    for name in ("settle", "complement", "fuse", "register_rule", "register_schedule",
                 "PackedLeaf"):
        setattr(xp, name, globals()[name])
    _register_all()
    _register_schedules()


install()
