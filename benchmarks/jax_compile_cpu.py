"""CPU seconds of compiling and stepping ours against `optax.adam` (jit, donated), alternating
in one process, and of compiling `optax.inject_hyperparams(optax.adam)` (its numbers data,
as ours are); `--kernels` prints the fusions in the optimised HLO and the jaxpr's size per
array instead.

Usage: `python benchmarks/jax_compile_cpu.py gpt2,gpt12,gpt48,B [--kernels]`
"""

import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from harness import shape_spec

import optimisers as O


def arrays(spec, seed=0):
    rng = np.random.default_rng(seed)

    def make(s):
        if isinstance(s, dict):
            return {k: make(v) for k, v in s.items()}
        if isinstance(s, list):
            return [make(v) for v in s]
        return jnp.asarray(rng.standard_normal(s, dtype=np.float32) * 0.02)

    return make(spec)


def ours_fn(tree, model, grads):
    return O.update(tree, model, grads)


def optax_fn(opt):
    def step(state, model, grads):
        updates, state = opt.update(grads, state, model)
        return state, optax.apply_updates(model, updates)

    return step


def compile_cpu(f, *args):
    start = time.process_time()
    jax.jit(lambda *a: f(*a), donate_argnums=(0, 1)).trace(*args).lower().compile()
    return time.process_time() - start


def steps(f, state, model, grads, n):
    step = jax.jit(f, donate_argnums=(0, 1))
    state, model = step(state, model, grads)
    jax.block_until_ready(model)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        state, model = step(state, model, grads)
    jax.block_until_ready((state, model))
    return (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n


def kernels(model, grads):
    def count(f, *args):
        text = jax.jit(f, donate_argnums=(0, 1)).lower(*args).compile().as_text()
        return len(re.findall(r"^\s*%?(\S*fusion\S*) = ", text, re.M))

    opt = optax.adam(1e-3)
    print("fusions: ours", count(ours_fn, O.setup(O.Adam(1e-3), model), model, grads))
    print("fusions: optax", count(optax_fn(opt), opt.init(model), model, grads))
    jaxpr = jax.make_jaxpr(ours_fn)(O.setup(O.Adam(1e-3), model), model, grads).jaxpr
    count = len(jax.tree.leaves(model))
    print(f"per array: {len(jaxpr.eqns) / count:.1f} eqns, {len(jaxpr.invars) / count:.2f} inputs")


def compare(name, model, grads):
    opt = optax.adam(1e-3)
    data = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)
    ours_c, optax_c, data_c = [], [], []
    for _ in range(1 if name == "B" else 3):
        ours_c.append(compile_cpu(ours_fn, O.setup(O.Adam(1e-3), model), model, grads))
        optax_c.append(compile_cpu(optax_fn(opt), opt.init(model), model, grads))
        data_c.append(compile_cpu(optax_fn(data), data.init(model), model, grads))
    n = 20 if name == "B" else 50
    ours_s, optax_s = [], []
    for _ in range(3):
        m = jax.tree.map(jnp.copy, model)
        ours_s.append(steps(ours_fn, O.setup(O.Adam(1e-3), m), m, grads, n))
        m = jax.tree.map(jnp.copy, model)
        optax_s.append(steps(optax_fn(opt), opt.init(m), m, grads, n))
    wall = min(s[0] for s in ours_s) / min(s[0] for s in optax_s)
    cpu = min(s[1] for s in ours_s) / min(s[1] for s in optax_s)
    print(
        f"{name}: compile cpu ours {min(ours_c):.2f}s optax {min(optax_c):.2f}s "
        f"ratio {min(ours_c) / min(optax_c):.2f}, against inject_hyperparams(adam) "
        f"{min(data_c):.2f}s ratio {min(ours_c) / min(data_c):.2f} | step ratio wall {wall:.2f} "
        f"cpu {cpu:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    for name in sys.argv[1].split(","):
        spec = shape_spec(name.upper())
        model, grads = arrays(spec), arrays(spec, 1)
        if "--kernels" in sys.argv:
            kernels(model, grads)
        else:
            compare(name, model, grads)
