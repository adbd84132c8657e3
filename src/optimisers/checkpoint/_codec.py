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
from optimisers.leaf import Leaf, leaves, nodes
from optimisers.rules import RULES, Rule
from optimisers.schedules import SCHEDULES, Function, Schedule, importable_name

FORMAT, VERSION, READS = "optimisers.checkpoint", 2, (1, 2)  # 2: nodes flat (1: nested)
MAX_DEPTH = 100  # tuples, lists, dicts and rules nested in one rule or state
STANDARD = {np.dtype(c).name: np.dtype(c) for c in np.typecodes["All"]
            if np.dtype(c).kind in "biufc"}  # NumPy's dtypes of numbers, by name
BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
SEQUENCES = {"tuple": tuple, "list": list}
FREE = object()  # the ``like`` of keys and hyper-parameters: nothing to compare with
_BUILD = object()  # the work item that builds a container once its children are read
_NAMES: dict = {}  # (library, dtype) -> the dtype's name


class Invalid(ValueError):
    """A problem found while loading; :func:`load` re-raises it as a plain ValueError."""


@functools.lru_cache(maxsize=256)
def params(cls: type) -> tuple[inspect.Parameter, ...]:
    """The named constructor parameters of a rule class (``*rules`` included)."""
    return tuple(p for p in inspect.signature(cls).parameters.values()
                 if p.kind is not p.VAR_KEYWORD)


def dtype_name(a: Any) -> str:
    """The name of the dtype of an array of any library, or of a NumPy scalar."""
    lib = backends.library(a)
    name = _NAMES.get((lib, a.dtype))
    if name is None:
        name = backends.ops(lib).dtype_name(a) if lib is not None else str(a.dtype)
        _NAMES[lib, a.dtype] = name
    return name


def encode_dtype(v: Any) -> dict | None:
    """A dtype's record (``{"dtype": "float32", "as": "numpy"}``); None for a non-dtype."""
    if isinstance(v, np.dtype) or isinstance(v, type) and issubclass(v, np.generic):
        return {"dtype": np.dtype(v).name, "as": "numpy" if isinstance(v, np.dtype) else "type"}
    lib = backends.dtype_library(v)
    return None if lib is None else {"dtype": backends.ops(lib).dtype_name_of(v), "as": lib}


