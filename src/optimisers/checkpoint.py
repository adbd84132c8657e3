"""Checkpoints: ``save`` and ``load`` a state tree, without pickle.

A checkpoint is one ZIP file (stored, not compressed; readable by ``numpy.load`` and
``unzip``) with these members:

``checkpoint.json``
    A UTF-8 JSON document::

        {"format": "optimisers.checkpoint", "version": 1,
         "tree": <node>, "leaves": [<leaf>, ...], "arrays": <count>}

``arrays/<i>.npy``
    Array number ``i`` in NumPy's ``.npy`` format (header version 1.0 or 2.0, never an
    object dtype). A dtype that NumPy lacks (``bfloat16``, ``float8_*``) is stored as its
    bits, an unsigned integer array of the same item size.

``<node>`` is the state tree: ``null`` (no Leaf here), ``{"leaf": i}`` (entry ``i`` of
``leaves``; a tied Leaf is stored once and referenced from every path to it),
``{"dict": [[<key>, <node>], ...]}``, ``{"tuple": [<node>, ...]}`` or
``{"list": [<node>, ...]}``. Each ``<leaf>`` is
``{"path": "layers.0.weight", "rule": <value>, "frozen": false, "state": <value>}``,
``path`` being the first key path that reaches it (for people; loading walks ``tree``).

A ``<value>`` is JSON ``null``, ``true``/``false``, an integer or a string as itself,
or an object with one tag:

- ``{"float": "0.9"}``: a Python float by ``repr``, exact (``"inf"``, ``"nan"``, ``"-0.0"``);
  ``{"complex": ["1.0", "-2.5"]}``.
- ``{"tuple": [...]}``, ``{"list": [...]}``, ``{"dict": [[<key>, <value>], ...]}``.
- ``{"array": i, "dtype": "float32", "shape": [3, 2], "library": "torch"}``, plus
  ``"bits": "uint16"`` when stored as bits, ``"scalar": true`` for a NumPy scalar and
  ``"weak": true`` for a weakly-typed JAX scalar; one array object reached twice is
  stored once.
- ``{"rule": "Adam", "fields": {"eta": <value>, "beta": <value>, ...}}``: a rule, by its
  class name in :data:`optimisers.RULES` and its constructor arguments (nested rules for
  :class:`OptimiserChain` and :class:`MixedPrecision`).
- ``{"dtype": "float32", "as": "type"}``: a dtype field, ``as`` one of ``"type"``
  (``np.float32``), ``"numpy"`` (``np.dtype("float32")``), ``"torch"``, ``"jax"``.

Loading never unpickles, never executes code from the file and never imports a name the
file chooses: rules come from the registry :data:`optimisers.RULES` (every subclass of
:class:`Rule` registers itself when defined), dtypes from a fixed list or from ``like``.
"""

from __future__ import annotations

import inspect
import io
import json
import math
import os
import secrets
import zipfile
from typing import Any

import numpy as np

from optimisers import backends, fused
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, leaves
from optimisers.rules import RULES, Rule

__all__ = ["save", "load"]

FORMAT = "optimisers.checkpoint"
VERSION = 1
_JSON = "checkpoint.json"
_STAMP = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same tree gives the same bytes
_STANDARD = frozenset(np.dtype(c).name for c in np.typecodes["All"]
                      if np.dtype(c).kind in "biufc")
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_TYPES = {"tuple": tuple, "list": list}


class _Invalid(ValueError):
    """A problem found while loading; :func:`load` re-raises it as a plain ValueError."""


