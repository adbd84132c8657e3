"""Changing a state tree after setup: hyper-parameters, freezing, and selecting by path."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, leaves, map_leaves
from optimisers.rules import OptimiserChain, Rule
from optimisers.tree import keys_shown

__all__ = ["adjust", "adjust_", "freeze_", "thaw_", "select", "matches", "covering"]

Where = str | Callable[[KeyPath, Leaf], bool] | None


def select(tree: Any, where: Where = None) -> list[Leaf]:
    """select(tree, where) -> the distinct Leafs of ``tree`` that ``where`` picks, in walk order.

    ``where`` is ``None`` (every Leaf), a glob over the dotted key path (see
    :func:`matches`), or a predicate ``(KeyPath, Leaf) -> bool``. A tied Leaf is picked
    when any of its paths is. Every ``where=`` of this library goes through here.

    Raises:
        ValueError: when ``where`` picks no Leaf, or a glob ends in a lone backslash.
        TypeError: when ``tree`` is not a state tree, or ``where`` cannot take
            ``(KeyPath, Leaf)``.

    Example:
        >>> from optimisers import Descent, setup
        >>> tree = setup(Descent(), {"enc": {"w": np.ones(2), "bias": np.ones(2)}})
        >>> len(select(tree, "*.bias")), len(select(tree, "enc")), len(select(tree))
        (1, 2, 2)
    """
    match = _matcher(where)
    picked: dict[int, Leaf] = {}
    for kp, leaf in leaves(tree):
        if match is None or match(kp, leaf):
            picked.setdefault(id(leaf), leaf)
    if where is not None and not picked:
        raise ValueError(f"where={where!r} matches no Leaf; the paths are: "
                         f"{keys_shown((kp for kp, _ in leaves(tree)), most=6, show=str)}")
    return list(picked.values())


def _matcher(where: Where) -> Callable[[KeyPath, Leaf], bool] | None:
    """``where`` as a predicate ``(KeyPath, Leaf) -> bool`` (``None`` for every Leaf)."""
    if isinstance(where, str):
        pattern = _compiled(where)
        return lambda kp, leaf: pattern.fullmatch(_text(kp)) is not None
    if where is None:
        return None
    if not callable(where):
        raise TypeError(f"where= takes a glob string or a predicate (KeyPath, Leaf) -> bool, "
                        f"got {type(where).__name__}")
    try:
        signature = inspect.signature(where)
    except (TypeError, ValueError):  # a builtin without a signature: trusted
        return where
    try:
        signature.bind(KeyPath(), None)
    except TypeError:
        name = getattr(where, "__name__", type(where).__name__)
        raise TypeError(f"where= takes a predicate of two arguments, (KeyPath, Leaf) -> bool, "
                        f"but {name}{signature} cannot take two; write it as "
                        f"lambda kp, leaf: ... (str(kp) is the dotted path)") from None
    return where


def matches(pattern: str, kp: KeyPath | tuple) -> bool:
    r"""matches(pattern, kp) -> whether the ``where=`` glob ``pattern`` picks the key path ``kp``.

    Matched against the keys joined by dots: ``*`` matches any run of characters, dots
    included (``*.bias``: every bias), ``?`` one character of a key, an unescaped ``.``
    only the dot between two keys, and a backslash makes the next character literal
    (``b\.c`` is the one key ``"b.c"``); every other character is itself. A pattern also
    picks every path below the one it matches (``encoder``; ``layers.1``, not ``layers.10``).
    """
    return _compiled(pattern).fullmatch(_text(kp)) is not None


def covering(paths: list[KeyPath], others: list[KeyPath]) -> list[str]:
    """covering(paths, others) -> ``where=`` patterns picking all of ``paths``, none of
    ``others``: each the shortest ``*.``-suffix of a path that can, else the path itself."""
    found: list[str] = []
    for kp in paths:
        if any(matches(pattern, kp) for pattern in found):
            continue
        keys = [re.sub(r"([\\.*?])", r"\\\1", str(k)) for k in kp]  # each key literally
        for pattern in [*("*." + ".".join(keys[i:]) for i in range(len(keys) - 1, 0, -1)),
                        ".".join(keys)]:
            if not any(matches(pattern, other) for other in others):
                break
        found.append(pattern)
    return found


def _text(kp: KeyPath | tuple) -> str:
    """The dotted path, each key's backslashes and dots escaped."""
    return ".".join(_escape(str(k)) for k in kp)


def _escape(key: str) -> str:
    return key.replace("\\", "\\\\").replace(".", "\\.")


_KEY_CHAR = r"(?:\\.|[^\\.])"  # one character of a key: an escaped pair, or any but \ and .
_ANY_CHARS = r"(?:\\.|[^\\])*"  # a run of characters of keys and the dots between them


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern:
    """``pattern`` as a regular expression over :func:`_text`."""
    parts, chars = [], iter(pattern)
    for c in chars:
        if c == "\\":
            literal = next(chars, None)
            if literal is None:
                raise ValueError(f"where={pattern!r} ends in a lone backslash; write \\\\ "
                                 f"for a backslash in a key")
            parts.append(re.escape(_escape(literal)))
        else:
            parts.append({"*": _ANY_CHARS, "?": _KEY_CHAR, ".": r"\."}.get(c, re.escape(c)))
    return re.compile("".join(parts) + r"(?:\..*)?", re.DOTALL)  # or a prefix of whole keys


