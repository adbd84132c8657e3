"""The benchmark's contestants: one Adam step of ours and of each peer, the bandwidth
kernels, destructure and setup, and a sanity check that each takes real Adam steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness import LR, Row, first, log, numpy_model, tleaves, tmap

JAX_FLOOR = ("jitted SGD step (floor)", "Adam, flat state (sketch)")  # --jax-floor rows


# --- contestants: one Adam step ---------------------------------------------------------------

def scheduled(o: Any) -> Any:
    """Adam whose learning rate is a warmup-cosine schedule (long, so that it stays near LR)."""
    return o.Adam(eta=o.Warmup(o.Cosine(LR, LR / 10, 10**7), 1, LR))


def numpy_rows(o: Any, x0: Any, g: Any) -> list[Row]:
    import numpy as np

    def ours(rule: Callable) -> Callable[[], Callable]:
        def build() -> Callable:
            model = tmap(np.copy, x0)
            tree = o.setup(rule(), model)
            return lambda: o.update_(tree, model, g)
        return build

    return [Row("ours numpy", "numpy", ours(lambda: o.Adam(LR))),
            Row("ours numpy, scheduled eta", "numpy", ours(lambda: scheduled(o))),
            Row("numpy loop", "numpy", lambda: adam_loop(x0, g)[0])]


def adam_loop(x0: Any, g: Any) -> tuple[Callable[[], None], list]:
    """The NumPy peer: a Python loop over the arrays, Adam by in-place ufuncs (``out=``) with
    one preallocated scratch buffer. Returns the step and the parameter arrays."""
    import numpy as np

    xs = [a.copy() for a in tleaves(x0)]
    gs = tleaves(g)
    ms = [np.zeros_like(a) for a in xs]
    vs = [np.zeros_like(a) for a in xs]
    scratch = np.empty(max(a.size for a in xs), np.float32)
    tmps = [scratch[:a.size].reshape(a.shape) for a in xs]
    b1, b2, eps = 0.9, 0.999, 1e-8
    t = [0]

    def step() -> None:
        t[0] += 1
        c1, c2 = 1 - b1 ** t[0], 1 - b2 ** t[0]
        lr, rc2, f1, f2 = LR / c1, 1 / c2 ** 0.5, 1 - b1, 1 - b2
        for x, gi, m, v, tmp in zip(xs, gs, ms, vs, tmps):
            np.multiply(m, b1, out=m)          # m = b1 m + (1-b1) g
            np.multiply(gi, f1, out=tmp)
            np.add(m, tmp, out=m)
            np.multiply(v, b2, out=v)          # v = b2 v + (1-b2) g^2
            np.multiply(gi, gi, out=tmp)
            np.multiply(tmp, f2, out=tmp)
            np.add(v, tmp, out=v)
            np.sqrt(v, out=tmp)                # x -= lr/c1 * m / (sqrt(v/c2) + eps)
            np.multiply(tmp, rc2, out=tmp)
            np.add(tmp, eps, out=tmp)
            np.divide(m, tmp, out=tmp)
            np.multiply(tmp, lr, out=tmp)
            np.subtract(x, tmp, out=x)

    return step, xs


def bandwidth_rows(n: int, use_torch: bool) -> list[Row]:
    """Streaming kernels over flat arrays of ``n`` float32: their GB/s give the floor. The
    adds work in place (``a += b``), reading and writing the same lines as Adam does, so
    the bytes they move are exactly the 12 per element counted (no write-allocate)."""
    import numpy as np

    def arrays() -> tuple:
        a = np.random.default_rng(1).standard_normal(n, dtype=np.float32)
        return a, a[::-1].copy(), np.empty_like(a)

    def copyto() -> Callable:
        a, _, out = arrays()
        return lambda: np.copyto(out, a)

    def add() -> Callable:
        a, b, _ = arrays()
        return lambda: np.add(a, b, out=a)

    def tadd() -> Callable:
        import torch

        a, b, _ = (torch.from_numpy(v) for v in arrays())
        return lambda: a.add_(b)

    rows = [Row("bw np.copyto", "numpy", copyto), Row("bw numpy a += b", "numpy", add)]
    if use_torch:
        rows.append(Row("bw torch a.add_(b)", "torch", tadd))
    return rows


BW_BYTES = {"bw np.copyto": 8, "bw numpy a += b": 12, "bw torch a.add_(b)": 12}


def torch_module(torch: Any, params: Any) -> Any:
    """An ``nn.Module`` mirroring nested dicts/lists of ``nn.Parameter``s."""
    nn = torch.nn
    if isinstance(params, dict):
        m = nn.Module()
        for k, v in params.items():
            setattr(m, k, torch_module(torch, v) if isinstance(v, (dict, list)) else v)
        return m
    if all(isinstance(v, nn.Parameter) for v in params):
        return nn.ParameterList(params)
    return nn.ModuleList([torch_module(torch, v) for v in params])


def torch_on(device: str) -> tuple[Callable[[Any], Any], Callable[[], None]]:
    """How to put a NumPy array on ``device`` as a tensor (on the CPU, sharing its memory),
    and how to wait for the work queued there (on a GPU, ``torch.cuda.synchronize``)."""
    import torch

    if torch.device(device).type == "cpu":
        return torch.from_numpy, lambda: None
    return (lambda a: torch.from_numpy(a).to(device)), lambda: torch.cuda.synchronize(device)


def torch_rows(o: Any, x0: Any, g: Any, device: str = "cpu",
               decay: float | None = None) -> list[Row]:
    """Our ``update_`` (on tensors, and on an ``nn.Module`` reading ``.grad``) against
    torch.optim's fused and foreach kernels, on ``device``: Adam, or with ``decay``, AdamW
    with that weight decay (the peers' rows then read ``AdamW``, and there is no scheduled
    row). On a GPU every step waits for its kernels."""
    import numpy as np
    import torch

    tensor, wait = torch_on(device)
    tg = tmap(tensor, g)  # on the CPU: shares memory with the NumPy gradients
    name = "Adam" if decay is None else "AdamW"

    def rule() -> Any:
        return o.Adam(LR) if decay is None else o.AdamW(LR, lambd=decay)

    def params() -> tuple[Any, list]:
        p = tmap(lambda a, gi: torch.nn.Parameter(tensor(np.copy(a))), x0, g)
        for pi, gi in zip(tleaves(p), tleaves(tg)):
            pi.grad = gi
        return p, tleaves(p)

    def ours(rule: Callable, module: bool = False) -> Callable[[], Callable]:
        def build() -> Callable:
            model = torch_module(torch, params()[0]) if module else tmap(
                lambda a: tensor(np.copy(a)), x0)
            tree = o.setup(rule(), model)
            grads = () if module else (tg,)  # a module: each parameter's .grad

            def step() -> None:
                with torch.no_grad():
                    o.update_(tree, model, *grads)
                wait()

            return step
        return build

    def peer(**kw: Any) -> Callable[[], Callable]:
        def build() -> Callable:
            decayed = {} if decay is None else {"weight_decay": decay}
            opt = getattr(torch.optim, name)(params()[1], lr=LR, **decayed, **kw)

            def step() -> None:
                opt.step()
                wait()

            return step

        return build

    rows = [Row("ours torch", "torch", ours(rule))]
    if decay is None:
        rows.append(Row("ours torch, scheduled eta", "torch", ours(lambda: scheduled(o))))
    return rows + [Row("ours torch nn.Module", "torch", ours(rule, module=True)),
                   Row(f"torch {name} fused", "torch", peer(fused=True)),
                   Row(f"torch {name} foreach", "torch", peer(foreach=True))]


CLIP_ROWS = ("ours clip + AdamW", "clip_grad_norm_ + AdamW fused")


def clip_rows(o: Any, x0: Any, g: Any, device: str = "cpu", decay: float = 0.01) -> list[Row]:
    """``OptimiserChain(ClipGlobalNorm(1.0), AdamW)`` through ``update_`` against
    ``clip_grad_norm_(params, 1.0, foreach=True)`` and ``torch.optim.AdamW(fused=True)``, on
    ``device``. Each row clips its own copy of the gradients (both clip in place)."""
    import numpy as np
    import torch

    tensor, wait = torch_on(device)

    def ours() -> Callable:
        model = tmap(lambda a: tensor(np.copy(a)), x0)
        grads = tmap(lambda a: tensor(np.copy(a)), g)
        tree = o.setup(o.OptimiserChain(o.ClipGlobalNorm(1.0), o.AdamW(LR, lambd=decay)),
                       model)

        def step() -> None:
            with torch.no_grad():
                o.update_(tree, model, grads)
            wait()

        return step

    def peer() -> Callable:
        ps = [torch.nn.Parameter(tensor(np.copy(a))) for a in tleaves(x0)]
        for p, gi in zip(ps, tleaves(g)):
            p.grad = tensor(np.copy(gi))
        opt = torch.optim.AdamW(ps, lr=LR, weight_decay=decay, fused=True)

        def step() -> None:
            torch.nn.utils.clip_grad_norm_(ps, 1.0, foreach=True)
            opt.step()
            wait()

        return step

    return [Row(CLIP_ROWS[0], "torch", ours), Row(CLIP_ROWS[1], "torch", peer)]


# --- contestants: one Muon step, one Adafactor step (--matrix) ----------------------------

MATRIX_ROWS = ("ours torch Muon", "torch.optim.Muon", "ours torch Adafactor",
               "torch.optim.Adafactor", "torch.optim.Adafactor foreach")


def matrix_rows(o: Any, x0: Any, g: Any) -> list[Row]:
    """Muon on the model's matrices and Adafactor on all its arrays, each with its
    defaults: ours on the tensors (``update_``) against ``torch.optim.Muon`` and
    ``torch.optim.Adafactor`` (its default for-loop, and ``foreach=True``)."""
    import numpy as np
    import torch

    tg = tmap(torch.from_numpy, g)

    def ours(rules: Any) -> Callable[[], Callable]:
        def build() -> Callable:
            model = tmap(lambda a: torch.from_numpy(np.copy(a)), x0)
            tree = o.setup(rules, model)

            def step() -> None:
                with torch.no_grad():
                    o.update_(tree, model, tg)

            return step

        return build

    def peer(cls: type, matrices: bool, **kw: Any) -> Callable[[], Callable]:
        def build() -> Callable:
            ps = [torch.nn.Parameter(torch.from_numpy(np.copy(a))) for a in tleaves(x0)]
            for p, gi in zip(ps, tleaves(tg)):
                p.grad = gi
            return cls([p for p in ps if p.ndim == 2 or not matrices], **kw).step

        return build

    return [Row("ours torch Muon", "torch",
                ours(lambda kp, x: o.Muon() if x.ndim == 2 else None)),
            Row("torch.optim.Muon", "torch", peer(torch.optim.Muon, True)),
            Row("ours torch Adafactor", "torch", ours(o.Adafactor())),
            Row("torch.optim.Adafactor", "torch", peer(torch.optim.Adafactor, False)),
            Row("torch.optim.Adafactor foreach", "torch",
                peer(torch.optim.Adafactor, False, foreach=True))]


def cache(f: Any) -> Callable[[], int]:
    """How many programs the jitted ``f`` has compiled, for ``Row.compiled``."""
    return lambda: f._cache_size() if hasattr(f, "_cache_size") else 1


KEPT = " kept"  # the suffix of the JAX rows that do not donate (--donation both)


def jax_rows(o: Any, x0: Any, g: Any, donate: bool, suffix: str = "") -> list[Row]:
    """Our jitted update and optax's, donating the tree and model (params and state) or
    not; ``suffix`` ends the rows' names."""
    import jax
    import jax.numpy as jnp

    jg = tmap(jnp.asarray, g)
    dn = (0, 1) if donate else ()

    f_ours = jax.jit(lambda t, m, gr: o.update(t, m, gr), donate_argnums=dn)

    def ours() -> Callable:
        model = tmap(lambda a: jnp.array(a), x0)
        box = [o.setup(o.Adam(LR), model), model]

        def step() -> None:
            box[0], box[1] = f_ours(box[0], box[1], jg)
            first(box[1]).block_until_ready()

        return step

    rows = [Row("ours jax (jit)" + suffix, "jax", ours, cache(f_ours))]
    try:
        import optax
    except ImportError:
        log("optax is not installed: its row is skipped")
        return rows
    opt = optax.adam(LR)
    f_optax = jax.jit(optax_step(opt), donate_argnums=dn)

    def peer() -> Callable:
        p = tmap(lambda a: jnp.array(a), x0)
        box = [p, opt.init(p)]

        def step() -> None:
            box[0], box[1] = f_optax(box[0], box[1], jg)
            first(box[0]).block_until_ready()

        return step

    rows.append(Row("optax.adam (jit)" + suffix, "jax", peer, cache(f_optax)))
    return rows


