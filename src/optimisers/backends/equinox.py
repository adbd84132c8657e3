"""equinox: its ``nn.StateIndex`` (a BatchNorm's running statistics) trains nothing (its
modules are dataclasses, nodes by type). Imports equinox only once the user has."""

from __future__ import annotations

import functools
import sys

__all__ = ["register_nodes"]


def register_nodes() -> None:
    """register_nodes(): ``equinox.nn.StateIndex`` trains nothing, once it is imported."""
    index = getattr(sys.modules.get("equinox.nn"), "StateIndex", None)
    if index is not None:
        _register(index)


@functools.cache  # once
def _register(index: type) -> None:
    from optimisers.tree import Node, register_node

    register_node(index, Node(trainable=lambda x, kids: ()))
