import sys, re; sys.path.insert(0, "benchmarks")
import jax, jax.numpy as jnp, numpy as np, optax, optimisers as O
from harness import shape_spec
sys.path.insert(0, "benchmarks"); from jax_compile_cpu import arrays, ours_fn, optax_fn
spec = shape_spec("GPT2"); m = arrays(spec); g = arrays(spec, 1)
def count(f, *a):
    txt = jax.jit(f, donate_argnums=(0, 1)).lower(*a).compile().as_text()
    fus = re.findall(r"^\s*%?(\S*fusion\S*) = ", txt, re.M)
    comps = re.findall(r"^fused_computation\S* ", txt, re.M)
    return len(fus), len(set(re.findall(r"calls=%?(\S+?)[,\s]", txt)))
print("ours", count(ours_fn, O.setup(O.Adam(1e-3), m), m, g))
opt = optax.adam(1e-3); print("optax", count(optax_fn(opt), opt.init(m), m, g))
eq = jax.make_jaxpr(ours_fn)(O.setup(O.Adam(1e-3), m), m, g)
print("eqns/array", len(eq.jaxpr.eqns) / len(jax.tree.leaves(m)), "inputs/array", len(eq.jaxpr.invars) / len(jax.tree.leaves(m)))
