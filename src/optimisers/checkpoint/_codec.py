"""The checkpoint's document both ways: a state tree to JSON nodes, Leaf records and arrays
(:class:`Writer`), and back, every part checked against ``like`` (:class:`Reader`)."""

from __future__ import annotations

import functools
import inspect
import itertools
import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, leaves, nodes, rooted
from optimisers.rules import RULES, Rule
from optimisers.schedules import SCHEDULES, Function, Schedule, importable_name

FORMAT, VERSION, READS = "optimisers.checkpoint", 2, (1, 2)  # 2: nodes flat (1: nested)
MAX_DEPTH = 100  # tuples, lists, dicts and rules nested in one rule or state
STANDARD = {np.dtype(c).name: np.dtype(c) for c in np.typecodes["All"]
            if np.dtype(c).kind in "biufc"}  # NumPy's dtypes of numbers, by name
BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
SEQUENCES = {"tuple": tuple, "list": list}
VALUES = ("array", "tuple", "list", "dict", "float", "complex", "rule", "schedule",
          "function", "dtype")
FREE = object()  # the ``like`` of keys and hyper-parameters: nothing to compare with
_BUILD = object()  # the work item that builds a container once its children are read


class Invalid(ValueError):
    """A problem found while loading; :func:`load` re-raises it as a plain ValueError."""


class Mismatch(Invalid):
    """A Leaf of the file that does not fit like's (structure, shape, dtype, rule, ties)."""


@functools.lru_cache(maxsize=256)
def params(cls: type) -> tuple[inspect.Parameter, ...]:
    """The named constructor parameters of a rule class (``*rules`` included)."""
    return tuple(p for p in inspect.signature(cls).parameters.values()
                 if p.kind is not p.VAR_KEYWORD)


def dtype_name(a: Any) -> str:
    """The name of the dtype of an array of any library, or of a NumPy scalar."""
    return backends.ops(backends.library(a) or "numpy").dtype_name(a)


def encode_dtype(v: Any) -> dict | None:
    """A dtype's record (``{"dtype": "float32", "as": "numpy"}``); None for a non-dtype."""
    if isinstance(v, np.dtype) or isinstance(v, type) and issubclass(v, np.generic):
        return {"dtype": np.dtype(v).name, "as": "numpy" if isinstance(v, np.dtype) else "type"}
    lib = backends.dtype_library(v)
    return None if lib is None else {"dtype": backends.ops(lib).dtype_name_of(v), "as": lib}