def _fields(rule: Rule) -> set[str]:
    """Every hyper-parameter name in ``rule``, through chains and wrappers."""
    names = set()
    for f in dataclasses.fields(rule):
        v = getattr(rule, f.name)
        inner = (v,) if isinstance(v, Rule) else v if f.name == "rules" else None
        names |= {f.name} if inner is None else set().union(*map(_fields, inner))
    return names


def _adjust_rule(rule: Rule, changes: dict) -> Rule:
    if isinstance(rule, OptimiserChain):
        return OptimiserChain(*(_adjust_rule(r, changes) for r in rule.rules))
    new = {}
    for f in dataclasses.fields(rule):
        v = getattr(rule, f.name)
        if isinstance(v, Rule):
            new[f.name] = _adjust_rule(v, changes)
        elif f.name in changes:
            new[f.name] = changes[f.name]
    return dataclasses.replace(rule, **new) if new else rule


def _chosen(tree: Any, where: Where, eta: float | None, fields: dict) -> tuple[list, Any]:
    """The Leafs ``where`` picks, and ``_adjust_rule`` with the changes, once per rule object:
    Leafs that shared a rule share the new one (fused groups stay whole)."""
    chosen = select(tree, where)
    changes = _changes([leaf.rule for leaf in chosen], eta, fields)
    made: dict[int, Rule] = {}  # (the old rules stay alive in the tree: their ids stay taken)

    def new(rule: Rule) -> Rule:
        if id(rule) not in made:
            made[id(rule)] = _adjust_rule(rule, changes)
        return made[id(rule)]

    return chosen, new


def _changes(rules: list[Rule], eta: float | None, fields: dict) -> dict:
    changes = dict(fields, **({} if eta is None else {"eta": eta}))
    known = set().union(*(_fields(r) for r in rules)) if rules else set()
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TypeError(f"no rule here has a field {unknown[0]!r} (the rules have "
                        f"{sorted(known)}); check the spelling")
    return changes


def adjust(tree: Any, eta: float | None = None, *, where: Where = None, **fields: Any) -> Any:
    """adjust(tree, eta=None, **fields) -> a new tree with hyper-parameters replaced.

    Each Leaf's rule gets the new values of the fields it has (through chains and
    wrappers); its state is kept (shared). A positional number is ``eta``. ``where=``
    (see :func:`select`) chooses the Leafs. Also works on a bare rule.

    Raises:
        TypeError: when no rule in the tree has one of the given fields.
        ValueError: when ``where`` matches nothing, or a new value is invalid.

    Example:
        >>> from optimisers import Adam
        >>> adjust(Adam(), 0.01) == Adam(0.01), adjust(Adam(), beta=(0.8, 0.99))
        (True, Adam(eta=0.001, beta=(0.8, 0.99), epsilon=1e-08))
    """
    if isinstance(tree, Rule):
        return _adjust_rule(tree, _changes([tree], eta, fields))
    chosen, adjusted = _chosen(tree, where, eta, fields)
    ids = {id(leaf) for leaf in chosen}

    def renew(leaf: Leaf) -> Leaf:
        rule = adjusted(leaf.rule) if id(leaf) in ids else leaf.rule
        return type(leaf)(rule, leaf.state, leaf.frozen, leaf.clock)  # see copy_tree

    return map_leaves(renew, tree)


def adjust_(tree: Any, eta: float | None = None, *, where: Where = None, **fields: Any) -> Any:
    """adjust_(tree, eta=None, **fields) -> tree, its Leafs' rules changed in place.

    As :func:`adjust`, but mutating the Leafs.

    Example:
        >>> from optimisers import AdamW, setup
        >>> tree = setup(AdamW(lambd=0.1), {"w": np.ones(2), "bias": np.ones(2)})
        >>> _ = adjust_(tree, where="bias", lambd=0.0)
        >>> tree["w"].rule.lambd, tree["bias"].rule.lambd
        (0.1, 0.0)
    """
    chosen, adjusted = _chosen(tree, where, eta, fields)
    new = [adjusted(leaf.rule) for leaf in chosen]  # validate all, then write
    for leaf, rule in zip(chosen, new):
        leaf.rule = rule
    return tree


def freeze_(tree: Any, where: Where = None) -> Any:
    """freeze_(tree, where=None) -> tree, with the chosen Leafs frozen (skipped by updates).

    Example:
        >>> from optimisers import Descent, setup
        >>> tree = setup(Descent(), {"enc": np.ones(2), "dec": np.ones(2)})
        >>> _ = freeze_(tree["enc"]); tree["enc"].frozen, tree["dec"].frozen
        (True, False)
    """
    for leaf in select(tree, where):
        leaf.frozen = True
    return tree


def thaw_(tree: Any, where: Where = None) -> Any:
    """thaw_(tree, where=None) -> tree, with the chosen Leafs unfrozen.

    Example:
        >>> from optimisers import Descent, setup
        >>> tree = freeze_(setup(Descent(), [np.ones(2), np.ones(2)]))
        >>> [leaf.frozen for leaf in select(thaw_(tree, "1"))]
        [True, False]
    """
    for leaf in select(tree, where):
        leaf.frozen = False
    return tree