def optax_step(opt: Any) -> Callable[[Any, Any, Any], tuple]:
    """``(params, state, grads) -> (params, state)``: one step of the optax optimiser ``opt``
    (its ``update``, then ``optax.apply_updates``), for ``jax.jit``."""
    import optax

    def step(p: Any, s: Any, gr: Any) -> tuple:
        u, s = opt.update(gr, s, p)
        return optax.apply_updates(p, u), s

    return step


FIRST = ("ours torch", "torch.optim", "ours jax", "optax")  # first_step's contestants


def first_step(o: Any, who: str, x0: Any, g: Any, device: str) -> float:
    """Seconds that the first step in this process takes, with its set-up: ``who`` is one of
    ``FIRST``: ``setup(AdamW)`` and ``update_`` on tensors; ``torch.optim.AdamW(fused=True)``
    and its ``step``; ``setup(Adam)`` and the first call of the jitted, donated ``update``;
    ``optax.adam``'s ``init`` and its first jitted, donated step. The model and gradients
    are on ``device`` (torch's, or JAX's platform) before the clock starts. Run it in a
    fresh process: a second call finds what the first one left (compiled, loaded)."""
    import time

    import numpy as np

    if who in FIRST[:2]:
        import torch

        tensor, wait = torch_on(device)
        xs, gs = [tensor(np.copy(a)) for a in tleaves(x0)], [tensor(a) for a in tleaves(g)]
        wait()
        t0 = time.perf_counter()
        if who == "ours torch":
            with torch.no_grad():
                o.update_(o.setup(o.AdamW(LR, lambd=0.01), xs), xs, gs)
        else:
            ps = [torch.nn.Parameter(x) for x in xs]
            for p, gi in zip(ps, gs):
                p.grad = gi
            torch.optim.AdamW(ps, lr=LR, weight_decay=0.01, fused=True).step()
        wait()
        return time.perf_counter() - t0
    import jax

    with jax.default_device(jax.devices(device)[0]):
        model, jg = tmap(jax.numpy.array, x0), tmap(jax.numpy.asarray, g)
        jax.block_until_ready((model, jg))
        t0 = time.perf_counter()
        if who == "ours jax":
            tree = o.setup(o.Adam(LR), model)
            out = jax.jit(o.update, donate_argnums=(0, 1))(tree, model, jg)
        else:
            import optax

            opt = optax.adam(LR)
            out = jax.jit(optax_step(opt), donate_argnums=(0, 1))(model, opt.init(model), jg)
        jax.block_until_ready(out)
        return time.perf_counter() - t0


