"""The Leaf: the optimiser state of one trainable array, and walking a state tree."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.keypath import KeyPath
from optimisers.rules import Rule

__all__ = ["Leaf", "leaves", "map_leaves"]


class _Lazy:
    """The value of a Leaf's rule and state not yet unpacked from its flat form."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<not unpacked>"

    def __reduce__(self) -> str:
        return "_LAZY"  # copies (and deep copies) are the one object


_LAZY = _Lazy()


def _set_frozen(leaf: Leaf, value: bool) -> None:
    leaf._frozen = value  # not part of a flat form: that stays
    _written()


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

    __slots__ = ("_rule", "_state", "_frozen", "_plan", "_lock", "_packed")

    def __init__(self, rule: Rule, state: Any, frozen: bool = False) -> None:
        self._rule, self._state, self._frozen = rule, state, frozen
        self._plan = None  # set on a tree's first Leaf by update_: see _Plan
        self._lock = None  # likewise: one thread at a time steps that tree in place
        self._packed = None  # an array library's flat form of rule and state: see _lazy
        _written()

    @classmethod
    def _lazy(cls, packed: tuple, frozen: bool = False) -> Leaf:
        """A Leaf known by a flat form ``(spec, *children)`` of its rule and state, which
        ``spec.unpack(children)`` turns back into ``(rule, state)`` when either is first
        read (the JAX backend keeps a Leaf's numbers packed in one array so: see
        ``backends/jax.py``). Setting ``rule`` or ``state`` drops the flat form.

        Example:
            >>> from optimisers import Descent
            >>> class Spec:
            ...     def unpack(self, children):
            ...         return Descent(children[0]), None
            >>> Leaf._lazy((Spec(), 0.5))
            Leaf(Descent(eta=0.5), None)
        """
        leaf = cls.__new__(cls)
        leaf._rule = leaf._state = _LAZY
        leaf._frozen, leaf._plan, leaf._lock, leaf._packed = frozen, None, None, packed
        _written()
        return leaf

    def _unpack(self) -> None:
        if self._rule is _LAZY:
            spec, *children = self._packed
            self._rule, self._state = spec.unpack(children)

    def _drop_packed(self) -> None:
        """Before a write of rule or state: the flat form goes stale, the other field stays."""
        if self._packed is not None:
            self._unpack()
            self._packed = None

    def _get(name: str) -> Any:  # noqa: N805 (a helper of the class body)
        def get(self: Leaf) -> Any:
            value = getattr(self, name)
            if value is _LAZY:
                self._unpack()
                value = getattr(self, name)
            return value
        return get

    def _set(name: str) -> Any:  # noqa: N805 (a helper of the class body)
        def set_(self: Leaf, value: Any) -> None:
            self._drop_packed()
            setattr(self, name, value)
            _written()  # after the write: whoever sees the new count sees the new value
        return set_

    rule = property(_get("_rule"), _set("_rule"), doc="The Leaf's rule.")
    state = property(_get("_state"), _set("_state"),
                     doc="The rule's state for this Leaf's array.")
    frozen = property(operator.attrgetter("_frozen"), _set_frozen,
                      doc="Whether updates skip this Leaf (see freeze_).")
    del _get, _set

    def __repr__(self) -> str:
        frozen = ", frozen=True" if self.frozen else ""
        return f"Leaf({shown(self.rule)}, {brief(self.state)}{frozen})"


_WRITES = itertools.count()
_LAST = [next(_WRITES)]


def _written() -> None:
    """Note that some Leaf's rule, state or frozen flag was set (see :func:`writes`)."""
    _LAST[0] = next(_WRITES)  # each value drawn once: a late write never restores an old one


def writes() -> int:
    """A number that changes whenever any Leaf's ``rule``, ``state`` or ``frozen`` is set.

    ``update_``'s cached plan compares it with the number it saw after its own last step:
    when equal, no Leaf anywhere was touched since, so every Leaf is as that step left it
    and need not be checked one by one.
    """
    return _LAST[0]


def restate(leaves: list, states: list) -> None:
    """Give each of ``leaves`` its new state from ``states``: one write noted for all."""
    for leaf, state in zip(leaves, states):
        if leaf._packed is not None:  # (no call for NumPy's Leafs, which have none)
            leaf._drop_packed()
        leaf._state = state
    _written()


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


def shown(rule: Rule) -> str:
    """``repr(rule)``, with hyper-parameters that are concrete 0-d arrays (JAX's after
    ``jax.jit``, where they travel as data) shown as the numbers they hold."""
    return repr(_numbers(rule))


def _numbers(v: Any) -> Any:
    if isinstance(v, Rule) and dataclasses.is_dataclass(v):
        new = copy.copy(v)  # the rule's own repr, on numbers (fields set as __init__ would)
        for f in dataclasses.fields(v):
            object.__setattr__(new, f.name, _numbers(getattr(v, f.name)))
        return new
    if type(v) is tuple:
        return tuple(map(_numbers, v))
    if isinstance(v, np.generic):
        a = v
    elif backends.library(v) is None or backends.istraced(v) or getattr(v, "shape", 0) != ():
        return v
    else:
        try:
            a = np.asarray(v)[()]
        except Exception:  # a tensor off the CPU, say: shown as it is
            return v
    return float(str(a)) if isinstance(a, np.floating) else a.item()  # float32 0.01: 0.01


def leaves(tree: Any, kp: KeyPath = KeyPath()) -> Iterator[tuple[KeyPath, Leaf]]:
    """Every ``(KeyPath, Leaf)`` of a state tree in walk order (a tied Leaf once per path).

    Raises:
        TypeError: when the tree holds an array or other object that ``setup`` never
            puts there (a model passed where the state tree belongs).

    Example:
        >>> import numpy as np
        >>> from optimisers import Descent, setup
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
        raise not_a_tree(tree, kp)


def map_leaves(f: Callable[[Leaf], Any], tree: Any, kp: KeyPath = KeyPath()) -> Any:
    """map_leaves(f, tree) -> the state tree with ``f(leaf)`` in place of each Leaf.

    ``f`` is called once per path (a tied Leaf once for each); keep ties by memoising on
    the Leaf. Only ``None``, Leafs and plain dicts, tuples and lists may be in a state tree.

    Raises:
        TypeError: when the tree holds anything else (a model passed as the tree).

    Example:
        >>> import numpy as np
        >>> from optimisers import Descent, setup
        >>> map_leaves(lambda leaf: leaf.rule.eta, setup(Descent(), {"a": [np.ones(1)], "n": 3}))
        {'a': [0.1], 'n': None}
    """
    if isinstance(tree, Leaf):
        return f(tree)
    if type(tree) is dict:
        return {k: map_leaves(f, v, kp + (k,)) for k, v in tree.items()}
    if type(tree) in (tuple, list):
        return type(tree)(map_leaves(f, v, kp + (i,)) for i, v in enumerate(tree))
    if tree is None:
        return tree
    raise not_a_tree(tree, kp)


def not_a_tree(t: Any, kp: KeyPath) -> TypeError:
    found = "an array" if backends.library(t) else f"a {type(t).__name__}"
    return TypeError(f"expected a state tree from setup(rule, model), but found {found} at "
                     f"{kp!r}; pass the state tree first: update(tree, model, grads)")
