"""The compiled kernels as a process meets them (``fast/jit.py``, ``fast/kernels.py``,
``fast/ufuncs.py``, ``fast/xla.py``): they survive ``fork``, load from the disk cache in a new
process instead of compiling, and refuse any array they would index by a size they did
not check. Whatever may hang or kill a process runs in a subprocess with a time limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
import warnings

import numpy as np
import pytest

import optimisers as O
from optimisers.fast import fused, jit, kernels, trace, ufuncs

HAVE_NUMBA = kernels.available()
needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed")
needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path, monkeypatch):
    """Kernels compiled by these tests go to a temporary cache directory."""
    monkeypatch.setenv(jit.ENV, str(tmp_path / "kernels"))
    return tmp_path / "kernels"


def run_script(source: str, *args: str, env: dict | None = None, timeout: float = 240) -> str:
    """Run ``source`` in a new Python process; its stdout. A hang, a kill or a failure
    fails the test (with the process's output) instead of the test run."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(source), *args],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the process did not finish in {timeout} s:\n{err.stdout}\n{err.stderr}")
    assert done.returncode == 0, f"exit status {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


# Each child runs under a deadline: the parent kills what is left and reports it, so that
# no hung child outlives the test.
_COMMON = """
import os, sys, threading, time
import numpy as np
import optimisers as O
from optimisers.fast import jit, kernels

if sys.argv[1] == "numpy":  # the thread pool of the NumPy path instead of numba's
    kernels._AVAILABLE = False
N = 1 << 19  # two of these: the parallel kernel, or the NumPy path's pool of threads


def model(value=1.0):
    return {"w": np.full(N, value, np.float32), "b": np.full(N, -value, np.float32)}


GRADS = {"w": np.full(N, 0.25, np.float32), "b": np.linspace(-1, 1, N, dtype=np.float32)}


def fork(child):
    pid = os.fork()
    if pid == 0:
        try:
            code = child()
        except BaseException as err:
            print("child failed:", repr(err), flush=True)
            code = 3
        os._exit(code)
    return pid


def wait(pids, limit=90.0):
    deadline, codes = time.monotonic() + limit, {}
    while len(codes) < len(pids) and time.monotonic() < deadline:
        for pid in set(pids) - set(codes):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    for pid in set(pids) - set(codes):
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        codes[pid] = "hung"
    return [codes[p] for p in pids]
"""

_THREAD_AND_CHILDREN = _COMMON + """
m = model()
tree = O.setup(O.Adam(), m)
O.update_(tree, m, GRADS)  # a parallel step before any fork
stop = threading.Event()


def steps():
    while not stop.is_set():
        O.update_(tree, m, GRADS)


def child():
    m2 = model(2.0)
    tree2 = O.setup(O.Adam(), m2)
    for _ in range(3):
        O.update_(tree2, m2, GRADS)
    return 0 if np.isfinite(m2["w"]).all() and (m2["w"] < 2).all() else 4


thread = threading.Thread(target=steps)
thread.start()
pids = []
for _ in range(3):
    time.sleep(0.05)
    pids.append(fork(child))
stop.set()
thread.join()
print(wait(pids))
"""

LAYERS = [pytest.param("numba", "", id="numba"),
          pytest.param("numba", "workqueue", id="numba-workqueue"),
          pytest.param("numpy", "", id="numpy")]


@needs_fork
@pytest.mark.parametrize("path,layer", LAYERS)
def test_forked_children_step_while_a_thread_steps_in_the_parent(path, layer):
    """Three children forked while a thread steps a large model (in the parallel kernel,
    holding its mutex, most of the time) each step a large model of their own: with
    numba's default layer (GNU OpenMP where TBB is missing), a fork-safe one, and the
    NumPy path's thread pool. Before: killed by GNU OpenMP, or blocked for ever."""
    if path == "numba" and not HAVE_NUMBA:
        pytest.skip("numba is not installed")
    env = {"NUMBA_THREADING_LAYER": layer} if layer else {}
    assert run_script(_THREAD_AND_CHILDREN, path, env=env).split() == ["[0,", "0,", "0]"]


_AFTER_A_PARALLEL_STEP = _COMMON + """
m = model()
tree = O.setup(O.Adam(), m)
O.update_(tree, m, GRADS)  # starts the thread pool (GNU OpenMP: the child may not use it)
out = sys.argv[2]


def child():  # steps the parent's tree, with the group (and kernel) the parent made
    O.update_(tree, m, GRADS)
    np.save(out, m["w"] + m["b"])
    return 0


codes = wait([fork(child)])
O.update_(tree, m, GRADS)
same = codes == [0] and (np.load(out) == m["w"] + m["b"]).all()
print(codes, "same" if same else "differs")
"""


@needs_fork
@pytest.mark.parametrize("path,layer", LAYERS)
def test_child_forked_after_a_parallel_step(path, layer, tmp_path):
    """A child forked after a parallel step takes the next step of the parent's tree and
    gets the very bits the parent then gets. Before: killed by GNU OpenMP."""
    if path == "numba" and not HAVE_NUMBA:
        pytest.skip("numba is not installed")
    env = {"NUMBA_THREADING_LAYER": layer} if layer else {}
    out = run_script(_AFTER_A_PARALLEL_STEP, path, str(tmp_path / "child.npy"), env=env)
    assert out.split() == ["[0]", "same"]


_HELD = _COMMON + """
m = model()
tree = O.setup(O.Adam(), m)
O.update_(tree, m, GRADS)
held = threading.Event()


def hold():  # as a parallel kernel does while it runs
    jit._PTHREAD.lock(jit._PTHREAD.memory)
    held.set()
    time.sleep(0.5)
    jit._PTHREAD.unlock(jit._PTHREAD.memory)


thread = threading.Thread(target=hold)
thread.start()
held.wait()
pid = fork(lambda: (O.update_(tree, m, GRADS), 0)[1])
thread.join()
print(wait([pid]))
"""


@needs_fork
@needs_numba
def test_fork_while_a_thread_holds_the_kernel_mutex():
    """The process forks while another thread holds the parallel kernels' mutex; the
    child's parallel step (on a fork-safe threading layer) must not block on it. Before:
    the child inherited the mutex locked and hung."""
    if not jit.MUTEX:
        pytest.skip("no pthread mutex here")
    out = run_script(_HELD, "numba", env={"NUMBA_THREADING_LAYER": "workqueue"})
    assert out.split() == ["[0]"]


_FIRST_STEPS = """
import json, sys
import numpy as np
from numba.core import event
import optimisers as O

compiles = []


class Count(event.Listener):
    def on_start(self, ev):
        compiles.append(ev.data["dispatcher"].py_func.__name__)

    def on_end(self, ev):
        pass


event.register("numba:compile", Count())
rng = np.random.default_rng(0)
models = {"parallel": [rng.normal(size=1 << 18).astype(np.float32) for _ in range(2)],
          "small": [rng.normal(size=8) for _ in range(100)]}
for rule in (O.Adam(), O.RAdam()):  # a one-pass kernel; scatter_sub (RAdam branches: no kernel)
    for model in models.values():
        tree = O.setup(rule, model)
        O.update_(tree, model, [np.ones_like(x) for x in model])
if sys.argv[1] == "jax":  # the XLA custom call, its handler and helpers
    import jax
    import jax.numpy as jnp
    model = [jnp.ones(1 << 16), jnp.ones(1 << 16)]
    jax.jit(O.update)(O.setup(O.Adam(), model), model, [jnp.ones(1 << 16)] * 2)
print(json.dumps(compiles))
"""


@needs_numba
@pytest.mark.parametrize("library", ["numpy", "jax"])
def test_a_second_process_compiles_no_kernel(library, kernel_cache):
    """The first process compiles its kernels into the cache directory; a second one's
    first steps load them and compile nothing. Before: every process compiled."""
    if library == "jax":
        jax = pytest.importorskip("jax")
        if jax.default_backend() != "cpu":
            pytest.skip("the custom call runs on the CPU only")
    first = json.loads(run_script(_FIRST_STEPS, library))
    second = json.loads(run_script(_FIRST_STEPS, library))
    assert "kernel" in first and "scatter_sub" in first
    if library == "jax":
        assert "run" in first  # (a numba cfunc, the handler, reports no compile event)
    assert second == []
    assert any(name.startswith("kernel_") for name in os.listdir(kernel_cache))


@needs_numba
def test_cache_directory_is_chosen_by_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(jit.ENV, "")
    assert jit.cache_dir() is None
    monkeypatch.setenv(jit.ENV, str(tmp_path / "here"))
    assert jit.cache_dir() == str(tmp_path / "here")
    monkeypatch.delenv(jit.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jit.cache_dir() == str(tmp_path / "xdg" / "optimisers")


@needs_numba
def test_a_cached_kernel_is_named_by_everything_it_depends_on(kernel_cache):
    """The same source compiled with other options or other globals is another file:
    numba's own cache index would not tell them apart."""
    source = "def f(a):\n    for i in range(a.size):\n        a[i] += K\n"
    made = [jit.compiled(source, "f", {"K": k}, **options)
            for k, options in [(1.0, {}), (2.0, {}), (1.0, {"nogil": True})]]
    for k, f in zip((1.0, 2.0, 1.0), made):
        a = np.zeros(3)
        f(a)
        assert a.tolist() == [k] * 3
    assert len([p for p in os.listdir(kernel_cache) if p.endswith(".py")]) == 3
    with pytest.raises(TypeError, match="'g'.*tag"):
        jit.compiled(source, "f", {"K": 1.0, "g": object()})


# ------------------------------------------------- no kernel indexes by an unchecked size

def group(rule, shapes, dtype=np.float32):
    """``(sig, xs, arrays)`` of a group of fresh Leafs of ``rule`` (as fused.Group has)."""
    xs = [np.ones(shape, dtype) for shape in shapes]
    arrays, sig = [], None
    for x in xs:
        out: list = []
        sig = fused.signature(rule.init(x), out)
        arrays.append(out)
    return sig, xs, arrays


MISFITS = {
    "longer state": lambda xs, arrays: arrays[1].__setitem__(0, np.zeros(70, np.float32)),
    "shorter state": lambda xs, arrays: arrays[0].__setitem__(1, np.zeros(3, np.float32)),
    "float64 state": lambda xs, arrays: arrays[0].__setitem__(0, np.zeros(64)),
    "scalar state": lambda xs, arrays: arrays[1].__setitem__(1, np.float32(0)),
    "missing state": lambda xs, arrays: arrays[1].pop(),
    "extra state": lambda xs, arrays: arrays[0].append(np.zeros(64, np.float32)),
}


@pytest.mark.parametrize("misfit", MISFITS)
@pytest.mark.parametrize("builder", [
    pytest.param(kernels.onepass, marks=needs_numba, id="numba"),
    pytest.param(ufuncs.onepass, id="ufuncs")])
def test_one_pass_steps_refuse_states_that_do_not_fit(builder, misfit, monkeypatch):
    """Each state array must have its parameter's size and the kernel's dtype, and each
    parameter as many state arrays as the rule reads: else no kernel (the caller takes
    the plain path). Before: the kernel indexed the state by its parameter's size."""
    monkeypatch.setattr(ufuncs, "LARGE", 1)
    sig, xs, arrays = group(O.Adam(), [(8, 8), (64,)])
    assert builder(O.Adam(), sig, xs, arrays) is not None
    MISFITS[misfit](xs, arrays)
    assert builder(O.Adam(), sig, xs, arrays) is None


@pytest.mark.parametrize("builder", [
    pytest.param(kernels.onepass, marks=needs_numba, id="numba"),
    pytest.param(ufuncs.onepass, id="ufuncs")])
@pytest.mark.parametrize("many", [False, True], ids=["few", "many"])
def test_one_pass_steps_refuse_gradients_that_do_not_fit(builder, many, monkeypatch):
    """A gradient of another size is a ValueError before anything is written, whether
    the gradients are read in place or concatenated first (many small arrays)."""
    monkeypatch.setattr(ufuncs, "LARGE", 1)
    sig, xs, arrays = group(O.Momentum(), [(4, 4)] * (100 if many else 2))
    step = builder(O.Momentum(), sig, xs, arrays)
    assert step is not None
    before = [a.copy() for a in (*xs, *(s for member in arrays for s in member))]
    for grads in ([np.ones(16, np.float32)] * (len(xs) - 1) + [np.ones(17, np.float32)],
                  [np.ones(16, np.float32)] * (len(xs) - 1)):
        with pytest.raises(ValueError, match="gradient"):
            step(grads, sig, O.Momentum())
    after = [*xs, *(s for member in arrays for s in member)]
    assert all((a == b).all() for a, b in zip(before, after))
    step([np.ones(16, np.float32)] * len(xs), sig, O.Momentum())
    assert (xs[0] == np.float32(1 - 0.01)).all()


@needs_numba
def test_scatter_sub_refuses_a_step_of_another_length():
    xs = [np.ones(3), np.ones(4)]
    kernel = kernels.scatter_sub(xs)
    with pytest.raises(ValueError, match="7"):
        kernel(np.ones(8))
    assert all((x == 1).all() for x in xs)
    kernel(np.arange(7.0))
    assert xs[1].tolist() == [-2.0, -3.0, -4.0, -5.0]
    assert kernels.scatter_sub([np.ones(3), np.float64(1.0)]) is None


@needs_numba
def test_a_kernel_is_built_only_for_the_states_its_rule_reads():
    program = trace.trace(O.Adam(), (fused.ARRAY, fused.ARRAY, 0.0))
    assert program.nstate == 2
    with pytest.raises(ValueError, match="1 state arrays for a rule reading 2"):
        kernels.build(program.lines, 1, False, np.float32, kernels.constants(program))


@needs_numba
def test_xla_call_refuses_a_state_that_does_not_fit():
    """Under jit, a Leaf whose first moment is a 0-d array (a state built by hand) is left
    to the plain path, quietly. Before: the kernel was built for the states that fit and
    failed to compile (a warning, and the kind of group marked unusable)."""
    jax = pytest.importorskip("jax")
    from optimisers.backends import jax as jax_backend  # noqa: F401 (rules: pytrees)
    from optimisers.fast import xla

    if jax.default_backend() != "cpu" or not xla._usable():
        pytest.skip("the custom call runs on the CPU with jax.ffi only")
    n = xla.LARGE

    def entries(x, g, m, v):
        return [types.SimpleNamespace(x=x, grads=(g,), leaf=O.Leaf(O.Adam(), (m, v, 0.0)))
                for _ in range(2)]

    def step(x, g, m, v):
        found = entries(x, g, m, v)
        rest, done = xla.fuse(found)
        assert rest == found and done == []
        return x

    ones = jax.numpy.ones(n)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.jit(step)(ones, ones, jax.numpy.zeros(()), ones)