def jax_floor_rows(x0: Any, g: Any, donate: bool) -> list[Row]:
    """Two jitted steps that are not the library (``--jax-floor``), to show where the JAX
    step's time and compile go: SGD on the same arrays, the least that any jitted step
    handing back every parameter costs; and Adam with its moments in one flat buffer for
    all arrays, a sketch of the cross-Leaf state layout that the contract's per-Leaf state
    rules out (CONTRACT.md section 2), kept to measure what that layout would gain."""
    import jax
    import jax.numpy as jnp

    jg = [jnp.asarray(a) for a in tleaves(g)]
    dn = (0,) if donate else ()

    f_sgd = jax.jit(lambda p, gr: [x - LR * d for x, d in zip(p, gr)], donate_argnums=dn)

    def sgd() -> Callable:
        box = [[jnp.array(a) for a in tleaves(x0)]]

        def step() -> None:
            box[0] = f_sgd(box[0], jg)
            box[0][0].block_until_ready()

        return step

    f_flat = jax.jit(flat_adam_step, donate_argnums=dn)

    def flat() -> Callable:
        state, starts = flat_adam_init([jnp.array(a) for a in tleaves(x0)])
        box = [state]

        def step() -> None:
            box[0] = f_flat(box[0], jg, starts)
            box[0][0][0].block_until_ready()

        return step

    return [Row("jitted SGD step (floor)", "jax", sgd, cache(f_sgd)),
            Row("Adam, flat state (sketch)", "jax", flat, cache(f_flat))]


