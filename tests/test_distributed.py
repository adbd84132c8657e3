"""Many processes on this machine (gloo, CPU): DistributedDataParallel, FSDP2's sharded
parameters and their state, the rules stepping local shards, and checkpoints through
``torch.distributed.checkpoint`` that reshard. Each test spawns its processes with a
time limit (``spawned.py``); the workers' assertions fail the test with their traceback."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
# torch's own DDP and inductor modules call a deprecated torch.jit API on import
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

from torch import nn  # noqa: E402

import optimisers as O  # noqa: E402
import spawned  # noqa: E402
from conftest import ALL_RULES, fitting  # noqa: E402
from optimisers import backends  # noqa: E402
from optimisers.state import leaves, plan_of  # noqa: E402


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))


def _sharded(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def _batch(step: int, rank: int) -> tuple:
    """This rank's batch of a step: each rank trains on its own data, as data parallel
    training does."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 6, generator=g), torch.randn(8, 4, generator=g)


def _backward(model: nn.Module, step: int, rank: int) -> None:
    x, y = _batch(step, rank)
    ((model(x) - y) ** 2).mean().backward()


def _whole_batch_backward(model: nn.Module, step: int, world: int) -> None:
    """The gradient that data parallel training over ``world`` ranks averages, on one
    unsharded model: the mean loss over every rank's batch."""
    x, y = (torch.cat(parts) for parts in zip(*(_batch(step, r) for r in range(world))))
    ((model(x) - y) ** 2).mean().backward()


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


# --- FSDP2 ------------------------------------------------------------------------------


def _fsdp_adamw(rank: int, world: int) -> None:
    ours, ref = _sharded(_mlp()), _sharded(_mlp())
    tree = O.setup(O.AdamW(0.01, lambd=0.1), ours)
    opt = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1)
    assert [str(kp) for kp, _ in leaves(tree)] == ["0.weight", "0.bias", "2.weight",
                                                   "2.bias"]
    for step in range(5):
        for model in (ours, ref):
            _backward(model, step, rank)
        O.update_(tree, ours)
        opt.step()
        for model in (ours, ref):
            model.zero_grad(set_to_none=True)
    assert len(plan_of(tree).groups) == 1  # one fused group, over the local shards
    for (kp, leaf), p in zip(leaves(tree), ref.parameters(), strict=True):
        torch.testing.assert_close(_local(O.getkeypath(ours, kp)), _local(p))
        m, v, _ = leaf.state
        for a, b in ((m, opt.state[p]["exp_avg"]), (v, opt.state[p]["exp_avg_sq"])):
            assert type(a) is type(p) and a.placements == p.placements, kp
            assert _local(a).numel() * world == a.numel(), kp  # 1/2 of it on each rank
            torch.testing.assert_close(_local(a), _local(b))


def test_fsdp2_adamw_equals_torch_optim_with_state_sharded():
    """AdamW on an FSDP2 model (2 ranks) gives torch.optim.AdamW's parameters and moments;
    the moments are DTensors placed as their parameters, half of each on each rank, and
    one fused group steps the local shards."""
    spawned.run(_fsdp_adamw, 2)


# rules that are not elementwise, chains, and rules held by other rules
FSDP_RULES = [O.Lion(0.01), O.OptimiserChain(O.ClipNorm(0.5), O.Momentum(0.05)),
              O.MixedPrecision(O.Adam(0.05)), O.OptimiserChain(O.AccumGrad(2), O.Nesterov(0.05)),
              {"*.weight": O.Muon(0.02), "*": O.AdamW(0.01)}]  # Muon: gathered (on_whole)


def _fsdp_rules(rank: int, world: int, folder: str) -> None:
    for rule in FSDP_RULES:
        ours, ref = _sharded(_mlp()), _mlp()
        tree, tref = O.setup(rule, ours), O.setup(rule, ref)
        for step in range(4):
            _backward(ours, step, rank)
            _whole_batch_backward(ref, step, world)
            O.update_(tree, ours)
            O.update_(tref, ref)
            ours.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
        for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a.full_tensor(), b, msg=f"{rule!r} at {name}")
    O.save(f"{folder}/{rank}.ckpt", tree)  # the library's own file: whole arrays
    back = O.load(f"{folder}/{rank}.ckpt", like=O.setup(rule, ours))
    for (kp, a), (_, b) in zip(leaves(tree), leaves(back), strict=True):
        for u, v in zip(O.fleaves(a.state), O.fleaves(b.state), strict=True):
            assert type(u) is type(v) and (u == v if not isinstance(u, torch.Tensor) else
                                           u.placements == v.placements
                                           and torch.equal(_local(u), _local(v))), kp
    _backward(ours, 0, rank)  # a pure update of a sharded module: refused
    with pytest.raises(TypeError, match="fully_shard.*update_"):
        O.update(O.setup(O.Descent(), ours), ours, {k: p.grad for k, p in
                                                     ours.named_parameters()})


