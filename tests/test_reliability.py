"""Reliability suite (issue 6, deliverable 4): properties over random nested models, and a
fuzz test of malformed gradient trees.

Properties, over the random models of ``strategies.py`` (random containers, ties, read-only
arrays, trainable subsets, ``None`` gradients, frozen Leafs, adjusted rules): ``update``
never mutates its inputs; ``update_`` equals ``update`` bit for bit over several steps;
ties are never lost nor invented; ``destructure`` then ``re`` is the identity; ``save``
then ``load`` is the identity. The fuzz test mutates a valid gradient tree at many paths
(wrong shapes, dtypes, Python values, NaN/inf, missing and extra keys, wrong containers,
whole trees in the wrong place), and checks each error's type, its message, where it was
raised, and that nothing was written. ``pytest -s`` prints the number of cases per category.
"""

from __future__ import annotations

import collections
import itertools
import linecache
import os
import random
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import optimisers as O
from optimisers.state import Leaf, leaves
from optimisers.tree import ispositional
from strategies import (
    ACTIONS,
    DTYPES,
    LITERALS,
    MODELS,
    NODES,
    POOL,
    RULES,
    SHAPES,
    Affine,
    Pair,
    decorate,
    fp,
    make_grads,
    make_model,
    model_snapshot,
    model_values,
    quiet_setup,
    state_arrays,
    tree_snapshot,
)
from test_properties import paths

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


def check_ties(model: Any, tree: Any) -> list:
    """The tie structure of ``model`` (canonical paths, as test_properties defines them),
    after checking that ``tree`` shares a Leaf exactly where the model has a tie."""
    canon = paths(model, canonical=True)
    for kp1, c1 in canon:
        for kp2, c2 in canon:
            same = c1 == c2
            assert (O.getkeypath(tree, kp1) is O.getkeypath(tree, kp2)) == same, (kp1, kp2)
            if same:
                assert O.getkeypath(model, kp1) is O.getkeypath(model, kp2), (kp1, kp2)
    return [c for _, c in canon]


# ----------------------------------------------------------------------------- properties


@SETTINGS
@given(desc=MODELS, rule=st.sampled_from(RULES), actions=ACTIONS, data=st.data())
def test_update_is_pure_equals_update_and_keeps_ties(desc: tuple, rule: O.Rule,
                                                      actions: list, data: Any) -> None:
    """(a) update never mutates model, state, Leafs or gradients; (b) update_ gives the same
    bits over several steps; (c) ties are never lost nor invented, by either."""
    model_a, model_b = make_model(desc), make_model(desc)
    assume(paths(model_a))
    tree_a, tree_b = quiet_setup(rule, model_a), quiet_setup(rule, model_b)
    decorate(tree_a, actions)
    decorate(tree_b, actions)
    assert tree_snapshot(tree_a, ids=False) == tree_snapshot(tree_b, ids=False)
    ties = check_ties(model_a, tree_a)
    # update_ writes a shared writable array in place, so a non-trainable path holding it
    # sees the step; update puts the new array there too, so whole models are compared
    for step in range(data.draw(st.integers(1, 4), label="steps")):
        p_none = data.draw(st.sampled_from([0.0, 0.2, 0.6]), label="p_none")
        seed = data.draw(st.integers(0, 2**16), label="grad seed")
        grads_a = make_grads(model_a, np.random.default_rng(seed), p_none)
        grads_b = make_grads(model_b, np.random.default_rng(seed), p_none)
        before = model_snapshot(model_a), tree_snapshot(tree_a), model_snapshot(grads_a)
        new_tree, new_model = O.update(tree_a, model_a, grads_a)
        after = model_snapshot(model_a), tree_snapshot(tree_a), model_snapshot(grads_a)
        assert after == before, f"update mutated its input at step {step}"  # (a)
        # the result shares no Leaf and no writable state memory with the input, so that
        # a later in-place step on it cannot reach the input
        old_leaves = {id(leaf) for _, leaf in leaves(tree_a)}
        assert not any(id(leaf) in old_leaves for _, leaf in leaves(new_tree))
        old_arrays = state_arrays(tree_a)
        for a in state_arrays(new_tree):
            assert not a.flags.writeable or not any(np.may_share_memory(a, b)
                                                    for b in old_arrays)

        g_before = model_snapshot(grads_b)
        tree_b, model_b = O.update_(tree_b, model_b, grads_b)
        assert model_snapshot(grads_b) == g_before, "update_ wrote into the gradients"
        assert tree_snapshot(new_tree, ids=False) == tree_snapshot(tree_b, ids=False)  # (b)
        assert model_values(new_model) == model_values(model_b)  # whole models, bit for bit
        assert check_ties(new_model, new_tree) == ties  # (c)
        assert check_ties(model_b, tree_b) == ties
        tree_a, model_a = new_tree, new_model