def flat_adam_init(params: list) -> tuple[tuple, list]:
    """The state of ``flat_adam_step``, (params, m, v, t) with ``m`` and ``v`` flat, and
    where each array starts in them."""
    import jax.numpy as jnp
    import numpy as np

    sizes = [a.size for a in params]
    starts = [jnp.asarray(np.int32(i)) for i in np.cumsum([0, *sizes[:-1]])]
    m, v = (jnp.zeros(sum(sizes), params[0].dtype) for _ in range(2))
    return (params, m, v, jnp.zeros(())), starts


def flat_adam_step(s: tuple, gr: list, starts: list) -> tuple:
    """Adam over one flat buffer per moment. Each array's update is sliced from one flat
    step at ``starts``, given as run-time int32 scalars: as constants they would make every
    slice a different XLA kernel, and XLA's CPU compile costs ~12 ms per distinct kernel
    (identical kernels are compiled once). The flat step is materialised once
    (``optimization_barrier``), else XLA repeats the formula in every array's kernel."""
    import jax.numpy as jnp
    from jax import lax

    b1, b2, eps = 0.9, 0.999, 1e-8
    p, m, v, t = s
    flat_g = jnp.concatenate([d.ravel() for d in gr])
    m = b1 * m + (1 - b1) * flat_g
    v = b2 * v + (1 - b2) * flat_g * flat_g
    t = t + 1
    u = lax.optimization_barrier(LR * (m / (1 - b1**t)) / (jnp.sqrt(v / (1 - b2**t)) + eps))
    p = [x - lax.dynamic_slice_in_dim(u, i, x.size).reshape(x.shape) for x, i in zip(p, starts)]
    return p, m, v, t


