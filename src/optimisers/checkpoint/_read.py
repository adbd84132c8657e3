"""Reading a checkpoint: every part checked against ``like`` before it is used."""

from __future__ import annotations

import json
import zipfile
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.checkpoint._archive import check_members, read_json, read_npy
from optimisers.checkpoint._format import (
    FORMAT,
    FREE,
    JSON_BASE,
    MAX_DEPTH,
    READS,
    STANDARD,
    TYPES,
    Invalid,
    constructor_params,
    dtype_name,
)
from optimisers.checkpoint._write import Measure, document, encode_dtype
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, leaves
from optimisers.rules import RULES, Rule
from optimisers.schedules import SCHEDULES, Function, Schedule


def _tag(j: Any, tags: tuple, what: str) -> tuple[str, Any]:
    if isinstance(j, dict) and j and next(iter(j)) in tags:
        tag = next(iter(j))
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


def _no_floats(s: str) -> Any:
    raise Invalid(f"the checkpoint is malformed: a bare JSON number {s} (floats are stored "
                  f"as strings)")


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
    if tag in ("tuple", "list") and isinstance(body, list):
        return f"a {tag} of length {len(body)}"
    if tag is None:
        return "None" if j is None else f"the {type(j).__name__} {j!r:.40}"
    return "a Leaf" if tag == "leaf" else f"a {tag}"


def _mismatch(kp: KeyPath, sub: str | None, file: str, like: Any, hint: str = "") -> Invalid:
    where = f"{kp!r}" + (f", state{sub}" if sub is not None else "")
    return Invalid(f"the checkpoint does not match like at {where}: the file has {file}, "
                   f"like has {_describe(like)}" + (f"; {hint}" if hint else ""))


def _dtype(j: dict) -> Any:
    """A dtype hyper-parameter, looked up only among dtypes (never an arbitrary name), and
    from a library only if this process has imported it already (never at a file's wish)."""
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


def _kinds(rule: Any) -> str:
    """A rule's class and those of the rules inside it: ``OptimiserChain(ClipGrad, Adam)``."""
    inner = []
    for p in constructor_params(type(rule)):
        v = getattr(rule, p.name, None)
        inner += [_kinds(r) for r in (v if isinstance(v, (tuple, list)) else (v,))
                  if isinstance(r, Rule)]
    name = type(rule).__name__
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
    both_dtypes = isinstance(value, np.dtype) and isinstance(like, np.dtype)
    return type(value) is type(like) or both_dtypes


def _kinds_json(j: Any, kp: KeyPath, depth: int = 0) -> str:
    """:func:`_kinds` of a rule in the file, read from its JSON: nothing is constructed."""
    _, name = _tag(j, ("rule",), "a rule")
    cls = RULES.get(_str(name))
    if not (isinstance(cls, type) and issubclass(cls, Rule)):
        raise Invalid(f"the checkpoint names the rule {name!r} at {kp!r}, which is not in "
                      f"optimisers.RULES; define (import) that Rule subclass first")
    if depth > MAX_DEPTH:
        raise Invalid(f"the checkpoint is malformed: rules nested more than {MAX_DEPTH} deep")
    fields, inner = j.get("fields"), []
    for p in constructor_params(cls):
        v = fields.get(p.name) if isinstance(fields, dict) else None
        tag = next(iter(v), None) if isinstance(v, dict) and v else None
        items = v[tag] if tag in TYPES and isinstance(v[tag], list) else (v,)
        inner += [_kinds_json(r, kp, depth + 1) for r in items
                  if isinstance(r, dict) and r and next(iter(r)) == "rule"]
    return f"{name}({', '.join(inner)})" if inner else name


def _container(tag: str, keys: list, kids: list) -> Any:
    return dict(zip(keys, kids)) if tag == "dict" else kids if tag == "list" else tuple(kids)


_BUILD = object()  # marks the work item that builds a container once its children are done


def functions(rule: Any) -> dict[str, Any]:
    """The functions of the :class:`~optimisers.schedules.Function` schedules in ``rule``
    (at any depth), by the name a checkpoint stores them under."""
    found, stack = {}, [rule]
    while stack:
        v = stack.pop()
        if isinstance(v, Function) and v.reference is not None:
            found[v.reference] = v.function
        elif isinstance(v, (tuple, list)):
            stack.extend(v)
        elif isinstance(v, (Rule, Schedule)):
            stack.extend(getattr(v, p.name, None) for p in constructor_params(type(v)))
    return found


