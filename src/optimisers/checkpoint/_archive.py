"""The ZIP container of a checkpoint, read as untrusted input: a regular file whose members
are stored (never compressed), each named once and read no further than its record allows."""

from __future__ import annotations

import errno
import functools
import io
import math
import os
import stat
import zipfile
from typing import BinaryIO

import numpy as np

from optimisers.checkpoint._format import JSON_MEMBER, Invalid

_NPY_HEADER = 2**16  # room for a .npy member's header beyond its data


def open_regular(name: str) -> BinaryIO:
    """``name`` opened for reading, if it is a regular file (or a symlink to one).

    Opened without blocking, so a FIFO cannot hang the open; a device (``/dev/zero``),
    FIFO or socket is refused before a byte is read.

    Raises:
        FileNotFoundError: there is no file at ``name``.
        IsADirectoryError: ``name`` is a directory.
        ValueError: ``name`` is a device, FIFO or socket.
    """
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


def check_members(zf: zipfile.ZipFile) -> None:
    """Refuse an archive with a member named twice, or a member not stored as is."""
    seen: set[str] = set()
    for info in zf.infolist():
        name = info.filename
        if name in seen:
            raise Invalid(f"the checkpoint is damaged: it has two members named {name!r} "
                          f"(save writes each once; a ZIP appended to, or made by hand)")
        seen.add(name)
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1:
            raise Invalid(f"the checkpoint's member {name!r} is compressed or encrypted "
                          f"(method {info.compress_type}); save stores every member as is, "
                          f"so this file was changed by another tool: re-save it with save")
        if info.compress_size != info.file_size:
            raise Invalid(f"the checkpoint is damaged: its member {name!r} is stored in "
                          f"{info.compress_size} bytes but declares {info.file_size}")


def read_json(zf: zipfile.ZipFile, cap: int) -> bytes:
    """The bytes of ``checkpoint.json``, refused unread when more than ``cap``."""
    try:
        info = zf.getinfo(JSON_MEMBER)
    except KeyError:
        raise Invalid("the file is a ZIP archive but not an optimisers checkpoint: it "
                      f"has no {JSON_MEMBER}") from None
    if info.file_size > cap:
        raise Invalid(f"the checkpoint's {JSON_MEMBER} is {info.file_size} bytes, more than the "
                      f"{cap} that a tree like `like` can need (4 times like's own document "
                      f"and 1 MiB); is like the tree of the model that was saved?")
    with zf.open(info) as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise Invalid(f"the checkpoint's {JSON_MEMBER} is longer than it declares")
    return data


@functools.lru_cache(maxsize=8)
def _npy_magic(raw: bytes) -> tuple:
    """The ``.npy`` version that a member's first 8 bytes give, checked by NumPy once per
    distinct prefix."""
    return np.lib.format.read_magic(io.BytesIO(raw))


@functools.lru_cache(maxsize=64)
def _npy_header(version: tuple, raw: bytes) -> tuple:
    """The shape, Fortran flag and dtype of a ``.npy`` header (its length prefix and text,
    ``raw``), parsed by NumPy once per distinct header: the arrays of a state tree share
    few headers, and parsing is most of the cost of reading a small array."""
    header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
              else np.lib.format.read_array_header_2_0)
    return header(io.BytesIO(raw))


def read_npy(zf: zipfile.ZipFile, idx: int, dtype: np.dtype, shape: tuple,
             where: str) -> np.ndarray:
    """Array ``idx`` from its ``.npy`` member, its size checked against ``dtype`` and
    ``shape`` (the JSON record) before its data is read, never unpickled."""
    try:
        info = zf.getinfo(f"arrays/{idx}.npy")
    except KeyError:
        raise Invalid(f"the checkpoint is damaged: array {idx} (at {where}) is missing"
                      ) from None
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if not nbytes < info.file_size <= nbytes + _NPY_HEADER:
        raise Invalid(f"the checkpoint is damaged: array {idx} (at {where}) is "
                      f"{info.file_size} bytes, but its record says {dtype} {shape}, "
                      f"{nbytes} bytes of data")
    with zf.open(info) as f:
        version = _npy_magic(f.read(8))
        if version not in ((1, 0), (2, 0)):
            raise Invalid(f"the checkpoint's array {idx} has .npy version {version}")
        size = f.read(2 if version == (1, 0) else 4)
        got_shape, fortran, got = _npy_header(version, size + f.read(int.from_bytes(size,
                                                                              "little")))
        left = info.file_size - f.tell()
        if got.hasobject or got.newbyteorder("=") != dtype or tuple(got_shape) != shape or (
                left != count * got.itemsize):
            raise Invalid(f"the checkpoint is damaged: array {idx} (at {where}) holds {got} "
                          f"{tuple(got_shape)} in {left} bytes, its record says "
                          f"{dtype} {shape}")
        data = f.read(left)
        if len(data) != left or f.read(1):  # reading to the end checks the CRC
            raise Invalid(f"the checkpoint is damaged: array {idx} (at {where}) is cut short")
    arr = np.frombuffer(data, got, count).reshape(shape, order="F" if fortran else "C")
    return np.array(arr, dtype=dtype, order="C", copy=True)
