"""The reduction of tree-level rules between gathering and stepping: a scope is the entries
holding an equal tree-level rule at the same *place* (``()``, a chain's index, ``"rule"``);
:func:`totals` reduces each scope, :func:`given` gives each Leaf its per-array rule."""

from __future__ import annotations

import copy as _copy_module
import dataclasses
import functools
import itertools
from collections.abc import Iterable
from typing import Any

from optimisers import backends
from optimisers.rules import OptimiserChain, Rule, call
from optimisers.rules.tree import TreeRule
from optimisers.schedules import at
from optimisers.walk import fmap

__all__ = ["places", "totals", "group_totals", "given", "copier"]


def copier() -> Any:
    """copier() -> a function copying writable arrays, leaving anything else as it is."""
    copiers: dict[str, Any] = {}

    def copy(a: Any) -> Any:
        lib = backends.library(a)
        if lib is None:
            return a
        if lib not in copiers:
            copiers[lib] = backends.ops(lib).copier()
        return copiers[lib](a)

    return copy


def places(rule: Rule) -> tuple:
    """places(rule) -> ``((place, tree_rule), ...)``: where tree-level rules sit in ``rule``.

    Example:
        >>> from optimisers import Adam, OptimiserChain, ClipGlobalNorm
        >>> places(OptimiserChain(ClipGlobalNorm(), Adam()))
        (((0,), ClipGlobalNorm(omega=1.0, p=2.0)),)
    """
    try:
        return _places(rule)
    except TypeError:  # unhashable: a value traced under jit
        return tuple(_find(rule, ()))


@functools.lru_cache(maxsize=4096)  # (a rule adjusted at every step is a new rule each time)
def _places(rule: Rule) -> tuple:
    return tuple(_find(rule, ()))


def _find(rule: Any, place: tuple) -> list:
    if isinstance(rule, TreeRule):
        return [(place, rule)]
    if type(rule) is OptimiserChain:
        return [f for i, r in enumerate(rule.rules) for f in _find(r, (*place, i))]
    if getattr(rule, "held", None) is not None:  # EMA, MixedPrecision: the rule they run
        return _find(rule.rule, (*place, "rule"))
    return []


def totals(entries: list) -> dict:
    """``{(place, tree_rule): total}`` per scope of ``entries``, checked."""
    scopes: dict[tuple, list] = {}
    for e in entries:
        for place, rule in places(at(e.leaf.rule, e.leaf.clock)):  # as given() finds them
            scopes.setdefault(_key(place, rule), [rule]).append(e)
    out, copy = {}, copier()
    for key, (rule, *members) in scopes.items():
        arriving = (_arriving(at(e.leaf.rule, e.leaf.clock), e.leaf.state, key[0], e.x,
                              e.grads[0], copy)[1] for e in members)
        arrived = [g for g in arriving if g is not None]
        if arrived:
            out[key] = _checked(rule, arrived, ((e.leaf.rule, e.leaf.state) for e in members),
                                key[0], [e.paths[0] for e in members])
    return out


def group_totals(rule: Rule, clock: Any, grads: list, states: list, paths: list
                 ) -> dict | None:
    """group_totals(rule, clock, grads, states, paths) -> :func:`totals` for one group's
    Leafs stepping ``rule`` at ``clock``; ``None`` where a rule runs before a tree-level one."""
    out = {}
    for place, tree_rule in places(at(rule, clock)):
        if any(step != 0 for step in place):
            return None
        out[_key(place, tree_rule)] = _checked(
            tree_rule, grads, zip(itertools.repeat(rule), states), place, paths)
    return out


def _checked(rule: TreeRule, grads: list, held: Iterable, place: tuple, paths: list) -> Any:
    """``rule``'s total of ``grads``, checked against the ``(rule, state)`` pairs ``held``."""
    total = rule.total(rule.parts(grads))
    if type(rule).check is not TreeRule.check:
        rule.check(total, [_arriving(r, s, place)[0] for r, s in held], paths)
    return total


def _key(place: tuple, rule: TreeRule) -> tuple:
    """A scope's key: the place and the rule (traced: its class and static fields)."""
    try:
        hash(rule)
    except TypeError:
        static = tuple(getattr(rule, f.name) for f in dataclasses.fields(rule)
                       if f.metadata.get("static"))
        return place, type(rule), static
    return place, rule


def _arriving(rule: Any, state: Any, place: tuple, x: Any = None, dx: Any = None,
              copy: Any = None) -> tuple[Any, Any]:
    """``(state, dx)`` as they reach ``place`` in ``rule`` (``dx`` ``None``: no step does)."""
    for step in place:
        if isinstance(step, int):  # a chain: the rules before run on copies of their states
            for r, s in zip(rule.rules[:step], state):
                if dx is not None:
                    _, dx = call(r, fmap(copy, s), x, (dx,))
            rule, state = rule.rules[step], state[step]
        else:
            rule, (state, x, dx) = rule.rule, rule.held(state, x, dx)
    return state, dx


def given(rule: Any, found: dict, place: tuple = ()) -> Any:
    """``rule`` with each tree-level rule replaced by its per-array form for ``found``."""
    if isinstance(rule, TreeRule):
        total = found.get(_key(place, rule))
        return rule if total is None else rule.given(total)
    if type(rule) is OptimiserChain:
        return OptimiserChain(*(given(r, found, (*place, i)) for i, r in enumerate(rule.rules)))
    if getattr(rule, "held", None) is not None:
        new = _copy_module.copy(rule)
        object.__setattr__(new, "rule", given(rule.rule, found, (*place, "rule")))
        return new
    return rule