class Writer:
    """A state tree as the document's nodes and Leaf records, its arrays in :attr:`arrays`."""

    def __init__(self) -> None:
        self.leaves: list[dict] = []
        self.arrays: list[np.ndarray] = []
        self.ids: dict[int, Any] = {}  # id of a Leaf or an array -> its index or record
        self.keep: list[Any] = []  # the arrays of those ids, alive so that ids stay unique

    def document(self, tree: Any) -> str:
        """The JSON document of ``tree``: nodes flat, parents before children, each container
        holding its children's indices, so that no depth limits either side."""
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
            else:
                out.append(None if t is None else {"leaf": self.leaf(t, kp)})
        doc = {"format": FORMAT, "version": VERSION, "nodes": out, "leaves": self.leaves,
               "arrays": len(self.arrays)}
        return json.dumps(doc, ensure_ascii=True, allow_nan=False, separators=(",", ":"))

    def leaf(self, t: Leaf, kp: KeyPath) -> int:
        if id(t) not in self.ids:
            self.ids[id(t)] = len(self.leaves)
            self.leaves.append({"path": str(kp), "rule": self.value(t.rule, kp, "the rule"),
                                "frozen": bool(t.frozen), "clock": int(t.clock),
                                "state": self.value(t.state, kp, "the state")})
        return self.ids[id(t)]

    def value(self, v: Any, kp: KeyPath, where: str, depth: int = 0) -> Any:
        """A value of a rule or a state as JSON, or a TypeError naming what it cannot store."""
        if depth > MAX_DEPTH:
            raise ValueError(f"cannot save {where} at {kp!r}: it nests tuples, lists, dicts "
                             f"and rules more than {MAX_DEPTH} levels deep, which load would "
                             f"refuse; flatten it")
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (np.generic, np.ndarray)) or backends.library(v) is not None:
            return self.array(v, kp, where)
        if isinstance(v, int):
            return int(v)
        if isinstance(v, (float, complex)):
            return {"float": repr(float(v))} if isinstance(v, float) else {
                "complex": [repr(v.real), repr(v.imag)]}
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
        """A rule, or a schedule in a rule's field: by the name its registry builds it from
        and its fields; a :class:`Function`'s function by the name that imports it."""
        cls, name = type(rule), type(rule).__name__
        tag, registry = ("rule", RULES) if issubclass(cls, Rule) else ("schedule", SCHEDULES)
        if registry.get(name) is not cls:
            raise TypeError(f"cannot save the {tag} {name} at {kp!r}: optimisers."
                            f"{tag.upper()}S maps {name!r} to {registry.get(name)!r}, not to "
                            f"this class, so loading would build a different {tag}; give the "
                            f"class a unique name")
        fields = {}
        for p in params(cls):
            if not hasattr(rule, p.name):
                raise TypeError(f"cannot save the rule {name} at {kp!r}: its constructor "
                                f"takes {p.name!r} but the rule has no attribute of that "
                                f"name; make the rule a dataclass")
            v = getattr(rule, p.name)
            if isinstance(rule, Function):
                fields[p.name] = {"function": importable_name(v) or _unnamed(v, kp, name)}
            else:
                fields[p.name] = self.value(v, kp, f"{name}.{p.name}", depth + 1)
        return {tag: name, "fields": fields}

    def array(self, a: Any, kp: KeyPath, where: str) -> dict:
        if id(a) in self.ids:
            return self.ids[id(a)]
        lib = "numpy" if isinstance(a, (np.generic, np.ndarray)) else backends.library(a)
        arr, name = backends.ops(lib).host(a, f"{where} at {kp!r}")
        rec = {"array": len(self.arrays), "dtype": name, "shape": list(arr.shape),
               "library": lib}
        if name not in STANDARD:  # a dtype NumPy lacks (bfloat16): stored as its bits
            kind, size = arr.dtype.kind, arr.dtype.itemsize
            if not ((kind == "u" or kind == "V" and arr.dtype.fields is None)
                    and size in BITS and name.isidentifier()):
                raise TypeError(f"cannot save {where} at {kp!r}: an array of dtype {name}; "
                                f"a checkpoint holds bool, integer, floating and complex "
                                f"arrays")
            arr = np.ascontiguousarray(arr).view(BITS[size])
            rec["bits"] = arr.dtype.name
        if isinstance(a, np.generic):
            rec["scalar"] = True
        if getattr(a, "weak_type", False) is True:
            rec["weak"] = True  # a JAX weakly-typed scalar, as jit makes step counters
        self.arrays.append(arr)
        self.keep.append(a)
        self.ids[id(a)] = rec
        return rec


def _unnamed(f: Any, kp: KeyPath, where: str) -> Any:
    raise TypeError(f"cannot save {where}.function at {kp!r}: the function "
                    f"{getattr(f, '__qualname__', f)!s:.60} has no name that imports it again "
                    f"(a lambda, a function defined inside another, a schedule an optax "
                    f"factory made), and a checkpoint stores a function by that name only, "
                    f"never its code; define it with def at the top level of a module, and "
                    f"pass it again through load(path, like=setup(<the rule with it>, model))")


