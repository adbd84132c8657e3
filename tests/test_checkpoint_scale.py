"""Loading a checkpoint costs the same per array at any size: the .npy headers that the
arrays share are parsed once, not once per array (issue 28: load linear in the arrays)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from optimisers import Adam, load, save, setup


@pytest.mark.parametrize("n", [200, 2000])
def test_load_parses_each_distinct_header_once(n: int, tmp_path: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    model = {f"w{i}": np.full(8, float(i), np.float32) for i in range(n)}
    tree = setup(Adam(), model)
    path = os.path.join(tmp_path, "opt.ckpt")
    save(path, tree)
    calls = []
    for name in ("read_array_header_1_0", "read_array_header_2_0"):
        real = getattr(np.lib.format, name)
        monkeypatch.setattr(np.lib.format, name,
                            lambda f, *a, _real=real, **k: calls.append(1) or _real(f, *a, **k))
    back = load(path, like=setup(Adam(), model))
    assert len(calls) <= 4  # a float32 (8,) header, the same for every moment array
    assert all(np.array_equal(back[k].state[0], tree[k].state[0]) for k in model)
