"""Writing a checkpoint: the state tree to JSON and ``.npy`` members, atomically."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import zipfile
from typing import Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

import numpy as np

from optimisers import backends
from optimisers.checkpoint._format import (
    BITS,
    FORMAT,
    JSON_MEMBER,
    MAX_DEPTH,
    STAMP,
    STANDARD,
    VERSION,
    constructor_params,
)
from optimisers.keypath import KeyPath
from optimisers.leaf import Leaf, nodes
from optimisers.rules import RULES, Rule
from optimisers.schedules import SCHEDULES, Function, Schedule, importable_name


class Writer:
    """Turns a state tree into the JSON document and the list of arrays."""

    def __init__(self) -> None:
        self.leaves: list[dict] = []
        self.arrays: list[np.ndarray] = []
        self.leaf_ids: dict[int, int] = {}
        self.array_ids: dict[int, dict] = {}
        self.keep: list[Any] = []  # holds every array seen, so that ids stay unique

    def tree(self, tree: Any) -> list:
        """The state tree as a flat list of nodes, parents before children (``nodes[0]`` the
        root), each container holding its children's indices: no depth limit on either side.

        Raises:
            TypeError: ``tree`` is not a state tree (a model passed in its place).
        """
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
        return out

    def leaf(self, t: Leaf, kp: KeyPath) -> int:
        if id(t) not in self.leaf_ids:
            self.leaf_ids[id(t)] = len(self.leaves)
            self.leaves.append({"path": str(kp), "rule": self.value(t.rule, kp, "the rule"),
                                "frozen": bool(t.frozen), "clock": int(t.clock),
                                "state": self.value(t.state, kp, "the state")})
        return self.leaf_ids[id(t)]

    def value(self, v: Any, kp: KeyPath, where: str, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            return self.too_deep(kp, where)
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
            return {tag: [self.value(x, kp, where, depth + 1) for x in v]}
        if isinstance(v, dict):
            return {"dict": [[self.value(k, kp, where, depth + 1),
                              self.value(x, kp, where, depth + 1)] for k, x in v.items()]}
        if isinstance(v, (Rule, Schedule)):
            return self.rule(v, kp, depth)
        dtype = encode_dtype(v)
        return dtype if dtype is not None else self.unsaveable(v, kp, where)

    def function(self, f: Any, kp: KeyPath, where: str, depth: int = 0) -> dict:
        """The function of a :class:`~optimisers.schedules.Function`: by the name that
        imports it, never its code; ``load`` takes it again from ``like``."""
        name = importable_name(f)
        if name is None:
            raise TypeError(
                f"cannot save {where} at {kp!r}: the function "
                f"{getattr(f, '__qualname__', f)!s:.60} has no name that imports it again (a "
                f"lambda, a function defined inside another, a schedule an optax factory "
                f"made), and a checkpoint stores a function by that name only, never its "
                f"code; define it with def at the top level of a module, and pass it again "
                f"through load(path, like=setup(<the rule with it>, model))")
        return {"function": name}

    def too_deep(self, kp: KeyPath, where: str) -> Any:
        raise ValueError(f"cannot save {where} at {kp!r}: it nests tuples, lists, dicts and "
                         f"rules more than {MAX_DEPTH} levels deep, which load would refuse; "
                         f"flatten it")

    def unsaveable(self, v: Any, kp: KeyPath, where: str) -> Any:
        raise TypeError(f"cannot save {where} at {kp!r}: it holds a {type(v).__name__} "
                        f"({v!r:.60}), which a checkpoint stores only by pickling; use "
                        f"numbers, strings, tuples, lists, dicts, dtypes, arrays and rules")

    def registered(self, cls: type, kp: KeyPath) -> str:
        """``"rule"`` or ``"schedule"``: the tag, after checking that the registry loading
        reads builds this very class."""
        name = cls.__name__
        tag, registry = ("rule", RULES) if issubclass(cls, Rule) else ("schedule", SCHEDULES)
        if registry.get(name) is not cls:
            raise TypeError(f"cannot save the {tag} {name} at {kp!r}: optimisers."
                            f"{tag.upper()}S maps {name!r} to {registry.get(name)!r}, not to "
                            f"this class, so loading would build a different {tag}; give the "
                            f"class a unique name")
        return tag

    def rule(self, rule: Rule | Schedule, kp: KeyPath, depth: int = 0) -> dict:
        """A rule, or a schedule in a rule's field: its class name and fields."""
        cls, name = type(rule), type(rule).__name__
        tag = self.registered(cls, kp)
        fields = {}
        for p in constructor_params(cls):
            if not hasattr(rule, p.name):
                raise TypeError(f"cannot save the rule {name} at {kp!r}: its constructor "
                                f"takes {p.name!r} but the rule has no attribute of that "
                                f"name; make the rule a dataclass")
            value = self.function if isinstance(rule, Function) else self.value
            fields[p.name] = value(getattr(rule, p.name), kp, f"{name}.{p.name}", depth + 1)
        return {tag: name, "fields": fields}

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
    """``(array, dtype name, bits dtype name or None)`` for an array of any library: its
    backend's host values, a dtype NumPy lacks stored as its bits."""
    arr, name = backends.ops(lib or "numpy").host(a, where)
    if name in STANDARD:
        return arr, name, None
    kind, size = arr.dtype.kind, arr.dtype.itemsize
    if (kind == "u" or kind == "V" and arr.dtype.fields is None) and size in BITS \
            and name.isidentifier():
        bits = np.ascontiguousarray(arr).view(BITS[size])
        return bits, name, np.dtype(BITS[size]).name
    raise TypeError(f"cannot save {where}: an array of dtype {name}; a checkpoint "
                    f"holds bool, integer, floating and complex arrays")