def size_bound(like: Any) -> int:
    """At least the length of ``like``'s own document (its arrays' records at their longest),
    without writing it: each rule measured once."""
    rules: dict[int, int] = {}

    def size(v: Any) -> int:
        if isinstance(v, str):
            return len(json.encoder.encode_basestring_ascii(v))
        if isinstance(v, (np.generic, np.ndarray)) or backends.library(v) is not None:
            return 160 + 12 * len(v.shape)
        if isinstance(v, (tuple, list)):
            return 16 + sum(size(x) + 1 for x in v)
        if isinstance(v, dict):
            return 16 + sum(size(k) + size(x) + 4 for k, x in v.items())
        if isinstance(v, (Rule, Schedule)):
            if id(v) not in rules:
                rules[id(v)] = 32 + sum(len(p.name) + 4 + size(getattr(v, p.name, None))
                                        for p in params(type(v))) + len(type(v).__name__)
            return rules[id(v)]
        if isinstance(v, int) and not isinstance(v, bool):
            return 8 + len(str(v))
        return 64 + len(getattr(v, "__module__", "") or "") + len(getattr(v, "__qualname__", ""))

    total = 64
    for kp, t in nodes(like):
        total += 16 + (sum(size(k) + 8 for k in t) if isinstance(t, dict) else 8 * len(t)
                       if isinstance(t, (tuple, list)) else 0)
        if isinstance(t, Leaf):
            total += 64 + size(str(kp)) + size(t.rule) + size(t.state)
    return total


