"""Moving a run between optax and this library, mid-run. An optax state holds arrays and
counts, not the transformation's numbers, so the rule of the same formula is given (or the
transformation, the other way); each optax state that keeps arrays (``ScaleByAdamState``,
``TraceState``) is matched, in order, to the rule of its formula in the chain, and the
count becomes the Leafs' clock. The next steps are then the same on either side, to
rounding."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import optax

from optimisers.adjust import adjust_
from optimisers.keypath import KeyPath, getkeypath
from optimisers.leaf import leaves
from optimisers.rules import Adam, AdamW, Momentum, Nesterov, OptimiserChain, Rule
from optimisers.rules.composite import chained
from optimisers.schedules import at, timed
from optimisers.state import setup
from optimisers.walk import fmap_with_path, substitute

__all__ = ["from_optax", "to_optax"]

_ADAM = (optax.ScaleByAdamState, ("mu", "nu", "count"))
_FIELDS = {Adam: _ADAM, AdamW: _ADAM, Momentum: (optax.TraceState, "trace"),
          Nesterov: (optax.TraceState, "trace")}
"""Each stateful rule: the optax state of its formula, and its state's items as that
state's fields (``Momentum`` with ``eta_outside=True``, ``optax.sgd``'s form)."""

_HYPER = {"learning_rate": "eta", "b1": "beta", "b2": "beta", "eps": "epsilon",
         "weight_decay": "lambd", "momentum": "rho", "max_norm": "omega", "eps_root": None}
"""``inject_hyperparams``' names and the rules' fields (``None``: must be 0)."""

_INJECTED = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)
_PLAIN = (optax.EmptyState, optax.ScaleByScheduleState, *_INJECTED)  # no arrays to move


def _parts(opt_state: Any) -> tuple[list, list]:
    """Every optax state in ``opt_state`` (NamedTuples, outer first), and those of them
    that keep arrays; another kind is refused."""
    nodes, stack = [], [opt_state]
    while stack:
        s = stack.pop()
        if hasattr(s, "_fields"):
            kinds = (*_PLAIN, *(kind for kind, _ in _FIELDS.values()))
            if not isinstance(s, kinds):
                raise ValueError(f"the optax state holds a {type(s).__name__}, which no rule here "
                                 f"reads; rules move from "
                                 f"{', '.join(k.__name__ for k in kinds)}")
            nodes.append(s)
        if isinstance(s, tuple):
            stack.extend(reversed(s))
    return nodes, [s for s in nodes if not isinstance(s, _PLAIN)]


def _matched(rule: Rule, state: Any, kp: KeyPath, found: list, f: Any) -> Any:
    """``state`` with ``f(names, s, node)`` for each rule of :data:`_FIELDS` in ``rule``,
    ``node`` the next of ``found``, checked to be of its kind (and all used)."""
    todo = iter(found)

    def each(r: Rule, s: Any) -> Any:
        if type(r) not in _FIELDS:
            if s is not None:
                raise ValueError(f"{r!r} keeps a state that no optax state here gives")
            return s
        kind, names = _FIELDS[type(r)]
        node = next(todo, None)
        if not isinstance(node, kind):
            raise ValueError(f"{r!r} at {kp!r} needs an optax {kind.__name__} at its place in "
                             f"the chain, but the optax state has {type(node).__name__} there; "
                             f"give the rule and the optax transformation of the same formula")
        if isinstance(r, Momentum) and not r.eta_outside:
            raise ValueError(f"{r!r} holds eta in its velocity, optax's trace does not; give "
                             f"{type(r).__name__}(..., eta_outside=True)")
        return f(names, s, node)

    state = chained(rule, state, each)
    if (left := next(todo, None)) is not None:
        raise ValueError(f"the optax state has a {type(left).__name__} that no rule of "
                         f"{rule!r} (at {kp!r}) keeps; give the rule of the same formula")
    return state


def from_optax(rule: Rule, opt_state: Any, params: Any) -> Any:
    """from_optax(rule, opt_state, params) -> tree: the state tree that goes on where the
    optax state ``opt_state`` of ``params`` stands.

    ``rule`` is the rule of the optax transformation's formula: ``optax.adam(lr, b1, b2,
    eps)`` is ``Adam(lr, (b1, b2), eps)``, ``optax.adamw(lr, ..., weight_decay=wd)``
    ``AdamW(lr, ..., lambd=wd)``, ``optax.sgd(lr, m, nesterov)`` ``Momentum`` or
    ``Nesterov(lr, m, eta_outside=True)`` (``Descent(lr)`` without momentum), and
    ``optax.chain(optax.clip_by_global_norm(c), t)`` ``OptimiserChain(ClipGlobalNorm(c),
    rule of t)``. Under ``optax.inject_hyperparams`` the state's numbers replace the rule's
    (``learning_rate`` is ``eta``, ``b1`` and ``b2`` ``beta``, ``eps`` ``epsilon``,
    ``weight_decay`` ``lambd``, ``momentum`` ``rho``), but a field where the rule holds a
    schedule keeps it (the state holds an injected schedule's value of one step: give the
    rule that schedule). The first count found is the clock.

    Args:
        rule: the rule (one for all of ``params``).
        opt_state: what ``transformation.init(params)`` and its updates gave.
        params: the parameters, a pytree of JAX arrays.

    Returns:
        The state tree of ``setup(rule, params)``, with optax's moments and counts.

    Raises:
        ValueError: the optax state and ``rule`` are not of one formula (naming the kinds).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from optimisers import Adam
        >>> params = {"w": jnp.ones(2)}
        >>> tx = optax.adam(0.1)
        >>> _, s = tx.update({"w": jnp.ones(2)}, tx.init(params))
        >>> tree = from_optax(Adam(0.1), s, params)
        >>> tree["w"].clock, tree["w"].state[0].tolist()
        (1, [0.1, 0.1])
    """
    nodes, found = _parts(opt_state)
    tree = setup(rule, params)
    hyper = {k: v for s in nodes if isinstance(s, _INJECTED) for k, v in s.hyperparams.items()}
    if unknown := [k for k, v in hyper.items() if _HYPER.get(k, "") is None and float(v) != 0
                   or k not in _HYPER]:
        raise ValueError(f"the injected hyper-parameters {unknown} have no field here")
    kept = _scheduled(rule)  # (an injected schedule's value of now: the rule's goes on)
    try:
        adjust_(tree, **{_HYPER[k]: (float(hyper["b1"]), float(hyper["b2"])) if k == "b1"
                         else float(v) for k, v in hyper.items()
                         if _HYPER[k] and k != "b2" and _HYPER[k] not in kept})
    except TypeError as err:
        err.add_note(f"from_optax: the optax state injects {sorted(hyper)}; give the rule of "
                     f"the transformation's formula")
        raise
    counts = [int(s.count) for s in nodes if "count" in s._fields]
    for kp, leaf in leaves(tree):
        leaf.state = _matched(leaf.rule, leaf.state, kp, found, lambda names, s, node, kp=kp:
                              _read(names, s, node, kp))
        leaf.clock = counts[0] if counts else 0
    return tree


def _scheduled(rule: Rule) -> set[str]:
    """The fields of ``rule`` (and of the rules it chains) that hold a schedule."""
    if isinstance(rule, OptimiserChain):
        return set().union(*map(_scheduled, rule.rules))
    return {f for f in getattr(rule, "__dataclass_fields__", ()) if timed(getattr(rule, f))}


def _read(names: Any, s: Any, node: Any, kp: KeyPath) -> Any:
    """The state ``s`` from the fields ``names`` of the optax state ``node``, at ``kp``."""
    if isinstance(names, tuple):
        return tuple(_read(n, x, node, kp) for n, x in zip(names, s))
    v = getattr(node, names)
    return float(v) if names == "count" else getkeypath(v, kp)


def to_optax(tree: Any, transformation: optax.GradientTransformation, params: Any) -> Any:
    """to_optax(tree, transformation, params) -> opt_state: the optax state with which
    ``transformation`` goes on where ``tree`` stands.

    ``transformation`` is of the formula of the tree's rule, as :func:`from_optax` reads
    them. Its ``init(params)`` gives the state's layout; the arrays come from the Leafs,
    every count from their clock (Adam's from its own), and injected hyper-parameters from
    the rule (its schedules at the clock).

    Args:
        tree: a state tree of ``params`` whose Leafs share one rule and one clock.
        transformation: the optax transformation to go on with.
        params: the parameters, a pytree of JAX arrays.

    Returns:
        The optax state, for ``transformation.update(grads, opt_state, params)``.

    Raises:
        ValueError: the rule and ``transformation`` are not of one formula, or the Leafs
            have several rules or clocks.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from optimisers import Momentum, setup, update
        >>> params = {"w": jnp.ones(2)}
        >>> tree, _ = update(setup(Momentum(0.1, eta_outside=True), params), params, params)
        >>> to_optax(tree, optax.sgd(0.1, 0.9), params)[0].trace["w"].tolist()
        [1.0, 1.0]
    """
    opt_state = transformation.init(params)
    nodes, found = _parts(opt_state)
    parts: list = [(None, {}) for _ in found]  # each of found: its fields, KeyPath -> items
    leafs = [leaf for _, leaf in leaves(tree)]
    for kp, leaf in leaves(tree):
        todo = iter(range(len(found)))
        _matched(leaf.rule, leaf.state, kp, found, lambda names, s, node, kp=kp, todo=todo:
                 _keep(parts, next(todo), names, kp, s))
    clocks = {int(leaf.clock) for leaf in leafs}
    if len(clocks) > 1 or any(leaf.rule != leafs[0].rule for leaf in leafs):
        raise ValueError(f"an optax state has one transformation and one count, but the "
                         f"tree's Leafs have several rules or the clocks {sorted(clocks)}")
    clock = clocks.pop() if clocks else 0
    new = {id(s): _written(s, *parts[i]) for i, s in enumerate(found) if parts[i][1]}
    members: list = []  # the rules of the chain, schedules at the clock
    if leafs:
        chained(at(leafs[0].rule, clock), leafs[0].state, lambda r, _: members.append(r))
    for s in nodes:
        if "count" in s._fields and id(s) not in new:
            new[id(s.count)] = jnp.asarray(clock, s.count.dtype)
        if isinstance(s, _INJECTED):
            new.update({id(v): jnp.asarray(_value(members, k), v.dtype)
                        for k, v in s.hyperparams.items() if _HYPER.get(k)})
            states = getattr(s, "hyperparams_states", {}).values()  # (a schedule's count)
            new.update({id(v.count): jnp.asarray(clock, v.count.dtype) for v in states
                        if hasattr(v, "count")})
    return substitute(opt_state, new)


def _keep(parts: list, i: int, names: Any, kp: KeyPath, s: Any) -> None:
    """Note the items of the state ``s`` at ``kp`` for the ``i``-th optax state."""
    parts[i] = (names, parts[i][1])
    parts[i][1][kp] = s if isinstance(names, tuple) else (s,)


def _written(node: Any, names: Any, parts: dict) -> Any:
    """The optax state ``node`` with the items ``parts`` (by KeyPath) in its fields."""
    new = {}
    for i, name in enumerate(names if isinstance(names, tuple) else (names,)):
        old = getattr(node, name)
        if name == "count":
            new[name] = jnp.asarray(next(iter(parts.values()))[i] if parts else old, old.dtype)
        else:
            new[name] = fmap_with_path(lambda kp, a, i=i: parts[kp][i] if kp in parts else a,
                                       old)
    return node._replace(**new)


def _value(members: list, name: str) -> Any:
    """The number of the injected hyper-parameter ``name`` in the first rule that has it."""
    field = _HYPER[name]
    r = next((r for r in members if hasattr(r, field)), None)
    if r is None:
        raise ValueError(f"the injected hyper-parameter {name!r} is no rule's field here")
    v = getattr(r, field)
    return v[("b1", "b2").index(name)] if field == "beta" else v
