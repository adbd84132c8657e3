"""Writing a checkpoint: the state tree to JSON and ``.npy`` members, atomically."""

from __future__ import annotations

import os
import secrets
import zipfile
from typing import Any

import numpy as np

from optimisers import backends
from optimisers.checkpoint._format import (
    _BITS,
    _JSON,
    _SIGNED,
    _STAMP,
    _STANDARD,
    _params,
)
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf
from optimisers.rules import RULES, Rule


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