class Reader:
    """Reads the document (``None`` for a rule's form alone) and ``like`` together.

    Every part is checked against ``like`` before it is used; rules (whose constructors may
    be user code) are built only once the whole tree matched. A function in a rule is taken
    from ``like``'s rule at the same Leaf (:attr:`functions`), never imported.
    """

    def __init__(self, doc: Any, like: Any, archive: Any = None) -> None:
        self.like, self.archive, self.functions = like, archive, {}
        self.here: Any = None  # the state of like's Leaf being read: where arrays go
        self.arrays: dict[int, tuple] = {}  # index -> record, owner, path, item, array
        self.kinds: dict[Any, str] = {}  # a file's rule form, or id of like's -> its classes
        if doc is None:
            return
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise Invalid(f"the file is not an optimisers checkpoint: its checkpoint.json "
                          f"lacks \"format\": \"{FORMAT}\"")
        self.version = doc.get("version")
        if self.version not in READS:
            raise Invalid(f"the checkpoint has format version {self.version!r}; this version "
                          f"of optimisers reads versions {READS}: upgrade it")
        self.records = _list(doc["leaves"])
        self.nodes = _list(doc["nodes"]) if self.version >= 2 else []
        self.root = 0 if self.version >= 2 else doc["tree"]
        self.used: set[int] = set()
        self.built: dict[int, tuple[Leaf, KeyPath, int]] = {}  # index -> Leaf, path, like's id
        self.seen: dict[int, tuple[int, KeyPath]] = {}  # id of like's Leaf -> index, path
        self.rules: list[tuple] = []  # Leaf, form, its text, path, like's state: built last

    def tree(self) -> Any:
        """The loaded tree, walked with a stack (any depth that ``save`` wrote loads); then
        the rules are built."""
        out: list = [None]
        work: list = [(self.root, self.like, KeyPath(), out, 0)]
        while work:
            ref, like, kp, parent, slot = work.pop()
            if ref is _BUILD:
                tag, keys, kids = like
                parent[slot] = dict(zip(keys, kids)) if tag == "dict" else SEQUENCES[tag](kids)
                continue
            j = self.node(ref, kp)
            if j is None or like is None:
                if j is not None or like is not None:
                    raise _mismatch(kp, None, _describe_json(j), like)
                continue
            tag, body = _tag(j, ("leaf", "dict", "tuple", "list"), "a node of the state tree")
            if tag == "leaf":
                if not isinstance(like, Leaf):
                    raise _mismatch(kp, None, "a Leaf", like)
                parent[slot] = self.leaf(body, like, kp)
                continue
            if tag == "dict":
                got = {k if type(k) is str else self.value(k, FREE, kp): v
                       for k, v in _list(body)}
                fits = isinstance(like, dict) and len(got) == len(body) and got.keys() == like.keys()
                keys, refs = list(like) if fits else [], [got[k] for k in like] if fits else []
            else:
                fits = isinstance(like, SEQUENCES[tag]) and len(_list(body)) == len(like)
                keys, refs = list(range(len(like))) if fits else [], body
            if not fits:
                raise _mismatch(kp, None, _describe_json(j), like)
            kids: list = [None] * len(keys)
            work.append((_BUILD, (tag, keys, kids), kp, parent, slot))
            likes = list(like.values() if tag == "dict" else like)
            work.extend((refs[i], likes[i], kp + (keys[i],), kids, i)
                        for i in reversed(range(len(keys))))
        if len(self.used) != len(self.nodes) and self.version >= 2:
            raise Invalid("the checkpoint is malformed: some of its nodes are not in the tree")
        built: dict[str, Rule] = {}  # a rule of optimisers' own classes, by its form
        for leaf, j, text, kp, here in self.rules:
            if text not in built:
                self.functions, self.here = functions(leaf.rule), here  # like's rule till set
                rule = self.rule(j, kp)
                if "'array'" in text or "'function'" in text or not all(type(v).__module__.startswith("optimisers.")
                                                for v in _parts(rule)):
                    leaf.rule = rule  # its own constructor call, and its own arrays
                    continue
                built[text] = rule
            leaf.rule = built[text]
        return out[0]

    def node(self, ref: Any, kp: KeyPath) -> Any:
        """The node ``ref`` names: version 1 nests them; version 2 lists them, each referenced
        by index once (so no cycle, and no node read twice)."""
        if self.version < 2:
            return ref
        if type(ref) is not int or not 0 <= ref < len(self.nodes) or ref in self.used:
            raise Invalid(f"the checkpoint is malformed: a node reference {ref!r} at {kp!r} "
                          f"(each node is referenced once)")
        self.used.add(ref)
        return self.nodes[ref]

    def leaf(self, i: Any, like: Leaf, kp: KeyPath) -> Leaf:
        if type(i) is not int or not 0 <= i < len(self.records):
            raise Invalid(f"the checkpoint is malformed: a Leaf reference {i!r} at {kp!r}")
        if id(like) in self.seen and self.seen[id(like)][0] != i:
            raise Invalid(f"the checkpoint does not match like at {kp!r}: like's Leaf there is "
                          f"shared with {self.seen[id(like)][1]!r}, but the file's Leafs are "
                          f"separate (a different model, or tied parameters were untied)")
        if i in self.built:
            leaf, first, like_id = self.built[i]
            if like_id != id(like):
                raise Invalid(f"the checkpoint does not match like at {kp!r}: the file's "
                              f"Leaf there is shared with {first!r}, but like's Leafs are "
                              f"separate (a different model, or tied parameters)")
            return leaf
        self.seen[id(like)] = (i, kp)
        rec = self.records[i]
        text = repr(rec["rule"])
        if text not in self.kinds:
            self.kinds[text] = _kinds_json(rec["rule"], kp)
        kinds, like_kinds = self.kinds[text], self.kinds_of(like.rule)
        if kinds != like_kinds:
            raise Invalid(f"the checkpoint does not match like at {kp!r}: the file has the "
                          f"rule {kinds}, like has {like_kinds}; make like with setup using "
                          f"the same rule classes (hyper-parameters may differ)")
        clock = rec.get("clock", 0)  # (files written before clocks: none taken)
        if type(rec["frozen"]) is not bool or type(clock) is not int or clock < 0:
            raise Invalid(f"the checkpoint is malformed: frozen={rec['frozen']!r}, "
                          f"clock={clock!r} at {kp!r}")
        self.here = like.state
        leaf = type(like)(like.rule, self.value(rec["state"], like.state, kp, ""),
                          rec["frozen"], clock)  # like's type: JAX's stay JAX's
        self.rules.append((leaf, rec["rule"], text, kp, like.state))
        self.built[i] = (leaf, kp, id(like))
        return leaf

    def kinds_of(self, rule: Rule) -> str:
        if id(rule) not in self.kinds:
            self.kinds[id(rule)] = _kinds(rule)
        return self.kinds[id(rule)]

    def value(self, j: Any, like: Any, kp: KeyPath, sub: str | None = None,
              depth: int = 0) -> Any:
        """A value: of a state (``sub`` the item's place, checked against ``like``), a key
        or a hyper-parameter (``like`` is FREE)."""
        if depth > MAX_DEPTH:
            raise Invalid(f"the checkpoint is malformed: a value at {kp!r} nests more than "
                          f"{MAX_DEPTH} levels deep (save refuses to write that)")
        if j is None or isinstance(j, (bool, str, int)):
            out = j
        else:
            tag, body = _tag(j, _VALUES, "a value")
            if tag == "array":
                return self.array(j, like, kp, sub)
            if tag in ("dict", "tuple", "list"):
                return self.container(tag, body, like, kp, sub, depth)
            if tag == "float":
                out = float(_str(body))
            elif tag == "complex":
                out = complex(float(_str(body[0])), float(_str(body[1])))
            elif tag in ("rule", "schedule"):
                if tag == "rule" and like is not FREE and (not isinstance(like, Rule) or
                                                           _kinds_json(j, kp) != _kinds(like)):
                    raise _mismatch(kp, sub, f"the rule {_kinds_json(j, kp)}", like)
                out = self.rule(j, kp, depth, tag)
            else:
                out = self.function(_str(body), kp) if tag == "function" else _dtype(j)
        if like is not FREE and not _compatible(out, like):
            raise _mismatch(kp, sub, _describe(out), like)
        return out

    def container(self, tag: str, body: Any, like: Any, kp: KeyPath, sub: str | None,
                  depth: int) -> Any:
        """A dict, tuple or list value, checked against ``like`` before its items are read."""
        free, sub = like is FREE, sub or ""
        if tag == "dict":
            got = {self.value(k, FREE, kp, depth=depth + 1): v for k, v in _list(body)}
            if not free and (not isinstance(like, dict) or len(got) != len(body)
                             or got.keys() != like.keys()):
                raise _mismatch(kp, sub, _describe_json({tag: body}), like)
            return {k: self.value(v, like if free else like[k], kp, f"{sub}[{k!r}]", depth + 1)
                    for k, v in got.items()}
        if not free and (not isinstance(like, SEQUENCES[tag]) or len(_list(body)) != len(like)):
            raise _mismatch(kp, sub, _describe_json({tag: body}), like)
        out = [self.value(v, like if free else like[n], kp, f"{sub}[{n}]", depth + 1)
               for n, v in enumerate(_list(body))]
        if tag == "list":
            return out
        return type(like)._make(out) if hasattr(type(like), "_make") else tuple(out)

    def rule(self, j: dict, kp: KeyPath, depth: int = 0, tag: str = "rule") -> Rule | Schedule:
        """A rule (or a schedule in a rule's field) from the registry, never from a name
        imported at the file's request."""
        name, fields = _str(j[tag]), j["fields"]
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

    def function(self, name: str, kp: KeyPath) -> Any:
        """The function the file names, taken from ``like``'s rule at this Leaf."""
        found = self.functions.get(name)
        if found is None:
            raise Invalid(f"the checkpoint's rule at {kp!r} holds the function {name!r} (a "
                          f"schedule), which load takes from like, never by importing what a "
                          f"file names: pass it again through load(path, like=setup(<the rule "
                          f"with {name.rpartition(':')[2]}>, model))")
        return found

    def array(self, j: dict, like: Any, kp: KeyPath, sub: str | None) -> Any:
        """An array record: checked against ``like``, read once, placed like ``like``'s."""
        name, shape, bits = j["dtype"], j["shape"], j.get("bits")
        if type(name) is not str or type(shape) is not list:
            raise Invalid(f"the checkpoint is malformed: an array record {j!r:.80} at {kp!r}")
        shape, lib = tuple(shape), None if like is FREE else backends.library(like)
        is_array = lib is not None or isinstance(like, np.generic)
        if like is not FREE and not (is_array or shape == () and _isnumber(like)):
            raise _mismatch(kp, sub, _describe_json(j), like)
        like_name = dtype_name(like) if is_array else None
        if is_array and (name != like_name or shape != tuple(like.shape)):
            raise _mismatch(kp, sub, _describe_json(j), like, "make like by setup on the same "
                            "model (from the same rule classes)")
        idx = j["array"]
        if type(idx) is not int or not is_array and not all(type(n) is int and n >= 0
                                                            for n in shape):
            raise Invalid(f"the checkpoint is malformed: an array reference {idx!r} of shape "
                          f"{shape!r:.40} at {kp!r}")
        owner = id(like) if is_array else FREE if like is FREE else object()
        if idx in self.arrays:
            first, first_owner, first_kp, first_sub, out = self.arrays[idx]
            if j != first or owner != first_owner:
                raise Invalid(f"the checkpoint is malformed: array {idx} is used at "
                              f"{_where(kp, sub)} and at {_where(first_kp, first_sub)}, but "
                              f"like does not share one array there, or the records differ "
                              f"({_describe_json(j)} and {_describe_json(first)})")
            return out
        stored = STANDARD.get(name if bits is None else bits if bits in (
            "uint8", "uint16", "uint32", "uint64") else "")
        if stored is None:
            raise Invalid(f"the checkpoint's array at {_where(kp, sub)} has dtype {name!r}, "
                          f"which is not a standard NumPy dtype and is not stored as bits")
        arr = self.archive.npy(idx, stored, shape, kp)
        if j.get("scalar") is True and bits is None and lib is None:
            out = arr[()]
        else:
            ref = like if is_array else self.place()
            if bits is not None and (ref is None or (like_name or dtype_name(ref)) != name):
                raise Invalid(f"the checkpoint's array at {_where(kp, sub)} has dtype {name}; "
                              f"like has no array of that dtype there to say what it is")
            lib = backends.library(ref) if not is_array and ref is not None else lib
            out = backends.ops(lib or "numpy").from_host(arr, ref, bits is not None,
                                                         j.get("weak") is True)
        self.arrays[idx] = (j, owner, kp, sub, out)
        return out

    def place(self) -> Any:
        """Where arrays go whose place in like is no array: like's Leaf's first, or like's."""
        states = itertools.chain([self.here], (t.state for _, t in leaves(self.like)))
        return next((a for t in states if (a := _first_array(t)) is not None), None)


