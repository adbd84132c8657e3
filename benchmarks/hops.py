"""How many files, file-to-file hops and calls of ``optimisers`` one steady-state
``update_`` makes (issue 17's measure of how far a reader must follow a step).

    python benchmarks/hops.py [numpy|torch]
"""

from __future__ import annotations

import os
import sys

import numpy as np

import optimisers as O

ROOT = os.path.dirname(O.__file__)


def model_of(lib: str) -> tuple:
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(64, 64)).astype(np.float32) for _ in range(8)]
    if lib == "torch":
        import torch

        model = [torch.tensor(a) for a in arrays]
        grads = [torch.ones_like(t) for t in model]
    else:
        model, grads = arrays, [np.ones_like(a) for a in arrays]
    return model, grads


def count(lib: str = "numpy") -> tuple[list, int, int]:
    """``(files, hops, calls)`` of the third ``update_`` of Adam on 8 arrays."""
    model, grads = model_of(lib)
    tree = O.setup(O.Adam(), model)
    for _ in range(2):
        O.update_(tree, model, grads)
    files: list = []
    seen = {"calls": 0, "hops": 0, "last": None}

    def profile(frame, event, arg):
        if event != "call":
            return
        name = frame.f_code.co_filename
        if not name.startswith(ROOT):
            return
        rel = os.path.relpath(name, ROOT)
        seen["calls"] += 1
        caller = frame.f_back.f_code.co_filename if frame.f_back else None
        if caller != name and caller is not None and caller.startswith(ROOT):
            seen["hops"] += 1
        if rel not in files:
            files.append(rel)

    sys.setprofile(profile)
    try:
        O.update_(tree, model, grads)
    finally:
        sys.setprofile(None)
    return files, seen["hops"], seen["calls"]


if __name__ == "__main__":
    lib = sys.argv[1] if len(sys.argv) > 1 else "numpy"
    files, hops, calls = count(lib)
    print(f"{lib}: {len(files)} files, {hops} hops between them, {calls} calls")
    print("  " + " -> ".join(files))