def test_fsdp2_rules_equal_one_process_on_the_whole_batch(tmp_path):
    """Rules with a norm (all-reduced by DTensor), a master copy, accumulation: the FSDP2
    model steps as one process would with the gradient of every rank's batch. save and
    load (whole arrays in the file) give each rank its shards back."""
    spawned.run(_fsdp_rules, 2, str(tmp_path))


@dataclass(frozen=True)
class Shrink(O.Rule):
    """An elementwise rule whose step is a new value, not a difference."""

    elementwise, reads_x = True, True
    eta: float = 0.1

    def raises(self):
        return False

    def apply(self, state, x, dx):
        return state, O.NewValue(x * 0.5 - self.eta * dx)


def _rules_on_shards(rank: int, world: int) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    from optimisers.fast import fused

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    shapes = {"a": ((5, 3), Shard(0)), "b": ((4,), Shard(0)), "c": ((1,), Shard(0)),
              "d": ((2, 6), Shard(1))}  # uneven, empty on one rank, sharded by columns
    whole = {k: torch.randn(s, generator=g) for k, (s, _) in shapes.items()}
    grads = [{k: torch.randn(v.shape, generator=g) for k, v in whole.items()}
             for _ in range(3)]

    def place(tree):
        return {k: distribute_tensor(v.clone(), mesh, [shapes[k][1]]) for k, v in tree.items()}

    for rule in [*ALL_RULES, Shrink()]:
        for fuse, inplace in [(True, True), (False, True), (True, False)]:
            fused.MIN_GROUP = 2 if fuse else 10**9
            ref, ours = {k: v.clone() for k, v in whole.items()}, place(whole)
            tref, tree = O.setup(fitting(rule), ref), O.setup(fitting(rule), ours)
            step = O.update_ if inplace else O.update
            for gs in grads:
                tref, ref = step(tref, ref, gs)
                try:
                    tree, ours = step(tree, ours, place(gs))
                except Exception as err:
                    err.add_note(f"stepping {rule!r} with {fuse=}, {inplace=}")
                    raise
            for k in whole:
                torch.testing.assert_close(ours[k].full_tensor(), ref[k], rtol=1e-6,
                                           atol=1e-6, msg=f"{rule!r} {fuse=} {inplace=} {k}")
                for a in O.fleaves(tree[k].state):  # (Adafactor's factored means: other
                    if isinstance(a, torch.Tensor) and a.shape == ours[k].shape:  # shapes)
                        assert a.placements == ours[k].placements, (rule, k)


def test_every_rule_steps_local_shards_as_whole_arrays():
    """Every rule of ALL_RULES, fused and not, in place and not, on DTensors sharded
    unevenly (one rank holding nothing of one array): the same numbers as on the whole
    arrays, with every state array of the parameter's shape placed as the parameter."""
    spawned.run(_rules_on_shards, 2)


@dataclass(frozen=True)
class OrthoMomentum(O.Rule):
    """A rule whose step needs the whole matrix: momentum, then the Q of its QR
    factorisation (as Muon orthogonalises), which no shard can compute alone."""

    eta: float = 0.1

    def init(self, x):
        return torch.zeros_like(x)

    @backends.on_whole
    def apply(self, state, x, dx):
        assert all(type(a) is torch.Tensor for a in (state, x, dx))  # whole, not DTensors
        m = 0.9 * state + dx
        return m, self.eta * torch.linalg.qr(m)[0]


def _whole_matrix_rule(rank: int, world: int) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    whole = torch.randn(6, 4, generator=g)
    ref, ours = [whole.clone()], [distribute_tensor(whole.clone(), mesh, [Shard(0)])]
    tref, tree = O.setup(OrthoMomentum(), ref), O.setup(OrthoMomentum(), ours)
    for _ in range(3):
        dx = torch.randn(6, 4, generator=g)
        O.update_(tref, ref, [dx])
        O.update_(tree, ours, [distribute_tensor(dx, mesh, [Shard(0)])])
    torch.testing.assert_close(ours[0].full_tensor(), ref[0])
    state = tree[0].state
    assert state.placements == ours[0].placements and state.to_local().shape == (3, 4)
    torch.testing.assert_close(state.full_tensor(), tref[0].state)