_VALUES = ("array", "tuple", "list", "dict", "float", "complex", "rule", "schedule",
           "function", "dtype")


def _tag(j: Any, tags: tuple, what: str) -> tuple[str, Any]:
    if isinstance(j, dict) and j and (tag := next(iter(j))) in tags:
        return tag, j[tag]
    raise Invalid(f"the checkpoint is malformed: expected {what}, found {str(j)[:80]}")


def _str(s: Any) -> str:
    if not isinstance(s, str):
        raise Invalid(f"the checkpoint is malformed: expected a string, found {s!r:.60}")
    return s


def _list(s: Any) -> list:
    if not isinstance(s, list):
        raise Invalid(f"the checkpoint is malformed: expected a list, found {s!r:.60}")
    return s


def _where(kp: KeyPath, sub: str | None) -> str:
    return f"{kp!r}" + (f", state{sub}" if sub is not None else "")


def _describe(t: Any) -> str:
    """How a node of a state tree, or a value in a state, reads in a message."""
    if t is None or isinstance(t, Leaf):
        return "None" if t is None else "a Leaf"
    if isinstance(t, dict):
        return f"a dict with keys {list(t)}"
    if isinstance(t, (tuple, list)):
        return f"a {type(t).__name__} of length {len(t)}"
    if backends.library(t) is not None or isinstance(t, np.generic):
        return f"an array of shape {tuple(t.shape)} and dtype {dtype_name(t)}"
    return f"the {type(t).__name__} {t!r:.40}"