def save(path: str | os.PathLike, tree: Any) -> None:
    """save(path, tree) -> None: write the state tree to a checkpoint file, atomically.

    Stores every Leaf's rule (class name and hyper-parameters), state (arrays with their
    dtypes, step counters and other numbers exactly), frozen flag, and which Leafs are
    shared, in the pickle-free format described in :mod:`optimisers.checkpoint`. The file
    is written to a temporary file in the same directory, flushed to disk, then renamed
    over ``path``: a crash during ``save`` leaves any previous checkpoint intact.

    Args:
        path: the file to write (any name; ``.ckpt`` or ``.npz`` are customary).
        tree: a state tree from :func:`setup`, with NumPy, PyTorch or JAX arrays.

    Raises:
        TypeError: the tree holds something a checkpoint cannot store without pickle (a
            function as a hyper-parameter, an object array, a rule class that is not the
            one registered under its name in ``RULES``), or it is not a state tree.

    Example:
        >>> import os, tempfile
        >>> import numpy as np
        >>> from optimisers import Adam, setup, update_
        >>> model = {"w": np.ones(3)}
        >>> tree = setup(Adam(0.1), model)
        >>> tree, model = update_(tree, model, {"w": np.ones(3)})
        >>> folder = tempfile.TemporaryDirectory()
        >>> save(os.path.join(folder.name, "opt.ckpt"), tree)
        >>> sorted(os.listdir(folder.name))
        ['opt.ckpt']
        >>> folder.cleanup()
    """
    for _ in leaves(tree):  # a model passed in place of the tree: TypeError, naming the path
        pass
    writer = _Writer()
    doc = {"format": FORMAT, "version": VERSION, "tree": writer.node(tree, KeyPath())}
    doc["leaves"], doc["arrays"] = writer.leaves, len(writer.arrays)
    text = json.dumps(doc, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    _atomic_write(os.fspath(path), text.encode("utf-8"), writer.arrays)


def load(path: str | os.PathLike, like: Any) -> Any:
    """load(path, like=tree) -> tree: read a checkpoint written by :func:`save`.

    ``like`` is a state tree for the same model (from :func:`setup`); it fixes the
    expected structure, and each state array comes back in the library and on the device
    of the matching array in ``like`` (NumPy, PyTorch or JAX; a checkpoint saved from one
    library loads into another). Everything else comes from the file: rules with their
    hyper-parameters (which may differ from ``like``'s, e.g. after :func:`adjust`), states,
    frozen flags and sharing. ``like`` is not changed. Training continued from the loaded
    tree is bit-for-bit the training that was never interrupted.

    Args:
        path: a file written by :func:`save`.
        like: a state tree of the same structure, giving array libraries and devices.

    Returns:
        A new state tree.

    Raises:
        ValueError: the file does not match ``like`` (structure, sharing, rule class,
            state shape or dtype; the message names the :class:`KeyPath`), names a rule
            that is not in ``RULES``, or is not an intact checkpoint (truncated,
            corrupted, or some other kind of file).
        TypeError: ``like`` is not a state tree.
        FileNotFoundError: there is no file at ``path``.

    Example:
        >>> import os, tempfile
        >>> import numpy as np
        >>> from optimisers import Adam, adjust_, setup, update_
        >>> model = {"w": np.ones(3)}
        >>> tree = adjust_(setup(Adam(0.1), model), 0.01)
        >>> tree, model = update_(tree, model, {"w": np.ones(3)})
        >>> folder = tempfile.TemporaryDirectory()
        >>> save(os.path.join(folder.name, "opt.ckpt"), tree)
        >>> back = load(os.path.join(folder.name, "opt.ckpt"), like=setup(Adam(), model))
        >>> back["w"].rule, back["w"].state[2] == tree["w"].state[2]
        (Adam(eta=0.01, beta=(0.9, 0.999), epsilon=1e-08), True)
        >>> folder.cleanup()
    """
    for _ in leaves(like):
        pass
    name = os.fspath(path)
    with open(name, "rb") as f:
        try:
            with zipfile.ZipFile(f) as zf:
                reader = _Reader(zf, like)
                tree = reader.tree()
        except _Invalid as e:
            raise ValueError(str(e)) from None
        except Exception as e:  # whatever a damaged file makes the decoders raise
            raise ValueError(f"{name!r} is not an intact optimisers checkpoint (truncated, "
                             f"corrupted, or another kind of file): {type(e).__name__}: "
                             f"{e}") from e
    fused.pack([leaf for leaf, _, _ in reader.built.values() if _hashable(leaf.rule)])
    return tree  # with states laid out as setup lays them out, for the fused path


def _hashable(rule: Rule) -> bool:
    """Whether a rule may key a fused group (not with a list field, nor, after ``jax.jit``,
    with JAX arrays for hyper-parameters)."""
    try:
        hash(rule)
    except TypeError:
        return False
    return True


# ----------------------------------------------------------------------------- writing


class _Writer:
    """Turns a state tree into the JSON document and the list of arrays."""

    def __init__(self) -> None:
        self.leaves: list[dict] = []
        self.arrays: list[np.ndarray] = []
        self.leaf_ids: dict[int, int] = {}
        self.array_ids: dict[int, dict] = {}
        self.keep: list[Any] = []  # holds every array seen, so that ids stay unique

    def node(self, t: Any, kp: KeyPath) -> Any:
        if t is None:
            return None
        if isinstance(t, Leaf):
            if id(t) not in self.leaf_ids:
                self.leaf_ids[id(t)] = len(self.leaves)
                self.leaves.append({"path": str(kp), "rule": self.value(t.rule, kp, "the rule"),
                                    "frozen": bool(t.frozen),
                                    "state": self.value(t.state, kp, "the state")})
            return {"leaf": self.leaf_ids[id(t)]}
        if isinstance(t, dict):
            return {"dict": [[self.value(k, kp, "a key"), self.node(v, kp + (k,))]
                             for k, v in t.items()]}
        tag = "tuple" if isinstance(t, tuple) else "list"
        return {tag: [self.node(v, kp + (i,)) for i, v in enumerate(t)]}

    def value(self, v: Any, kp: KeyPath, where: str) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (np.generic, np.ndarray)) or backends.library(v) is not None:
            return self.array(v, kp, where)
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            return {"float": repr(float(v))}
        if isinstance(v, complex):
            return {"complex": [repr(v.real), repr(v.imag)]}
        if isinstance(v, (tuple, list)):
            tag = "tuple" if isinstance(v, tuple) else "list"
            return {tag: [self.value(x, kp, where) for x in v]}
        if isinstance(v, dict):
            return {"dict": [[self.value(k, kp, where), self.value(x, kp, where)]
                             for k, x in v.items()]}
        if isinstance(v, Rule):
            return self.rule(v, kp)
        dtype = _encode_dtype(v)
        if dtype is not None:
            return dtype
        raise TypeError(f"cannot save {where} at {kp!r}: it holds a {type(v).__name__} "
                        f"({v!r:.60}), which a checkpoint stores only by pickling; use "
                        f"numbers, strings, tuples, lists, dicts, dtypes, arrays and rules")

    def rule(self, rule: Rule, kp: KeyPath) -> dict:
        cls, name = type(rule), type(rule).__name__
        if RULES.get(name) is not cls:
            raise TypeError(f"cannot save the rule {name} at {kp!r}: optimisers.RULES maps "
                            f"{name!r} to {RULES.get(name)!r}, not to this class, so loading "
                            f"would build a different rule; give the class a unique name")
        fields = {}
        for p in _params(cls):
            if not hasattr(rule, p.name):
                raise TypeError(f"cannot save the rule {name} at {kp!r}: its constructor "
                                f"takes {p.name!r} but the rule has no attribute of that "
                                f"name; make the rule a dataclass")
            fields[p.name] = self.value(getattr(rule, p.name), kp, f"{name}.{p.name}")
        return {"rule": name, "fields": fields}

    def array(self, a: Any, kp: KeyPath, where: str) -> dict:
        if id(a) in self.array_ids:
            return self.array_ids[id(a)]
        lib = "numpy" if isinstance(a, (np.generic, np.ndarray)) else backends.library(a)
        arr, name, bits = _to_numpy(a, lib, f"{where} at {kp!r}")
        rec = {"array": len(self.arrays), "dtype": name, "shape": list(arr.shape),
               "library": lib}
        if bits:
            rec["bits"] = bits
        if isinstance(a, np.generic):
            rec["scalar"] = True
        if getattr(a, "weak_type", False) is True:
            rec["weak"] = True  # a JAX weakly-typed scalar, as jit makes step counters
        self.arrays.append(arr)
        self.keep.append(a)
        self.array_ids[id(a)] = rec
        return rec