class Writer:
    """A state tree as the document's nodes and Leaf records, its arrays in :attr:`arrays`."""

    def __init__(self) -> None:
        self.leaves: list[dict] = []  # the Leaf records
        self.arrays: list[np.ndarray] = []
        self.ids: dict[int, Any] = {}  # id of a Leaf, rule or array -> index or record; the
        self.keep: list[Any] = []  # arrays of those ids kept alive, so that ids stay unique

    def document(self, tree: Any) -> str:
        """The JSON document: nodes flat, parents first, containers holding children's indices."""
        out: list = []
        pending: list[tuple[Any, int]] = [([None], 0)]  # where each next node's index goes
        for kp, t in nodes(tree):
            body, slot = pending.pop()
            body[slot] = len(out)
            if isinstance(t, dict):
                pairs = [[self.value(k, kp, "a key"), None] for k in t]
                out.append({"dict": pairs})
                pending.extend((pair, 1) for pair in reversed(pairs))
            elif isinstance(t, (tuple, list)):
                items: list = [None] * len(t)
                out.append({"tuple" if isinstance(t, tuple) else "list": items})
                pending.extend((items, i) for i in reversed(range(len(t))))
            elif t is None:
                out.append(None)
            else:
                if id(t) not in self.ids:
                    self.ids[id(t)] = len(self.leaves)
                    if id(t.rule) not in self.ids:  # a rule shared by Leafs: encoded once
                        self.ids[id(t.rule)] = self.value(t.rule, kp, "the rule")
                    self.leaves.append({
                        "path": str(kp), "rule": self.ids[id(t.rule)],
                        "frozen": bool(t.frozen), "clock": int(t.clock),
                        "state": self.value(t.state, kp, "the state")})
                out.append({"leaf": self.ids[id(t)]})
        doc = {"format": FORMAT, "version": VERSION, "nodes": out, "leaves": self.leaves,
               "arrays": len(self.arrays)}
        return json.dumps(doc, ensure_ascii=True, allow_nan=False, separators=(",", ":"))

    def value(self, v: Any, kp: KeyPath, where: str, depth: int = 0) -> Any:
        """A value of a rule or a state as JSON; what needs pickling is a TypeError."""
        if depth > MAX_DEPTH:
            raise ValueError(f"cannot save {where} at {kp!r}: it nests tuples, lists, dicts "
                             f"and rules more than {MAX_DEPTH} levels deep, which load would "
                             f"refuse; flatten it")
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (np.generic, np.ndarray)) or backends.library(v) is not None:
            return self.array(v, kp, where)
        if isinstance(v, (int, float, complex)):
            return int(v) if isinstance(v, int) else {"float": repr(float(v))} if isinstance(
                v, float) else {"complex": [repr(v.real), repr(v.imag)]}
        if isinstance(v, (tuple, list)):
            return {"tuple" if isinstance(v, tuple) else "list":
                    [self.value(x, kp, where, depth + 1) for x in v]}
        if isinstance(v, dict):
            return {"dict": [[self.value(k, kp, where, depth + 1),
                              self.value(x, kp, where, depth + 1)] for k, x in v.items()]}
        if isinstance(v, (Rule, Schedule)):
            return self.rule(v, kp, depth)
        if (dtype := encode_dtype(v)) is not None:
            return dtype
        raise TypeError(f"cannot save {where} at {kp!r}: it holds a {type(v).__name__} "
                        f"({v!r:.60}), which a checkpoint stores only by pickling; use "
                        f"numbers, strings, tuples, lists, dicts, dtypes, arrays and rules")

    def rule(self, rule: Rule | Schedule, kp: KeyPath, depth: int = 0) -> dict:
        """A rule or a schedule by its registered name and fields (a function by import name)."""
        cls, name = type(rule), type(rule).__name__
        tag, registry = ("rule", RULES) if issubclass(cls, Rule) else ("schedule", SCHEDULES)
        if registry.get(name) is not cls:
            raise TypeError(f"cannot save the {tag} {name} at {kp!r}: {tag.upper()}S maps "
                            f"{name!r} to {registry.get(name)!r}, not to this class; rename it")
        fields = {}
        for p in params(cls):
            if not hasattr(rule, p.name):
                raise TypeError(f"cannot save the rule {name} at {kp!r}: it has no attribute "
                                f"{p.name!r}, which its constructor takes; make it a dataclass")
            v = getattr(rule, p.name)
            if isinstance(rule, Function) and importable_name(v) is None:
                raise TypeError(f"cannot save {name}.{p.name} at {kp!r}: the function "
                                f"{getattr(v, '__qualname__', v)!s:.60} has no name that imports "
                                f"it again (a lambda, a nested def), which a checkpoint stores; "
                                f"def it at a module's top level and pass it again through "
                                f"load(path, like=setup(<the rule with it>, model))")
            fields[p.name] = {"function": importable_name(v)} if isinstance(
                rule, Function) else self.value(v, kp, f"{name}.{p.name}", depth + 1)
        return {tag: name, "fields": fields}

    def array(self, a: Any, kp: KeyPath, where: str) -> dict:
        weak = getattr(a, "weak_type", False) is True and a.shape == ()
        if id(a) in self.ids and not weak:  # (a number, such as a step count JAX's group
            return self.ids[id(a)]  # of Leafs shares, is each Leaf's own value)
        lib = "numpy" if isinstance(a, (np.generic, np.ndarray)) else backends.library(a)
        arr, name = backends.ops(lib).host(a, f"{where} at {kp!r}")
        rec = {"array": len(self.arrays), "dtype": name, "shape": list(arr.shape),
               "library": lib}
        if name not in STANDARD:  # a dtype NumPy lacks (bfloat16): stored as its bits
            kind, size = arr.dtype.kind, arr.dtype.itemsize
            if not ((kind == "u" or kind == "V" and arr.dtype.fields is None)
                    and size in BITS and name.isidentifier()):
                raise TypeError(f"cannot save {where} at {kp!r}: an array of dtype {name}; a "
                                f"checkpoint holds bool, integer, floating and complex ones")
            arr = np.ascontiguousarray(arr).reshape(arr.shape).view(BITS[size])  # (0-d too)
            rec["bits"] = arr.dtype.name
        if isinstance(a, np.generic):
            rec["scalar"] = True
        if weak:
            rec["weak"] = True  # a JAX weakly-typed scalar, as jit makes step counters
        self.arrays.append(arr)
        self.keep.append(a)
        self.ids[id(a)] = rec
        return rec


