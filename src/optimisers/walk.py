"""Walking models: fmap and friends, with the identity cache that keeps ties."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from optimisers.keypath import KeyPath
from optimisers.tree import children, isleaf, ismutable, ispositional, rebuild, rebuild_

__all__ = ["fmap", "fmap_with_path", "fmapstructure", "fleaves", "mirror", "place", "substitute",
           "MAX_DEPTH"]

MAX_DEPTH = 100
"""How many containers deep ``setup``, ``update`` and ``fmap`` walk a model (deeper: a
``ValueError`` naming the path); state-tree walks take any depth."""


def enter(path: tuple, x: Any, inside: dict, what: str) -> None:
    """Note the container ``x`` as open in a walk (``inside``: id to path; the caller deletes
    ``id(x)`` when done), or refuse it past :data:`MAX_DEPTH` or already open (a cycle)."""
    if len(path) >= MAX_DEPTH:
        shown = ", ".join([*map(repr, path[:3]), "...", *map(repr, path[-3:])])
        raise ValueError(f"{what} is nested more than {MAX_DEPTH} containers deep: the "
                         f"{type(x).__name__} at KeyPath({shown}) ({len(path)} keys down) "
                         f"holds more, and setup, update and fmap walk at most {MAX_DEPTH} "
                         f"levels (optimisers.walk.MAX_DEPTH); nest the model less deeply")
    first = inside.setdefault(id(x), path)
    if first is not path:
        raise ValueError(f"{what} contains itself: the {type(x).__name__} at "
                         f"{KeyPath(*first)!r} is reached again at {KeyPath(*path)!r}, inside "
                         f"itself (a cycle, which no walk finishes); break the reference "
                         f"back to the enclosing node, or keep it out of the node's children")


def mirror(x: Any, new_children: Mapping) -> Any:
    """The state tree's twin of the node ``x``: a tuple or list, or a ``dict`` by key."""
    if ispositional(x):
        return list(new_children.values()) if isinstance(x, list) else tuple(new_children.values())
    return dict(new_children)


def _child_of(y: Any, key: Any) -> Any:
    """The child of a companion tree ``y`` under ``key``, or ``None``."""
    return None if y is None else (y if isinstance(y, Mapping) else children(y)).get(key)


def walk(f: Callable, x: Any, ys: tuple, *, exclude: Callable, cache: bool, build: Callable,
         keys: Callable | None = None, again: Callable | None = None) -> Any:
    """The one tree walk behind fmap, fmapstructure and setup.

    ``f(keypath, leaf, *ys_leaves)`` runs where ``exclude`` holds; other nodes become
    ``build(node, new_children)``, walking only ``keys(node)`` (the others ``None``).
    With ``cache``, a mutable object reached again reuses its first result, and
    ``again(first_keypath, keypath, object, result)`` is told.
    """
    memo: dict[int, tuple[Any, Any, KeyPath]] = {}
    inside: dict[int, tuple] = {}

    def go(kp: KeyPath, x: Any, ys: tuple) -> Any:
        tied = cache and ismutable(x)
        if tied and id(x) in memo:
            _, out, first = memo[id(x)]
            if again is not None:
                again(first, kp, x, out)
            return out
        if exclude(x):
            out = f(kp, x, *ys)
        else:
            enter(kp, x, inside, "the model")
            kids = children(x)
            walked = kids.keys() if keys is None else set(keys(x))
            out = build(x, {
                k: go(kp + (k,), v, tuple(_child_of(y, k) for y in ys)) if k in walked else None
                for k, v in kids.items()})
            del inside[id(x)]
        if tied:
            memo[id(x)] = (x, out, kp)  # holding x keeps its id from being reused
        return out

    return go(KeyPath(), x, ys)


def fmap_with_path(f: Callable, x: Any, *ys: Any, exclude: Callable = isleaf,
                   cache: bool = True) -> Any:
    """fmap_with_path(f, x, *ys) -> ``x`` rebuilt with ``f(keypath, leaf, *y_leaves)`` at each leaf.

    Like :func:`fmap`, but ``f`` also receives the :class:`KeyPath` of the leaf.

    Example:
        >>> fmap_with_path(lambda kp, v: f"{kp}={v}", {"a": 1, "b": (2, 3)})
        {'a': 'a=1', 'b': ('b.0=2', 'b.1=3')}
    """
    return walk(f, x, ys, exclude=exclude, cache=cache, build=rebuild)


