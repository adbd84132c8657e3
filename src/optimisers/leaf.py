"""The Leaf: the optimiser state of one trainable array, and the one walk of a state tree."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from optimisers import backends
from optimisers.display import leaf_text
from optimisers.keypath import KeyPath
from optimisers.rules import Rule

__all__ = ["Leaf", "nodes", "leaves", "map_leaves"]


class Leaf:
    """Leaf(rule, state, frozen=False, clock=0): the optimiser state of one trainable array.

    A small mutable record whose identity encodes sharing: a tied parameter has one Leaf.
    ``frozen`` Leafs are skipped by updates; ``clock`` counts the rule's real steps here
    (schedules are evaluated at it). The ``repr`` shows the state by shape and dtype.

    Example:
        >>> from optimisers import Adam
        >>> Leaf(Adam(), Adam().init(np.zeros((3, 2), np.float32)))
        Leaf(Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-08), (f32[3, 2], f32[3, 2], 0.0))
    """

    # _kept: the tree's lock and plan, set by update_ on its first Leaf (state.py); a weak
    # table keyed by the Leaf would keep every tree alive, as the plan holds it
    __slots__ = ("rule", "state", "frozen", "clock", "_kept")

    def __init__(self, rule: Rule, state: Any, frozen: bool = False, clock: Any = 0) -> None:
        self.rule, self.state, self.frozen, self.clock = rule, state, frozen, clock

    def __repr__(self) -> str:
        return leaf_text(self.rule, self.state, self.frozen)

    def __reduce__(self) -> tuple:
        return type(self), (self.rule, self.state, self.frozen, self.clock)

    def advance(self, state: Any, ticks: dict | None = None) -> None:
        """Take the new state; count the step on the clock where
        :meth:`~optimisers.Rule.stepped` says it was real (traced: added as 0 or 1);
        ``ticks``: Leafs that shared a clock share the new one (JAX's groups)."""
        self.state = state
        real = self.rule.stepped(state)
        if real is False:
            return
        if ticks is None or type(self.clock) is int:
            self.clock = self.clock + (1 if real is True else real)
            return
        key = (id(self.clock), id(real))  # (``ticks`` holds both while the step runs)
        if key not in ticks:
            ticks[key] = (self.clock, real, self.clock + (1 if real is True else real))
        self.clock = ticks[key][2]


def nodes(tree: Any, kp: KeyPath = KeyPath()) -> Iterator[tuple[KeyPath, Any]]:
    """Every ``(KeyPath, node)`` of a state tree, parents first: the one walk of a state tree,
    lazy and of any depth; a ``TypeError`` for anything else (a model passed as the tree)."""
    stack = [iter(((kp, tree),))]
    while stack:
        for kp, t in stack[-1]:
            if not isinstance(t, (Leaf, dict, tuple, list)) and t is not None:
                raise not_a_tree(t, kp)
            yield kp, t
            if isinstance(t, (dict, tuple, list)):
                stack.append(_below(kp, t))
                break
        else:
            stack.pop()


def _below(kp: KeyPath, t: Any) -> Iterator[tuple[KeyPath, Any]]:
    """The ``(KeyPath, child)`` pairs of a dict, tuple or list, made lazily."""
    return ((kp + (k,), v) for k, v in (t.items() if isinstance(t, dict) else enumerate(t)))


def leaves(tree: Any, kp: KeyPath = KeyPath()) -> Iterator[tuple[KeyPath, Leaf]]:
    """Every ``(KeyPath, Leaf)`` of a state tree (a tied Leaf once a path)."""
    return ((kp, t) for kp, t in nodes(tree, kp) if isinstance(t, Leaf))


def map_leaves(f: Callable[[Leaf], Any], tree: Any) -> Any:
    """The state tree with ``f(leaf)`` for each Leaf, called once a Leaf (ties kept); a tree
    of any depth maps."""
    root: list = []
    mapped: dict[int, Any] = {}  # id(Leaf): f(Leaf)
    building = [(None, root, 1)]  # each open container: the node, its new children, how many
    for _, t in nodes(tree):
        if isinstance(t, (dict, tuple, list)):
            building.append((t, [], len(t)))
        else:
            if t is not None and id(t) not in mapped:
                mapped[id(t)] = f(t)
            building[-1][1].append(mapped.get(id(t)))
        while len(building) > 1 and len(building[-1][1]) == building[-1][2]:
            node, kids, _ = building.pop()
            building[-1][1].append(dict(zip(node, kids)) if isinstance(node, dict)
                                   else list(kids) if isinstance(node, list) else tuple(kids))
    return rooted(tree, root[0])


def rooted(like: Any, tree: Any) -> Any:
    """rooted(like, tree) -> ``tree`` in the class of ``like``'s root where that class says
    so (``__state_root__``: JAX's roots, ``fast/jaxtree.py``), else as it is."""
    if getattr(type(like), "__state_root__", False) and type(tree) is not type(like):
        out = type(like)(tree)
        vars(out).update(vars(like))  # (what the root keeps for JAX)
        return out
    return tree


def not_a_tree(t: Any, kp: KeyPath) -> TypeError:
    found = "an array" if backends.library(t) else f"a {type(t).__name__}"
    return TypeError(f"expected a state tree from setup(rule, model), but found {found} at "
                     f"{kp!r}; pass the state tree first: update(tree, model, grads)")
