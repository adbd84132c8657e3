"""The state tree: ``setup`` mirrors the model with Leafs; an update is *plan* (``plan.py``,
the steady state), else *gather* (``gather.py``, validating), then *step* (:func:`_step`)."""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import os
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from optimisers import backends, telemetry
from optimisers.adjust import covering, matches
from optimisers.backends.registry import COMPILERS
from optimisers.fast import fused
from optimisers.gather import DOTGRAD, Entry, check_fit, gather, module_grads, nest_dotted
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, leaves, map_leaves
from optimisers.plan import Plan, first_leaf
from optimisers.reduce import copier, given, places, totals
from optimisers.rules import NewValue, Rule, call
from optimisers.schedules import at, timed
from optimisers.tree import isleaf, ismutable, isnumeric, maywrite, trainable
from optimisers.walk import fmap, mirror, place, substitute, walk

__all__ = ["Leaf", "chooser", "setup", "update", "update_", "leaves"]


Rules = Rule | Mapping[str, "Rule | None"] | Callable[[KeyPath, Any], "Rule | None"]


def setup(rule: Rules, model: Any) -> Any:
    """setup(rule, model) -> tree: the optimiser state tree for ``model``.

    Walks the model once. Each trainable numeric array (by :func:`trainable` and
    :func:`isnumeric`) gets ``Leaf(rule, rule.init(x))``; every other position gets
    ``None``. Keyed nodes become dicts keyed like the model, tuples stay tuples and
    lists lists, so ``tree["layers"][0]["weight"]`` addresses a Leaf. A mutable array
    reached by several paths (a tie; also an array inside a shared container or
    ``nnx.Param``) gets one shared Leaf.

    Rules per subset, as torch's parameter groups and optax's ``partition``: ``rule`` may
    be a mapping from ``where=`` patterns (see :func:`~optimisers.adjust.matches`) to
    rules, the first pattern that matches an array's path winning, ``None`` meaning "not
    trained"; or a function ``(KeyPath, array) -> Rule | None``. Every path of a tie is
    asked, once, and all must give equal (``==``) rules.

    Args:
        rule: the optimisation rule, e.g. ``Adam()``; or rules by path, as above.
        model: any nesting of arrays in tuples, lists, dicts, dataclasses, registered
            classes or ``torch.nn.Module``, at most :data:`~optimisers.walk.MAX_DEPTH`
            containers deep.

    Returns:
        The state tree, to be passed to :func:`update` / :func:`update_`.

    Raises:
        TypeError: ``rule`` is none of these, or its function gives no rule (naming the path).
        ValueError: no pattern matches a trainable array, a tie's paths pick different rules,
            a rule refuses its array (:meth:`Rule.refuses`: ``Muon`` trains matrices only),
            or the model nests deeper than :data:`~optimisers.walk.MAX_DEPTH` or contains
            itself (a cycle), naming the paths.

    Example:
        >>> from optimisers import AdamW, Descent
        >>> w = np.ones(2)
        >>> tree = setup(Descent(), {"enc": w, "dec": w, "steps": np.arange(3)})
        >>> tree
        {'enc': Leaf(Descent(eta=0.1), None), 'dec': Leaf(Descent(eta=0.1), None), 'steps': None}
        >>> tree["enc"] is tree["dec"]
        True
        >>> tree = setup({"*.bias": AdamW(lambd=0.0), "*": AdamW(lambd=0.1)},
        ...              {"enc": {"weight": np.ones(2), "bias": np.ones(2)}})
        >>> tree["enc"]["bias"].rule.lambd, tree["enc"]["weight"].rule.lambd
        (0.0, 0.1)
    """
    choose = chooser(rule)
    made: list[Leaf] = []
    libs: set = set()

    def make(kp: KeyPath, x: Any) -> Leaf | None:
        r = choose(kp, x)
        if r is None:
            return None
        if (why := r.refuses(x)) is not None:
            raise ValueError(f"{r!r} cannot train the array at {kp}: {why}; "
                             f"{_another_rule(rule, model, kp)}")
        made.append(Leaf(r, at(r, 0).init(x)))
        libs.add(backends.library(x))
        return made[-1]

    tree = walk_trainable(make, model, cache=True, build=mirror,
                          again=None if isinstance(rule, Rule) else _asker(choose))
    fused.pack(made)
    for ext in filter(None, map(backends.registry.extension, libs)):
        tree = ext.root(tree)
    if not made:
        warnings.warn("setup found no trainable parameter in the model: no floating-point "
                      "array sits at a trainable position", UserWarning, stacklevel=2)
    return tree


