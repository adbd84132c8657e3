"""update_ writes nothing unless every rule returned: user rules that raise, errors inside
fused groups naming their Leafs, one tree stepped from several threads, and a child
forked while a thread held that tree."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import optimisers as O
from optimisers.leaf import leaves


@dataclasses.dataclass(frozen=True)
class Picky(O.Rule):
    """A user rule that refuses a gradient above ``limit`` (it declares nothing)."""

    eta: float = 0.1
    limit: float = 10.0

    def init(self, x):
        return np.zeros_like(x)

    def apply(self, state, x, dx):
        if np.abs(dx).max() > self.limit:
            raise ValueError(f"gradient above {self.limit}")
        state[...] = state + dx  # written in place, as rules do
        return state, self.eta * dx


def test_a_user_rule_that_raises_mid_tree_leaves_everything_as_it_was():
    model = {k: np.ones(4) for k in "abcd"}
    tree = O.setup(Picky(), model)
    grads = {"a": np.ones(4), "b": np.ones(4), "c": np.full(4, 50.0), "d": np.ones(4)}
    with pytest.raises(ValueError, match=r"gradient above 10.0 \(in Picky.* at KeyPath\('c'\)"):
        O.update_(tree, model, grads)
    assert all((model[k] == 1).all() for k in "abcd")
    assert all((leaf.state == 0).all() for _, leaf in leaves(tree))
    tree, model = O.update_(tree, model, {k: np.ones(4) for k in "abcd"})
    assert all(np.allclose(model[k], 0.9) for k in "abcd")


def test_user_rules_may_say_they_never_raise():
    @dataclasses.dataclass(frozen=True)
    class Calm(Picky):
        def raises(self):
            return False

    assert Picky().raises() and not Calm().raises()
    assert not O.Adam().raises() and O.ClipNorm().raises()
    assert O.OptimiserChain(O.Descent(), Picky()).raises()


@dataclasses.dataclass(frozen=True)
class Fragile(O.Rule):
    """An elementwise user rule, declared not to raise, that does on a NaN gradient."""

    elementwise = True
    eta: float = 0.1

    def raises(self):
        return False

    def apply(self, state, x, dx):
        if np.isnan(dx).any():
            raise FloatingPointError("a NaN gradient")
        return state, self.eta * dx


def test_an_error_inside_a_fused_group_names_its_leafs():
    model = {k: np.ones(3) for k in "abc"}
    tree = O.setup(Fragile(), model)
    grads = {k: np.ones(3) for k in "abc"}
    for _ in range(2):  # the second step takes the cached whole-group path
        tree, model = O.update_(tree, model, grads)
    for bad in ({**grads, "b": np.full(3, np.nan)}, {"a": grads["a"], "b": np.full(3, np.nan)}):
        with pytest.raises(FloatingPointError) as info:
            O.update_(tree, model, bad)
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "fused over" in notes and "a, b" in notes, notes


def big_model(n=4, size=1 << 16):
    return [np.zeros(size, np.float32) for _ in range(n)]


def in_two_threads(step, times):
    """``step()`` ``times`` times in each of two threads started together."""
    start = threading.Barrier(2)

    def run():
        start.wait()
        for _ in range(times):
            step()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_one_tree_stepped_from_two_threads_loses_no_step():
    model = big_model()
    tree = O.setup(O.Descent(1.0), model)
    in_two_threads(lambda: O.update_(tree, model, [np.ones_like(x) for x in model]), 50)
    assert all((x == -100).all() for x in model)


def test_one_adam_tree_stepped_from_two_threads_counts_every_step():
    model = big_model()
    tree = O.setup(O.Adam(0.1), model)
    in_two_threads(lambda: O.update_(tree, model, [np.ones_like(x) for x in model]), 25)
    assert {leaf.state[2] for _, leaf in leaves(tree)} == {50.0}


FORKED = textwrap.dedent("""
    import dataclasses, os, threading, numpy as np
    import optimisers as O

    entered, release = threading.Event(), threading.Event()

    @dataclasses.dataclass(frozen=True)
    class Slow(O.Rule):
        def apply(self, state, x, dx):
            entered.set()
            release.wait(20)
            return state, 0.1 * dx

    model = [np.ones(3), np.ones(3)]
    tree = O.setup(Slow(), model)
    t = threading.Thread(target=O.update_, args=(tree, model, [np.ones(3), np.ones(3)]))
    t.start()
    entered.wait(20)  # the thread holds the tree's lock now
    pid = os.fork()
    if pid == 0:
        release.set()  # in the child no thread holds it: its own lock is new
        O.update_(tree, model, [np.ones(3), np.ones(3)])
        os._exit(0 if np.allclose(model[0], 0.9) else 3)
    _, status = os.waitpid(pid, 0)
    release.set()
    t.join()
    print("child", os.waitstatus_to_exitcode(status))
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_thread_steps_the_tree_can_step_it():
    done = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "child 0" in done.stdout, done.stderr[-2000:]


def test_a_tree_whose_first_child_holds_no_leaf_is_locked_and_planned(monkeypatch):
    """The tree's lock and plan live on its first Leaf, found depth first: a leading
    sub-tree without Leafs (a config) hid it, and steps from two threads were lost."""
    from optimisers import plan

    model = {"cfg": {"n": 3}, "w": big_model(2)}
    tree = O.setup(O.Adam(0.1), model)
    assert plan.first_leaf(tree) is tree["w"][0]
    in_two_threads(lambda: O.update_(tree, model, {"w": [np.ones_like(x) for x in model["w"]]}),
                   25)
    assert tree["w"][0].state[2] == 50.0


FORKED_MAKING = textwrap.dedent("""
    import os, numpy as np
    import optimisers as O
    from optimisers import state
    model = [np.ones(3)]
    tree = O.setup(O.Descent(0.1), model)
    state._LOCKING[0].acquire()  # as if another thread were making a tree's lock
    pid = os.fork()
    if pid == 0:
        O.update_(tree, model, [np.ones(3)])  # makes this tree's lock: must not wait
        os._exit(0 if np.allclose(model[0], 0.9) else 3)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status))
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_lock_was_being_made_can_step():
    done = subprocess.run([sys.executable, "-c", FORKED_MAKING], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "child 0" in done.stdout, done.stderr[-2000:]
