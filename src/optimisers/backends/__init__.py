"""Per-library array functions, imported lazily: rules are written once against these.

Each backend module (``numpy``, ``torch``, ``jax``) defines the same small set of
functions; :func:`ops` returns the module for an array's library. ``import optimisers``
imports neither PyTorch nor JAX: a backend is imported the first time one of its arrays
is seen, and an array of a library is only seen once the user has imported it.
"""

from optimisers.backends.registry import (
    carries_grads,
    dtype_library,
    issubclass_ndarray,
    istraced,
    library,
    nograd,
    of,
    ops,
)

__all__ = ["library", "ops", "of", "nograd", "istraced", "issubclass_ndarray", "dtype_library",
           "carries_grads"]