def _describe_json(j: Any) -> str:
    """:func:`_describe` for the JSON of a node or a value."""
    tag, body = next(iter(j.items())) if isinstance(j, dict) and j else (None, j)
    if tag == "array":
        return f"an array of shape {tuple(j.get('shape', ()))} and dtype {j.get('dtype')}"
    if tag == "dict" and isinstance(body, list):
        return f"a dict with keys {[k[0] if isinstance(k, list) else k for k in body]}"
    if tag in SEQUENCES and isinstance(body, list):
        return f"a {tag} of length {len(body)}"
    if tag is None:
        return "None" if j is None else f"the {type(j).__name__} {j!r:.40}"
    return "a Leaf" if tag == "leaf" else f"a {tag}"


def _mismatch(kp: KeyPath, sub: str | None, file: str, like: Any, hint: str = "") -> Invalid:
    return Invalid(f"the checkpoint does not match like at {_where(kp, sub)}: the file has "
                   f"{file}, like has {_describe(like)}" + (f"; {hint}" if hint else ""))


def _dtype(j: dict) -> Any:
    """A dtype hyper-parameter, looked up only among dtypes, and from a library only if this
    process has imported it already (never at a file's wish)."""
    name, form = _str(j["dtype"]), j.get("as")
    if form in ("numpy", "type") and name in STANDARD:
        return np.dtype(name) if form == "numpy" else np.dtype(name).type
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