def check_rebuilt(x: Any, y: Any, train: bool = True) -> None:
    """``y`` is ``x`` rebuilt: trainable arrays equal bit for bit in dtype and shape,
    every non-trainable part the very same object."""
    if not train:
        assert y is x
        return
    if O.isnumeric(x):
        assert type(y) is np.ndarray and fp(y)[1:3] == fp(x)[1:3]
        assert y.tobytes() == x.tobytes()
        return
    kids = O.children(x)
    if not kids:
        assert y is x
        return
    assert type(y) is type(x)
    ykids = O.children(y)
    assert list(ykids) == list(kids)
    keys = set(O.trainable(x))
    for k, v in kids.items():
        check_rebuilt(v, ykids[k], k in keys)


@SETTINGS
@given(desc=MODELS, seed=st.integers(0, 2**16))
def test_destructure_then_re_is_the_identity(desc: tuple, seed: int) -> None:
    """(d) re(flat) rebuilds the model exactly; re(v) puts v where trainables says."""
    model = make_model(desc)
    before = model_snapshot(model)
    ties = [c for _, c in paths(model, canonical=True)]
    flat, re = O.destructure(model)
    found = O.trainables(model, path=True)
    assert [id(x) for _, x in found] == [id(x) for x in O.trainables(model)]
    assert len(found) == len(set(ties))  # each tied array once
    assert flat.ndim == 1 and len(re) == flat.shape[0] == sum(x.size for _, x in found)
    if found:
        assert flat.dtype == np.result_type(*(x.dtype for _, x in found))
        expect = np.concatenate([x.ravel().astype(flat.dtype) for _, x in found])
        assert flat.tobytes() == expect.tobytes()

    same = re(flat)
    check_rebuilt(model, same)
    assert [c for _, c in paths(same, canonical=True)] == ties
    assert O.destructure(same)[0].tobytes() == flat.tobytes()

    v = np.random.default_rng(seed).standard_normal(len(re)).astype(flat.dtype)
    new = re(v)
    start = 0
    for kp, x in found:
        y = O.getkeypath(new, kp)
        want = v[start:start + x.size].reshape(x.shape).astype(x.dtype)
        assert fp(y)[1:3] == fp(want)[1:3] and y.tobytes() == want.tobytes(), kp
        start += x.size
    assert start == len(re)
    old = paths(model, canonical=True)
    for (kp, c), (_, y) in zip(paths(new, canonical=True), paths(new)):
        first = next(k for k, c2 in old if c2 == c)
        assert y is O.getkeypath(new, first), kp  # ties restored: one array at every path
    assert [c for _, c in paths(new, canonical=True)] == ties
    assert model_snapshot(model) == before  # destructure and re leave the model alone
    with pytest.raises(ValueError, match="length"):
        re(np.zeros(len(re) + 1, flat.dtype))


_FILES = itertools.count()


@SETTINGS
@given(desc=MODELS, rule=st.sampled_from(RULES), actions=ACTIONS, data=st.data())
def test_save_then_load_is_the_identity(desc: tuple, rule: O.Rule, actions: list,
                                        data: Any, tmp_path: Any) -> None:
    """(e) save then load gives the same tree (rules, flags, states bit for bit, sharing),
    after 0-3 update_ steps; training goes on from it exactly as from the original."""
    model = make_model(desc)
    assume(paths(model))
    tree = quiet_setup(rule, model)
    decorate(tree, actions)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="grad seed"))
    for _ in range(data.draw(st.integers(0, 3), label="steps")):
        tree, model = O.update_(tree, model, make_grads(model, rng, 0.3))
    path = tmp_path / f"{next(_FILES)}.ckpt"
    O.save(path, tree)
    like = quiet_setup(rule, model)
    back = O.load(path, like=like)
    assert tree_snapshot(back, ids=False) == tree_snapshot(tree, ids=False)
    assert not {id(leaf) for _, leaf in leaves(back)} & {id(leaf) for _, leaf in leaves(tree)}
    grads = make_grads(model, rng, 0.3)
    t1, m1 = O.update(tree, model, grads)
    t2, m2 = O.update(back, model, grads)
    assert model_values(m1) == model_values(m2)
    assert tree_snapshot(t1, ids=False) == tree_snapshot(t2, ids=False)


