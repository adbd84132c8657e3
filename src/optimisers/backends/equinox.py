"""equinox: its ``nn.StateIndex`` trains nothing (``protocol.Nodes``).

An equinox module is a dataclass, a node of the tree protocol by type. A ``StateIndex``
is where an equinox BatchNorm keeps the first values of its running statistics: never
trained. This module imports equinox only when asked about an object of it, which only
exists once the user has imported equinox.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

__all__ = ["register_nodes"]


def register_nodes() -> None:
    """register_nodes(): ``equinox.nn.StateIndex`` as a node that trains nothing, once
    ``equinox.nn`` is imported.

    Example:
        >>> import equinox as eqx
        >>> import jax.numpy as jnp
        >>> from optimisers.tree import trainable
        >>> register_nodes()
        >>> trainable(eqx.nn.StateIndex(jnp.zeros(2)))
        ()
    """
    index = getattr(sys.modules.get("equinox.nn"), "StateIndex", None)
    if index is not None:
        _register(index)


@functools.cache  # once
def _register(index: type) -> None:
    from optimisers.tree import Node, register_node

    register_node(index, Node(trainable=_nothing))


def _nothing(x: Any, kids: dict) -> tuple:
    return ()