def _kinds(rule: Any) -> str:
    """A rule's class and those of the rules inside it: ``OptimiserChain(ClipGrad, Adam)``."""
    inner = []
    for p in params(type(rule)):
        v = getattr(rule, p.name, None)
        inner += [_kinds(r) for r in (v if isinstance(v, (tuple, list)) else (v,))
                  if isinstance(r, Rule)]
    return f"{type(rule).__name__}({', '.join(inner)})" if inner else type(rule).__name__


def _kinds_json(j: Any, kp: KeyPath, depth: int = 0) -> str:
    """:func:`_kinds` of a rule in the file, read from its JSON: nothing is constructed."""
    name = _str(_tag(j, ("rule",), "a rule")[1])
    cls = _registered("rule", name, kp)
    if depth > MAX_DEPTH:
        raise Invalid(f"the checkpoint is malformed: rules nested more than {MAX_DEPTH} deep")
    fields, inner = j.get("fields"), []
    for p in params(cls):
        v = fields.get(p.name) if isinstance(fields, dict) else None
        tag = next(iter(v), None) if isinstance(v, dict) and v else None
        items = v[tag] if tag in SEQUENCES and isinstance(v[tag], list) else (v,)
        inner += [_kinds_json(r, kp, depth + 1) for r in items
                  if isinstance(r, dict) and r and next(iter(r)) == "rule"]
    return f"{name}({', '.join(inner)})" if inner else name


def _first_array(x: Any) -> Any:
    if backends.library(x) is not None:
        return x
    for v in x.values() if isinstance(x, dict) else x if isinstance(x, (tuple, list)) else ():
        if (a := _first_array(v)) is not None:
            return a
    return None


def _isnumber(x: Any) -> bool:
    if isinstance(x, (int, float, complex, np.number)):
        return not isinstance(x, bool)
    return backends.library(x) is not None and tuple(x.shape) == ()


def _compatible(value: Any, like: Any) -> bool:
    """Whether ``value`` from the file may stand where ``like`` holds ``like``: the same kind;
    a number and a 0-d array are one kind (``jax.jit`` turns step counters into arrays)."""
    if isinstance(value, bool) or isinstance(like, bool) or value is None or like is None:
        return type(value) is type(like)
    if isinstance(value, (int, float, complex)):
        return _isnumber(like)
    return type(value) is type(like) or isinstance(value, np.dtype) and isinstance(like,
                                                                                 np.dtype)


def _parts(rule: Any) -> Iterator[Rule | Schedule]:
    """The rules and schedules in ``rule``'s fields, at any depth, and ``rule``."""
    stack = [rule]
    while stack:
        v = stack.pop()
        if isinstance(v, (tuple, list)):
            stack.extend(v)
        elif isinstance(v, (Rule, Schedule)):
            yield v
            stack.extend(getattr(v, p.name, None) for p in params(type(v)))


def functions(rule: Any) -> dict[str, Any]:
    """The functions of the :class:`Function` schedules in ``rule``, by the name a
    checkpoint stores them under."""
    return {v.reference: v.function for v in _parts(rule)
            if isinstance(v, Function) and v.reference is not None}
