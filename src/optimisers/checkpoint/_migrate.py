"""Loading by path, for a model that changed (``strict=False``): what both loaders share, the
old paths renamed, each Leaf of ``like`` matched to the file's by path, the report, and which
changes of rule keep a Leaf's state."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from optimisers import backends
from optimisers.backends.common import mapstate
from optimisers.checkpoint._codec import Invalid, Mismatch, Reader, describe, functions, isnumber
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, leaves, map_leaves
from optimisers.reduce import copier

# Rules whose states mean the same, item for item: (m, v, t), the moments of the gradient and
# its square and the step count. Not AdaMax (u: a maximum), AdaBelief (s: |g - m|^2), AMSGrad
# (vhat), OAdam (one more array): as alike in shape, but a different state.
FAMILIES = (("Adam", "AdamW", "NAdam", "RAdam"),)
_FAMILY = re.compile(r"\b(" + "|".join(n for f in FAMILIES for n in f) + r")\b")


class LoadReport(NamedTuple):
    """LoadReport(matched, missing, unexpected, mismatched): what ``strict=False`` loaded.

    Attributes:
        matched: like's paths (new names) whose Leaf took the checkpoint's state and clock.
        missing: like's paths the checkpoint lacks: their Leafs keep like's fresh state.
        unexpected: the checkpoint's paths (old names) that no Leaf of like took (but those
            that ``renames`` drops).
        mismatched: like's path -> why the checkpoint's entry there does not fit (shape,
            dtype, structure of the state); those Leafs keep like's fresh state.

    Example:
        >>> import os, tempfile
        >>> from optimisers import Adam, AdamW, load, save, setup
        >>> folder = tempfile.TemporaryDirectory()
        >>> path = os.path.join(folder.name, "opt.ckpt")
        >>> save(path, setup(Adam(), {"w": np.ones(3), "old": np.ones(2), "gone": np.ones(1)}))
        >>> new = {"w": np.ones(3), "new": np.ones(2), "added": np.ones(1)}
        >>> tree, report = load(path, setup(AdamW(), new), strict=False, renames={"old": "new"})
        >>> report.matched, report.missing, report.unexpected, report.mismatched
        (('w', 'new'), ('added',), ('gone',), {})
        >>> tree["new"].rule == AdamW() and tree["new"].clock == 0, folder.cleanup()
        (True, None)
    """

    matched: tuple[str, ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    mismatched: dict[str, str]


STRICT = object()  # the migrate of a strict load: a changed rule class is an error


def by_path(strict: bool, renames: Any, migrate: Any) -> None:
    """A TypeError for ``renames`` or ``migrate`` of the wrong kind, or given a strict load;
    a ValueError for a new path of ``renames`` with more ``*`` than its old."""
    if not (renames is None or callable(renames) or isinstance(renames, Mapping)) or not (
            migrate is None or callable(migrate)):
        raise TypeError(f"renames= takes a dict {{old path prefix: new}} or a function of the "
                        f"old path, migrate= a function; got {renames!r:.50} and {migrate!r:.50}")
    for old, new in renames.items() if isinstance(renames, Mapping) else ():
        if not isinstance(old, str) or not (new is None or isinstance(new, str)):
            raise TypeError(f"renames= maps dotted paths to dotted paths, got {old!r:.50}: "
                            f"{new!r:.50}")
        if new is not None and new.count("*") > old.count("*"):
            raise ValueError(f"renames= {old!r}: {new!r}: each '*' of the new path takes "
                             f"what a '*' of the old matched; give the old as many")
    if strict and (renames is not None or migrate is not None):
        raise TypeError("renames= and migrate= load by path: pass strict=False as well, and "
                        "read the report it returns: (tree, report)")


class Raised(Exception):
    """What the caller's ``renames`` or ``migrate`` raised (``args[0]``), carried through
    :func:`load`, which takes any other exception for a sign of a damaged file."""


def called(f: Callable, *args: Any) -> Any:
    """``f(*args)``, a function of the caller's: what it raises, carried in a Raised."""
    try:
        return f(*args)
    except Exception as e:
        raise Raised(e) from e


def renamed(path: str, renames: Any) -> str | None:
    """The new path of the old ``path``: ``renames(path)``, or the first ``{old: new}`` prefix
    of whole keys that fits, each ``*`` of ``old`` any text, put in for the ``*`` of ``new``
    in order (``None``: dropped), else ``path`` itself."""
    if callable(renames):
        if (new := called(renames, path)) is None or isinstance(new, str):
            return new
        raise Invalid(f"renames({path!r}) gave {new!r:.50}; give the new dotted path, or None")
    for old, new in (renames or {}).items():
        found = re.fullmatch("(.*)".join(map(re.escape, old.split("*"))) + r"(\..*)?", path,
                             re.DOTALL)
        if found and new is None:
            return None
        if found:  # each '*' of new takes what one of old matched (no more: by_path)
            *stars, rest = found.groups()
            return re.sub(r"\*", lambda _, s=iter(stars): next(s), new) + (rest or "")
    return path