class Reader:
    """Walks the JSON document and ``like`` together, building the loaded tree.

    Every part of the file is checked against ``like`` before it is used, and rules (whose
    constructors may be user code) are built only after the whole tree matched. A function
    in a rule is taken from ``like``'s rule at the same Leaf (:attr:`functions`).
    """

    functions: dict[str, Any] = {}  # the functions of the rule being built, by name

    def __init__(self, zf: zipfile.ZipFile, like: Any) -> None:
        self.zf, self.like = zf, like
        check_members(zf)
        cap = JSON_BASE + 4 * len(document(Measure(), like))
        raw = read_json(zf, cap)
        doc = json.loads(raw.decode("utf-8"), parse_float=_no_floats, parse_constant=_no_floats)
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
        self.rules: list[tuple[Leaf, Any, KeyPath, Any]] = []  # built after the whole tree
        self.arrays: dict[int, tuple[dict, Any, str, Any]] = {}  # index -> record, owner, out
        self.fallback: Any = ...

    def tree(self) -> Any:
        """The loaded tree: a walk of ``like`` and the file's nodes with a stack, so that a
        tree of any depth that ``save`` wrote loads; then the rules are built."""
        out: list = [None]
        work: list = [(self.root, self.like, KeyPath(), out, 0)]
        while work:
            ref, like, kp, parent, slot = work.pop()
            if ref is _BUILD:
                parent[slot] = _container(*like)
                continue
            j = self.node_json(ref, kp)
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
            keys, refs = self.children(tag, body, like, kp)
            kids: list = [None] * len(keys)
            work.append((_BUILD, (tag, keys, kids), kp, parent, slot))
            likes = list(like.values() if isinstance(like, dict) else like)
            work.extend((refs[i], likes[i], kp + (keys[i],), kids, i)
                        for i in reversed(range(len(keys))))
        if len(self.used) != len(self.nodes) and self.version >= 2:
            raise Invalid("the checkpoint is malformed: some of its nodes are not in the tree")
        for leaf, j, kp, place in self.rules:
            self.functions = functions(leaf.rule)  # (like's rule, until set here)
            leaf.rule = self.rule(j, kp, place)
        return out[0]

    def node_json(self, ref: Any, kp: KeyPath) -> Any:
        """The node that ``ref`` names: version 1 nests nodes; version 2 lists them, each
        referenced by index exactly once (so no cycle, and no node read twice)."""
        if self.version < 2:
            return ref
        if not isinstance(ref, int) or isinstance(ref, bool) or not 0 <= ref < len(
                self.nodes) or ref in self.used:
            raise Invalid(f"the checkpoint is malformed: a node reference {ref!r} at {kp!r} "
                          f"(each node is referenced once)")
        self.used.add(ref)
        return self.nodes[ref]

    def children(self, tag: str, body: Any, like: Any, kp: KeyPath) -> tuple[list, list]:
        """The keys of a container of the file's tree and its children's references, in
        ``like``'s order, after checking that ``like`` has the same container there."""
        if tag == "dict":
            got = {self.value(k, FREE, kp): v for k, v in _list(body)}
            if not isinstance(like, dict) or len(got) != len(body) or got.keys() != like.keys():
                raise _mismatch(kp, None, _describe_json({tag: body}), like)
            return list(like), [got[k] for k in like]
        if not isinstance(like, TYPES[tag]) or len(_list(body)) != len(like):
            raise _mismatch(kp, None, _describe_json({tag: body}), like)
        return list(range(len(like))), body

    def leaf(self, i: Any, like: Leaf, kp: KeyPath) -> Leaf:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self.records):
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
        rec, place = self.records[i], _first_array(like.state)
        kinds = _kinds_json(rec["rule"], kp)
        if kinds != _kinds(like.rule):
            raise Invalid(f"the checkpoint does not match like at {kp!r}: the file has the "
                          f"rule {kinds}, like has {_kinds(like.rule)}; make like with "
                          f"setup using the same rule classes (hyper-parameters may differ)")
        if not isinstance(rec["frozen"], bool):
            raise Invalid(f"the checkpoint is malformed: frozen={rec['frozen']!r} at {kp!r}")
        clock = rec.get("clock", 0)  # (files written before clocks: none taken)
        if not isinstance(clock, int) or isinstance(clock, bool) or clock < 0:
            raise Invalid(f"the checkpoint is malformed: clock={clock!r} at {kp!r}")
        state = self.value(rec["state"], like.state, kp, "", place)
        # like's type: JAX's stay JAX's
        leaf = type(like)(like.rule, state, rec["frozen"], clock)
        self.rules.append((leaf, rec["rule"], kp, place))
        self.built[i] = (leaf, kp, id(like))
        return leaf

    def value(self, j: Any, like: Any, kp: KeyPath, sub: str = "", place: Any = None,
              depth: int = 0) -> Any:
        """A value: in a state (checked against ``like``), a key or a hyper-parameter."""
        free = like is FREE
        if depth > MAX_DEPTH:
            raise Invalid(f"the checkpoint is malformed: a value at {kp!r} nests more than "
                          f"{MAX_DEPTH} levels deep (save refuses to write that)")
        if j is None or isinstance(j, (bool, str, int)):
            out = j
        else:
            tag, body = _tag(j, ("array", "tuple", "list", "dict", "float", "complex", "rule",
                                 "schedule", "function", "dtype"), "a value")
            if tag == "array":
                return self.array(j, like, kp, sub, place)
            if tag in ("dict", "tuple", "list"):
                return self.container(tag, body, like, kp, sub, place, depth)
            if tag == "float":
                out = float(_str(body))
            elif tag == "complex":
                out = complex(float(_str(body[0])), float(_str(body[1])))
            elif tag in ("rule", "schedule"):
                if tag == "rule" and not free and (
                        not isinstance(like, Rule) or _kinds_json(j, kp) != _kinds(like)):
                    raise _mismatch(kp, sub, f"the rule {_kinds_json(j, kp)}", like)
                out = self.rule(j, kp, place, depth, tag)
            else:
                out = self.function(_str(body), kp) if tag == "function" else _dtype(j)
        if not free and not _compatible(out, like):
            raise _mismatch(kp, sub, _describe(out), like)
        return out

    def container(self, tag: str, body: Any, like: Any, kp: KeyPath, sub: str, place: Any,
                  depth: int) -> Any:
        """A dict, tuple or list value, checked against ``like`` before its items are read."""
        free = like is FREE
        if tag == "dict":
            got = {self.value(k, FREE, kp, depth=depth + 1): v for k, v in _list(body)}
            if not free and (not isinstance(like, dict) or len(got) != len(body)
                             or got.keys() != like.keys()):
                raise _mismatch(kp, sub, _describe_json({tag: body}), like)
            return {k: self.value(v, like if free else like[k], kp, f"{sub}[{k!r}]", place,
                                  depth + 1) for k, v in got.items()}
        if not free and (not isinstance(like, TYPES[tag]) or len(_list(body)) != len(like)):
            raise _mismatch(kp, sub, _describe_json({tag: body}), like)
        out = [self.value(v, like if free else like[n], kp, f"{sub}[{n}]", place, depth + 1)
               for n, v in enumerate(_list(body))]
        if tag == "list":
            return out
        return type(like)._make(out) if hasattr(type(like), "_make") else tuple(out)

    def rule(self, j: dict, kp: KeyPath, place: Any, depth: int = 0, tag: str = "rule"
             ) -> Rule | Schedule:
        """A rule (or a schedule in a rule's field) from the registry, never from a name
        imported at the file's request."""
        name, fields = _str(j[tag]), j["fields"]
        registry, base = (RULES, Rule) if tag == "rule" else (SCHEDULES, Schedule)
        cls = registry.get(name)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise Invalid(f"the checkpoint names the {tag} {name!r} at {kp!r}, which is not "
                          f"in optimisers.{tag.upper()}S; define (import) that "
                          f"{base.__name__} subclass first")
        params = {p.name: p for p in constructor_params(cls)}
        args, kwargs = [], {}
        for field, v in dict(fields).items():
            p = params.get(field)
            if p is None or p.kind is p.POSITIONAL_ONLY:
                raise Invalid(f"the checkpoint gives the {tag} {name} at {kp!r} a field "
                              f"{field!r}, which {name}'s constructor does not take")
            v = self.value(v, FREE, kp, place=place, depth=depth + 1)
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
        """The function the file names, taken from ``like``'s rule at this Leaf (a
        :class:`~optimisers.schedules.Function`'s), never imported at the file's request."""
        found = self.functions.get(name)
        if found is None:
            raise Invalid(f"the checkpoint's rule at {kp!r} holds the function {name!r} (a "
                          f"schedule), which load takes from like, never by importing what a "
                          f"file names: pass it again through load(path, like=setup(<the rule "
                          f"with {name.rpartition(':')[2]}>, model))")
        return found

    def array(self, j: dict, like: Any, kp: KeyPath, sub: str, place: Any) -> Any:
        name, shape, bits = _str(j["dtype"]), tuple(_list(j["shape"])), j.get("bits")
        is_array = like is not FREE and (backends.library(like) is not None
                                          or isinstance(like, np.generic))
        if like is not FREE and not (is_array or shape == () and _isnumber(like)):
            raise _mismatch(kp, sub, _describe_json(j), like)
        like_name = dtype_name(like) if is_array else None
        if is_array and (name != like_name or shape != tuple(like.shape)):
            raise _mismatch(kp, sub, _describe_json(j), like, "make like by setup on the same "
                            "model (from the same rule classes)")
        idx = j["array"]
        if not isinstance(idx, int) or isinstance(idx, bool) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise Invalid(f"the checkpoint is malformed: an array reference {idx!r} of shape "
                          f"{shape!r:.40} at {kp!r}")
        owner = id(like) if is_array else FREE if like is FREE else object()
        if idx in self.arrays:
            return self.again(idx, j, owner, f"{kp!r}, state{sub}")
        stored = np.dtype(name) if bits is None and name in STANDARD else np.dtype(
            bits) if bits in ("uint8", "uint16", "uint32", "uint64") else None
        if stored is None:
            raise Invalid(f"the checkpoint's array at {kp!r}, state{sub} has dtype {name!r}, "
                          f"which is not a standard NumPy dtype and is not stored as bits")
        arr = read_npy(self.zf, idx, stored, shape, repr(kp))
        if j.get("scalar") is True and bits is None and not (is_array and backends.library(
                like) is not None):
            out = arr[()]
        else:
            ref = like if is_array else place if place is not None else self.default()
            out = _place(arr, name, bits, ref, kp, sub, j.get("weak") is True,
                         like_name)
        self.arrays[idx] = (j, owner, f"{kp!r}, state{sub}", out)
        return out

    def again(self, idx: int, j: dict, owner: Any, where: str) -> Any:
        """Array ``idx`` once more: only where ``like`` shares its array too (or both places
        are hyper-parameters) and the records agree; never an array read for another place."""
        first, first_owner, first_where, out = self.arrays[idx]
        if j != first or owner != first_owner:
            raise Invalid(f"the checkpoint is malformed: array {idx} is used at {where} and at "
                          f"{first_where}, but like does not share one array there, or the "
                          f"records differ ({_describe_json(j)} and {_describe_json(first)})")
        return out

    def default(self) -> Any:
        """Where arrays go whose Leaf in ``like`` has none: the first array of ``like``."""
        if self.fallback is ...:
            self.fallback = next((a for _, t in leaves(self.like)
                                  if (a := _first_array(t.state)) is not None), None)
        return self.fallback


def _place(arr: np.ndarray, name: str, bits: Any, ref: Any, kp: KeyPath, sub: str,
           weak: bool = False, ref_name: str | None = None) -> Any:
    """A NumPy array from the file as an array of ``ref``'s library, on ``ref``'s device;
    a dtype that NumPy lacks (stored as bits) is taken from ``ref`` (whose dtype name is
    ``ref_name`` where the caller has it)."""
    lib = backends.library(ref) if ref is not None else "numpy"
    same = ref is not None and (ref_name or dtype_name(ref)) == name
    if bits is not None and not same:
        raise Invalid(f"the checkpoint's array at {kp!r}, state{sub} has dtype {name}; like "
                      f"has no array of that dtype there to say what it is")
    return backends.ops(lib).from_host(arr, ref, bits is not None, weak)
