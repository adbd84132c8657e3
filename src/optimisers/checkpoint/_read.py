"""Reading a checkpoint: every part checked against ``like`` before it is used."""

from __future__ import annotations

import io
import json
import math
import zipfile
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.checkpoint._format import (
    _FREE,
    _JSON,
    _SIGNED,
    _STANDARD,
    _TYPES,
    FORMAT,
    VERSION,
    _dtype_name,
    _Invalid,
    _params,
)
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, leaves
from optimisers.rules import RULES, Rule


def _tag(j: Any, tags: tuple, what: str) -> tuple[str, Any]:
    if isinstance(j, dict) and j and next(iter(j)) in tags:
        tag = next(iter(j))
        return tag, j[tag]
    raise _Invalid(f"the checkpoint is malformed: expected {what}, found {str(j)[:80]}")


def _str(s: Any) -> str:
    if not isinstance(s, str):
        raise _Invalid(f"the checkpoint is malformed: expected a string, found {s!r:.60}")
    return s


def _list(s: Any) -> list:
    if not isinstance(s, list):
        raise _Invalid(f"the checkpoint is malformed: expected a list, found {s!r:.60}")
    return s


def _no_floats(s: str) -> Any:
    raise _Invalid(f"the checkpoint is malformed: a bare JSON number {s} (floats are stored "
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
        return f"an array of shape {tuple(t.shape)} and dtype {_dtype_name(t)}"
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


def _mismatch(kp: KeyPath, sub: str | None, file: str, like: Any, hint: str = "") -> _Invalid:
    where = f"{kp!r}" + (f", state{sub}" if sub is not None else "")
    return _Invalid(f"the checkpoint does not match like at {where}: the file has {file}, "
                    f"like has {_describe(like)}" + (f"; {hint}" if hint else ""))


def _dtype(j: dict) -> Any:
    """A dtype hyper-parameter, looked up only among dtypes (never an arbitrary name)."""
    name, form = _str(j["dtype"]), j.get("as")
    if form == "torch" and name.isidentifier():
        import torch

        obj = getattr(torch, name, None)
        if isinstance(obj, torch.dtype):
            return obj
    elif form == "jax" and name in _STANDARD | {"bfloat16"}:
        import jax.numpy as jnp

        obj = getattr(jnp, name, None)
        if isinstance(obj, type) and np.dtype(obj).name == name:
            return obj
    elif form in ("numpy", "type") and name in _STANDARD:
        return np.dtype(name) if form == "numpy" else np.dtype(name).type
    raise _Invalid(f"the checkpoint names an unknown dtype {name!r} (as {form!r})")


def _kinds(rule: Any) -> str:
    """A rule's class and those of the rules inside it: ``OptimiserChain(ClipGrad, Adam)``."""
    inner = []
    for p in _params(type(rule)):
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


class _Reader:
    """Walks the JSON document and ``like`` together, building the loaded tree."""

    def __init__(self, zf: zipfile.ZipFile, like: Any) -> None:
        self.zf, self.like = zf, like
        try:
            raw = zf.read(_JSON)
        except KeyError:
            raise _Invalid("the file is a ZIP archive but not an optimisers checkpoint: it "
                           f"has no {_JSON}") from None
        doc = json.loads(raw.decode("utf-8"), parse_float=_no_floats, parse_constant=_no_floats)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise _Invalid(f"the file is not an optimisers checkpoint: its {_JSON} lacks "
                           f"\"format\": \"{FORMAT}\"")
        if doc.get("version") != VERSION:
            raise _Invalid(f"the checkpoint has format version {doc.get('version')!r}; this "
                           f"version of optimisers reads version {VERSION}: upgrade it")
        self.doc, self.records = doc, _list(doc["leaves"])
        self.built: dict[int, tuple[Leaf, KeyPath, int]] = {}  # index -> Leaf, path, like's id
        self.seen: dict[int, tuple[int, KeyPath]] = {}  # id of like's Leaf -> index, path
        self.arrays: dict[int, Any] = {}
        self.fallback: Any = ...

    def tree(self) -> Any:
        return self.node(self.doc["tree"], self.like, KeyPath())

    def node(self, j: Any, like: Any, kp: KeyPath) -> Any:
        """A node of the state tree: None, a Leaf, or a dict, tuple or list of nodes."""
        if j is None or like is None:
            if j is not None or like is not None:
                raise _mismatch(kp, None, _describe_json(j), like)
            return None
        tag, body = _tag(j, ("leaf", "dict", "tuple", "list"), "a node of the state tree")
        if tag == "leaf":
            if not isinstance(like, Leaf):
                raise _mismatch(kp, None, "a Leaf", like)
            return self.leaf(body, like, kp)
        if tag == "dict":
            got = {self.value(k, _FREE, kp): v for k, v in _list(body)}
            if not isinstance(like, dict) or len(got) != len(body) or got.keys() != like.keys():
                raise _mismatch(kp, None, _describe_json(j), like)
            return {k: self.node(got[k], v, kp + (k,)) for k, v in like.items()}
        if not isinstance(like, _TYPES[tag]) or len(_list(body)) != len(like):
            raise _mismatch(kp, None, _describe_json(j), like)
        return _TYPES[tag](self.node(v, x, kp + (i,)) for i, (v, x) in enumerate(zip(body, like)))

    def leaf(self, i: Any, like: Leaf, kp: KeyPath) -> Leaf:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self.records):
            raise _Invalid(f"the checkpoint is malformed: a Leaf reference {i!r} at {kp!r}")
        if id(like) in self.seen and self.seen[id(like)][0] != i:
            raise _Invalid(f"the checkpoint does not match like at {kp!r}: like's Leaf there is "
                           f"shared with {self.seen[id(like)][1]!r}, but the file's Leafs are "
                           f"separate (a different model, or tied parameters were untied)")
        if i in self.built:
            leaf, first, like_id = self.built[i]
            if like_id != id(like):
                raise _Invalid(f"the checkpoint does not match like at {kp!r}: the file's "
                               f"Leaf there is shared with {first!r}, but like's Leafs are "
                               f"separate (a different model, or tied parameters)")
            return leaf
        self.seen[id(like)] = (i, kp)
        rec, place = self.records[i], _first_array(like.state)
        rule = self.value(rec["rule"], _FREE, kp, place=place)
        if not isinstance(rule, Rule):
            raise _Invalid(f"the checkpoint is malformed: the rule at {kp!r} is {rule!r:.60}")
        if _kinds(rule) != _kinds(like.rule):
            raise _Invalid(f"the checkpoint does not match like at {kp!r}: the file has the "
                           f"rule {_kinds(rule)}, like has {_kinds(like.rule)}; make like with "
                           f"setup using the same rule classes (hyper-parameters may differ)")
        if not isinstance(rec["frozen"], bool):
            raise _Invalid(f"the checkpoint is malformed: frozen={rec['frozen']!r} at {kp!r}")
        leaf = Leaf(rule, self.value(rec["state"], like.state, kp, "", place), rec["frozen"])
        self.built[i] = (leaf, kp, id(like))
        return leaf

    def value(self, j: Any, like: Any, kp: KeyPath, sub: str = "", place: Any = None) -> Any:
        """A value: in a state (checked against ``like``), a key or a hyper-parameter."""
        free = like is _FREE
        if j is None or isinstance(j, (bool, str, int)):
            out = j
        else:
            tag, body = _tag(j, ("array", "tuple", "list", "dict", "float", "complex", "rule",
                                 "dtype"), "a value")
            if tag == "array":
                return self.array(j, like, kp, sub, place)
            if tag == "dict":
                got = {self.value(k, _FREE, kp): v for k, v in _list(body)}
                if not free and (not isinstance(like, dict) or len(got) != len(body)
                                 or got.keys() != like.keys()):
                    raise _mismatch(kp, sub, _describe_json(j), like)
                return {k: self.value(v, like if free else like[k], kp, f"{sub}[{k!r}]", place)
                        for k, v in got.items()}
            if tag in _TYPES:
                if not free and (not isinstance(like, _TYPES[tag]) or len(_list(body)) != len(
                        like)):
                    raise _mismatch(kp, sub, _describe_json(j), like)
                out = [self.value(v, like if free else like[n], kp, f"{sub}[{n}]", place)
                       for n, v in enumerate(_list(body))]
                if tag == "list":
                    return out
                return type(like)._make(out) if hasattr(type(like), "_make") else tuple(out)
            if tag == "float":
                out = float(_str(body))
            elif tag == "complex":
                out = complex(float(_str(body[0])), float(_str(body[1])))
            elif tag == "rule":
                out = self.rule(j, kp, place)
            else:
                out = _dtype(j)
        if not free and not _compatible(out, like):
            raise _mismatch(kp, sub, _describe(out), like)
        return out

    def rule(self, j: dict, kp: KeyPath, place: Any) -> Rule:
        """A rule from the registry, never from a name imported at the file's request."""
        name, fields = _str(j["rule"]), j["fields"]
        cls = RULES.get(name)
        if not (isinstance(cls, type) and issubclass(cls, Rule)):
            raise _Invalid(f"the checkpoint names the rule {name!r} at {kp!r}, which is not in "
                           f"optimisers.RULES; define (import) that Rule subclass first")
        params = {p.name: p for p in _params(cls)}
        args, kwargs = [], {}
        for field, v in dict(fields).items():
            p = params.get(field)
            if p is None or p.kind is p.POSITIONAL_ONLY:
                raise _Invalid(f"the checkpoint gives the rule {name} at {kp!r} a field "
                               f"{field!r}, which {name}'s constructor does not take")
            v = self.value(v, _FREE, kp, place=place)
            if p.kind is p.VAR_POSITIONAL:
                args.extend(v)
            else:
                kwargs[field] = v
        try:
            return cls(*args, **kwargs)
        except Exception as e:
            raise _Invalid(f"the checkpoint's rule {name} at {kp!r} cannot be rebuilt: "
                           f"{type(e).__name__}: {e}") from e

    def array(self, j: dict, like: Any, kp: KeyPath, sub: str, place: Any) -> Any:
        name, shape, bits = _str(j["dtype"]), tuple(_list(j["shape"])), j.get("bits")
        is_array = like is not _FREE and (backends.library(like) is not None
                                          or isinstance(like, np.generic))
        if like is not _FREE and not (is_array or shape == () and _isnumber(like)):
            raise _mismatch(kp, sub, _describe_json(j), like)
        if is_array and (name != _dtype_name(like) or shape != tuple(like.shape)):
            raise _mismatch(kp, sub, _describe_json(j), like, "make like by setup on the same "
                            "model (from the same rule classes)")
        idx = j["array"]
        if not isinstance(idx, int) or isinstance(idx, bool):
            raise _Invalid(f"the checkpoint is malformed: an array reference {idx!r} at {kp!r}")
        if idx in self.arrays:
            return self.arrays[idx]
        stored = np.dtype(name) if bits is None and name in _STANDARD else np.dtype(
            bits) if bits in ("uint8", "uint16", "uint32", "uint64") else None
        if stored is None:
            raise _Invalid(f"the checkpoint's array at {kp!r}, state{sub} has dtype {name!r}, "
                           f"which is not a standard NumPy dtype and is not stored as bits")
        arr = self.read(idx, stored, shape, kp)
        if j.get("scalar") is True and bits is None and not (is_array and backends.library(
                like) is not None):
            out = arr[()]
        else:
            ref = like if is_array else place if place is not None else self.default()
            out = _place(arr, name, bits, ref, kp, sub, j.get("weak") is True)
        self.arrays[idx] = out
        return out

    def default(self) -> Any:
        """Where arrays go whose Leaf in ``like`` has none: the first array of ``like``."""
        if self.fallback is ...:
            self.fallback = next((a for _, leaf in leaves(self.like)
                                  if (a := _first_array(leaf.state)) is not None), None)
        return self.fallback

    def read(self, idx: int, dtype: np.dtype, shape: tuple, kp: KeyPath) -> np.ndarray:
        """Array ``idx`` from its ``.npy`` member, checked against the JSON, never unpickled."""
        try:
            info = self.zf.getinfo(f"arrays/{idx}.npy")
        except KeyError:
            raise _Invalid(f"the checkpoint is damaged: array {idx} (at {kp!r}) is missing"
                           ) from None
        if info.file_size > math.prod(shape) * dtype.itemsize + 2**16:  # never inflate a bomb
            raise _Invalid(f"the checkpoint is damaged: array {idx} (at {kp!r}) is "
                           f"{info.file_size} bytes, far more than its record says")
        data = self.zf.read(info)
        fp = io.BytesIO(data)
        version = np.lib.format.read_magic(fp)
        if version not in ((1, 0), (2, 0)):
            raise _Invalid(f"the checkpoint's array {idx} has .npy version {version}")
        header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                  else np.lib.format.read_array_header_2_0)
        got_shape, fortran, got = header(fp)
        count, start = math.prod(shape), fp.tell()
        if got.hasobject or got.newbyteorder("=") != dtype or tuple(got_shape) != shape or len(
                data) - start != count * got.itemsize:
            raise _Invalid(f"the checkpoint is damaged: array {idx} (at {kp!r}) holds {got} "
                           f"{tuple(got_shape)} in {len(data) - start} bytes, its record says "
                           f"{dtype} {shape}")
        arr = np.frombuffer(data, got, count, start).reshape(shape, order="F" if fortran else "C")
        return np.array(arr, dtype=dtype, order="C", copy=True)


def _place(arr: np.ndarray, name: str, bits: Any, ref: Any, kp: KeyPath, sub: str,
           weak: bool = False) -> Any:
    """A NumPy array from the file as an array of ``ref``'s library, on ``ref``'s device;
    a dtype that NumPy lacks (stored as bits) is taken from ``ref``."""
    lib = backends.library(ref) if ref is not None else "numpy"
    same = ref is not None and _dtype_name(ref) == name
    if bits is not None and not same:
        raise _Invalid(f"the checkpoint's array at {kp!r}, state{sub} has dtype {name}; like "
                       f"has no array of that dtype there to say what it is")
    if lib == "torch":
        import torch

        if bits is None:
            return torch.from_numpy(arr).to(device=ref.device)
        t = torch.from_numpy(arr.view(_SIGNED[arr.dtype.itemsize])).view(ref.dtype)
        return t.to(device=ref.device)
    out = arr if bits is None else arr.view(ref.dtype)
    if lib == "jax":
        import jax

        if weak and out.shape == ():  # as jnp.asarray(0.9): weakly typed, like under jit
            value = jax.numpy.asarray(out.item())
            out = value if value.dtype == out.dtype else out
        return jax.device_put(out, ref.sharding)
    return out