def fmap(f: Callable, x: Any, *ys: Any, exclude: Callable = isleaf, cache: bool = True) -> Any:
    """fmap(f, x, *ys) -> ``x`` rebuilt with ``f(leaf, *y_leaves)`` in place of each leaf,
    every node as its own type. With ``cache=True`` a **mutable** object reached by several
    paths is mapped once and the one result placed at every path, so ties survive.

    Args:
        f: the function applied to each leaf.
        x: the model.
        *ys: companion trees of the same structure.
        exclude: the predicate that stops the walk (default: nodes without children).
        cache: whether to keep ties of mutable objects.

    Example:
        >>> w = np.ones(2)
        >>> out = fmap(lambda a: a * 2, {"enc": w, "dec": w, "n": (1.0,)})
        >>> out["enc"], out["enc"] is out["dec"]
        (array([2., 2.]), True)
    """
    return walk(lambda kp, *a: f(*a), x, ys, exclude=exclude, cache=cache, build=rebuild)


def fmapstructure(f: Callable, x: Any, *ys: Any, exclude: Callable = isleaf,
                  cache: bool = True) -> Any:
    """fmapstructure(f, x, *ys) -> like :func:`fmap`, but into plain containers.

    Tuples and lists stay so; every other node becomes a ``dict`` (a state tree's shape).

    Example:
        >>> from collections import namedtuple
        >>> P = namedtuple("P", "w b")
        >>> fmapstructure(lambda v: v * 10, [P(1, 2)])
        [{'w': 10, 'b': 20}]
    """
    return walk(lambda kp, *a: f(*a), x, ys, exclude=exclude, cache=cache, build=mirror)


def fleaves(x: Any, exclude: Callable = isleaf) -> list:
    """fleaves(x) -> the list of leaves of ``x``, in walk order; a tied mutable leaf once.

    Example:
        >>> w = np.zeros(2)
        >>> len(fleaves({"a": w, "b": w, "c": 1.0}))
        2
    """
    out: list = []
    walk(lambda kp, v: out.append(v), x, (), exclude=exclude, cache=True, build=lambda x, c: x)
    return out


def place(t: Any, x: Any, value: Callable[[Any, Any], Any], inplace: bool = False) -> Any:
    """The model ``x`` with ``value(marker, old)`` where the mirror tree ``t`` holds a
    marker (a Leaf, an index; ``None``: unchanged); ``inplace`` uses :func:`rebuild_`."""

    def at(t: Any, x: Any) -> tuple[Any, Any]:
        if t is None or not isinstance(t, (dict, tuple, list)):
            return (x if t is None else value(t, x)), None
        kids = children(x)
        return None, ((k, t[k], kids[k]) for k in (t if isinstance(t, dict) else range(len(t))))

    return _rewritten(t, x, at, rebuild_ if inplace else rebuild, "the state tree")


def substitute(x: Any, new: dict) -> Any:
    """``x`` with every leaf whose ``id`` is a key of ``new`` replaced (ties kept)."""

    def at(x: Any, _: Any) -> tuple[Any, Any]:
        if id(x) in new:
            return new[id(x)], None
        kids = children(x)
        return (x, None) if not kids else (None, ((k, c, c) for k, c in kids.items()))

    return _rewritten(x, x, at, rebuild, "the model")


def _rewritten(t: Any, x: Any, at: Callable, build: Callable, what: str) -> Any:
    """``x`` rewritten by ``at(t, x) -> (new, None) or (None, (key, t_child, x_child)s)``;
    only nodes with a changed child rebuilt, each mutable one once (ties kept)."""
    memo: dict[int, tuple[Any, Any]] = {}
    inside: dict[int, tuple] = {}

    def go(path: tuple, t: Any, x: Any) -> Any:
        out, below = at(t, x)
        if below is None:
            return out
        if id(x) in memo:
            return memo[id(x)][1]
        enter(path, t, inside, what)
        walked = ((k, xk, go((*path, k), tk, xk)) for k, tk, xk in below)
        changed = {k: y for k, xk, y in walked if y is not xk}
        del inside[id(t)]
        out = build(x, changed) if changed else x
        if ismutable(x):
            memo[id(x)] = (x, out)
        return out

    return go((), t, x)
