"""Narrow numbers, the arithmetic in float32: a rule's array state kept in another dtype
(:class:`LowPrecision`) or as 8-bit codes (:class:`Quantised`), and bfloat16 parameters
rounded stochastically (:class:`StochasticRounding`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

from optimisers import backends
from optimisers.rules.adaptive import Adam
from optimisers.rules.base import NewValue, Rule, call, real_dtype_name
from optimisers.rules.fields import dtype_name, hyperparameter

__all__ = ["LowPrecision", "Quantised", "StochasticRounding", "Blocks", "dynamic_code"]


class _Narrowed:
    """What :class:`LowPrecision` and :class:`Quantised` share: a wrapper whose rule sees
    the state read back (``_read``); no rule on the parameter inside it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _outermost(self)

    def raises(self) -> bool:
        return self.rule.raises()

    def stepped(self, state: Any) -> Any:
        return self.rule.stepped(state)

    def held(self, state: Any, x: Any, dx: Any) -> tuple:
        """``(state, x, dx)`` as the rule it runs sees them (the state read back)."""
        return (state if x is None else self._read(state, x)), x, dx


@dataclass(frozen=True)
class LowPrecision(_Narrowed, Rule):
    """LowPrecision(rule=Adam(), dtype="bfloat16"): keep ``rule``'s state arrays in ``dtype``.

    Each array of the state with the parameter's shape and a real floating dtype (Adam's
    ``m`` and ``v``) is stored in ``dtype``; a tuple of dtypes gives the first such array
    (in the state's order) ``dtype[0]``, the next ``dtype[1]``, ..., ``None`` keeping one
    as the rule made it. Each step reads them back in the parameter's dtype, runs ``rule``
    there, and rounds its new state to the stored dtypes (to nearest, ties to even): the
    arithmetic is the rule's own. Adam's float32 state is 8 bytes a parameter, 4 in
    bfloat16. Wrap a chain to keep all its rules' state narrow; for a low-precision
    parameter put it inside :class:`MixedPrecision` (optax: ``adam(mu_dtype=...)``, the
    first moment only; torchao: ``AdamW(bf16_stochastic_round=...)`` state).

    Example:
        >>> rule, x = LowPrecision(Adam(0.1), "float16"), np.ones(3, np.float32)
        >>> s = rule.init(x)
        >>> s, d = rule.apply(s, x, np.full(3, 0.3, np.float32))
        >>> s[0].dtype, s[1].dtype, d.round(4)
        (dtype('float16'), dtype('float16'), array([0.1, 0.1, 0.1], dtype=float32))
    """

    elementwise = True
    rule: Rule = hyperparameter(default_factory=Adam, kind="rule")
    dtype: Any = hyperparameter("bfloat16", kind="dtypes")

    def __repr__(self) -> str:
        """Dtypes by name, so that the text is code that makes this rule again."""
        names = tuple(map(_name, self.dtype)) if type(self.dtype) is tuple else _name(self.dtype)
        return f"LowPrecision(rule={self.rule!r}, dtype={names!r})"

    def init(self, x):
        return self._stored(self.rule.init(x), x)

    def apply(self, state, x, dx, *higher):
        new, d = call(self.rule, self._read(state, x), x, (dx, *higher))
        return self._stored(new, x, state), d

    def misfit(self, state: Any, x: Any) -> tuple | None:
        """The rule's own test, each stored array (of ``x``'s shape) standing as ``x``."""
        return self.rule.misfit(_each(state, x, lambda i, a: x), x)

    def _read(self, state: Any, x: Any) -> Any:
        """``state`` with its stored arrays in the parameter's (real) dtype."""
        xp, wide = backends.of(x), real_dtype_name(x)
        return _each(state, x, lambda i, a: a if xp.dtype_name(a) == wide else xp.astype(a, wide))

    def _stored(self, new: Any, x: Any, old: Any = None) -> Any:
        """``new`` with its arrays rounded to the stored dtypes, into ``old``'s where it may."""
        xp = backends.of(x)
        olds = [] if old is None else _each(old, x, None)
        many = type(self.dtype) is tuple

        def store(i: int, a: Any) -> Any:
            dtype = (self.dtype[i] if i < len(self.dtype) else None) if many else self.dtype
            name = None if dtype is None else dtype_name(dtype)
            if name is None or name == xp.dtype_name(a):
                return a
            old = olds[i] if i < len(olds) else None
            if old is not None and xp.dtype_name(old) == name and xp.maywrite(old):
                return xp.assign(old, a)  # (rounded by the cast)
            return xp.astype(a, dtype)

        return _each(new, x, store)


def _name(dtype: Any) -> Any:
    return None if dtype is None else dtype_name(dtype)