def test_a_rule_on_whole_matrices_gathers_them():
    """backends.on_whole: a rule needing the whole matrix (a QR factorisation) sees a
    sharded one gathered, as a plain tensor, and its state stays sharded as the
    parameter."""
    spawned.run(_whole_matrix_rule, 2)


# --- DistributedDataParallel ----------------------------------------------------------------


def _ddp(rank: int, world: int) -> None:
    ours, ref = _mlp(), _mlp()
    ddp = nn.parallel.DistributedDataParallel(ours)
    compiled = nn.parallel.DistributedDataParallel(torch.compile(_mlp(), backend="eager"))
    tree = O.setup(O.AdamW(0.01, lambd=0.1), ddp)
    paths = [str(kp) for kp, _ in leaves(tree)]
    assert paths == ["0.weight", "0.bias", "2.weight", "2.bias"]  # no "module." prefix
    assert [str(kp) for kp, _ in leaves(O.setup(O.Adam(), compiled))] == paths
    refddp = nn.parallel.DistributedDataParallel(ref)
    opt = torch.optim.AdamW(refddp.parameters(), lr=0.01, weight_decay=0.1)
    for step in range(5):
        _backward(ddp, step, rank)
        _backward(refddp, step, rank)
        if step % 2:  # gradients read from .grad, or given by the DDP's own names
            O.update_(tree, ddp)
        else:
            O.update_(tree, ddp, {k: p.grad for k, p in ddp.named_parameters()})
        opt.step()
        ddp.zero_grad(set_to_none=True)
        refddp.zero_grad(set_to_none=True)
    for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    for kp, leaf in leaves(tree):
        p = O.getkeypath(ref, kp)
        torch.testing.assert_close(leaf.state[0], opt.state[p]["exp_avg"])


def test_ddp_adamw_equals_torch_optim():
    """AdamW on a DistributedDataParallel model (2 ranks) gives torch.optim.AdamW's numbers;
    the tree's paths are the wrapped module's own (a compiled one's too)."""
    spawned.run(_ddp, 2)


# --- ClipGlobalNorm + AdamW against clip_grad_norm_ + torch.optim.AdamW ------------------


def _clipped_adamw(rank: int, world: int) -> None:
    rule = O.OptimiserChain(O.ClipGlobalNorm(0.05), O.AdamW(0.01, lambd=0.1))
    for wrap in ("ddp", "fsdp2"):
        if wrap == "ddp":
            ours, ref = (nn.parallel.DistributedDataParallel(_mlp()) for _ in "ab")
        else:
            ours, ref = _sharded(_mlp()), _sharded(_mlp())
        tree = O.setup(rule, ours)
        opt = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1)
        for step in range(5):
            for model in (ours, ref):
                _backward(model, step, rank)
            norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
            assert norm > 0.05  # the norm of the whole gradient: clipped
            O.update_(tree, ours)
            opt.step()
            for model in (ours, ref):
                model.zero_grad(set_to_none=True)
        for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
            # clip_grad_norm_ divides by norm + 1e-6: the two differ by that, relatively
            torch.testing.assert_close(_local(a), _local(b), rtol=1e-5, atol=1e-6,
                                       msg=f"{wrap} {name}")


def test_clip_global_norm_and_adamw_equal_torch_on_ddp_and_fsdp2():
    """ClipGlobalNorm + AdamW on DDP and on FSDP2 (2 ranks) gives clip_grad_norm_ +
    torch.optim.AdamW's parameters: the norm is over the whole model, all shards."""
    if not hasattr(O, "ClipGlobalNorm"):
        pytest.skip("ClipGlobalNorm is not in this version")
    spawned.run(_clipped_adamw, 2)


# --- torch.distributed.checkpoint: saved by 2 ranks, loaded by 1, and back ----------------


def _whole_arrays(tree) -> dict:
    """The tree's state dict with every array whole (a DTensor gathered)."""
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v
            for k, v in O.state_dict(tree).items() if isinstance(v, torch.Tensor)}