# --- destructure and setup ------------------------------------------------------------------

def flatten_rows(o: Any, x0: Any, libs: set) -> list[Row]:
    import numpy as np

    rows: list[Row] = []

    def pair(lib: str, model_fn: Callable, block: Callable) -> None:
        def d() -> Callable:
            model = model_fn()
            return lambda: block(o.destructure(model)[0])

        def r() -> Callable:
            flat, re = o.destructure(model_fn())
            return lambda: block(first(re(flat)))

        rows.extend([Row(f"ours destructure {lib}", lib, d), Row(f"ours re(v) {lib}", lib, r)])

    if "numpy" in libs:
        pair("numpy", lambda: x0, lambda a: a)
    if "torch" in libs:
        import torch
        from torch.nn.utils import parameters_to_vector, vector_to_parameters

        def tmodel() -> Any:
            return tmap(lambda a: torch.from_numpy(np.copy(a)), x0)

        pair("torch", tmodel, lambda a: a)

        def p2v() -> Callable:
            ps = tleaves(tmodel())
            return lambda: parameters_to_vector(ps)

        def v2p() -> Callable:
            ps = tleaves(tmodel())
            v = parameters_to_vector(ps)
            return lambda: vector_to_parameters(v, ps)

        rows.extend([Row("parameters_to_vector", "torch", p2v),
                     Row("vector_to_parameters", "torch", v2p)])
    if "jax" in libs:
        import jax.numpy as jnp
        from jax.flatten_util import ravel_pytree

        def jmodel() -> Any:
            return tmap(jnp.asarray, x0)

        def ready(a: Any) -> Any:
            return a.block_until_ready()

        pair("jax", jmodel, ready)

        def rav() -> Callable:
            model = jmodel()
            return lambda: ready(ravel_pytree(model)[0])

        def unrav() -> Callable:
            flat, un = ravel_pytree(jmodel())
            return lambda: ready(first(un(flat)))

        rows.extend([Row("ravel_pytree", "jax", rav), Row("unravel(v)", "jax", unrav)])
    return rows


def setup_rows(o: Any, x0: Any, libs: set) -> list[Row]:
    import numpy as np

    def ours(model_fn: Callable, block: Callable) -> Callable[[], Callable]:
        def build() -> Callable:
            model = model_fn()
            return lambda: block(o.setup(o.Adam(LR), model))

        return build

    def zeros() -> Callable:
        xs = tleaves(x0)
        return lambda: [(np.zeros_like(a), np.zeros_like(a)) for a in xs]

    rows = []
    if "numpy" in libs:
        rows += [Row("ours setup numpy", "numpy", ours(lambda: x0, lambda t: t)),
                 Row("2 x np.zeros_like", "numpy", zeros)]
    if "torch" in libs:
        import torch

        rows.append(Row("ours setup torch", "torch",
                        ours(lambda: tmap(torch.from_numpy, x0), lambda t: t)))
    if "jax" in libs:
        import jax
        import jax.numpy as jnp

        def jmodel() -> Any:
            return tmap(jnp.asarray, x0)

        def block(t: Any) -> Any:
            return jax.block_until_ready(t)

        rows.append(Row("ours setup jax", "jax", ours(jmodel, block)))
        try:
            import optax

            def oinit() -> Callable:
                p, opt = jmodel(), optax.adam(LR)
                return lambda: block(opt.init(p))

            rows.append(Row("optax.adam init", "jax", oinit))
        except ImportError:
            pass
    return rows