def test_update_equals_update__for_an_array_also_held_at_a_non_trainable_position() -> None:
    """Found by the property test above (which compares such models at trainable paths
    only); the minimal case."""
    model_a = Affine(np.ones(2), None)
    model_a.b = model_a.w
    model_b = Affine(np.ones(2), None)
    model_b.b = model_b.w
    tree_a, tree_b = O.setup(O.Descent(0.5), model_a), O.setup(O.Descent(0.5), model_b)
    _, new = O.update(tree_a, model_a, {"w": np.ones(2)})
    _, same = O.update_(tree_b, model_b, {"w": np.ones(2)})
    np.testing.assert_array_equal(new.w, same.w)
    np.testing.assert_array_equal(new.b, same.b)


# ----------------------------------------------------------------------------- fuzz

STRUCT = (ValueError, TypeError)
SRC = os.path.dirname(os.path.abspath(O.__file__))

FUZZ_RULES = [O.Adam(0.1), O.OptimiserChain(O.ClipNorm(1.0), O.Nesterov(0.1)),
              O.MixedPrecision(O.OptimiserChain(O.AccumGrad(2), O.Adam(0.05))),
              O.Momentum(0.1), O.OptimiserChain(O.WeightDecay(0.01), O.ClipNorm(2.0),
                                                O.Descent(0.1))]
FUZZ_MODELS = 12  # models with two or more trainable arrays, each mutated at up to
FUZZ_SITES = 10  # this many of its paths (a random choice; all of them when fewer)
VARIANTS = ("update", "update_", "update_ warm")  # warm: a step first, so the plan is reused


def random_spec(r: random.Random, depth: int = 0) -> tuple:
    if depth > 0 and (depth >= 3 or r.random() < 0.35):
        tag = r.choices(["arr", "lit", "ref"], [6, 3, 1])[0]
        return (tag, r.randrange(POOL if tag == "arr" else len(LITERALS) if tag == "lit"
                                 else 8))
    return (r.choice(NODES[:6] if depth == 0 else NODES),
            [random_spec(r, depth + 1) for _ in range(r.randint(1, 3))])


def random_desc(seed: int) -> tuple:
    r = random.Random(seed)
    pool = [(r.choice(SHAPES), r.choice(DTYPES), r.random() < 0.25) for _ in range(POOL)]
    return random_spec(r), pool, seed


def sites(model: Any, tree: Any) -> list:
    """``(KeyPath, 'param' | 'node')`` for every path where update checks the gradient:
    each Leaf, and each container of the state tree."""
    out = []

    def go(kp: O.KeyPath, x: Any, t: Any) -> None:
        if t is None:
            return
        if isinstance(t, Leaf):
            out.append((kp, "param"))
            return
        out.append((kp, "node"))
        kids = O.children(x)
        for k in (t if isinstance(t, dict) else range(len(t))):
            go(kp + (k,), kids[k], t[k])

    go(O.KeyPath(), model, tree)
    return out


def replace_at(g: Any, kp: tuple, new: Any) -> Any:
    """``g`` with the node at ``kp`` replaced by ``new(old)`` (containers copied, not
    mutated)."""
    if not kp:
        return new(g)
    k, rest = kp[0], kp[1:]
    if isinstance(g, Mapping):
        return {**g, k: replace_at(g[k], rest, new)}
    return O.rebuild(g, {k: replace_at(O.children(g)[k], rest, new)})