def walk_trainable(f: Callable, model: Any, ys: tuple = (), *, cache: bool = False,
                   build: Callable = lambda node, kids: None, again: Callable | None = None
                   ) -> Any:
    """The walk of ``setup`` (and ``trainables``): ``f(keypath, array, *ys_leaves)`` at each
    trainable numeric array, ``None`` at every other leaf and untrained child."""
    return walk(lambda kp, x, *ys: f(kp, x, *ys) if isnumeric(x) else None, model, ys,
                exclude=lambda x: isnumeric(x) or isleaf(x), cache=cache, build=build,
                keys=trainable, again=again)


def chooser(rule: Rules) -> Callable[[KeyPath, Any], Rule | None]:
    """chooser(rule) -> the function ``(KeyPath, array) -> Rule | None`` :func:`setup` asks,
    for any ``rule`` that setup takes; raising as setup does (a TypeError for another ``rule``).

    Example:
        >>> from optimisers import Adam, KeyPath
        >>> choose = chooser({"*.bias": None, "*": Adam()})
        >>> choose(KeyPath("enc", "bias"), np.ones(2)) is None
        True
    """
    if isinstance(rule, Rule):
        return lambda kp, x: rule
    if isinstance(rule, Mapping):
        return _by_pattern(rule)
    if not callable(rule):
        raise TypeError(f"setup(rule, model) takes a Rule first (or a mapping of patterns "
                        f"to rules, or a function of the path and array), got "
                        f"{type(rule).__name__}; e.g. setup(Adam(), model)")

    def by_function(kp: KeyPath, x: Any) -> Rule | None:
        r = rule(kp, x)
        if r is not None and not isinstance(r, Rule):
            raise TypeError(f"setup's function gave a {type(r).__name__} for {kp}; it must "
                            f"give a Rule or None")
        return r
    return by_function


def _by_pattern(rules: Mapping) -> Callable[[KeyPath, Any], Rule | None]:
    """The rule of the first pattern of ``rules`` that matches a path."""
    patterns = list(rules.items())
    for pattern, r in patterns:
        if r is not None and not isinstance(r, Rule):
            raise TypeError(f"setup(rule, model) takes a Rule first, got "
                            f"{type(rules).__name__} mapping {pattern!r} to a "
                            f"{type(r).__name__} (a mapping gives rules or None by where= "
                            f"pattern); e.g. setup(Adam(), model)")

    def by_pattern(kp: KeyPath, x: Any) -> Rule | None:
        for pattern, r in patterns:
            if matches(pattern, kp):
                return r
        raise ValueError(f"no pattern of setup matches the trainable array at {kp} "
                         f"(patterns: {', '.join(map(repr, rules))}); add one, or "
                         f"'*': None to leave the rest untrained")
    return by_pattern


def _another_rule(rule: Rules, model: Any, kp: KeyPath) -> str:
    """What to do when a rule refuses the array at ``kp``: a ``setup`` call that works."""
    if not isinstance(rule, Rule | Mapping):
        return (f"make the function given to setup return another rule (AdamW(), say) for "
                f"{kp} and arrays like it")
    if not kp:
        return "give it another rule, e.g. setup(AdamW(), model)"
    choose, refused, kept = chooser(rule), [], []

    def note(path: KeyPath, x: Any) -> None:
        try:
            r = choose(path, x)
        except ValueError:  # no pattern matches it: not this error's business
            r = None
        (refused if r is not None and r.refuses(x) is not None else kept).append(path)

    walk_trainable(note, model)
    given = {"*": rule} if isinstance(rule, Rule) else rule
    items = [*(f"{p!r}: AdamW()" for p in covering(refused, kept)),
             *(f"{p!r}: {r!r}" for p, r in given.items())]
    return f"give such arrays another rule by path, e.g. setup({{{', '.join(items)}}}, model)"


