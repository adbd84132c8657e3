"""The guard on XLA's FFI layout (``fast/ffi.py``): the XLA custom calls of
``fast/xla.py`` read XLA's C structures by offset, so a probe checks once per process
that XLA passes them as tested. Here it passes and the custom call runs; with the tested
layout changed (as a JAX with other structures would show it), the check fires: one
warning, no custom call, the plain path's results. The probe's verdict is kept for the
process, so each of those runs in a new Python process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from optimisers.fast import ffi, kernels  # noqa: E402

pytestmark = pytest.mark.skipif(not kernels.available() or jax.default_backend() != "cpu",
                                reason="needs numba, and JAX on the CPU")

# Adam steps under jax.jit, with the tested layout changed as argv[1] says; prints how many
# custom calls the step makes, the warnings, and whether its results are the plain path's.
_CHILD = """
import json, sys, warnings
import numpy as np
import jax, jax.numpy as jnp
import optimisers as O
from optimisers.fast import ffi, xla

ffi.TESTED = ffi.TESTED._replace(**json.loads(sys.argv[1]))


def steps(large):
    xla.LARGE = large
    f = jax.jit(lambda t, m, g: O.update(t, m, g))
    rng = np.random.default_rng(0)
    model = {"w": jnp.asarray(rng.normal(size=(8, 16)), jnp.float32),
             "b": [jnp.asarray(rng.normal(size=100), jnp.float32) for _ in range(2)]}
    tree = O.setup(O.Adam(0.01), model)
    calls = None
    for k in range(3):
        g = jax.tree.map(lambda a: jnp.full(a.shape, 0.1 * (k + 1), a.dtype), model)
        if calls is None:
            calls = f.lower(tree, model, g).as_text().count("optimisers_onepass")
        tree, model = f(tree, model, g)
    return calls, [np.asarray(a) for a in jax.tree.leaves((tree, model))]


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    calls, fused = steps(64)
    again, _ = steps(64)  # a second jitted step: no second warning
plain = steps(10**12)[1]
print(json.dumps({
    "calls": [calls, again],
    "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
    "equal": all(np.array_equal(a, b) for a, b in zip(fused, plain, strict=True)),
    "close": all(np.allclose(a, b, rtol=1e-5, atol=1e-6)
                 for a, b in zip(fused, plain, strict=True)),
}))
"""


def child(patch: dict, timeout: float = 300) -> dict:
    """The child's report, for the tested layout changed by ``patch``."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD), json.dumps(patch)],
                              capture_output=True, text=True, timeout=timeout, env=os.environ)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the process did not finish in {timeout} s:\n{err.stdout}\n{err.stderr}")
    assert done.returncode == 0, f"exit status {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_probe_finds_the_tested_layout_here():
    assert ffi.differences() == ()
    assert ffi.differences() == ()  # kept: the probe runs once


def test_the_custom_call_runs_where_the_layout_is_the_tested_one():
    report = child({})
    assert report["warnings"] == []
    assert report["calls"][0] > 0 and report["calls"][1] > 0
    assert report["close"]


@pytest.mark.parametrize(("patch", "named"), [
    # the call frame's size: the metadata is not answered, XLA refuses the registration
    ({"frame": 176}, r"the probe failed: .*API version \(0\.0\)"),
    # the execute stage's code: the probe never writes its record
    ({"execute": 2}, "the probe read nothing"),
    # a code the probe reads and Python compares
    ({"f64": 99}, r"0-d dtype 12 \(tested 99\)"),
], ids=["frame size", "stage", "dtype code"])
def test_a_layout_other_than_the_tested_one_turns_the_custom_call_off(patch, named):
    report = child(patch)
    assert len(report["warnings"]) == 1, report["warnings"]
    message = report["warnings"][0]
    assert "is not the layout the custom calls were tested with" in message
    assert "The plain path runs" in message
    assert re.search(named, message), message
    assert report["calls"] == [0, 0]
    assert report["equal"]


def test_the_comparison_names_each_difference():
    expected = [np.nan if v is None else v for v in ffi._expected()]
    record = np.asarray(expected, np.float32)
    record[ffi.FIELDS.index("API minor version")] = 7  # read, not compared
    assert ffi._compare(record) == ()
    record[0] = 176
    record[ffi.FIELDS.index("array dims[1]")] = -1
    assert ffi._compare(record) == ("call frame struct_size 176 (tested 168)",
                                     "array dims[1] unread (tested 3)")
    assert "read nothing" in ffi._compare(np.full(len(ffi.FIELDS), -1, np.float32))[0]