def size_bound(like: Any) -> int:
    """At least the length of ``like``'s own document, without writing it (TypeError: no tree)."""
    rules: dict[int, int] = {}

    def size(v: Any) -> int:
        if isinstance(v, str):
            return len(json.encoder.encode_basestring_ascii(v))
        if isinstance(v, (np.generic, np.ndarray)) or backends.library(v) is not None:
            return 160 + 12 * len(v.shape)
        if isinstance(v, (tuple, list, dict)):
            return 16 + sum(size(x) + 4 + (size(v[x]) if isinstance(v, dict) else 0) for x in v)
        if isinstance(v, (Rule, Schedule)) and id(v) not in rules:
            rules[id(v)] = 32 + len(type(v).__name__) + sum(
                len(p.name) + 4 + size(getattr(v, p.name, None)) for p in params(type(v)))
        return rules[id(v)] if id(v) in rules else 64 + len(str(getattr(
            v, "__qualname__", v if isinstance(v, int) else "")))

    total = 64
    for kp, t in nodes(like):
        total += 16 + (sum(size(k) + 8 for k in t) if isinstance(t, dict) else 8 * len(t)
                       if isinstance(t, (tuple, list)) else 0)
        if isinstance(t, Leaf):
            total += 64 + size(str(kp)) + size(t.rule) + size(t.state)
    return total


