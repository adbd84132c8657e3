"""Checkpoints: ``save`` and ``load`` a state tree, without pickle.

A checkpoint is one ZIP file (stored, not compressed; readable by ``numpy.load`` and
``unzip``) with these members:

``checkpoint.json``
    A UTF-8 JSON document::

        {"format": "optimisers.checkpoint", "version": 2,
         "nodes": [<node>, ...], "leaves": [<leaf>, ...], "arrays": <count>}

``arrays/<i>.npy``
    Array number ``i`` in NumPy's ``.npy`` format (header version 1.0 or 2.0, never an
    object dtype). A dtype that NumPy lacks (``bfloat16``, ``float8_*``) is stored as its
    bits, an unsigned integer array of the same item size.

``nodes`` is the state tree, flat, parents before children, ``nodes[0]`` its root (so a
tree of any depth is a shallow document). A ``<node>`` is ``null`` (no Leaf here),
``{"leaf": i}`` (entry ``i`` of ``leaves``; a tied Leaf is stored once and referenced from
every path to it), ``{"dict": [[<key>, n], ...]}``, ``{"tuple": [n, ...]}`` or
``{"list": [n, ...]}``, each child ``n`` the index of a node, every node but the root
referenced exactly once. (Version 1, still read, nested the nodes in one ``"tree"``.)
Each ``<leaf>`` is
``{"path": "layers.0.weight", "rule": <value>, "frozen": false, "state": <value>}``,
``path`` being the first key path that reaches it (for people; loading walks ``nodes``).

A ``<value>`` is JSON ``null``, ``true``/``false``, an integer or a string as itself,
or an object with one tag:

- ``{"float": "0.9"}``: a Python float by ``repr``, exact (``"inf"``, ``"nan"``, ``"-0.0"``);
  ``{"complex": ["1.0", "-2.5"]}``.
- ``{"tuple": [...]}``, ``{"list": [...]}``, ``{"dict": [[<key>, <value>], ...]}``.
- ``{"array": i, "dtype": "float32", "shape": [3, 2], "library": "torch"}``, plus
  ``"bits": "uint16"`` when stored as bits, ``"scalar": true`` for a NumPy scalar and
  ``"weak": true`` for a weakly-typed JAX scalar; one array object reached twice is
  stored once (loading accepts an index twice only with equal records, and only where
  ``like`` holds one array at both places or both are hyper-parameters).
- ``{"rule": "Adam", "fields": {"eta": <value>, "beta": <value>, ...}}``: a rule, by its
  class name in :data:`optimisers.RULES` and its constructor arguments (nested rules for
  :class:`OptimiserChain` and :class:`MixedPrecision`).
- ``{"dtype": "float32", "as": "type"}``: a dtype field, ``as`` one of ``"type"``
  (``np.float32``), ``"numpy"`` (``np.dtype("float32")``), ``"torch"``, ``"jax"``.

Values nest (tuples, lists, dicts, rules) at most 100 levels deep: ``save`` refuses deeper
ones, so that whatever ``save`` writes, ``load`` reads.

A file is untrusted input. Loading never unpickles, never executes code from the file and
never imports a name the file chooses: rules come from the registry
:data:`optimisers.RULES` (every subclass of :class:`Rule` registers itself when defined),
dtypes from a fixed list or from a library already imported; the file's rule classes are
compared with ``like``'s before any rule is constructed, and rules are constructed only
after the whole file matched ``like``. It reads regular files only (never a device or a
FIFO), members stored as is (a compressed or encrypted member, or a name used twice, is
refused), each array's member no larger than its record says, and a ``checkpoint.json`` of
at most 4 times the size of ``like``'s own document plus 1 MiB.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

from optimisers import fused
from optimisers.checkpoint._archive import open_regular
from optimisers.checkpoint._format import Invalid, nodes
from optimisers.checkpoint._read import Reader
from optimisers.checkpoint._write import Writer, document, write_atomic
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
    it points to is replaced, the link stays).

    Args:
        path: the file to write (any name; ``.ckpt`` or ``.npz`` are customary).
        tree: a state tree from :func:`setup`, with NumPy, PyTorch or JAX arrays.

    Raises:
        TypeError: the tree holds something a checkpoint cannot store without pickle (a
            function as a hyper-parameter, an object array, a rule class that is not the
            one registered under its name in ``RULES``), or it is not a state tree.
        ValueError: a rule or state nests values more than 100 levels deep.

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