def param_mutations(x: np.ndarray, kp: O.KeyPath, leaf: Leaf) -> list:
    """``(kind, make(old gradient) -> bad gradient, expectation)`` for a parameter ``x``.

    Expectations: ``("error", types)``, the error naming ``kp``; ``("legal", oracle)``,
    the same result as with ``oracle(old)``; ``("nonfinite", must, may)``: must / may it
    raise FloatingPointError (ClipNorm(throw=True) on the way)."""
    shape = x.shape
    err = lambda *types: ("error", types)  # noqa: E731
    legal = lambda f: ("legal", f)  # noqa: E731
    out = [
        ("shape: extra axis", lambda g: np.zeros(shape + (2,), x.dtype), err(ValueError)),
        ("shape: one more", lambda g: np.zeros((shape[0] + 1,) + shape[1:] if shape else (1,),
                                                x.dtype), err(ValueError)),
        ("shape: empty", lambda g: np.zeros((0,), x.dtype), err(ValueError)),
        ("dtype: str", lambda g: np.full(shape, "a"), err(TypeError, ValueError)),
        ("dtype: bytes", lambda g: np.full(shape, b"a"), err(TypeError, ValueError)),
        ("dtype: object", lambda g: np.full(shape, 1.0, object), err(TypeError, ValueError)),
        ("dtype: datetime", lambda g: np.zeros(shape, "datetime64[s]"),
         err(TypeError, ValueError)),
        ("dtype: structured", lambda g: np.zeros(shape, [("a", "f4")]),
         err(TypeError, ValueError)),
        ("dtype: bool (cast)", lambda g: np.asarray(g > 0),
         legal(lambda g: np.asarray(g > 0).astype(x.dtype))),
        ("dtype: int (cast)", lambda g: np.asarray(g * 3).astype(np.int64),
         legal(lambda g: np.asarray(g * 3).astype(np.int64).astype(x.dtype))),
        ("dtype: float16/64 (cast)",
         lambda g: g.astype(np.float16 if x.dtype != np.float16 else np.float64),
         legal(lambda g: g.astype(np.float16 if x.dtype != np.float16 else np.float64)
               .astype(x.dtype))),
        ("dtype: complex", lambda g: np.asarray(g * (1 + 1j)),  # an error, or the real part
         ("either", (TypeError, ValueError), lambda g: np.asarray(g * (1 + 1j)).real)),
        ("python: float", lambda g: 1.0, err(TypeError, ValueError)),
        ("python: int", lambda g: 1, err(TypeError, ValueError)),
        ("python: bool", lambda g: True, err(TypeError, ValueError)),
        ("python: complex", lambda g: 1 + 2j, err(TypeError, ValueError)),
        ("python: numpy scalar", lambda g: np.float64(1.0), err(TypeError, ValueError)),
        ("python: str", lambda g: "grad", err(TypeError, ValueError)),
        ("python: object", lambda g: object(), err(TypeError, ValueError)),
        ("container at array: list", lambda g: [g], err(*STRUCT)),
        ("container at array: tuple", lambda g: (g, g), err(*STRUCT)),
        ("container at array: dict", lambda g: {"w": g}, err(*STRUCT)),
        ("container at array: empty list", lambda g: [], err(*STRUCT)),
        ("container at array: empty dict", lambda g: {}, err(*STRUCT)),
        ("container at array: set", lambda g: {1.0}, err(*STRUCT)),
        ("container at array: Leaf", lambda g: Leaf(O.Descent(), None), err(*STRUCT)),
    ]
    if x.ndim == 2:
        out.append(("shape: transposed", lambda g: np.ascontiguousarray(g.T), err(ValueError)))
    if x.ndim >= 1:
        out.append(("shape: 0-d", lambda g: np.asarray(1.0, x.dtype), err(ValueError)))
    clip = clipping(leaf.rule)
    nonfinite = ("nonfinite", clip and not leaf.frozen and not accumulates(leaf.rule),
                 clip and not leaf.frozen)
    for name, value in [("nan", np.nan), ("inf", np.inf), ("-inf", -np.inf)]:
        out.append((f"nonfinite: all {name}", lambda g, v=value: np.full(shape, v, x.dtype),
                    nonfinite))
        out.append((f"nonfinite: one {name}",
                    lambda g, v=value: np.where(np.arange(g.size).reshape(shape) == 0, v, g)
                    .astype(x.dtype), nonfinite))
    return out