def _asker(choose: Callable[[KeyPath, Any], Rule | None]) -> Callable:
    """``setup``'s check that every path of a tie gets the first path's rule from ``choose``."""

    def same(first: KeyPath, kp: KeyPath, x: Any, out: Any) -> None:
        want = out.rule if isinstance(out, Leaf) else None
        r = choose(kp, x)
        if r != want:
            raise ValueError(f"the tied array at {first} and {kp} would get two rules, "
                             f"{want!r} and {r!r}; give its paths one rule")

    def again(first: KeyPath, kp: KeyPath, x: Any, out: Any) -> None:
        walk_trainable(lambda rel, a, y: same(first + rel, kp + rel, a, y), x, (out,))
    return again


def _step(entries: list, inplace: bool, known: list | None = None) -> tuple[dict, list]:
    """Each Leaf's rule once, fused where possible (rules that may raise first, on copies)."""
    kinds: dict[int, tuple] = {}  # id(rule): (whether timed, its tree-level rules)
    reducing = []  # the entries whose rules hold tree-level rules
    nows: dict = {}  # the rule at a clock, made once for Leafs that share both
    for e in entries:
        check_fit(e)
        rule = e.leaf.rule
        kind = kinds.get(id(rule)) or kinds.setdefault(id(rule), (timed(rule), places(rule)))
        if kind[0]:
            _apply(e, None, {}, nows, dry=True)  # a schedule's value out of its field's range
        if kind[1]:
            reducing.append(e)
    found = totals(reducing) if reducing else {}  # tree-level rules' reductions
    risky = [e for e in entries if e.leaf.rule.raises()] if inplace else []
    copy = copier() if risky else None
    done = {id(e.leaf): _apply(e, fmap(copy, e.leaf.state), found, nows) for e in risky}
    rest, new, groups = fused.step_groups([e for e in entries if id(e.leaf) not in done],
                                          inplace, known, found)
    for e in (*rest, *risky):
        leaf, x = e.leaf, e.x
        state, d = done[id(leaf)] if id(leaf) in done else _apply(e, leaf.state, found, nows)
        leaf.advance(state)
        if d is None:
            continue
        xp = backends.of(x)
        if isinstance(d, NewValue):
            y = xp.assign(x, d.value) if inplace else xp.like(d.value, x)
        else:
            y = xp.subtract(x, d, inplace)
        if y is not x:
            new[id(leaf)] = y
    return new, groups


def _share(e: Entry, new: dict, inplace: bool) -> None:
    """A tie the tree declares but the model does not share: the other arrays follow."""
    y = new.get(id(e.leaf), e.x)
    if inplace and all(map(maywrite, e.others)):
        for other in e.others:
            backends.of(other).assign(other, y)
    else:
        new[id(e.leaf)] = y


def _apply(e: Entry, state: Any, found: dict, nows: dict, dry: bool = False) -> tuple[Any, Any]:
    """``(new_state, step)`` of one entry's rule (``dry``: only checked); errors name the path."""
    try:
        rule, clock = e.leaf.rule, e.leaf.clock
        now = nows.get((id(rule), id(clock)))
        if now is None or now[0] is not rule or now[1] is not clock:
            now = nows[id(rule), id(clock)] = (rule, clock, at(rule, clock))
        now = given(now[2], found) if found else now[2]
        return (None, None) if dry else call(now, state, e.x, tuple(e.grads))
    except (ValueError, TypeError, ArithmeticError) as err:
        raise type(err)(f"{err} (in {e.leaf.rule!r} at {e.paths[0]!r})") from err


_LOCKING = [threading.Lock()]  # guards making a tree's lock; made anew in a forked child
_FORKS = [0]  # how many forks this process descends from: a child makes its locks anew


def _forked() -> None:
    _FORKS[0] += 1
    _LOCKING[0] = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forked)