def encode_dtype(v: Any) -> dict | None:
    if isinstance(v, np.dtype):
        return {"dtype": v.name, "as": "numpy"}
    if isinstance(v, type) and issubclass(v, np.generic):
        return {"dtype": np.dtype(v).name, "as": "type"}
    lib = backends.dtype_library(v)
    if lib is not None:
        return {"dtype": backends.ops(lib).dtype_name_of(v), "as": lib}
    return None


class Measure(Writer):
    """A :class:`Writer` that only sizes a tree's document: each array is an upper bound on
    its record, and nothing is refused (``load`` sizes ``like`` so, to bound the file's)."""

    def array(self, a: Any, kp: KeyPath, where: str) -> dict:
        return {"array": 2**31, "dtype": "complex128", "shape": [2**31] * len(a.shape),
                "library": "numpy", "bits": "uint64", "scalar": True, "weak": True}

    def too_deep(self, kp: KeyPath, where: str) -> Any:
        return None

    def unsaveable(self, v: Any, kp: KeyPath, where: str) -> Any:
        return "?" * 64


    def rule(self, rule: Rule, kp: KeyPath, depth: int = 0) -> dict:
        return {"rule": type(rule).__name__, "fields": {
            p.name: self.value(getattr(rule, p.name, None), kp, "", depth + 1)
            for p in constructor_params(type(rule))}}


def document(writer: Writer, tree: Any) -> str:
    """The JSON document of a checkpoint of ``tree``, its arrays left in ``writer.arrays``."""
    doc = {"format": FORMAT, "version": VERSION, "nodes": writer.tree(tree)}
    doc["leaves"], doc["arrays"] = writer.leaves, len(writer.arrays)
    return json.dumps(doc, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def write_atomic(path: str, doc: bytes, arrays: list[np.ndarray]) -> None:
    """Write the ZIP to a temporary file beside ``path``, fsync it, rename it over ``path``.

    A symlink at ``path`` is written through (its target is replaced, the link stays);
    an existing file's permission bits are kept; temporary files of this same target left
    by a killed ``save`` (no process holds their lock) are removed first. A write that
    fails (a full disk) removes the temporary file and leaves ``path`` as it was.

    Raises:
        ValueError: ``path`` (or the file a symlink there points to) exists and is not a
            regular file: a directory, device, FIFO or socket, which is never replaced.
    """
    target = os.path.realpath(path)
    _check_replaceable(path, target)
    folder, base = os.path.split(target)
    _remove_abandoned(folder, base)
    fd, tmp = _create_temp(folder, base)
    f = os.fdopen(fd, "wb")
    try:
        _keep_mode(f.fileno(), tmp, target)
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            zf.writestr(zipfile.ZipInfo(JSON_MEMBER, STAMP), doc)
            for i, arr in enumerate(arrays):
                info = zipfile.ZipInfo(f"arrays/{i}.npy", STAMP)
                with zf.open(info, "w", force_zip64=arr.nbytes > 2**30) as member:
                    np.lib.format.write_array(member, arr, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
        if fcntl is None:  # Windows renames no open file (and has no lock to keep)
            f.close()
        _check_replaceable(path, target)  # again: it may have been made while we wrote
        os.replace(tmp, target)  # with the lock held, so no other save takes tmp for abandoned
    except BaseException:
        with contextlib.suppress(OSError):  # flushing what a full disk refused fails again
            f.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        f.close()
    _sync_folder(folder)


def _check_replaceable(path: str, target: str) -> None:
    """Refuse to replace anything but a regular file (or nothing) at ``target``."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
        via = f" (a symlink to {target!r})" if os.path.islink(path) else ""
        raise ValueError(f"cannot save to {path!r}{via}: it is {kind}, not a regular file, "
                         f"and save replaces the file at its path; pass the path of a "
                         f"checkpoint file")


def _temp_pattern(base: str) -> re.Pattern:
    return re.compile(rf"\.{re.escape(base)}\.[0-9a-f]{{12}}\.tmp")


def _create_temp(folder: str, base: str) -> tuple[int, str]:
    """A new temporary file beside the target, opened and locked for as long as it is open."""
    while True:
        tmp = os.path.join(folder, f".{base}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                     0o666)
        if fcntl is None:
            return fd, tmp
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_nlink > 0:  # not removed by another save between open and lock
            return fd, tmp
        os.close(fd)


def _remove_abandoned(folder: str, base: str) -> None:
    """Remove this target's temporary files whose ``save`` died (so none holds its lock)."""
    pattern = _temp_pattern(base)
    try:
        names = [n for n in os.listdir(folder) if pattern.fullmatch(n)]
    except OSError:
        return
    for name in names:
        tmp = os.path.join(folder, name)
        try:
            fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: that save is running
                os.unlink(tmp)
        except OSError:
            pass
        finally:
            os.close(fd)
        if fcntl is None:  # Windows: a file another process has open cannot be removed
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _keep_mode(fd: int, tmp: str, target: str) -> None:
    """Give the new file the permission bits of the file it replaces, if there is one."""
    try:
        mode = os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        return
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)
    else:
        os.chmod(tmp, mode)


def _sync_folder(folder: str) -> None:
    """Make the rename itself durable; not possible everywhere (Windows)."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
