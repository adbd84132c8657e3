"""The ZIP file of a checkpoint: written atomically beside its target; read as untrusted
input, each member straight from its offset in the file with its CRC checked."""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import math
import os
import re
import secrets
import stat
import struct
import zipfile
import zlib
from typing import Any, BinaryIO

try:
    import fcntl
except ImportError:  # Windows: no locks, so abandoned temporary files stay
    fcntl = None

import numpy as np

from optimisers.checkpoint._codec import Invalid
from optimisers.keypath import KeyPath

JSON_MEMBER = "checkpoint.json"
STAMP = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same tree gives the same bytes
_HEADER = 2**16  # room for a .npy member's header beyond its data


def open_regular(name: str) -> BinaryIO:
    """``name`` opened for reading if it is a regular file, without blocking on a FIFO."""
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "a directory, not a checkpoint file", name)
        if not stat.S_ISREG(mode):
            raise ValueError(f"{name!r} is not a regular file (it is a device, FIFO or socket, "
                             f"or a symlink to one); pass the path of a file written by save")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class Archive:
    """A checkpoint's members, each stored as is and named once, read from the open file."""

    def __init__(self, f: BinaryIO) -> None:
        self.file, self.infos, self.size = f, {}, os.fstat(f.fileno()).st_size
        for info in zipfile.ZipFile(f).infolist():
            name = info.filename
            if name in self.infos:
                raise Invalid(f"the checkpoint is damaged: it has two members named {name!r} "
                              f"(save writes each once; a ZIP appended to, or made by hand)")
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1:
                raise Invalid(f"the checkpoint's member {name!r} is compressed or encrypted "
                              f"(method {info.compress_type}); save stores every member as "
                              f"is, so this file was changed by another tool: re-save it")
            if info.compress_size != info.file_size:
                raise Invalid(f"the checkpoint is damaged: its member {name!r} is stored in "
                              f"{info.compress_size} bytes but declares {info.file_size}")
            self.infos[name] = info

    def read(self, info: zipfile.ZipInfo, idx: int | None = None, kp: Any = None) -> bytearray:
        """A member's bytes (array ``idx``'s, at ``kp``), from its local header, CRC checked."""
        self.file.seek(info.header_offset)
        head = self.file.read(30)
        data = bytearray(min(info.file_size, self.size))  # never more than the file holds
        if len(head) == 30 and head[:4] == b"PK\x03\x04" and len(data) == info.file_size:
            self.file.seek(sum(struct.unpack_from("<HH", head, 26)), 1)
            if self.file.readinto(data) == len(data) and zlib.crc32(data) == info.CRC:
                return data
        what = JSON_MEMBER if idx is None else f"array {idx} (at {kp!r})"
        raise Invalid(f"the checkpoint is damaged: {what} is cut short or corrupted")

    def json(self, cap: int) -> bytes:
        """The bytes of ``checkpoint.json``, refused unread when more than ``cap``."""
        info = self.infos.get(JSON_MEMBER)
        if info is None:
            raise Invalid("the file is a ZIP archive but not an optimisers checkpoint: it "
                          f"has no {JSON_MEMBER}")
        if info.file_size > cap:
            raise Invalid(f"the checkpoint's {JSON_MEMBER} is {info.file_size} bytes, more than "
                          f"the {cap} that a tree like `like` can need (4 times what like's "
                          f"own document takes and 1 MiB); is like the tree of the model that "
                          f"was saved?")
        return bytes(self.read(info))

    def npy(self, idx: int, dtype: np.dtype, shape: tuple, kp: KeyPath) -> np.ndarray:
        """Array ``idx``, its size checked against its record before it is read; no pickle."""
        info, count = self.infos.get(f"arrays/{idx}.npy"), math.prod(shape)
        if info is None:
            raise Invalid(f"the checkpoint is damaged: array {idx} (at {kp!r}) is missing")
        nbytes = count * dtype.itemsize
        if not nbytes < info.file_size <= nbytes + _HEADER:
            raise Invalid(f"the checkpoint is damaged: array {idx} (at {kp!r}) is "
                          f"{info.file_size} bytes, but its record says {dtype} {shape}, "
                          f"{nbytes} bytes of data")
        data = self.read(info, idx, kp)
        version = bytes(data[6:8])
        if data[:6] != b"\x93NUMPY" or version not in (b"\x01\x00", b"\x02\x00"):
            raise Invalid(f"the checkpoint's array {idx} is not in .npy format {version}")
        size = 2 if version == b"\x01\x00" else 4
        start = 8 + size + int.from_bytes(data[8:8 + size], "little")
        got_shape, fortran, got, native = _npy_header(version, bytes(data[8:start]))
        left = len(data) - start
        if native != dtype or got_shape != shape or left != count * got.itemsize:
            raise Invalid(f"the checkpoint is damaged: array {idx} (at {kp!r}) holds {got} "
                          f"{tuple(got_shape)} in {left} bytes, its record says "
                          f"{dtype} {shape}")
        arr = np.frombuffer(data, got, count, start).reshape(shape, order="F" if fortran else "C")
        return arr if got == dtype and not fortran else np.array(arr, dtype, order="C")


@functools.lru_cache(maxsize=64)
def _npy_header(version: bytes, raw: bytes) -> tuple:
    """Shape, Fortran flag, dtype, native dtype (None for objects) of a ``.npy`` header."""
    read = (np.lib.format.read_array_header_1_0 if version == b"\x01\x00"
            else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read(io.BytesIO(raw))
    return tuple(shape), fortran, dtype, None if dtype.hasobject else dtype.newbyteorder("=")


def write_atomic(path: str, doc: bytes, arrays: list[np.ndarray]) -> None:
    """Write the ZIP to a locked temporary file beside ``path``'s target, fsync it, rename it
    over (keeping the permission bits), remove it if that fails; first those of dead saves."""
    target = os.path.realpath(path)
    _check_replaceable(path, target)
    folder, base = os.path.split(target)
    _remove_abandoned(folder, base)
    fd, tmp = _create_temp(folder, base)
    f = os.fdopen(fd, "wb")
    try:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, os.stat(target).st_mode & 0o7777)
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            zf.writestr(zipfile.ZipInfo(JSON_MEMBER, STAMP), doc)
            for i, arr in enumerate(arrays):
                info = zipfile.ZipInfo(f"arrays/{i}.npy", STAMP)
                with zf.open(info, "w", force_zip64=arr.nbytes > 2**30) as member:
                    np.lib.format.write_array(member, arr, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
        if fcntl is None:  # Windows renames no open file
            f.close()
        _check_replaceable(path, target)  # again: it may have been made while we wrote
        os.replace(tmp, target)  # lock held: no other save takes tmp for abandoned
    except BaseException:
        with contextlib.suppress(OSError):  # flushing what a full disk refused fails again
            f.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        f.close()
    with contextlib.suppress(OSError):  # the rename itself made durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


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


def _create_temp(folder: str, base: str) -> tuple[int, str]:
    """A new temporary file beside the target, locked for as long as it is open."""
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
    """Remove this target's temporary files whose ``save`` died (none holds their lock)."""
    pattern = re.compile(rf"\.{re.escape(base)}\.[0-9a-f]{{12}}\.tmp")
    try:
        names = [n for n in os.listdir(folder) if pattern.fullmatch(n)] if fcntl else []
    except OSError:
        return
    for name in names:
        tmp = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: that save is running
                os.unlink(tmp)
            finally:
                os.close(fd)