class Reader:
    """Reads a document (``None``: a rule's form alone) checked against ``like`` part by part;
    rules (user code, maybe) built last, once the whole tree matched."""

    def __init__(self, doc: Any, like: Any, archive: Any = None) -> None:
        self.like, self.archive, self.functions, self.used = like, archive, {}, set()
        self.here: Any = None  # the state of like's Leaf being read: where arrays go
        self.arrays: dict[int, tuple] = {}  # index -> record, owner, path, item, array
        self.kinds: dict[Any, str] = {}  # a file's rule form, or id of like's -> its classes
        self.built: dict[int, tuple] = {}  # Leaf index -> Leaf, path, id of like's Leaf
        self.seen: dict[int, tuple] = {}  # id of like's Leaf -> Leaf index, path
        self.rules: list[tuple] = []  # Leaf, form, its text, path, like's state: built last
        if doc is None:
            return
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise Invalid(f"the file is not an optimisers checkpoint: its checkpoint.json "
                          f"lacks \"format\": \"{FORMAT}\"")
        self.version = doc.get("version")
        if self.version not in READS:
            raise Invalid(f"the checkpoint has format version {self.version!r}; this version "
                          f"of optimisers reads versions {READS}")
        self.records = doc["leaves"]
        self.nodes = doc["nodes"] if self.version >= 2 else []
        self.root = 0 if self.version >= 2 else doc["tree"]

    def tree(self) -> Any:
        """The loaded tree, walked with a stack (any depth); then its rules, built last."""
        out: list = [None]
        work: list = [(self.root, self.like, KeyPath(), out, 0)]
        while work:
            ref, like, kp, parent, slot = work.pop()
            if ref is _BUILD:
                tag, keys, kids = like
                parent[slot] = dict(zip(keys, kids)) if tag == "dict" else SEQUENCES[tag](kids)
                continue
            j, tag, body = self.node(ref, kp)
            if (j is None) != (like is None) or (tag == "leaf") != isinstance(like, Leaf):
                raise _mismatch(kp, None, describe(j, True), like)
            if tag == "leaf":
                parent[slot] = self.leaf(body, like, kp)
            elif tag is not None:
                keys, refs = self.fit(tag, body, like, kp, None, 0)
                kids: list = [None] * len(keys)
                work.append((_BUILD, (tag, keys, kids), kp, parent, slot))
                work.extend((refs[i], like[keys[i]], kp + (keys[i],), kids, i)
                            for i in reversed(range(len(keys))))
        self.build()
        return rooted(self.like, out[0])

    def changed(self, kp: KeyPath, old: str, new: str) -> bool:
        """A Leaf whose rule classes changed: refused (by path: whether its state converts)."""
        raise Mismatch(f"the checkpoint does not match like at {kp!r}: the file has the rule "
                       f"{old}, like has {new}; set like up with the same rule classes")

    def build(self) -> None:
        """The rules of the Leafs read (a Leaf whose rule changed keeps like's), built last."""
        built: dict[str, Rule] = {}
        for leaf, j, text, kp, here in self.rules:
            if text is None:
                continue
            if text not in built:
                self.functions, self.here = functions(leaf.rule), here  # like's rule till set
                leaf.rule = self.rule(j, kp)
                if "'array'" in text or "'function'" in text or not all(
                        type(v).__module__.startswith("optimisers.") for v in _inside(
                            leaf.rule) if isinstance(v, (Rule, Schedule))):
                    continue  # a user's rule: its constructor runs for each Leaf
                built[text] = leaf.rule
            leaf.rule = built[text]

    def paths(self) -> dict[str, int]:
        """Each path of the file's state tree (each of a tie's) -> the index of its Leaf."""
        found, work = {}, [(self.root, KeyPath())]
        while work:
            ref, kp = work.pop()
            _, tag, body = self.node(ref, kp)
            if tag == "leaf":
                found[str(kp)] = body
            elif tag is not None:
                keys, refs = self.fit(tag, body, FREE, kp, None, 0)
                work.extend((ref, kp + (key,)) for key, ref in zip(keys[::-1], refs[::-1]))
        return found

    def node(self, ref: Any, kp: KeyPath) -> tuple[Any, str | None, Any]:
        """The node ``ref`` names (nested in version 1, in version 2 an index used once), its
        tag and body."""
        if self.version >= 2:
            if type(ref) is not int or not 0 <= ref < len(self.nodes) or ref in self.used:
                raise Invalid(f"the checkpoint is malformed: a node reference {ref!r} at "
                              f"{kp!r} (each node is referenced once)")
            self.used.add(ref)
            ref = self.nodes[ref]
        return ref, *((None, ref) if ref is None else _tag(
            ref, ("leaf", "dict", "tuple", "list"), "a node of the state tree"))

    def fit(self, tag: str, body: Any, like: Any, kp: KeyPath, sub: str | None,
            depth: int) -> tuple[list, list]:
        """A container's keys and items, in ``like``'s order, once ``like`` has the same."""
        got = {k if type(k) is str else self.value(k, FREE, kp, depth=depth + 1): v
               for k, v in body} if tag == "dict" else body
        if like is not FREE and not (isinstance(like, SEQUENCES.get(tag, dict)) and len(
                got) == len(body) == len(like) and (tag != "dict" or got.keys() == like.keys())):
            raise _mismatch(kp, sub, describe({tag: body}, True), like)
        keys = list(got if like is FREE else like) if tag == "dict" else range(len(body))
        return list(keys), [got[k] for k in keys]

    def leaf(self, i: Any, like: Leaf, kp: KeyPath) -> Leaf:
        if type(i) is not int or not 0 <= i < len(self.records):
            raise Invalid(f"the checkpoint is malformed: a Leaf reference {i!r} at {kp!r}")
        met, (leaf, at, like_id) = self.seen.get(id(like), (i,)), self.built.get(i, (
            None, kp, id(like)))  # like's Leaf met before, with file Leaf met[0]; and the file's
        if met[0] != i or like_id != id(like):
            shared, separate, at = ("like's", "the file's", met[1]) if met[0] != i else (
                "the file's", "like's", at)
            raise Mismatch(f"the checkpoint does not match like at {kp!r}: {shared} Leaf there is "
                          f"shared with {at!r}, but {separate} Leafs are separate (a different "
                          f"model, or tied parameters were untied)")
        if leaf is not None:
            return leaf
        self.seen[id(like)], rec = (i, kp), self.records[i]
        text = repr(rec["rule"])
        for key, rule in ((text, rec["rule"]), (id(like.rule), like.rule)):
            if key not in self.kinds:
                self.kinds[key] = classes(rule, kp)
        same = self.kinds[text] == self.kinds[id(like.rule)]
        converts = not same and self.changed(kp, self.kinds[text], self.kinds[id(like.rule)])
        clock = rec.get("clock", 0)  # (files written before clocks: none taken)
        if type(rec["frozen"]) is not bool or type(clock) is not int or clock < 0:
            raise Invalid(f"the checkpoint is malformed: frozen={rec['frozen']!r}, "
                          f"clock={clock!r} at {kp!r}")
        self.here = like.state
        leaf = type(like)(like.rule, self.value(rec["state"], FREE if converts else like.state,
                                                kp, ""), rec["frozen"], clock)  # JAX's stay JAX's
        self.rules.append((leaf, rec["rule"], text if same else None, kp, like.state))
        self.built[i] = (leaf, kp, id(like))
        return leaf

    def value(self, j: Any, like: Any, kp: KeyPath, sub: str | None = None,
              depth: int = 0) -> Any:
        """A value of a state (``sub``: its place in it), or a key or hyper-parameter (FREE)."""
        if depth > MAX_DEPTH:
            raise Invalid(f"the checkpoint is malformed: a value at {kp!r} nests more than "
                          f"{MAX_DEPTH} levels deep (save refuses to write that)")
        tag, body = (None, j) if j is None or isinstance(j, (bool, str, int)) else _tag(
            j, VALUES, "a value")
        if tag == "array":
            return self.array(j, like, kp, sub)
        if tag in ("dict", "tuple", "list"):
            keys, items = self.fit(tag, body, like, kp, sub, depth)
            out = [self.value(v, like if like is FREE else like[k], kp, f"{sub or ''}[{k!r}]",
                              depth + 1) for k, v in zip(keys, items)]
            return dict(zip(keys, out)) if tag == "dict" else out if tag == "list" else (
                type(like)._make(out) if hasattr(type(like), "_make") else tuple(out))
        if tag == "rule" and like is not FREE and (not isinstance(like, Rule) or classes(
                j, kp) != classes(like)):
            raise _mismatch(kp, sub, f"the rule {classes(j, kp)}", like)
        if tag == "function" and body not in self.functions:  # taken from like's rule
            raise Invalid(f"the checkpoint's rule at {kp!r} holds the function {body!r}, "
                          f"which load takes from like, never imports: pass it again through "
                          f"load(path, like=setup(<the rule with it>, model))")
        out = body if tag is None else float(body) if tag == "float" else complex(
            float(body[0]), float(body[1])) if tag == "complex" else self.rule(
            j, kp, depth, tag) if tag in ("rule", "schedule") else self.functions[
            body] if tag == "function" else _dtype(j)
        if like is not FREE and not _compatible(out, like):
            raise _mismatch(kp, sub, describe(out), like)
        return out

    def rule(self, j: dict, kp: KeyPath, depth: int = 0, tag: str = "rule") -> Rule | Schedule:
        """A rule (or a schedule in a rule's field) from the registry."""
        name, fields = j[tag], j["fields"]
        cls = _registered(tag, name, kp)
        known = {p.name: p for p in params(cls)}
        args, kwargs = [], {}
        for field, v in dict(fields).items():
            p = known.get(field)
            if p is None or p.kind is p.POSITIONAL_ONLY:
                raise Invalid(f"the checkpoint gives the {tag} {name} at {kp!r} a field "
                              f"{field!r}, which {name}'s constructor does not take")
            v = self.value(v, FREE, kp, depth=depth + 1)
            if p.kind is p.VAR_POSITIONAL:
                args.extend(v)
            else:
                kwargs[field] = v
        try:
            return cls(*args, **kwargs)
        except Exception as e:
            raise Invalid(f"the checkpoint's {tag} {name} at {kp!r} cannot be rebuilt: "
                          f"{type(e).__name__}: {e}") from e

    def array(self, j: dict, like: Any, kp: KeyPath, sub: str | None) -> Any:
        """An array record: checked against ``like``, read once, placed like ``like``'s."""
        name, shape, bits = j["dtype"], tuple(j["shape"]), j.get("bits")
        lib = None if like is FREE else backends.library(like)
        is_array = lib is not None or isinstance(like, np.generic)
        if like is not FREE and not (shape == () and isnumber(like) if not is_array else (
                name, shape) == (dtype_name(like), tuple(like.shape))):
            raise _mismatch(kp, sub, describe(j, True), like, is_array and "make like by setup "
                            "on the same model (from the same rule classes)")
        idx = j["array"]
        owner = id(like) if is_array else FREE if like is FREE else object()
        if idx in self.arrays:
            first, first_owner, first_kp, first_sub, out = self.arrays[idx]
            if j != first or owner != first_owner:
                raise Invalid(f"the checkpoint is malformed: array {idx} is used at "
                              f"{_where(kp, sub)} and at {_where(first_kp, first_sub)}, but "
                              f"like does not share one array there, or the records differ "
                              f"({describe(j, True)} and {describe(first, True)})")
            return out
        stored = STANDARD.get(name if bits is None else bits if str(bits).startswith("uint")
                              else "")
        if stored is None:
            raise Invalid(f"the checkpoint's array at {_where(kp, sub)} has dtype {name!r}, "
                          f"neither NumPy's nor stored as bits")
        out = self.archive.npy(idx, stored, shape, kp)
        if j.get("scalar") is True and bits is None and lib is None:
            out = out[()]
        else:
            ref = like if is_array else next((a for t in itertools.chain([self.here], (
                t.state for _, t in leaves(self.like))) for a in _inside(t)
                if backends.library(a) is not None), None)  # like's Leaf's first, or like's
            if bits is not None and (ref is None or dtype_name(ref) != name):
                raise Invalid(f"the checkpoint's array at {_where(kp, sub)} has dtype {name}; "
                              f"like has no array of that dtype there to say what it is")
            out = backends.ops(backends.library(ref) or "numpy").from_host(
                out, ref, bits is not None, j.get("weak") is True)
        self.arrays[idx] = (j, owner, kp, sub, out)
        return out


