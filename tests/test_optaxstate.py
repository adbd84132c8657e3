"""Moving a run from optax and back (``optimisers.backends.optaxstate``): a few optax steps,
then the same next steps with ``update`` from :func:`from_optax`, and with optax again from
:func:`to_optax`, for adam, adamw, sgd with and without momentum, a chain after
``clip_by_global_norm``, ``inject_hyperparams`` and a schedule; the refusals name the kinds."""

from __future__ import annotations

import numpy as np
import pytest

import optimisers as O

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
from optimisers.backends.optaxstate import from_optax, to_optax  # noqa: E402

jnp = jax.numpy
CASES = [
    (O.Adam(0.01), lambda: optax.adam(0.01)),
    (O.AdamW(0.02, (0.8, 0.99), lambd=0.1), lambda: optax.adamw(0.02, 0.8, 0.99,
                                                               weight_decay=0.1)),
    (O.Descent(0.1), lambda: optax.sgd(0.1)),
    (O.Momentum(0.05, 0.9, eta_outside=True), lambda: optax.sgd(0.05, 0.9)),
    (O.Nesterov(0.05, 0.8, eta_outside=True), lambda: optax.sgd(0.05, 0.8, nesterov=True)),
    (O.OptimiserChain(O.ClipGlobalNorm(0.5), O.AdamW(0.01, lambd=0.1)),
     lambda: optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(0.01, weight_decay=0.1))),
    (O.Adam(), lambda: optax.inject_hyperparams(optax.adam)(learning_rate=0.02, b1=0.8)),
    (O.Adam(O.Linear(0.02, 0.0, 20)), lambda: optax.adam(optax.linear_schedule(0.02, 0.0, 20))),
    (O.Adam(O.Linear(0.02, 0.0, 20)), lambda: optax.inject_hyperparams(optax.adam)(
        optax.linear_schedule(0.02, 0.0, 20))),
]
IDS = ["adam", "adamw", "sgd", "sgd-momentum", "sgd-nesterov", "clip-adamw", "inject-adam",
       "adam-schedule", "inject-schedule"]


def _params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"w": jax.random.normal(k1, (4, 3)), "b": [jax.random.normal(k2, (3,))]}


def _grads(params, i):
    kx, ky = jax.random.split(jax.random.key(i + 1))
    x, y = jax.random.normal(kx, (16, 4)), jax.random.normal(ky, (16, 3))
    return jax.grad(lambda p: jnp.mean((jnp.tanh(x @ p["w"] + p["b"][0]) - y) ** 2))(params)


def _optax_steps(tx, params, opt_state, steps, start=0):
    for i in range(start, start + steps):
        updates, opt_state = tx.update(_grads(params, i), opt_state, params)
        params = optax.apply_updates(params, updates)
    return params, opt_state


def _our_steps(tree, params, steps, start=0):
    for i in range(start, start + steps):
        tree, params = O.update(tree, params, _grads(params, i))
    return tree, params


def _close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rule, make", CASES, ids=IDS)
def test_the_next_steps_are_optaxs_after_from_optax_and_after_to_optax(rule, make):
    tx = make()
    params, opt_state = _optax_steps(tx, _params(), tx.init(_params()), 3)
    tree = from_optax(rule, opt_state, params)
    counted = not isinstance(rule, (O.Descent, O.Momentum))  # (optax.sgd keeps no count)
    assert {leaf.clock for leaf in O.select(tree)} == {3 if counted else 0}
    theirs, opt_state = _optax_steps(tx, params, opt_state, 4, 3)
    tree, ours = _our_steps(tree, params, 4, 3)
    _close(theirs, ours)

    back = to_optax(tree, tx, ours)
    assert jax.tree.structure(back) == jax.tree.structure(opt_state)
    theirs, _ = _optax_steps(tx, ours, back, 4, 7)
    _, ours = _our_steps(tree, ours, 4, 7)
    _close(theirs, ours)


def test_injected_numbers_replace_the_rules_and_go_back():
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=0.02, b1=0.8, weight_decay=0.1)
    tree = from_optax(O.AdamW(), tx.init(_params()), _params())
    f32 = [float(np.float32(v)) for v in (0.02, 0.8, 0.999, 0.1, 1e-8)]
    assert tree["w"].rule == O.AdamW(f32[0], tuple(f32[1:3]), *f32[3:])
    O.adjust_(tree, 0.5)
    assert float(to_optax(tree, tx, _params()).hyperparams["learning_rate"]) == 0.5


@pytest.mark.parametrize("rule, tx, match", [
    (O.Adam(), optax.sgd(0.1, 0.9), "needs an optax ScaleByAdamState"),
    (O.Descent(), optax.adam(0.1), "has a ScaleByAdamState that no rule"),
    (O.RMSProp(), optax.rmsprop(0.1), "holds a ScaleByRmsState, which no rule here reads"),
    (O.Momentum(0.1), optax.sgd(0.1, 0.9), "eta_outside=True"),
    (O.Lion(), optax.lion(0.1), "holds a ScaleByLionState"),
    (O.Adam(), optax.inject_hyperparams(optax.adam)(0.1, eps_root=0.1), r"\['eps_root'\]"),
], ids=["kind", "extra", "rmsprop", "inside", "lion", "eps-root"])
def test_a_rule_and_a_state_of_other_formulas_are_refused(rule, tx, match):
    with pytest.raises(ValueError, match=match):
        from_optax(rule, tx.init(_params()), _params())


def test_an_injected_number_that_no_rule_has_is_refused():
    tx = optax.inject_hyperparams(optax.sgd)(0.1, 0.9)
    with pytest.raises(TypeError, match="no rule here has a field 'rho'") as err:
        from_optax(O.Descent(), tx.init(_params()), _params())
    assert "injects ['learning_rate', 'momentum']" in err.value.__notes__[0]


def test_to_optax_refuses_several_rules_or_clocks():
    tree = O.setup({"w": O.Adam(0.1), "*": O.Adam(0.2)}, _params())
    with pytest.raises(ValueError, match="several rules"):
        to_optax(tree, optax.adam(0.1), _params())
    tree = O.setup(O.Adam(), _params())
    tree["w"].clock = 2
    with pytest.raises(ValueError, match=r"the clocks \[0, 2\]"):
        to_optax(tree, optax.adam(0.1), _params())
    with pytest.raises(ValueError, match="needs an optax TraceState"):
        to_optax(O.setup(O.Momentum(eta_outside=True), _params()), optax.adam(0.1), _params())