def _params(cls: type) -> list[inspect.Parameter]:
    """The named constructor parameters of a rule class (``*rules`` included)."""
    return [p for p in inspect.signature(cls).parameters.values()
            if p.kind is not p.VAR_KEYWORD]


def _to_numpy(a: Any, lib: str | None, where: str) -> tuple[np.ndarray, str, str | None]:
    """``(array, dtype name, bits dtype name or None)`` for an array of any library."""
    if lib == "torch":
        import torch

        t = a.detach()
        if t.layout is not torch.strided:
            raise TypeError(f"cannot save {where}: a {t.layout} tensor; make it dense")
        t = t.cpu().resolve_conj().resolve_neg().contiguous()
        name = str(t.dtype).removeprefix("torch.")
        if name in _STANDARD:
            return t.numpy(), name, None
        size = t.element_size()
        if size not in _SIGNED:
            raise TypeError(f"cannot save {where}: tensors of dtype {name}")
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
        return t.view(ints).numpy().view(_BITS[size]), name, np.dtype(_BITS[size]).name
    arr = np.asarray(a)  # NumPy arrays and scalars, JAX arrays (fetched from the device)
    name = arr.dtype.name
    if name in _STANDARD:
        return arr, name, None
    kind, size = arr.dtype.kind, arr.dtype.itemsize
    if kind == "V" and arr.dtype.fields is None and size in _BITS and name.isidentifier():
        bits = np.ascontiguousarray(arr).view(_BITS[size])
        return bits, name, np.dtype(_BITS[size]).name
    raise TypeError(f"cannot save {where}: an array of dtype {arr.dtype}; a checkpoint "
                    f"holds bool, integer, floating and complex arrays")