def clipping(rule: O.Rule) -> bool:
    """Whether ClipNorm(throw=True) is part of the rule."""
    if isinstance(rule, O.ClipNorm):
        return rule.throw
    if isinstance(rule, O.OptimiserChain):
        return any(clipping(r) for r in rule.rules)
    return isinstance(rule, O.MixedPrecision) and clipping(rule.rule)


def accumulates(rule: O.Rule) -> bool:
    if isinstance(rule, O.AccumGrad):
        return True
    if isinstance(rule, O.OptimiserChain):
        return any(accumulates(r) for r in rule.rules)
    return isinstance(rule, O.MixedPrecision) and accumulates(rule.rule)


def node_mutations(x: Any, kp: O.KeyPath, r: random.Random) -> list:
    kids = O.children(x)
    keys = list(kids)
    as_dict = lambda g: dict(g) if isinstance(g, Mapping) else O.children(g)  # noqa: E731
    err = ("error", STRUCT)
    out = [
        ("node: array", lambda g: np.ones(3), err),
        ("node: number", lambda g: 1.5, err),
        ("node: string", lambda g: "grads", err),
        ("node: set", lambda g: set(), err),
        ("extra key: None", lambda g: {**as_dict(g), "bogus": None}, ("error", (ValueError,))),
        ("extra key: array", lambda g: {**as_dict(g), "bogus": np.ones(2)},
         ("error", (ValueError,))),
    ]
    if ispositional(x):
        seq = lambda g: list(as_dict(g).values())  # noqa: E731
        out += [
            ("too long: None", lambda g: type(x)(seq(g) + [None]), ("error", (ValueError,))),
            ("too long: array", lambda g: type(x)(seq(g) + [np.ones(2)]),
             ("error", (ValueError,))),
            ("too short", lambda g: type(x)(seq(g)[:-1]), ("error", (ValueError,))),
            ("keys as strings", lambda g: {str(k): v for k, v in as_dict(g).items()},
             ("error", (ValueError,))),
        ]
    elif keys:
        out.append(("keyed node as list", lambda g: list(as_dict(g).values()), err))
    if keys:
        gone = r.choice(keys)
        out.append(("missing key (skip)",
                    lambda g: {k: v for k, v in as_dict(g).items() if k != gone},
                    ("legal", lambda g: {**as_dict(g), gone: None})))
    return out


def fuzz_cases(seed: int) -> tuple[Any, list]:
    """The description of model ``seed`` and its cases: ``(category, kind, kp, make,
    expectation)``, ``make`` turning (tree, model, grads) into the call's arguments."""
    desc = random_desc(seed)
    model = make_model(desc)
    if len({c for _, c in paths(model, canonical=True)}) < 2:
        return desc, []
    tree = prepare(desc, seed)[0]
    r = random.Random(seed)
    cases = []
    where = sites(model, tree)
    if len(where) > FUZZ_SITES:
        where = [where[i] for i in sorted(r.sample(range(len(where)), FUZZ_SITES))]
    for kp, what in where:
        x = O.getkeypath(model, kp)
        if what == "param":
            muts = param_mutations(x, kp, O.getkeypath(tree, kp))
        else:
            muts = node_mutations(x, kp, r)
        for kind, bad, expect in muts:
            def make(t, m, g, kp=kp, bad=bad):
                return t, m, replace_at(g, kp, bad)
            if expect[0] == "nonfinite":  # if accepted: as update does it, with the same
                expect = (*expect, bad)
            cases.append((kind.split(":")[0], kind, kp, make, expect))
    whole = [
        ("model as tree", lambda t, m, g: (m, m, g), ("error", STRUCT)),
        ("tree as grads", lambda t, m, g: (t, m, t), ("error", STRUCT)),
        ("tree as model", lambda t, m, g: (t, t, g), ("error", STRUCT)),
        ("grads as tree", lambda t, m, g: (g, m, g), ("error", STRUCT)),
    ]
    cases += [("whole", kind, None, make, expect) for kind, make, expect in whole]
    return desc, cases


