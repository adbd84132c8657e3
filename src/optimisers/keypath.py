"""Key paths: where a child sits inside a nested model."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from optimisers.tree import children, keys_shown

__all__ = ["KeyPath", "getkeypath", "haskeypath"]


class KeyPath(tuple):
    """KeyPath(*keys) -> an immutable path of child keys, from the root down.

    A tuple of keys (``keys``, outermost first), as :func:`children` names them; ``str``
    gives the dotted ``layers.0.weight`` that ``where=`` globs match.

    Example:
        >>> kp = KeyPath("layers", 0) + ("weight",)
        >>> kp, str(kp)
        (KeyPath('layers', 0, 'weight'), 'layers.0.weight')
    """

    def __new__(cls, *keys: Hashable) -> KeyPath:
        return super().__new__(cls, keys)

    def __add__(self, other: tuple) -> KeyPath:  # type: ignore[override]
        return KeyPath(*self, *other)

    def __getitem__(self, i):  # type: ignore[override]
        got = super().__getitem__(i)
        return KeyPath(*got) if isinstance(i, slice) else got

    def __repr__(self) -> str:
        return "KeyPath(" + ", ".join(repr(k) for k in self) + ")"

    def __str__(self) -> str:
        return ".".join(str(k) for k in self)


def getkeypath(x: Any, kp: KeyPath | tuple) -> Any:
    """getkeypath(x, kp) -> the child of ``x`` at the key path ``kp``.

    Args:
        x: a model (any node of the tree protocol).
        kp: a :class:`KeyPath` or tuple of keys.

    Returns:
        The object found by following each key through :func:`children`.

    Raises:
        KeyError: when a key along the way is missing, naming the path walked so far.

    Example:
        >>> getkeypath({"layers": [{"weight": 1.0}]}, KeyPath("layers", 0, "weight"))
        1.0
    """
    for depth, key in enumerate(kp):
        kids = children(x)
        if key not in kids:
            raise KeyError(f"{KeyPath(*kp[:depth])!r} has no child {key!r}; its keys are "
                           f"[{keys_shown(kids)}]")
        x = kids[key]
    return x


def haskeypath(x: Any, kp: KeyPath | tuple) -> bool:
    """haskeypath(x, kp) -> whether :func:`getkeypath` would find a child at ``kp``.

    Example:
        >>> haskeypath({"a": (1, 2)}, KeyPath("a", 1)), haskeypath({"a": (1, 2)}, ("a", 2))
        (True, False)
    """
    try:
        getkeypath(x, kp)
    except KeyError:
        return False
    return True
