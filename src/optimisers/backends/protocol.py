"""The backend interface: what the core and the rules call on a backend module.

Every backend (``backends.of(x)``) provides :class:`Backend`; the other protocols are
optional parts, and ``tests/test_protocol.py`` checks every backend against them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Backend", "Grouping", "Fusing", "Carrying", "Nodes", "Checking", "Registering",
           "Sharding"]

Array = Any  # an array of the backend's library (np.ndarray, torch.Tensor, jax.Array)


class Backend(Protocol):
    """What every backend module provides (``backends.of(x)``, called ``xp`` by rules)."""

    CONCATENATES: bool
    """Whether fused groups step over concatenations (then it provides :class:`Grouping`)."""

    FUSES_ITSELF: bool
    """Whether it groups and steps fusible entries itself (then it provides :class:`Fusing`)."""

    # --- what an array is -----------------------------------------------------------------

    def isfloating(self, x: Array) -> bool:
        """Whether ``x`` holds floating or complex numbers (a trainable array)."""

    def isnumber(self, g: Array) -> bool:
        """Whether ``g`` holds numbers (bool, integer, floating or complex)."""

    def iscomplex(self, x: Array) -> bool:
        """Whether ``x`` holds complex numbers."""

    def ishalf(self, x: Array) -> bool:
        """Whether ``x``'s real dtype is float16."""

    def maywrite(self, x: Array) -> bool:
        """Whether ``x`` may be written in place."""

    def shape(self, x: Array) -> tuple:
        """``x``'s shape as a tuple of ints."""

    def size(self, x: Array) -> int:
        """The number of elements of ``x``."""

    def nbytes(self, x: Array) -> int:
        """The bytes ``x``'s elements take."""

    def dtype_name(self, x: Array) -> str:
        """The name of ``x``'s dtype (``"float32"``, never ``"torch.float32"``)."""

    def dtype_name_of(self, v: Any) -> str:
        """The name of the library's dtype object ``v``."""

    def gradtype(self, x: Array) -> type:
        """The type of a gradient that needs no cast for the parameter ``x``."""

    def isfinite(self, n: Any) -> bool | None:
        """Whether the scalar ``n`` is finite; ``None`` where it cannot be known now."""

    # --- hyper-parameters ----------------------------------------------------------------

    def hyper(self, x: Array, *values: Any) -> tuple:
        """The hyper-parameters ``values`` as scalars that keep arithmetic in ``x``'s dtype."""

    def complement(self, v: Any) -> Any:
        """``1 - v``, as precisely as the library's reference optimisers compute it."""

    def eps(self, x: Array, e: Any) -> Any:
        """The epsilon ``e`` for ``x`` (``common.eps``: floored for float16)."""

    # --- making and converting arrays -----------------------------------------------------

    def zeros_like(self, x: Array, real_: bool = False) -> Array:
        """Zeros shaped and typed like ``x`` (its real dtype with ``real_``)."""

    def full_like(self, x: Array, value: Any, real_: bool = False) -> Array:
        """``value`` everywhere, shaped and typed like ``x`` (its real dtype with ``real_``)."""

    def complex_from(self, re: Array, im: Array) -> Array:
        """The complex array ``re + i*im``, of their precision."""

    def cast(self, x: Any, like: Array) -> Array:
        """``x`` as an array of ``like``'s dtype (and device); no copy when it is one."""

    def astype(self, x: Array, dtype: Any) -> Array:
        """A copy of ``x`` in ``dtype`` (complex stays complex)."""

    def todtype(self, dtype: Any) -> Any:
        """The library's dtype for a dtype of any library, or a name."""

    def copy(self, x: Array) -> Array:
        """A copy of ``x`` that a write to ``x`` does not change."""

    def copier(self) -> Callable[[Array], Array]:
        """A function copying writable arrays (packed state stays packed), the rest as is."""

    def like(self, y: Array, x: Array) -> Array:
        """``y`` made a new value of the parameter ``x`` (an ``nn.Parameter`` for one)."""

    # --- writing -------------------------------------------------------------------------

    def assign(self, dst: Array, value: Any) -> Array:
        """``value`` written into ``dst`` where it may be written, else a new array."""

    def subtract(self, x: Array, d: Any, inplace: bool) -> Array:
        """``x - d``, written into ``x`` when ``inplace`` and it may be written."""

    def add(self, a: Array, b: Array) -> Array:
        """``a + b`` as an array (two gradients of a tied parameter summed)."""

    # --- elementwise primitives ----------------------------------------------------------

    def abs(self, x: Array, /) -> Array:
        """``|x|`` elementwise."""

    def sqrt(self, x: Array, /, out: Array | None = None) -> Array:
        """The square root elementwise. Here and below, ``out`` is a temporary of the
        caller's own to write the result into, as NumPy's ``out=`` (JAX ignores it)."""

    def rsqrt(self, x: Array, /, out: Array | None = None) -> Array:
        """``1 / sqrt(x)`` elementwise (one kernel where the library has one)."""

    def sign(self, x: Array, /) -> Array:
        """The sign elementwise; ``x/|x|`` (0 at 0) for complex ``x``."""

    def cos(self, x: Any, /) -> Any:
        """The cosine elementwise (schedules evaluate it on a step count)."""

    def real(self, x: Array, /) -> Array:
        """The real part."""

    def conj(self, x: Array, /) -> Array:
        """The complex conjugate."""

    def maximum(self, a: Any, b: Any, /, out: Array | None = None) -> Array:
        """The larger of ``a`` and ``b`` elementwise (either may be a number)."""

    def divide(self, a: Any, b: Any, /, out: Array | None = None) -> Array:
        """``a / b`` elementwise."""

    def multiply(self, a: Any, b: Any, /, out: Array | None = None) -> Array:
        """``a * b`` elementwise."""

    def minimum(self, a: Any, b: Any, /) -> Array:
        """The smaller of ``a`` and ``b`` elementwise (either may be a number)."""

    def where(self, cond: Array, a: Any, b: Any, /) -> Array:
        """``a`` where ``cond`` holds, else ``b``."""

    def clamp(self, x: Array, lo: Any, hi: Any) -> Array:
        """A real ``x`` clamped to ``[lo, hi]``."""

    def lerp(self, a: Array, b: Array, w: Any, inplace: bool = False) -> Array:
        """``a + w*(b - a)`` elementwise, written into ``a`` when ``inplace`` and allowed."""

    def scaled_sum(self, a: Any, x: Array, b: Any, y: Array) -> Array:
        """``a*x + b*y`` as one new array of ``x``'s dtype, ``a`` and ``b`` numbers."""

    # --- reductions ----------------------------------------------------------------------

    def amax(self, a: Array) -> Array:
        """The largest element of ``a`` (``a >= 0``), 0 for an empty ``a``, as a 0-d array."""

    def amin(self, a: Array) -> Array:
        """The smallest element of ``a``, ``inf`` for an empty ``a``, as a 0-d array."""

    def count_nonzero(self, g: Array, like: Array) -> Array:
        """The number of non-zero elements of ``g``, a 0-d array of ``like``'s dtype."""

    def allfinite(self, g: Array) -> Array:
        """Whether every element of ``g`` is finite, a 0-d bool array, warning of nothing."""

    # --- matrices (for rules that are not elementwise: Muon, Adafactor) --------------------

    def transpose(self, x: Array, /) -> Array:
        """``x`` with its last two axes swapped (never conjugated)."""

    def matmul(self, a: Array, b: Array, /) -> Array:
        """The matrix product over the last two axes, batched, accumulated in float32 at
        least and rounded to the arrays' dtype."""

    def matmul_add(self, c: Array, a: Array, b: Array, beta: Any, alpha: Any) -> Array:
        """``beta*c + alpha*(a @ b)``, batched, rounded once to ``c``'s dtype."""

    def vector_norm(self, x: Array, axes: tuple) -> Array:
        """The 2-norm of ``x`` over ``axes`` (kept, of length 1), of ``x``'s real dtype."""

    def mean(self, x: Array, axes: tuple) -> Array:
        """The mean of ``x`` over ``axes``, kept as axes of length 1."""

    def to_bfloat16(self, x: Array) -> Array:
        """``x`` rounded to bfloat16 (NumPy: float32 holding bfloat16's values)."""

    def machine_epsilon(self, x: Array) -> float:
        """``finfo(x's real dtype).eps``."""

    # --- written once over the primitives (common.py) -------------------------------------

    def abs2(self, g: Array) -> Array:
        """``|g|^2``, real for complex ``g`` (``common.abs2``)."""

    def clip(self, g: Array, lo: Any, hi: Any) -> Array:
        """``g`` clamped to ``[lo, hi]``, complex parts each (``common.clip``)."""

    def norm(self, g: Array, p: float) -> Array:
        """The ``p``-norm of all of ``g`` (``common.norm``)."""

    # --- whole trees of arrays -----------------------------------------------------------

    def concat(self, arrays: list, like: list) -> Array:
        """One flat vector of ``arrays`` in the dtype ``like``'s promote to; differentiable."""

    def split(self, v: Array, stops: list, like: list) -> list:
        """Segments of ``v`` ending at ``stops``, each a new array like ``like``'s."""

    def settle(self, leaf: Any) -> Any:
        """A new Leaf made ready for the library (JAX: its flat form), or itself."""

    # --- checkpoints ---------------------------------------------------------------------

    def host(self, a: Array, at: str) -> tuple:
        """``(values, dtype name)``: ``a`` as a NumPy array on the host, for a checkpoint."""

    def from_host(self, arr: Any, ref: Array, bits: bool, weak: bool = False) -> Array:
        """The host values ``arr`` as an array like ``ref`` (its library and device)."""


