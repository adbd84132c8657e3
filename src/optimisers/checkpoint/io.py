"""save and load: a state tree to a checkpoint file and back (the format: ``__init__``)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from optimisers.checkpoint._archive import Archive, open_regular, write_atomic
from optimisers.checkpoint._codec import Invalid, Reader, Writer, size_bound
from optimisers.checkpoint._migrate import PathReader, Raised, by_path
from optimisers.fast import fused
from optimisers.leaf import leaves

__all__ = ["save", "load"]


def save(path: str | os.PathLike, tree: Any) -> None:
    """save(path, tree) -> None: write the state tree to a checkpoint file, atomically.

    Stores each Leaf's rule, state (arrays with their dtypes, numbers exactly), frozen flag
    and clock, and which Leafs are shared, without pickle.

    Args:
        path: the file to write (``.ckpt`` or ``.npz`` are customary), beside which the new
            file is written, flushed, then renamed over it (keeping its permission bits;
            through a symlink): a crash or a full disk leaves the previous one as it was.
        tree: a state tree from :func:`setup`, with NumPy, PyTorch or JAX arrays.

    Raises:
        TypeError: the tree holds what only pickling stores (a function, but an importable
            one in a :class:`~optimisers.Function`; an object array), or is no state tree.
        ValueError: a value nests over 100 levels deep, or ``path`` is no regular file.

    Example:
        >>> import os, tempfile
        >>> from optimisers import Adam, setup
        >>> folder = tempfile.TemporaryDirectory()
        >>> save(os.path.join(folder.name, "opt.ckpt"), setup(Adam(0.1), {"w": np.ones(3)}))
        >>> os.listdir(folder.name), folder.cleanup()
        (['opt.ckpt'], None)
    """
    with _paused_collector():
        doc = (writer := Writer()).document(tree).encode("utf-8")
    write_atomic(os.fspath(path), doc, writer.arrays)


def load(path: str | os.PathLike, like: Any, strict: bool = True, renames: Any = None,
         migrate: Callable | None = None) -> Any:
    """load(path, like=tree, strict=True) -> tree: read a checkpoint written by :func:`save`;
    ``strict=False``: ``(tree, report)``, for a model that changed.

    Rules, hyper-parameters, states, frozen flags, clocks and sharing come from the file;
    training resumed from the result is bit for bit the training never interrupted. With
    ``strict=False`` each Leaf of ``like`` takes the Leaf at its path in the file (after
    ``renames``) as above: one the file lacks, or whose state there differs in shape, dtype or
    structure, keeps like's fresh state; the file's other Leafs are left; ties stay as in
    ``like``. A Leaf whose rule class changed keeps like's rule and takes the file's state
    where the two states mean the same (Adam, AdamW, NAdam, RAdam; also inside the same
    chains), else ``migrate`` converts it.

    Args:
        path: a file written by :func:`save`.
        like: a state tree of the same model, not changed: it fixes the structure, each
            state array's library and device, and a :class:`~optimisers.Function`'s function.
        strict: False to load by path what fits and report the rest (a :class:`LoadReport`).
        renames: with ``strict=False``, the file's paths renamed: ``{"old.prefix":
            "new.prefix"}`` (whole keys, first fit; ``None`` drops it; each ``*`` any text,
            put in for a ``*`` of the new: ``{"h.*": "blocks.*"}``), or a function of the
            old dotted path giving the new one or ``None``.
        migrate: with ``strict=False``, ``migrate(path, old_rule, old_state, new_rule,
            new_state) -> state`` for a Leaf whose rule changed to one with another state:
            ``new_state`` is a fresh one to fill, the result must have its form.

    Returns:
        A new state tree; with ``strict=False``, ``(tree, report)``.

    Raises:
        ValueError: the file does not match ``like`` (the message names the path), names a
            rule not in ``RULES``, is damaged, or is no regular file; with ``strict=False``, a
            rule changed to one with another state and no ``migrate``, two old paths
            renamed to one, or a new path of ``renames`` with more ``*`` than its old.
        TypeError: ``like`` is not a state tree, or ``renames``/``migrate`` is of the wrong
            kind or given with ``strict``.
        FileNotFoundError: there is no file at ``path``.

    Example:
        >>> import os, tempfile
        >>> from optimisers import Adam, setup
        >>> folder = tempfile.TemporaryDirectory()
        >>> path = os.path.join(folder.name, "opt.ckpt")
        >>> save(path, setup(Adam(0.01), {"w": np.ones(3)}))
        >>> load(path, like=setup(Adam(), {"w": np.ones(3)}))["w"].rule.eta, folder.cleanup()
        (0.01, None)
    """
    by_path(strict, renames, migrate)
    cap = (1 << 20) + 4 * size_bound(like)  # TypeError for a like that is no state tree
    name = os.fspath(path)
    with open_regular(name) as f, _paused_collector():
        try:
            doc = json.loads((archive := Archive(f)).json(cap).decode("utf-8"),
                             parse_float=_no_floats, parse_constant=_no_floats)
            reader = Reader(doc, like, archive) if strict else PathReader(
                doc, like, archive, renames, migrate)
            tree = reader.tree()
        except Invalid as e:
            raise ValueError(str(e)) from None
        except Raised as e:  # by the caller's renames or migrate
            raise e.args[0] from None
        except Exception as e:  # whatever a damaged file makes the decoders raise
            raise ValueError(f"{name!r} is not an intact optimisers checkpoint (truncated, "
                             f"corrupted, or another kind of file): {type(e).__name__}: "
                             f"{e}") from e
        fused.pack(list({id(t): t for _, t in leaves(tree[0] if not strict else tree)}.values()))
    return tree  # (states laid out as setup lays them)


@contextlib.contextmanager
def _paused_collector() -> Iterator[None]:
    """The cyclic garbage collector paused: a document makes millions of objects, all kept."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _no_floats(s: str) -> Any:
    raise Invalid(f"the checkpoint is malformed: a bare JSON number {s} (floats are stored "
                  f"as strings)")