# --- sanity: the timed code really takes Adam steps ---------------------------------------

def sanity(o: Any, libs: set, donate: bool, flat: bool = False) -> str:
    """Three steps of each contestant on a small model, against Adam in float64: the largest
    absolute difference of the parameters (float32 rounding is ~1e-9 here)."""
    import numpy as np

    spec = {"w": (64, 32), "b": [(512,), (7,)]}
    x0, g = numpy_model(spec, 5), numpy_model(spec, 6, grad=True)
    b1, b2, eps = 0.9, 0.999, 1e-8
    ref_tree = tmap(lambda a: a.astype(np.float64), x0)
    ref = tleaves(ref_tree)
    ms = [np.zeros_like(a) for a in ref]
    vs = [np.zeros_like(a) for a in ref]
    for t in range(1, 4):
        for x, gi, m, v in zip(ref, tleaves(g), ms, vs):
            m[...] = b1 * m + (1 - b1) * gi
            v[...] = b2 * v + (1 - b2) * gi.astype(np.float64) ** 2
            x -= LR * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)

    def err(model: Any) -> float:
        if isinstance(model, dict):  # by key: JAX hands dicts back with their keys sorted
            model = tleaves(tmap(lambda r, a: a, ref_tree, model))
        return max(float(np.max(np.abs(np.asarray(a, np.float64) - r)))
                   for a, r in zip(model, ref))

    def ours_np() -> Any:
        model = tmap(np.copy, x0)
        tree = o.setup(o.Adam(LR), model)
        for _ in range(3):
            tree, model = o.update_(tree, model, g)
        return model

    def loop() -> Any:
        step, xs = adam_loop(x0, g)
        for _ in range(3):
            step()
        return xs

    cases: list[tuple[str, Callable]] = []
    if "numpy" in libs:
        cases += [("ours numpy", ours_np), ("numpy loop", loop)]
    if "torch" in libs:
        import torch

        def ours_torch() -> Any:
            model = tmap(lambda a: torch.from_numpy(np.copy(a)), x0)
            tree = o.setup(o.Adam(LR), model)
            with torch.no_grad():
                for _ in range(3):
                    tree, model = o.update_(tree, model, tmap(torch.from_numpy, g))
            return model

        def fused() -> Any:
            ps = [torch.nn.Parameter(torch.from_numpy(np.copy(a))) for a in tleaves(x0)]
            for p, gi in zip(ps, tleaves(g)):
                p.grad = torch.from_numpy(gi)
            opt = torch.optim.Adam(ps, lr=LR, fused=True)
            for _ in range(3):
                opt.step()
            return [p.detach().numpy() for p in ps]

        cases += [("ours torch", ours_torch), ("torch fused", fused)]
    if "jax" in libs:
        import jax
        import jax.numpy as jnp

        def ours_jax() -> Any:
            f = jax.jit(lambda t, m, gr: o.update(t, m, gr), donate_argnums=(0, 1) if donate
                        else ())
            model = tmap(jnp.array, x0)
            tree = o.setup(o.Adam(LR), model)
            for _ in range(3):
                tree, model = f(tree, model, tmap(jnp.asarray, g))
            return model

        cases.append(("ours jax", ours_jax))
        try:
            import optax

            def ox() -> Any:
                opt = optax.adam(LR)
                p = tmap(jnp.array, x0)
                st = opt.init(p)
                for _ in range(3):
                    u, st = opt.update(tmap(jnp.asarray, g), st, p)
                    p = optax.apply_updates(p, u)
                return p

            cases.append(("optax", ox))
        except ImportError:
            pass
        if flat:
            def flat_sketch() -> Any:
                s, starts = flat_adam_init([jnp.array(a) for a in tleaves(x0)])
                for _ in range(3):
                    s = jax.jit(flat_adam_step)(s, [jnp.asarray(a) for a in tleaves(g)], starts)
                return s[0]

            cases.append(("flat-state sketch", flat_sketch))
    parts = []
    for name, fn in cases:
        try:
            e = err(fn())
            parts.append(f"{name} {e:.1e}" + (" MISMATCH" if e > 1e-5 else ""))
        except Exception as ex:  # noqa: BLE001
            parts.append(f"{name} error ({type(ex).__name__})")
    return ("sanity, max |x - x_float64| after 3 Adam steps on a small model: "
            + ", ".join(parts))