@dataclasses.dataclass(slots=True)
class _Kept:
    """What ``update_`` keeps on a tree's first Leaf: its lock and the last step's plan."""

    forks: int
    lock: Any
    plan: Plan | None = None


def _kept_of(first: Leaf) -> _Kept:
    """What ``update_`` keeps for the tree whose first Leaf is ``first`` (anew after fork)."""
    kept = getattr(first, "_kept", None)
    if kept is None or kept.forks != _FORKS[0]:
        with _LOCKING[0]:
            kept = getattr(first, "_kept", None)
            if kept is None or kept.forks != _FORKS[0]:
                plan = kept.plan if kept is not None else None
                kept = first._kept = _Kept(_FORKS[0], threading.RLock(), plan)
    return kept


def plan_of(tree: Any) -> Plan | None:
    """plan_of(tree) -> the plan that ``update_`` keeps for ``tree`` (its fused groups:
    ``plan_of(tree).groups``), or ``None`` before any step."""
    return getattr(getattr(first_leaf(tree), "_kept", None), "plan", None)


def _update(tree: Any, model: Any, grads: tuple, inplace: bool, stats: bool) -> tuple:
    """``(tree, model)``, and the step's :class:`~optimisers.LeafStats` by path if ``stats``."""
    first = first_leaf(tree) if inplace else None
    kept = _kept_of(first) if first is not None else None
    record: dict | None = {} if stats else None
    with kept.lock if kept is not None else contextlib.nullcontext():
        tree, model = _locked_update(tree, model, grads, inplace, kept, record)
    return (tree, model) if record is None else (tree, model, record)


def _nested(grads: Any, model: Any) -> Any:
    """The gradient trees with dicts of dotted names nested as the model is."""
    if grads is DOTGRAD:
        return grads
    nested = tuple(nest_dotted(g, model) for g in grads)
    return grads if all(map(operator.is_, nested, grads)) else nested


def _locked_update(tree: Any, model: Any, grads: tuple, inplace: bool, kept: _Kept | None,
                   record: dict | None) -> tuple[Any, Any]:
    known, given = kept.plan if kept is not None else None, grads
    if known is not None and known.dotted:
        grads = _nested(given, model)
    per_tree = known.read(tree, model, grads) if known is not None else None
    if per_tree is not None and record is None and known.whole(per_tree, grads is DOTGRAD):
        return tree, model  # the usual training loop: one fused group, all checked
    entries = known.entries(per_tree) if per_tree is not None else None
    if entries is None:
        grads = _nested(given, model)
        if known is not None:
            known.dotted = grads is not given
        entries = gather(tree, model, (module_grads(model),) if grads is DOTGRAD else grads)
    new, groups = _stepped(entries, inplace, known.groups if known is not None else None,
                           record)
    if not new:
        if kept is not None and (known is None or known.tree is not tree
                                 or known.model is not model):
            known = kept.plan = Plan(tree, model)  # the next step reuses what it learned
            known.dotted = grads is not given
        if known is not None:
            known.learn(groups)
        return tree, model
    model = place(tree, model, lambda leaf, x: new.get(id(leaf), x), inplace)
    # a mutable array may also sit where no Leaf is: update changes it there as update_ does
    moved = {id(e.x): new[id(e.leaf)] for e in entries
             if id(e.leaf) in new and ismutable(e.x)}
    return tree, substitute(model, moved) if moved else model


def _stepped(entries: list, inplace: bool, known: list | None, record: dict | None
             ) -> tuple[dict, list]:
    """:func:`_step`, ties the model does not share made to follow, and the record of the
    step into ``record`` (unless ``None``)."""
    with backends.nograd():  # PyTorch: no autograd graph through the step
        seen = telemetry.before(entries, inplace) if record is not None else None
        new, groups = _step(entries, inplace, known)
        for e in entries:
            if e.others:
                _share(e, new, inplace)
        if seen is not None:
            record.update(telemetry.after(entries, seen, new))
    return new, groups