def match(like: Any, old: Mapping[str, Any], renames: Any,
          read: Callable[[KeyPath, Leaf, Any], Any]) -> tuple[dict[int, Any], LoadReport]:
    """Each Leaf of ``like`` read (``read(kp, leaf, entry)``) from the entry of ``old``
    (every old path -> its Leaf's entry) renamed to one of its paths; a Mismatch reported."""
    new: dict[str, tuple[str, Any]] = {}
    dropped = set()
    for path, entry in old.items():
        if (to := renamed(path, renames)) is None:
            dropped.add(entry)
        elif new.setdefault(to, (path, entry))[1] != entry:
            raise Invalid(f"renames maps both {new[to][0]!r} and {path!r} to {to!r}; map "
                          f"each old path to a path of its own")
    paths: dict[int, tuple[Leaf, list[KeyPath]]] = {}
    for kp, leaf in leaves(like):
        paths.setdefault(id(leaf), (leaf, []))[1].append(kp)
    loaded, taken, missing, mismatched = {}, dropped, [], {}
    for leaf, kps in paths.values():
        kp = next((kp for kp in kps if str(kp) in new), None)
        if kp is None:
            missing.append(str(kps[0]))
            continue
        taken.add(entry := new[str(kp)][1])
        try:
            loaded[id(leaf)] = read(kp, leaf, entry)
        except Mismatch as e:
            mismatched[str(kp)] = str(e)
    firsts: dict[Any, str] = {}
    for path, entry in old.items():
        firsts.setdefault(entry, path)
    matched = tuple(str(kps[0]) for leaf, kps in paths.values() if id(leaf) in loaded)
    return loaded, LoadReport(matched, tuple(missing), tuple(
        path for i, path in firsts.items() if i not in taken), mismatched)


def keeps_state(kp: KeyPath, old: str, new: str, migrate: Any) -> bool:
    """Whether the state of rule classes ``old`` loads as it is into ``new``'s (same family);
    False where ``migrate`` converts it; a ValueError naming the path where neither."""
    if _family(old) == _family(new):
        return True
    if migrate is None:
        families = ", ".join(map("/".join, FAMILIES))
        raise Invalid(f"the rule saved at {kp!r} is {old}, like's is {new}, whose state "
                      f"is another (a state loads as it is across {families}); pass "
                      f"migrate=lambda path, old_rule, old_state, new_rule, new_state: <the "
                      f"state for new_rule>, or set like up with {old}")
    return False


def _family(classes: str) -> str:
    """Rule classes with each rule named by its family's first: ``Chain(ClipGrad, Adam)``."""
    return _FAMILY.sub(lambda m: next(f[0] for f in FAMILIES if m[1] in f), classes)


def migrated(migrate: Callable, kp: KeyPath, old_rule: Any, old_state: Any, rule: Any,
             state: Any) -> Any:
    """``migrate``'s state for ``rule`` (given its fresh ``state``), checked to be like that."""
    out = called(migrate, str(kp), old_rule, old_state, rule, state)
    if _form(out) != _form(state):
        raise Invalid(f"migrate returned a state at {kp!r} that is not like the fresh state "
                      f"of {type(rule).__name__} there ({describe(out)} for {describe(state)}: "
                      f"items, libraries, shapes, dtypes); return one like new_state")
    return out


def _form(state: Any) -> list:
    """Each item of a state: its key, library, and shape and dtype or kind."""
    out: list = []
    mapstate(lambda v, k: out.append((k, backends.library(v), describe(v) if backends.library(
        v) else isnumber(v) or type(v).__name__)), state)
    return out


class PathReader(Reader):
    """A :class:`Reader` matching like's Leafs to the file's by path: ``tree()`` gives the
    tree (a Leaf not loaded keeps a copy of like's) and the report."""

    def __init__(self, doc: Any, like: Any, archive: Any, renames: Any, migrate: Any) -> None:
        super().__init__(doc, like, archive)
        self.renames, self.migrate, self.converts = renames, migrate, set()

    def tree(self) -> tuple[Any, LoadReport]:
        loaded, report = match(self.like, self.paths(), self.renames,
                               lambda kp, leaf, i: self.leaf(i, leaf, kp))
        copy = copier()
        tree = map_leaves(lambda t: loaded[id(t)] if id(t) in loaded else type(t)(
            t.rule, copied(t.state, copy), t.frozen, t.clock), self.like)
        for leaf, j, _, kp, here in self.rules:  # (rules built once every Leaf matched)
            if kp in self.converts:
                self.functions, self.here = functions(leaf.rule), here
                leaf.state = migrated(self.migrate, kp, self.rule(j, kp), leaf.state,
                                      leaf.rule, copied(here, copy))
        self.build()
        return tree, report

    def changed(self, kp: KeyPath, old: str, new: str) -> bool:
        if keeps_state(kp, old, new, self.migrate):
            return False
        self.converts.add(kp)
        return True


def copied(state: Any, copy: Callable) -> Any:
    """``state`` with its arrays copied (by ``reduce.copier()``): like's, left as it was."""
    return mapstate(lambda v, _: copy(v), state)
