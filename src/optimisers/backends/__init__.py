"""Per-library array functions (``protocol.Backend``), imported the first time one of
the library's arrays is seen: rules are written once against these."""

from optimisers.backends.protocol import Backend
from optimisers.backends.registry import (
    BACKENDS,
    LIBRARIES,
    carries_grads,
    check_trainable,
    dtype_library,
    dtype_module,
    istraced,
    library,
    nograd,
    of,
    on_whole,
    ops,
    register_nodes,
    rule_defined,
)

__all__ = ["library", "ops", "of", "nograd", "istraced", "dtype_library", "carries_grads",
           "dtype_module", "register_nodes", "check_trainable", "rule_defined", "on_whole",
           "Backend", "BACKENDS", "LIBRARIES"]