def _tag(j: Any, tags: tuple, what: str) -> tuple[str, Any]:
    """A JSON object's tag (first key, else any in ``tags``: keys may be sorted) and body."""
    tag = next(iter(j), None) if isinstance(j, dict) else None
    if tag not in tags and isinstance(j, dict):
        tag = next((t for t in tags if t in j), None)
    if tag is None:
        raise Invalid(f"the checkpoint is malformed: expected {what}, found {str(j)[:80]}")
    return tag, j[tag]


def _where(kp: KeyPath, sub: str | None) -> str:
    return f"{kp!r}" + (f", state{sub}" if sub is not None else "")


def describe(t: Any, form: bool = False) -> str:
    """How a node or value of a state tree (``form``: its JSON) reads in a message."""
    tag, body = next(iter(t.items())) if form and isinstance(t, dict) and t else (None, t)
    if tag == "array" or tag is None and (backends.library(t) is not None
                                          or isinstance(t, np.generic)):
        shape = tuple(t.get("shape", ())) if tag else tuple(t.shape)
        return f"an array of shape {shape} and dtype {t.get('dtype') if tag else dtype_name(t)}"
    if tag == "dict" and isinstance(body, list) or tag is None and isinstance(t, dict):
        return f"a dict with keys {[k[0] if isinstance(k, list) else k for k in body]}"
    if tag in SEQUENCES and isinstance(body, list) or tag is None and isinstance(t, (tuple,
                                                                                    list)):
        return f"a {tag or type(t).__name__} of length {len(body)}"
    if tag is None:
        return "None" if t is None else "a Leaf" if isinstance(t, Leaf) else (
            f"the {type(t).__name__} {t!r:.40}")
    return "a Leaf" if tag == "leaf" else f"a {tag}"