def _each(state: Any, x: Any, f: Any, coded: bool = False) -> Any:
    """``state`` with ``f(i, a)`` in place of its ``i``-th real floating array of ``x``'s
    shape (``coded``: of each :class:`Blocks` instead); ``f`` None: the list of them."""
    found: list = []
    shape = tuple(x.shape)

    def visit(s: Any) -> Any:
        if type(s) is Blocks:
            if coded:
                found.append(s)
                return s if f is None else f(len(found) - 1, s)
            return s
        if isinstance(s, (tuple, list)):
            items = [visit(v) for v in s]
            return type(s)(*items) if hasattr(s, "_fields") else type(s)(items)
        if isinstance(s, dict):
            return type(s)((k, visit(v)) for k, v in s.items())
        xp = backends.library(s) and backends.of(s)
        if coded or not xp or tuple(s.shape) != shape or xp.dtype_name(s)[:5] not in (
                "float", "bfloa"):
            return s
        found.append(s)
        return s if f is None else f(len(found) - 1, s)

    out = visit(state)
    return found if f is None else out


def _outermost(wrapper: Rule) -> None:
    """Refuse inside ``wrapper`` a rule that acts on the parameter after the step (keeping
    a copy of it or its average in the state, which ``wrapper`` would narrow too)."""
    if type(wrapper.rule).outermost:
        name, inner = type(wrapper).__name__, type(wrapper.rule).__name__
        raise ValueError(f"{name}({inner}(...)) would narrow {inner}'s own numbers: write "
                         f"{inner}({name}(rule)) instead")


class Blocks(NamedTuple):
    """An array kept by :class:`Quantised`: ``codes`` (uint8, ``(blocks, block)``) index
    the code, times each block's ``scale`` (float32, its largest magnitude)."""

    codes: Any
    scale: Any


@functools.cache
def dynamic_code(bits: int = 8, exponent_bits: int = 7) -> tuple[float, ...]:
    """dynamic_code() -> the 256 values of the signed dynamic-tree code, sorted, in [-1, 1]
    (Dettmers et al. 2022, 8-bit Optimizers via Block-wise Quantization): for each of
    ``exponent_bits`` decades ``10**(i - exponent_bits + 1)``, linear steps in [0.1, 1]
    whose number doubles with each decade, both signs, and 0; the largest magnitudes are
    -1 and 1, so that a block's largest element codes exactly, whatever its sign, and
    coding what was decoded gives the same codes (a skipped step leaves the state be).

    Example:
        >>> code = dynamic_code()
        >>> len(code), code[0], code[1], code[-1], min(abs(v) for v in code if v)
        (256, -1.0, -0.97890625, 1.0, 5.5e-07)
    """
    values = {0.0}
    for i in range(exponent_bits):
        n = 2 ** (i + bits - 1 - exponent_bits) + 1  # the linear steps' edges in a decade
        edges = [0.1 + 0.9 * k / (n - 1) for k in range(n)]
        for a, b in zip(edges, edges[1:]):
            v = round(10.0 ** (i - exponent_bits + 1) * (a + b) / 2, 12)
            values.update((v, -v))
    return (-1.0, *sorted(values)[1:], 1.0)  # (the most negative made -1, and 1 added)