def _encode_dtype(v: Any) -> dict | None:
    if isinstance(v, np.dtype):
        return {"dtype": v.name, "as": "numpy"}
    if isinstance(v, type) and issubclass(v, np.generic):
        return {"dtype": np.dtype(v).name, "as": "type"}
    mod = type(v).__module__.partition(".")[0]
    if mod == "torch" and type(v).__name__ == "dtype":
        return {"dtype": str(v).removeprefix("torch."), "as": "torch"}
    if mod == "jax" and isinstance(v, type) and hasattr(v, "dtype"):
        return {"dtype": np.dtype(v).name, "as": "jax"}
    return None


def _atomic_write(path: str, doc: bytes, arrays: list[np.ndarray]) -> None:
    """Write the ZIP to a temporary file beside ``path``, fsync it, rename it over ``path``."""
    folder, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{base}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                zf.writestr(zipfile.ZipInfo(_JSON, _STAMP), doc)
                for i, arr in enumerate(arrays):
                    info = zipfile.ZipInfo(f"arrays/{i}.npy", _STAMP)
                    with zf.open(info, "w", force_zip64=arr.nbytes > 2**30) as member:
                        np.lib.format.write_array(member, arr, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable; not possible everywhere (Windows)
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


# ----------------------------------------------------------------------------- reading

_FREE = object()  # the ``like`` of keys and hyper-parameters: nothing to compare with


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


def _dtype_name(a: Any) -> str:
    return str(a.dtype).removeprefix("torch.")


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