def _dcp_load(model, tree, path):
    import torch.distributed.checkpoint as dcp

    both = {"model": model.state_dict(), "optim": O.state_dict(tree)}
    dcp.load(both, checkpoint_id=path)
    model.load_state_dict(both["model"])
    return O.load_state_dict(tree, both["optim"])


def _dcp_save(model, tree, path):
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": model.state_dict(), "optim": O.state_dict(tree)}, checkpoint_id=path)


def _save_on_two(rank: int, world: int, folder: str) -> None:
    """3 steps, saved (each rank its shards); 2 more, whose parameters are kept whole."""
    model = _sharded(_mlp())
    tree = O.setup(O.AdamW(0.01, lambd=0.1), model)
    for step in range(5):
        if step == 3:
            _dcp_save(model, tree, f"{folder}/two")
            whole = _whole_arrays(tree)
            assert all(_local(v).numel() * world == v.numel()
                       for v in O.state_dict(tree).values() if isinstance(v, torch.Tensor))
        _backward(model, step, rank)
        O.update_(tree, model)
        model.zero_grad(set_to_none=True)
    after = {k: p.full_tensor() for k, p in model.state_dict().items()}
    if rank == 0:
        torch.save({"state": whole, "after": after}, f"{folder}/two.pt")


def _load_on_one(rank: int, world: int, folder: str) -> None:
    """The 2 ranks' checkpoint on 1: the same state; 2 more steps on the whole batch give
    the 2 ranks' parameters; saved again."""
    model = _mlp(seed=1)
    tree = _dcp_load(model, O.setup(O.AdamW(), model), f"{folder}/two")
    want = torch.load(f"{folder}/two.pt")
    got = _whole_arrays(tree)
    assert got.keys() == want["state"].keys()
    for k, v in got.items():
        assert type(v) is torch.Tensor and torch.equal(v, want["state"][k]), k
    assert tree["0"]["weight"].rule == O.AdamW(0.01, lambd=0.1)
    for step in range(3, 5):
        _whole_batch_backward(model, step, 2)
        O.update_(tree, model)
        model.zero_grad(set_to_none=True)
    for k, p in model.state_dict().items():
        torch.testing.assert_close(p, want["after"][k], msg=k)
    _dcp_save(model, tree, f"{folder}/one")
    torch.save(_whole_arrays(tree), f"{folder}/one.pt")


def _load_on_two(rank: int, world: int, folder: str) -> None:
    """The 1 rank's checkpoint on 2: each rank loads its shards of it."""
    model = _sharded(_mlp(seed=2))
    tree = _dcp_load(model, O.setup(O.AdamW(), model), f"{folder}/one")
    want = torch.load(f"{folder}/one.pt")
    for k, v in O.state_dict(tree).items():
        if isinstance(v, torch.Tensor):
            assert _local(v).numel() * world == v.numel(), k
            assert torch.equal(v.full_tensor(), want[k]), k
    _backward(model, 5, rank)
    O.update_(tree, model)  # and it steps on


def test_dcp_saves_on_two_ranks_loads_on_one_and_back(tmp_path):
    """torch.distributed.checkpoint with the optimiser's state_dict beside the model's:
    FSDP2's 2 ranks each write their shards; one process loads the whole state (and its
    training continues as the 2 ranks' did), saves it, and 2 ranks load it sharded."""
    spawned.run(_save_on_two, 2, str(tmp_path))
    spawned.run(_load_on_one, 1, str(tmp_path))
    spawned.run(_load_on_two, 2, str(tmp_path))


# --- leaving: no abort in the interpreter's teardown -----------------------------------------


def _collectives_in_flight(rank: int, world: int) -> None:
    nn.parallel.DistributedDataParallel(nn.Linear(4, 4))  # its reducer keeps the group alive
    for _ in range(20):  # handles dropped at once: gloo's threads free the tensors, late
        out = [torch.empty(1000) for _ in range(world)]
        dist.all_gather(out, torch.ones(1000), async_op=True)


def test_a_worker_leaving_collectives_in_flight_exits_cleanly():
    """A worker whose group outlives ``destroy_process_group`` (DDP's reducer holds it)
    while gloo's threads still free tensors: it exits with status 0, not SIGABRT from the
    interpreter's teardown (9 runs in 10 aborted before ``spawned`` left by ``os._exit``)."""
    for _ in range(3):
        spawned.run(_collectives_in_flight, 2)


# --- the site's example --------------------------------------------------------------------------


