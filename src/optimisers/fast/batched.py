"""JAX's stacks (``fused.Stack`` for NumPy and PyTorch): Leafs whose rule stacks (``Muon``)
and whose rule and state have one structure, and parameters one shape, dtype and placement,
stepped by one ``jax.vmap`` of the rule's ``apply``: one batched product per matrix product.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from optimisers.fast import fused
from optimisers.rules import NewValue, call
from optimisers.schedules import at

__all__ = ["fuse"]


def fuse(entries: list) -> tuple[list, list]:
    """fuse(entries) -> ``(left, done)``: the entries (of rules that stack) left for the
    plain path, and ``(leaf, new state, new x)`` for those stepped in groups.

    Example:
        >>> import jax.numpy as jnp
        >>> from optimisers import Muon
        >>> from optimisers.gather import Entry
        >>> from optimisers.leaf import Leaf
        >>> entries = [Entry(Leaf(Muon(), Muon().init(jnp.ones((2, 2)))), jnp.ones((2, 2)),
        ...                  [jnp.eye(2)], ()) for _ in range(3)]
        >>> left, done = fuse(entries)
        >>> len(left), [y.shape for _, _, y in done]
        (0, [(2, 2), (2, 2), (2, 2)])
    """
    groups: dict[tuple, list] = {}
    for e in entries:
        x, rule = e.x, at(e.leaf.rule, e.leaf.clock)  # (schedules at the Leaf's clock)
        key = (jax.tree.structure((rule, e.leaf.state)), tuple(x.shape), x.dtype,
               None if isinstance(x, jax.core.Tracer) else x.sharding)
        groups.setdefault(key, []).append((e, rule))
    left, done = [], []
    for members in groups.values():
        if len(members) < fused.MIN_GROUP:
            left.extend(e for e, _ in members)
        else:
            done.extend(_step(members))
    return left, done


def _stack(*values: Any) -> Any:
    return jnp.stack(values)


def _shared(rules: list) -> Any:
    """The Leafs' one rule when equal and of Python numbers, not traced (kept floats, as on
    the plain path); else ``None``."""
    if any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(rules)):
        return None
    first = rules[0]
    return first if all(r == first for r in rules[1:]) else None


def _step(members: list) -> list:
    """``(leaf, state, x)`` of each ``(entry, its rule at its clock)``, by one ``vmap``."""
    kinds: list = []

    def apply(rule: Any, state: Any, x: Any, g: Any) -> tuple:
        state, d = call(rule, state, x, (g,))
        kinds.append(type(d))
        return state, d.value if isinstance(d, NewValue) else d

    members, rules = [e for e, _ in members], [rule for _, rule in members]
    shared = _shared(rules)
    states = jax.tree.map(_stack, *[e.leaf.state for e in members])
    xs, gs = jnp.stack([e.x for e in members]), jnp.stack([e.grads[0] for e in members])
    if shared is not None:  # (closed over, not an argument: vmap would make its numbers arrays)
        states, ds = jax.vmap(lambda s, x, g: apply(shared, s, x, g))(states, xs, gs)
    else:
        states, ds = jax.vmap(apply)(jax.tree.map(_stack, *rules), states, xs, gs)
    out = []
    for i, e in enumerate(members):
        state = jax.tree.map(lambda v, i=i: v[i], states)
        y = e.x if ds is None else jnp.asarray(
            ds[i] if kinds[0] is NewValue else e.x - ds[i], e.x.dtype)
        out.append((e.leaf, state, y))
    return out