class Grouping(Protocol):
    """What a backend with ``CONCATENATES`` provides besides: ``fused.Group``'s steps."""

    def device(self, x: Array) -> Any:
        """Where ``x`` lives; arrays of one group share it."""

    def footprints(self, xs: list) -> Any:
        """What a group's views assume of its arrays' memory, cheap to read each step."""

    def flatcat(self, arrays: list) -> Array:
        """All ``arrays`` (of one dtype) flattened into one vector; only read."""

    def packed(self, parts: tuple) -> list:
        """``parts`` copied into one new buffer: views of it shaped like each."""

    def joined(self, parts: tuple) -> tuple:
        """``(flat, isview)``: the packed buffer of ``parts``, or a new concatenation."""

    def scatter(self, flat: Array, parts: tuple) -> list | None:
        """Segments of ``flat`` written into ``parts``; ``None``, or new parts."""

    def subtractor(self, xs: list) -> Callable[[Array], None]:
        """A function ``f(d)`` doing ``x -= segment of d`` for each ``x``, in place."""

    def split_like(self, d: Array, xs: list) -> list:
        """New arrays ``x_i - segment of d``, each like ``x_i``."""

    def flat(self, x: Array, g: Array, arrays: list) -> tuple | None:
        """``(x, g, [states])`` as flat views to step piece by piece, or ``None``."""