def prepare(desc: tuple, seed: int, warm: bool = False) -> tuple[Any, Any]:
    """A fresh (tree, model) for fuzz model ``seed``: random frozen Leafs; ``warm``: after
    one valid update_ step, so update_ reuses the plan it learned."""
    model = make_model(desc)
    tree = O.setup(FUZZ_RULES[seed % len(FUZZ_RULES)], model)
    r = random.Random(seed)
    for leaf in O.select(tree):
        leaf.frozen = r.random() < 0.15
    if warm:
        tree, model = O.update_(tree, model, make_grads(model, np.random.default_rng(-seed % 97)))
    return tree, model


def check_error(e: BaseException, kp: O.KeyPath | None, types: tuple) -> None:
    assert type(e) in types, f"{type(e).__name__}: {e}"  # exact: no KeyError, AxisError, ...
    assert "KeyPath(" in str(e), f"the message names no KeyPath: {e}"
    if kp is not None:
        assert repr(kp) in str(e), f"the message does not name {kp!r}: {e}"
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    name, line = tb.tb_frame.f_code.co_filename, linecache.getline(
        tb.tb_frame.f_code.co_filename, tb.tb_lineno)
    assert name.startswith(SRC) and line.lstrip().startswith("raise"), (
        f"raised from {name}:{tb.tb_lineno} ({line.strip()!r}), not by optimisers: {e}")


def run_fuzz(only: str | None = None, stop_at_partial: bool = False
             ) -> tuple[collections.Counter, list, list]:
    """Every case of every fuzz model, in every variant. Returns the counts per category,
    the failures (as text), and the partial writes of update_ after FloatingPointError."""
    counts: collections.Counter = collections.Counter()
    failures: list[str] = []
    partial: list[str] = []
    models = 0
    ready: dict = {}  # (seed, variant) -> a prepared case that nothing has written to
    for seed in itertools.count():
        if models == FUZZ_MODELS:
            break
        desc, cases = fuzz_cases(seed)
        models += bool(cases)
        for category, kind, kp, make, expect in cases:
            if only is not None and category != only:
                continue
            for variant in VARIANTS:
                try:
                    outcome = run_case(desc, seed, variant, kp, make, expect, ready)
                except AssertionError as e:
                    ready.clear()
                    failures.append(f"seed {seed}, {variant}, {kind} at {kp!r}: {e}")
                    continue
                if outcome == "partial write":
                    partial.append(f"seed {seed}, {variant}, {kind} at {kp!r}")
                    if stop_at_partial:
                        return counts, failures, partial
                counts[category] += 1
                counts[f"{category}: {outcome}"] += 1
                counts["total"] += 1
    return counts, failures, partial