def copy_tree(tree: Any) -> Any:
    """A state tree whose Leafs and writable state arrays are fresh copies; sharing kept,
    and state packed by :func:`fused.pack` stays packed. Each new Leaf is of its old one's
    type: JAX's stay JAX's (``fast/jaxtree.py``), so that a jitted call does not trace again."""
    copy = copier()
    return map_leaves(lambda t: type(t)(t.rule, fmap(copy, t.state), t.frozen, t.clock), tree)


def update(tree: Any, model: Any, grads: Any, *higher: Any, stats: bool = False) -> tuple:
    """update(tree, model, grads, stats=False) -> (tree, model): one optimisation step, pure.

    Neither the old tree nor the old model, nor any array in them, is changed: the
    returned tree and model are new (unchanged parts are shared). ``grads`` mirrors the
    model: the same container types, a ``dict`` keyed by child names for any node, or an
    object of the model's own class (what ``jax.grad`` returns). ``None``, or a key
    missing from a dict, means "no gradient here": those Leafs keep their state.
    Gradients reaching one tied Leaf by several paths are summed, the rule runs once,
    and the new array is placed at every path.

    Args:
        tree: the state tree from :func:`setup`.
        model: the model the tree was made for.
        grads: the gradient of the loss with respect to ``model``.
        *higher: further gradient trees for rules whose ``apply`` takes them.
        stats: also return what the step did to each Leaf: a dict of
            :class:`~optimisers.LeafStats` (norms of the gradient, the update and the
            parameter, their ratio, non-finite gradients, the state's RMS, scheduled
            values) keyed by each Leaf's (first) path: under ``jit``, part of the output;
            outside it, one host read a step (whether any gradient is non-finite). It costs
            passes over the arrays (and, in place, a copy of each parameter): ask for it on
            the steps you log.

    Returns:
        ``(new_tree, new_model)``, or ``(new_tree, new_model, stats)``.

    Raises:
        ValueError: a gradient's shape or the gradient tree's structure does not match
            the model, or the tree does not match the model; the message names the path.
        TypeError: a gradient is not an array, or a model was passed as the tree.

    Example:
        >>> from optimisers import Descent
        >>> model = {"w": np.array([1.0, 2.0]), "n": 3}
        >>> tree = setup(Descent(0.1), model)
        >>> tree, new = update(tree, model, {"w": np.array([10.0, 0.0])})
        >>> new["w"], model["w"]
        (array([0., 2.]), array([1., 2.]))
    """
    for compiling, untraced in COMPILERS:  # traced by torch.compile: run as Python
        if compiling():
            return untraced(update)(tree, model, grads, *higher, stats=stats)
    return _update(copy_tree(tree), model, (grads, *higher), False, stats)


_NOGRAD = object()


def update_(tree: Any, model: Any, grads: Any = _NOGRAD, *higher: Any, stats: bool = False
            ) -> tuple:
    """update_(tree, model, grads, stats=False) -> (tree, model): one optimisation step, in
    place.

    Like :func:`update` (``stats`` too), but arrays that may be written (NumPy, PyTorch)
    are updated in place, and the Leafs' states are mutated; JAX arrays are replaced. Use
    the returned model. Everything is validated before anything is written: after an
    error, model and tree are as they were. For a ``torch.nn.Module``, ``grads`` may be
    left out: each parameter's ``.grad`` is used.

    Example:
        >>> from optimisers import Momentum
        >>> model = [np.array([1.0, 2.0])]
        >>> tree = setup(Momentum(0.1), model)
        >>> tree, same = update_(tree, model, [np.array([1.0, 1.0])])
        >>> model[0], same is model
        (array([0.9, 1.9]), True)
    """
    for compiling, untraced in COMPILERS:  # traced by torch.compile: run as Python
        if compiling():
            return untraced(update_)(tree, model, grads, *higher, stats=stats)
    return _update(tree, model, DOTGRAD if grads is _NOGRAD else (grads, *higher), True, stats)


backends.registry.extend("jax", "optimisers.fast.jaxtree")  # Leafs, rules: pytrees
backends.registry.load_imported()  # JAX imported first: rules and Leafs are pytrees already
