"""Graph compilers (``torch.compile``): the calls that run as Python inside a traced function.

The library's own step is Python bookkeeping around a few large array operations: a
cached plan, and Python numbers in the Leafs' state (Adam's bias corrections) that move at
every step. A trace would freeze those into guards and constants, so a traced call to
``update`` or ``update_`` breaks the graph and runs as Python, with the same fused kernels
and results as anywhere else. ``torch`` is not imported here: only looked up once the user
has imported it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from optimisers.backends import ops


def untraced(fn: Callable) -> Callable:
    """@untraced: ``fn``, run as Python when ``torch.compile`` traces a call to it (the
    torch backend's ``untraced``: a graph break); otherwise ``fn`` as it is.

    Example:
        >>> untraced(abs)(-2)
        2
    """

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and torch.compiler.is_compiling():
            return ops("torch").untraced(fn)(*args, **kwargs)
        return fn(*args, **kwargs)

    return call