def run_case(desc: tuple, seed: int, variant: str, kp: O.KeyPath | None, make: Any,
             expect: tuple, ready: dict) -> str:
    """One case: the call, then its judgement. ``ready`` keeps the prepared tree, model and
    valid gradients of (seed, variant) for the next case as long as nothing writes to them
    (which every error case checks anyway)."""
    if (seed, variant) not in ready:
        tree, model = prepare(desc, seed, warm=variant == "update_ warm")
        grads = make_grads(model, np.random.default_rng(seed * 1000 + 7), 0.0)
        ready[seed, variant] = (tree, model, grads, model_snapshot(model), tree_snapshot(tree))
    tree, model, grads, *before = ready.pop((seed, variant))
    fn = O.update if variant == "update" else O.update_
    args = make(tree, model, grads)
    before.append(model_snapshot(args[2]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow in float16, NaN
        try:
            new_tree, new_model = fn(*args)
            error = None
        except Exception as e:  # noqa: BLE001 - judged below
            error = e
    after = [model_snapshot(model), tree_snapshot(tree), model_snapshot(args[2])]
    untouched = after == before
    if untouched:
        ready[seed, variant] = (tree, model, grads, *before[:2])
    if expect[0] == "error":
        assert error is not None, "no error"
        check_error(error, kp, expect[1])
        assert untouched, "an error, but something was written"
        return "error"
    if expect[0] == "either":
        if error is not None:
            check_error(error, kp, expect[1])
            assert untouched, "an error, but something was written"
            return "error"
        expect = ("legal", expect[2])
    if expect[0] == "nonfinite":
        _, must, may, bad = expect
        if error is None:
            assert not must, "no FloatingPointError from ClipNorm(throw=True)"
            expect = ("legal", bad)  # NaN and inf are data: as update would do them
        else:
            assert may, f"{type(error).__name__} from a rule without ClipNorm: {error}"
            check_error(error, None, (FloatingPointError,))
            named = [repr(p) for p, leaf in leaves(tree) if leaf is O.getkeypath(tree, kp)]
            assert any(p in str(error) for p in named), f"the message names no path: {error}"
            if not untouched:
                assert variant != "update", "update wrote into its input"
                return "partial write"
            return "error"
    assert error is None, f"{type(error).__name__}: {error}"
    assert untouched or variant != "update", "update wrote into its input"
    # legal: the same as update (pure) on a fresh copy with the equivalent gradients
    tree2, model2 = prepare(desc, seed, warm=variant == "update_ warm")
    grads2 = make_grads(model2, np.random.default_rng(seed * 1000 + 7), 0.0)
    oracle = replace_at(grads2, kp, expect[1]) if kp is not None else grads2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want_tree, want_model = O.update(tree2, model2, oracle)
    assert tree_snapshot(new_tree, ids=False) == tree_snapshot(want_tree, ids=False)
    assert [(p, fp(x)) for p, x in paths(new_model)] == [
        (p, fp(x)) for p, x in paths(want_model)]
    return "accepted"


def report(counts: collections.Counter, title: str) -> None:
    print(f"\n{title}: {counts['total']} cases "
          f"({FUZZ_MODELS} models x paths x mutations x {len(VARIANTS)} variants)")
    for k in sorted(counts):
        if k != "total":
            print(f"  {k:36s} {counts[k]:6d}")


def test_fuzz_malformed_gradients() -> None:
    """Each malformed gradient tree gets a ValueError/TypeError (FloatingPointError for
    NaN/inf under ClipNorm(throw=True)) raised by optimisers, naming the KeyPath, and
    nothing is written; each legal oddity (missing key, castable dtype, NaN for Adam) gives
    the same result as its plain equivalent."""
    counts, failures, partial = run_fuzz()
    report(counts, "fuzz of malformed gradients")
    print(f"  update_ partial writes after FloatingPointError: {len(partial)} "
          f"(see test_fuzz_nonfinite_update__writes_nothing)")
    assert not failures, f"{len(failures)} failures, e.g.:\n" + "\n".join(failures[:10])
    assert counts["total"] >= 4000
    for category in ["shape", "dtype", "python", "container at array", "nonfinite", "node",
                     "extra key", "too long", "too short", "keys as strings",
                     "missing key (skip)", "keyed node as list", "whole"]:
        assert counts[category] >= 30, (category, counts[category])
    assert counts["nonfinite: error"] >= 30 and counts["nonfinite: accepted"] >= 30


def test_fuzz_nonfinite_update__writes_nothing() -> None:
    counts, failures, partial = run_fuzz(only="nonfinite", stop_at_partial=True)
    assert not failures, failures[:3]
    assert not partial, f"update_ wrote before raising: {partial[0]}"
    report(counts, "fuzz of NaN/inf gradients")
    assert counts["nonfinite: error"] >= 30


def test_clipnorm_nan_in_update__leaves_model_and_tree_unchanged() -> None:
    model = {"a": np.ones(3), "b": np.ones(3)}
    tree = O.setup(O.OptimiserChain(O.ClipNorm(1.0), O.Nesterov(0.1)), model)
    with pytest.raises(FloatingPointError, match=r"KeyPath\('b'\)"):
        O.update_(tree, model, {"a": np.ones(3), "b": np.array([np.nan, 1.0, 1.0])})
    np.testing.assert_array_equal(model["a"], np.ones(3))
    np.testing.assert_array_equal(tree["a"].state[1], np.zeros(3))


def test_update_of_a_model_holding_a_namedtuple_as_tree_names_the_path() -> None:
    model = {"p": Pair(np.ones(2), np.ones(2))}
    O.setup(O.Adam(), model)
    with pytest.raises((TypeError, ValueError), match=r"KeyPath\("):
        O.update(model, model, {"p": {"left": np.ones(2), "right": np.ones(2)}})
