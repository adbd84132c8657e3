"""save and load: a state tree to a checkpoint file and back (the format: ``__init__``)."""

from __future__ import annotations

import os
import zipfile
from typing import Any

from optimisers.checkpoint._archive import open_regular
from optimisers.checkpoint._format import Invalid
from optimisers.checkpoint._read import Reader
from optimisers.checkpoint._write import Writer, document, write_atomic
from optimisers.fast import fused
from optimisers.leaf import nodes
from optimisers.rules import Rule

__all__ = ["save", "load"]


def save(path: str | os.PathLike, tree: Any) -> None:
    """save(path, tree) -> None: write the state tree to a checkpoint file, atomically.

    Stores every Leaf's rule (class name and hyper-parameters), state (arrays with their
    dtypes, step counters and other numbers exactly), frozen flag, and which Leafs are
    shared, in the pickle-free format described in :mod:`optimisers.checkpoint`. The file
    is written to a temporary file in the same directory, flushed to disk, then renamed
    over ``path``: a crash during ``save`` leaves any previous checkpoint intact, and the
    next ``save`` to that path removes the temporary file a killed one left. A file it
    replaces keeps its permission bits; a symlink at ``path`` is written through (the file
    it points to is replaced, the link stays). Only a regular file is ever replaced: a
    directory, device, FIFO or socket at ``path`` (or where its symlink points) is refused
    and left as it is. A write that fails (a full disk) leaves no temporary file behind and
    the previous checkpoint as it was.

    Args:
        path: the file to write (any name; ``.ckpt`` or ``.npz`` are customary).
        tree: a state tree from :func:`setup`, with NumPy, PyTorch or JAX arrays.

    Raises:
        TypeError: the tree holds something a checkpoint cannot store without pickle (a
            function as a hyper-parameter, but for a :class:`~optimisers.Function`
            schedule's importable by its name; an object array; a rule class that is not
            the one registered under its name in ``RULES``), or it is not a state tree.
        ValueError: a rule or state nests values more than 100 levels deep, or ``path``
            (or a symlink's target) exists and is not a regular file.
        OSError: the file could not be written (a full disk: ``ENOSPC``, ``EFBIG``).

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
    writer = Writer()
    text = document(writer, tree)
    write_atomic(os.fspath(path), text.encode("utf-8"), writer.arrays)


def load(path: str | os.PathLike, like: Any) -> Any:
    """load(path, like=tree) -> tree: read a checkpoint written by :func:`save`.

    ``like`` is a state tree for the same model (from :func:`setup`); it fixes the
    expected structure, and each state array comes back in the library and on the device
    of the matching array in ``like`` (NumPy, PyTorch or JAX; a checkpoint saved from one
    library loads into another). Everything else comes from the file: rules with their
    hyper-parameters (which may differ from ``like``'s, e.g. after :func:`adjust`), states,
    frozen flags and sharing; but a :class:`~optimisers.Function` schedule's function,
    which the file names, is taken from ``like``'s rule at the same Leaf, never imported.
    ``like`` is not changed. Training continued from the loaded tree is bit-for-bit the
    training that was never interrupted.

    Args:
        path: a file written by :func:`save`.
        like: a state tree of the same structure, giving array libraries and devices.

    Returns:
        A new state tree.

    Raises:
        ValueError: the file does not match ``like`` (structure, sharing, rule class,
            state shape or dtype; the message names the :class:`KeyPath`), names a rule
            that is not in ``RULES``, or is not an intact checkpoint (truncated,
            corrupted, compressed, or some other kind of file), or ``path`` is not a
            regular file (a device, FIFO or socket).
        TypeError: ``like`` is not a state tree.
        FileNotFoundError: there is no file at ``path``.
        IsADirectoryError: ``path`` is a directory.

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
    for _ in nodes(like):  # not a state tree: TypeError, naming the path
        pass
    name = os.fspath(path)
    with open_regular(name) as f:
        try:
            with zipfile.ZipFile(f) as zf:
                reader = Reader(zf, like)
                tree = reader.tree()
        except Invalid as e:
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