def _mismatch(kp: KeyPath, sub: str | None, file: str, like: Any, hint: Any = "") -> Invalid:
    return Mismatch(f"the checkpoint does not match like at {_where(kp, sub)}: the file has "
                   f"{file}, like has {describe(like)}" + (f"; {hint}" if hint else ""))


def _dtype(j: dict) -> Any:
    """A dtype hyper-parameter, from a library only if imported already (not at a file's wish)."""
    name, form = j["dtype"], j.get("as")
    if form in ("numpy", "type") and name in STANDARD:
        return STANDARD[name] if form == "numpy" else STANDARD[name].type
    try:
        module = backends.dtype_module(form)
    except LookupError:
        raise Invalid(f"the checkpoint has a {form} dtype {name!r}, but this process has not "
                      f"imported {form}; import it before load (load never imports a library "
                      f"because a file names it)") from None
    obj = vars(module).get(name) if module is not None else None  # no module __getattr__
    if obj is not None and encode_dtype(obj) == {"dtype": name, "as": form}:
        return obj
    raise Invalid(f"the checkpoint names an unknown dtype {name!r} (as {form!r})")


def _registered(tag: str, name: str, kp: KeyPath) -> type:
    registry, base = (RULES, Rule) if tag == "rule" else (SCHEDULES, Schedule)
    cls = registry.get(name)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise Invalid(f"the checkpoint names the {tag} {name!r} at {kp!r}, which is not in "
                      f"optimisers.{tag.upper()}S; define (import) that {base.__name__} "
                      f"subclass first")
    return cls


