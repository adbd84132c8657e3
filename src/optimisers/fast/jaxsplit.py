"""A traced step split where it first reads an array (:func:`split`), so that a group's
Leafs compute what they share once, and that shared part's numbers passed behind one
barrier (:func:`barrier`): what ``fast/jaxtree.py`` steps a group of Leafs with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from jax.extend.core import Jaxpr, Var

__all__ = ["Split", "split", "barrier"]


class Split(NamedTuple):
    """A function of ``(common, own)`` arguments, traced and split: ``common`` (a jaxpr)
    makes, from the common arguments alone, what ``own`` (a jaxpr) reads of them besides
    the own arguments (the first ``reads`` of them read by its equations, the rest results);
    ``out`` is the structure of the function's result, ``shared`` marks the results that
    read no own argument.

    Example:
        >>> import jax.numpy as jnp
        >>> s = split(lambda a, x: (a + 1, x * 2), (1.0,), (jnp.ones(2),))
        >>> s.shared, len(s.common.eqns), len(s.own.eqns)
        ((True, False), 1, 1)
    """

    common: Any
    consts: list
    own: Any
    out: Any
    shared: tuple
    reads: int

    def values(self, *common: Any) -> list:
        """The common part's values from the common arguments' leaves, those that the own
        part reads passed through :func:`barrier`."""
        values = jax.core.eval_jaxpr(self.common, self.consts, *common)
        return barrier(values[:self.reads]) + values[self.reads:]

    def outputs(self, common: list, own: tuple) -> list:
        """The function's flat results from the common part's values and own arguments."""
        return jax.core.eval_jaxpr(self.own, [], *common, *jax.tree.leaves(own))

    def given(self, first: list, outs: list) -> list:
        """``outs`` with the ``first`` call's results where they read no own argument."""
        return [a if s and aval(a) == aval(b) else b for a, b, s in zip(first, outs, self.shared)]


def split(f: Callable, common: tuple, own: tuple) -> Split | None:
    """split(f, common, own) -> the :class:`Split` of ``f(*common, *own)``, or ``None``
    where it cannot be traced apart from a call (it raised, or has effects).

    Args:
        f: a function of the common arguments, then the own ones (pytrees of arrays).
        common: the arguments that every call shares.
        own: one call's own arguments.

    Returns:
        The split.

    Example:
        >>> import jax.numpy as jnp
        >>> s = split(lambda a, x: x * (1 - a), (0.5,), (jnp.ones(2),))
        >>> s.outputs(s.values(0.5), (jnp.ones(2),))
        [Array([0.5, 0.5], dtype=float32)]
    """
    try:
        closed, shape = jax.make_jaxpr(f, return_shape=True)(*common, *own)
    except Exception:  # the plain call says what is wrong, or steps where tracing cannot
        return None
    inner = closed.jaxpr
    if inner.effects:
        return None
    n = len(jax.tree.leaves(common))
    mine, first, rest = set(inner.invars[n:]), [], []
    for eqn in inner.eqns:
        if any(isinstance(v, Var) and v in mine for v in eqn.invars):
            mine.update(eqn.outvars)
            rest.append(eqn)
        else:
            first.append(eqn)
    read = [v for eqn in rest for v in eqn.invars if isinstance(v, Var) and v not in mine]
    out = [v for v in inner.outvars if isinstance(v, Var) and v not in mine]  # no Literal
    bound = list(dict.fromkeys(read + out))
    reads = len(dict.fromkeys(read))
    return Split(_jaxpr(inner, inner.constvars, inner.invars[:n], bound, first), closed.consts,
                 _jaxpr(inner, [], bound + list(inner.invars[n:]), inner.outvars, rest),
                 jax.tree.structure(shape),
                 tuple(isinstance(v, Var) and v not in mine for v in inner.outvars), reads)


def _jaxpr(whole: Any, constvars: list, invars: list, outvars: list, eqns: list) -> Any:
    info = whole.debug_info._replace(arg_names=("",) * len(invars),
                                     result_paths=("",) * len(outvars))
    return Jaxpr(constvars, invars, outvars, eqns, debug_info=info)


def barrier(values: list) -> list:
    """barrier(values) -> ``values`` with their traced 0-d ones stacked by dtype into one
    vector each, behind an optimization barrier, and read back.

    XLA then passes a group's numbers to each array's fused kernel as one operand, and
    compiles one kernel for the arrays of a shape (as separate scalars, their order among a
    kernel's operands varies, and so do the kernels).

    Args:
        values: what a :class:`Split`'s common part made.

    Returns:
        The values, those traced and 0-d read from their vector.

    Example:
        >>> import jax.numpy as jnp
        >>> jax.jit(lambda a, b: barrier([a, b, jnp.ones(2)])[1])(1.0, 2.0)
        Array(2., dtype=float32, weak_type=True)
    """
    slots: dict[tuple, list] = {}
    for i, v in enumerate(values):
        if isinstance(v, jax.core.Tracer) and v.shape == ():
            slots.setdefault((v.dtype, v.aval.weak_type), []).append(i)
    if not slots:
        return values
    vectors = jax.lax.optimization_barrier(
        [jax.lax.concatenate([jax.lax.broadcast(values[i], (1,)) for i in spots], 0)
         for spots in slots.values()])
    out = list(values)
    for vector, spots in zip(vectors, slots.values()):
        for j, i in enumerate(spots):
            out[i] = jax.lax.index_in_dim(vector, j, keepdims=False)
    return out


def aval(v: Any) -> Any:
    """aval(v) -> JAX's abstract value of ``v``, or its type (a Python number).

    Example:
        >>> import jax.numpy as jnp
        >>> aval(1.0), aval(jnp.ones(2))
        (<class 'float'>, ShapedArray(float32[2]))
    """
    return getattr(v, "aval", type(v))
