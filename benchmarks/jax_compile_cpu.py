"""CPU-seconds compile and step of ours vs optax.adam (jit, donated), alternating, one process.
usage: PYTHONPATH=<tree>/src python jaxcmp.py gpt2,gpt12,gpt48,B"""
import sys, time, gc
sys.path.insert(0, "benchmarks")
import jax, jax.numpy as jnp, numpy as np, optax
import optimisers as O
from harness import shape_spec

def arrays(spec, seed=0):
    rng = np.random.default_rng(seed)
    def mk(s):
        if isinstance(s, dict): return {k: mk(v) for k, v in s.items()}
        if isinstance(s, list): return [mk(v) for v in s]
        return jnp.asarray(rng.standard_normal(s, dtype=np.float32) * 0.02)
    return mk(spec)

def ours_fn(tree, model, grads):
    return O.update(tree, model, grads)

def optax_fn(opt):
    def f(state, model, grads):
        upd, state = opt.update(grads, state, model)
        return state, optax.apply_updates(model, upd)
    return f

def compile_cpu(f, *args):
    t = time.process_time()
    jax.jit(lambda *a: f(*a), donate_argnums=(0, 1)).trace(*args).lower().compile()
    return time.process_time() - t

def steps(f, state, model, grads, n):
    g = jax.jit(f, donate_argnums=(0, 1))
    state, model = g(state, model, grads); jax.block_until_ready(model)
    t = time.perf_counter(); c = time.process_time()
    for _ in range(n):
        state, model = g(state, model, grads)
    jax.block_until_ready((state, model))
    return (time.perf_counter() - t) / n, (time.process_time() - c) / n

for name in (sys.argv[1].split(",") if __name__ == "__main__" else []):
    spec = shape_spec(name.upper() if name in ("B",) else name.upper())
    model = arrays(spec); grads = arrays(spec, 1)
    opt = optax.adam(1e-3)
    co, cx = [], []
    for r in range(1 if name == "B" else 3):
        co.append(compile_cpu(ours_fn, O.setup(O.Adam(1e-3), model), model, grads))
        cx.append(compile_cpu(optax_fn(opt), opt.init(model), model, grads))
    n = 20 if name == "B" else 50
    so, sx = [], []
    for r in range(3):
        m = jax.tree.map(jnp.copy, model)
        so.append(steps(ours_fn, O.setup(O.Adam(1e-3), m), m, grads, n))
        m = jax.tree.map(jnp.copy, model)
        sx.append(steps(optax_fn(opt), opt.init(m), m, grads, n))
    print(f"{name}: compile cpu ours {min(co):.2f}s optax {min(cx):.2f}s ratio {min(co)/min(cx):.2f} | "
          f"step wall ratio {min(s[0] for s in so)/min(s[0] for s in sx):.2f} cpu ratio "
          f"{min(s[1] for s in so)/min(s[1] for s in sx):.2f} (ours {min(s[0] for s in so)*1e3:.2f} ms)", flush=True)