class Fusing(Protocol):
    """What a backend with ``FUSES_ITSELF`` provides besides."""

    def fuse(self, entries: list) -> tuple[list, list]:
        """``(left, done)``: entries left for the plain path, ``(leaf, new x)`` stepped."""


class Carrying(Protocol):
    """What a backend of a library whose parameters carry their gradients provides."""

    def hasmodule(self, model: Any) -> bool:
        """Whether ``model`` holds a model of the library whose parameters carry ``.grad``."""

    def module_grads(self, model: Any) -> Any:
        """The gradient tree read from the parameters of ``model``."""


class Nodes(Protocol):
    """What a backend of a library with its own model classes provides."""

    def register_nodes(self) -> None:
        """Register the library's model classes with ``tree.register_node``."""


class Checking(Protocol):
    """What a backend that knows of a mistake in what is trained provides."""

    def check_trainable(self, x: Any, kids: dict) -> None:
        """Warn when training the node ``x`` (children ``kids``) whole is such a mistake."""


class Registering(Protocol):
    """What a backend that registers this package's rules with its library provides."""

    def register_rule(self, cls: type) -> None:
        """Register the rule class ``cls`` with the library (once)."""


class Sharding(Protocol):
    """What a backend of arrays split across processes provides (each holds a part)."""

    def local(self, x: Array) -> Array:
        """The part of ``x`` that this process holds, sharing its memory."""

    def gathered(self, apply: Callable, state: Any, x: Array, *grads: Array
                 ) -> tuple[Any, Any]:
        """``apply(state, x, *grads)`` on whole arrays (see ``registry.on_whole``)."""
