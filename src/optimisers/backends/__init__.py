"""Per-library array functions, imported lazily: rules are written once against these.

Each backend module (``numpy``, ``torch``, ``jax``) defines the same set of functions,
declared in ``protocol.py`` (:class:`Backend`); :func:`ops` returns the module for an
array's library. ``import optimisers`` imports neither PyTorch nor JAX: a backend is
imported the first time one of its arrays is seen, and an array of a library is only
seen once the user has imported it.
"""

from optimisers.backends.protocol import Backend
from optimisers.backends.registry import (
    carries_grads,
    check_trainable,
    dtype_library,
    dtype_module,
    issubclass_ndarray,
    istraced,
    library,
    nograd,
    of,
    on_whole,
    ops,
    register_nodes,
    rule_defined,
)

__all__ = ["library", "ops", "of", "nograd", "istraced", "issubclass_ndarray", "dtype_library",
           "carries_grads", "dtype_module", "register_nodes", "check_trainable",
           "rule_defined", "on_whole", "Backend"]