def test_the_readme_fsdp2_example_runs_on_two_processes(tmp_path):
    """The FSDP2 example (docs/guides/devices.md), which test_site.py only defines (its
    spawn is under ``if __name__ == "__main__"``), run as a script: it prints what the
    page says."""
    from test_readme import BLOCKS

    (code, expected), = [(code, expected) for heading, code, expected in BLOCKS
                         if heading == "Training on many devices" and "fully_shard" in code]
    text = expected or _text_after(code)
    script = tmp_path / "example.py"
    script.write_text(code)
    assert spawned.run_script(str(script)).splitlines() == text.splitlines()


def _text_after(code: str) -> str:
    """The ```text block that follows ``code`` on its page (past a sentence)."""
    from markdown_examples import text_after
    from test_readme import page

    return text_after(page("Training on many devices"), code)


# --- ZeRO-1 ---------------------------------------------------------------------------------


def _state_bytes(tree) -> int:
    return sum(a.numel() * a.element_size() for _, leaf in leaves(tree)
               for a in O.fleaves(leaf.state) if isinstance(a, torch.Tensor))


def _zero(rank: int, world: int, folder: str) -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from optimisers import distributed

    rule = O.AdamW(0.01, lambd=0.1)
    ours, ref, theirs = (nn.parallel.DistributedDataParallel(_mlp()) for _ in "abc")
    tree, tref = distributed.setup(rule, ours), O.setup(rule, ref)  # ZeRO-1, and not
    opt = ZeroRedundancyOptimizer(theirs.parameters(), optimizer_class=torch.optim.AdamW,
                                  lr=0.01, weight_decay=0.1)
    for step in range(5):
        for model in (ours, ref, theirs):
            _backward(model, step, rank)
        if step % 2:
            distributed.update_(tree, ours)
        else:
            distributed.update_(tree, ours, {k: p.grad for k, p in ours.named_parameters()})
        O.update_(tref, ref)
        opt.step()
        for model in (ours, ref, theirs):
            model.zero_grad(set_to_none=True)
    for (name, a), b, c in zip(ours.named_parameters(), ref.parameters(), theirs.parameters(),
                               strict=True):
        # as if every process stepped every parameter (to rounding: an array stepped alone
        # takes the plain path, in a group torch's fused Adam kernel), and as torch's
        # ZeroRedundancyOptimizer
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)
        torch.testing.assert_close(a, c, msg=name)
    mine = [str(kp) for kp, _ in leaves(tree)]
    every = [None] * world
    dist.all_gather_object(every, (mine, _state_bytes(tree)))
    assert sorted(p for paths, _ in every for p in paths) == sorted(
        str(kp) for kp, _ in leaves(tref))  # each Leaf on one process
    assert sum(n for _, n in every) == _state_bytes(tref)
    assert max(n for _, n in every) <= 0.6 * _state_bytes(tref)  # about 1/2 on each
    with pytest.raises(ValueError, match="'0.weight'.*ClipGlobalNorm.*only those"):
        distributed.setup(O.OptimiserChain(O.ClipGlobalNorm(), rule), ours)
    _dcp_save(ours, tree, f"{folder}/zero")  # each process its own Leafs
    torch.save(_whole_arrays(tree), f"{folder}/zero{rank}.pt")


def _zero_on_one(rank: int, world: int, folder: str) -> None:
    from optimisers import distributed

    model = nn.parallel.DistributedDataParallel(_mlp(seed=3))
    tree = _dcp_load(model, distributed.setup(O.AdamW(), model), f"{folder}/zero")
    want = {**torch.load(f"{folder}/zero0.pt"), **torch.load(f"{folder}/zero1.pt")}
    assert _whole_arrays(tree).keys() == want.keys()
    for k, v in _whole_arrays(tree).items():
        assert torch.equal(v, want[k]), k
    assert tree["0"]["weight"].rule == O.AdamW(0.01, lambd=0.1)


def test_zero1_keeps_each_state_on_one_process_and_steps_as_one(tmp_path):
    """optimisers.distributed.setup(rule, ddp_model): each Leaf on one of 2 processes (about
    half of the state on each), the parameters bit for bit those of every process stepping
    all, and torch's ZeroRedundancyOptimizer's; the processes' checkpoint through
    torch.distributed.checkpoint loads whole on one."""
    spawned.run(_zero, 2, str(tmp_path))
    spawned.run(_zero_on_one, 1, str(tmp_path))