def classes(rule: Any, kp: KeyPath = KeyPath()) -> str:
    """A Rule's or a rule JSON's classes, ``OptimiserChain(ClipGrad, Adam)``, building nothing."""
    live = isinstance(rule, Rule)
    cls = type(rule) if live else _registered("rule", _tag(rule, ("rule",), "a rule")[1], kp)
    fields = {} if live or not isinstance(rule.get("fields"), dict) else rule["fields"]
    inner = []
    for p in params(cls):
        v = getattr(rule, p.name, None) if live else fields.get(p.name)
        if not live and isinstance(v, dict) and v and next(iter(v)) in SEQUENCES:
            v = v[next(iter(v))]  # a tuple or list of rules
        inner += [classes(r, kp) for r in (v if isinstance(v, (tuple, list)) else (v,)) if (
            isinstance(r, Rule) if live else isinstance(r, dict) and "rule" in r)]
    return f"{cls.__name__}({', '.join(inner)})" if inner else cls.__name__


def isnumber(x: Any) -> bool:
    if isinstance(x, (int, float, complex, np.number)):
        return not isinstance(x, bool)
    return backends.library(x) is not None and tuple(x.shape) == ()


def _compatible(value: Any, like: Any) -> bool:
    """Whether ``value`` may stand for ``like``: the same kind (numbers and 0-d arrays one)."""
    if isinstance(value, bool) or isinstance(like, bool) or value is None or like is None:
        return type(value) is type(like)
    if isinstance(value, (int, float, complex)):
        return isnumber(like)
    return type(value) is type(like) or isinstance(value, np.dtype) and isinstance(
        like, np.dtype)


def _inside(x: Any) -> Iterator[Any]:
    """``x`` and what its tuples, lists, dicts, rules and schedules hold, in order, lazily."""
    stack = [x]
    while stack:
        yield (v := stack.pop())
        if isinstance(v, (tuple, list, dict)):
            stack.extend(reversed(v.values() if isinstance(v, dict) else v))
        elif isinstance(v, (Rule, Schedule)):
            stack.extend(getattr(v, p.name, None) for p in reversed(params(type(v))))


def functions(rule: Any) -> dict[str, Any]:
    """The functions of the :class:`Function` schedules in ``rule``, by their stored names."""
    return {v.reference: v.function for v in _inside(rule)
            if isinstance(v, Function) and v.reference is not None}