@dataclass(frozen=True)
class Quantised(_Narrowed, Rule):
    """Quantised(rule=Adam(), block=256, min_size=4096): keep ``rule``'s state arrays as
    8-bit codes, one float32 scale a block of ``block`` elements.

    Each state array of the parameter's shape and a real floating dtype, of at least
    ``min_size`` elements, is kept as :class:`Blocks`: each block's elements divided by
    its largest magnitude and rounded to the nearest value of the signed dynamic-tree
    code (:func:`dynamic_code`, which keeps small values' relative precision, so Adam's
    second moment stays stable). Each step reads them back in the parameter's dtype, runs
    ``rule`` there and codes its new state again: about 1 + 4/``block`` bytes an element
    (Adam: 2.03 a parameter, against 8 in float32). Smaller arrays stay as the rule made
    them, as bitsandbytes' and torchao's 8-bit optimisers do. Dettmers et al. 2022.

    Example:
        >>> rule, x = Quantised(Adam(0.1), block=4, min_size=1), np.ones(8, np.float32)
        >>> s, d = rule.apply(rule.init(x), x, np.linspace(-1, 1, 8, dtype=np.float32))
        >>> s[0].codes.dtype, s[0].codes.shape, s[0].scale.shape, d.round(2)[:3]
        (dtype('uint8'), (2, 4), (2,), array([-0.1, -0.1, -0.1], dtype=float32))
    """

    rule: Rule = hyperparameter(default_factory=Adam, kind="rule")
    block: int = hyperparameter(256, "[1, inf)", kind="whole")
    min_size: int = hyperparameter(4096, "[0, inf)", kind="whole")

    def init(self, x):
        return self._coded(self.rule.init(x), x)[0]

    @backends.on_whole  # (FSDP2's shards: blocks of the whole array, as on one process)
    def _coded(self, state: Any, x: Any) -> tuple:
        return self._stored(state, x), None

    @backends.on_whole
    def apply(self, state, x, dx, *higher):
        new, d = call(self.rule, self._read(state, x), x, (dx, *higher))
        return self._stored(new, x), d

    def misfit(self, state: Any, x: Any) -> tuple | None:
        """Each :class:`Blocks`' shapes against ``x``'s size (in its own blocks: ``adjust``
        may change ``block``, and the next store uses it), then the rule's own test with
        ``x`` standing for them."""
        for b in _each(state, x, None, coded=True):
            block = b.codes.shape[-1] if len(b.codes.shape) == 2 else self.block
            n = -(-backends.of(x).size(x) // block)
            if (tuple(b.codes.shape), tuple(b.scale.shape)) != ((n, block), (n,)):
                return (tuple(b.codes.shape), tuple(b.scale.shape)), ((n, block), (n,))
        return self.rule.misfit(_each(state, x, lambda i, b: x, coded=True), x)

    def _read(self, state: Any, x: Any) -> Any:
        """``state`` with each :class:`Blocks` decoded to the parameter's (real) dtype."""
        xp, wide = backends.of(x), real_dtype_name(x)
        return _each(state, x, lambda i, b: xp.dequantise(b.codes, b.scale, dynamic_code(),
                                                         x.shape, wide), coded=True)

    def _stored(self, new: Any, x: Any) -> Any:
        """``new`` with each large enough array coded."""
        if backends.of(x).size(x) < self.min_size:
            return new
        xp = backends.of(x)
        return _each(new, x, lambda i, a: Blocks(*xp.quantise(a, self.block, dynamic_code())))


@dataclass(frozen=True)
class StochasticRounding(Rule):
    """StochasticRounding(rule=Adam(), dtype="float32"): train a bfloat16 parameter without a
    master copy, each step rounded stochastically.

    The state is ``(t, rule_state)``: ``rule`` steps the parameter read in ``dtype``, and
    the result is rounded to bfloat16 up or down at random, in proportion to its distance
    to each (unbiased: steps below bfloat16's spacing still move the weights on average),
    the bits from the array library's own generator seeded by the step count ``t`` (a
    resumed run repeats them). Saves :class:`MixedPrecision`'s float32 copy, 4 bytes a
    parameter. Zamirai et al. 2020; torchao's ``bf16_stochastic_round``.

    Example:
        >>> import ml_dtypes
        >>> rule, x = StochasticRounding(Adam(1e-4)), np.ones(1000, ml_dtypes.bfloat16)
        >>> s, d = rule.apply(rule.init(x), x, np.ones(1000, ml_dtypes.bfloat16))
        >>> sorted(set(d.value.astype(float).tolist())), s[0]  # (1 or the next below)
        ([0.99609375, 1.0], 1)
    """

    outermost = True
    rule: Rule = hyperparameter(default_factory=Adam, kind="rule")
    dtype: Any = hyperparameter("float32", kind="dtype")

    def __post_init__(self) -> None:
        super().__post_init__()
        if dtype_name(self.dtype) not in ("float32", "float64"):
            raise ValueError(f"StochasticRounding's dtype is where its rule computes: "
                             f"float32 or float64, not {dtype_name(self.dtype)}")

    def __repr__(self) -> str:
        """The dtype by its name, so that the text is code that makes this rule again."""
        return f"StochasticRounding(rule={self.rule!r}, dtype={dtype_name(self.dtype)!r})"

    def raises(self) -> bool:
        return self.rule.raises()

    def refuses(self, x: Any) -> str | None:
        name = backends.of(x).dtype_name(x)
        if name != "bfloat16":
            return (f"StochasticRounding rounds to bfloat16; this parameter is {name}: "
                    f"give it MixedPrecision(rule) or the rule alone")
        return super().refuses(x)

    def init(self, x):
        return 0, self.rule.init(backends.of(x).astype(x, self.dtype))

    def misfit(self, state: Any, x: Any) -> tuple | None:
        """The rule's own test, against the parameter read in ``dtype``."""
        return self.rule.misfit(state[1], backends.of(x).astype(x, self.dtype))

    def stepped(self, state: Any) -> Any:
        return self.rule.stepped(state[1])

    def held(self, state: Any, x: Any, dx: Any) -> tuple:
        """``(state, x, dx)`` as the rule it runs sees them: in ``dtype``."""
        if x is None:
            return state[1], x, dx
        wide = backends.of(x).astype(x, self.dtype)
        return state[1], wide, dx if dx is None else backends.of(x).cast(dx, wide)

    def apply(self, state, x, dx, *higher):
        xp = backends.of(x)
        t, st = state
        wide = xp.astype(x, self.dtype)
        st, d = call(self.rule, st, wide, tuple(xp.cast(g, wide) for g in (dx, *higher)))
        if d is None:
            return (t, st), None
        return (t + 1, st), NewValue(xp.stochastic_bfloat16(xp.subtract(wide, d, True), t))
