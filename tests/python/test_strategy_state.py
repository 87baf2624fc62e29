"""Strategy state in-process: name-keyed state through a DataParallel wrapper, the three kinds
of optimizer state a checkpoint may hold, fsdp's full and sharded state as rank 0 or 1 of a
fake group of 2 (every collective returns this rank's own values), and fsdp's shard units."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hpc_harness.strategy import Strategy, _has_tensors, shard_units


def _ctx(world_size: int = 1, rank: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        rank=rank,
        world_size=world_size,
        local_world_size=world_size,
        device=torch.device("cpu"),
        devices=[],
    )


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2))


def _trained(seed: int, optimizer=torch.optim.AdamW) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = _net()
    opt = optimizer(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def _same_optimizer_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    sa, sb = list(a.state.values()), list(b.state.values())
    return len(sa) == len(sb) and all(
        sorted(x) == sorted(y) and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(sa, sb)
    )


def test_state_is_keyed_by_parameter_name_through_a_data_parallel_wrapper(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # its wrapper stays on the CPU
    strategy = Strategy("dp", _ctx())
    model, opt = _trained(0)
    wrapped = nn.DataParallel(model)  # what dp and ddp2 hold on a GPU node
    msd, osd = strategy.state(wrapped, opt)
    assert sorted(msd) == ["0.bias", "0.weight", "1.bias", "1.weight"]  # no "module." prefix
    assert sorted(osd["state"]) == sorted(msd)
    other, other_opt = _trained(1)
    strategy.load(nn.DataParallel(other), other_opt, {"model": msd, "optimizer": osd})
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters()))
    assert _same_optimizer_state(opt, other_opt)


@pytest.mark.parametrize("kind", ["adamw_by_name", "sgd_no_tensors", "by_position"])
def test_every_kind_of_optimizer_state_loads(kind: str) -> None:
    optimizer = torch.optim.SGD if kind.startswith("sgd") else torch.optim.AdamW
    strategy = Strategy("ddp", _ctx())
    model, opt = _trained(0, optimizer)
    msd, osd = strategy.state(model, opt)
    if kind == "by_position":  # checkpoints of earlier versions: optimizer.state_dict()
        osd = opt.state_dict()
    other, other_opt = _trained(1, optimizer)
    other_opt.param_groups[0]["lr"] = 0.5
    strategy.load(other, other_opt, {"model": msd, "optimizer": osd})
    assert other_opt.param_groups[0]["lr"] == 0.1
    assert _same_optimizer_state(opt, other_opt)


def test_optimizer_state_counts_as_tensors_only_with_non_scalar_tensors() -> None:
    vector, scalar = torch.zeros(3), torch.tensor(2.0)
    assert _has_tensors({"state": {"w": {"step": scalar, "exp_avg": vector}}})
    assert _has_tensors({"state": {"b": {"exp_avg": vector}}})  # a bias: one dimension
    assert not _has_tensors({"state": {"w": {"step": scalar}}})
    assert not _has_tensors({"state": {"w": {"momentum_buffer": None}}})  # plain SGD
    assert not _has_tensors({"param_groups": []})


@pytest.fixture
def fake_group(request):
    """This process as rank R of a fake group of W, ``request.param`` = (R, W).

    FSDP2 (torch 2.13) gives a module the DTensor mesh of an earlier one of the same shape in
    this process, with the rank that one was made as: a test faking rank 0 after one faking
    rank 1 of the same world size would compute rank 1's shards. So each test that checks a
    rank's own shards fakes a world size no other test fakes."""
    import torch.distributed as dist

    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    rank, world_size = request.param
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=rank, world_size=world_size)
    yield rank
    dist.destroy_process_group()


@pytest.mark.parametrize("fake_group", [(0, 4)], indirect=True)
def test_fsdp_state_is_whole_or_sharded_and_loads_into_rank_0s_shards(fake_group) -> None:
    from torch.distributed.tensor import DTensor

    strategy = Strategy("fsdp", _ctx(world_size=4))
    model = strategy.wrap(_net())
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    whole, whole_optim = strategy.state(model, opt)
    assert sorted(whole) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert not any(isinstance(v, DTensor) for v in whole.values())
    shards, _ = strategy.state(model, opt, sharded=True)
    assert all(isinstance(v, DTensor) for v in shards.values())

    source, source_opt = _trained(0)  # a full checkpoint, as rank 0 reads it from a file
    full_model, full_optim = Strategy("ddp", _ctx()).state(source, source_opt)
    strategy.load(model, opt, {"model": full_model, "optimizer": full_optim})
    for (name, p), q in zip(model.named_parameters(), source.parameters()):
        mine = p.to_local()  # rank 0 holds the first quarter of the rows
        assert torch.equal(mine, q.detach()[: mine.shape[0]]), name
        exp_avg = opt.state[p]["exp_avg"].to_local()
        assert torch.equal(exp_avg, source_opt.state[q]["exp_avg"][: mine.shape[0]]), name


@pytest.mark.parametrize("fake_group", [(1, 2)], indirect=True)
def test_fsdp_whole_state_is_empty_on_ranks_other_than_0(fake_group) -> None:
    strategy = Strategy("fsdp", _ctx(world_size=2, rank=1))
    model = strategy.wrap(_net())
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    assert strategy.state(model, opt) == ({}, {})  # rank 0 alone writes the checkpoint
    assert len(strategy.state(model, opt, sharded=True)[0]) == 4  # its own shards


def _load_as_rank_1(monkeypatch, sent_by_rank_0) -> tuple[list, torch.optim.Optimizer]:
    """Strategy.load on rank 1, which holds no state (None): what it hands to torch's loaders,
    with the broadcast of rank 0's optimizer state simulated."""
    import torch.distributed as dist
    from torch.distributed.checkpoint import state_dict as dsd

    calls: list = []
    monkeypatch.setattr(
        dsd, "set_model_state_dict", lambda m, sd, options: calls.append(("model", sd, options))
    )
    monkeypatch.setattr(
        dsd,
        "set_optimizer_state_dict",
        lambda m, o, sd, options: calls.append(("optimizer", sd, options)),
    )

    def broadcast_object_list(objects: list, src: int) -> None:
        calls.append(("broadcast from", src))
        # the state sent whole (or None), then the parameters it has state for
        objects[:] = [sent_by_rank_0, {name for name, _ in model.named_parameters()}]

    monkeypatch.setattr(dist, "broadcast_object_list", broadcast_object_list)
    strategy = Strategy("ddp", _ctx(world_size=2, rank=1))
    model, opt = _trained(1)
    strategy.load(model, opt, {"model": None, "optimizer": None})
    return calls, opt


@pytest.mark.parametrize("fake_group", [(1, 2)], indirect=True)
def test_ranks_without_state_receive_it_from_rank_0(fake_group, monkeypatch) -> None:
    calls, _ = _load_as_rank_1(monkeypatch, None)  # a name-keyed state with tensors
    assert [c[:2] for c in calls] == [("model", {}), ("broadcast from", 0), ("optimizer", {})]
    model_options, optimizer_options = calls[0][2], calls[2][2]
    assert model_options.full_state_dict and model_options.broadcast_from_rank0
    assert model_options.strict  # a parameter may lack optimizer state, not model state
    assert optimizer_options == dataclasses.replace(model_options, strict=False)


@pytest.mark.parametrize("fake_group", [(1, 2)], indirect=True)
def test_optimizer_state_rank_0_sends_whole_is_loaded_as_sent(fake_group, monkeypatch) -> None:
    _, by_position = _trained(0)
    calls, opt = _load_as_rank_1(monkeypatch, by_position.state_dict())
    assert [c[0] for c in calls] == ["model", "broadcast from"]  # optimizer.load_state_dict
    assert _same_optimizer_state(opt, by_position)
    no_tensors = {"state": {}, "param_groups": [{"lr": 0.3, "params": ["0.weight"]}]}
    calls, _ = _load_as_rank_1(monkeypatch, no_tensors)  # plain SGD, keyed by name
    assert calls[2][:2] == ("optimizer", no_tensors)
    assert not calls[2][2].full_state_dict and not calls[2][2].broadcast_from_rank0


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)


class _TiedLM(nn.Module):
    """A GPT-2 shape: blocks in a ModuleList, the output head tied to the token embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(5, 4)
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.lm_head = nn.Linear(4, 5, bias=False)
        self.lm_head.weight = self.wte.weight


def test_fsdp_shards_the_module_list_classes_and_leaves_tied_modules_to_the_root() -> None:
    model = _TiedLM()
    assert shard_units(model) == list(model.blocks)
    linears = shard_units(model, (nn.Linear, nn.Embedding))  # the tied pair: neither
    assert linears == [model.blocks[0].fc, model.blocks[1].fc]
    assert shard_units(model, (_TiedLM,)) == []  # the root is sharded last, by wrap()
    assert shard_units(nn.Sequential(nn.Linear(2, 2))) == []  # no ModuleList: root only


class _Recorded(nn.Module):
    """A model that records where it is moved (no GPU here: ``to`` goes nowhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.moved_to: list = []

    def to(self, device):  # noqa: D102
        self.moved_to.append(device)
        return self


class _DataParallel(nn.Module):
    def __init__(self, module: nn.Module, device_ids: list) -> None:
        super().__init__()
        self.module, self.device_ids = module, device_ids


def _wrap_as_two_ranks(monkeypatch, name: str, device: torch.device, devices: list, wrap=()):
    """Strategy(name).wrap as one of 2 ranks, with torch's wrappers and collectives faked in
    this process (what a GPU node would call them with is the point: no GPU here)."""
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp as fsdp
    import torch.nn.parallel as parallel

    from hpc_harness import strategy as strategy_module

    calls: list = []
    monkeypatch.setattr(strategy_module.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(strategy_module, "check_strategy", lambda *args: None)  # GPU counts
    monkeypatch.setattr(
        parallel, "DistributedDataParallel", lambda m, device_ids: ("DDP", m, device_ids)
    )
    monkeypatch.setattr(strategy_module.nn, "DataParallel", _DataParallel)
    monkeypatch.setattr(
        strategy_module.dist, "broadcast", lambda t, src: calls.append(("broadcast", t, src))
    )
    monkeypatch.setattr(
        device_mesh, "init_device_mesh", lambda device_type, shape: ("mesh", device_type, shape)
    )
    monkeypatch.setattr(fsdp, "fully_shard", lambda m, mesh: calls.append(("fully_shard", m, mesh)))
    ctx = SimpleNamespace(rank=0, world_size=2, local_world_size=2, device=device, devices=devices)
    model = _Recorded()
    return Strategy(name, ctx, fsdp_wrap=wrap).wrap(model), model, calls


def test_ddp_on_a_gpu_names_that_gpu_and_on_cpu_none(monkeypatch) -> None:
    wrapped, model, _ = _wrap_as_two_ranks(monkeypatch, "ddp", torch.device("cuda", 1), [1])
    assert wrapped == ("DDP", model, [torch.device("cuda", 1)])
    assert model.moved_to == [torch.device("cuda", 1)]
    wrapped, model, _ = _wrap_as_two_ranks(monkeypatch, "ddp", torch.device("cpu"), [])
    assert wrapped == ("DDP", model, None)


def test_dp_and_ddp2_spread_over_the_nodes_gpus_and_ddp2_starts_every_rank_from_rank_0(
    monkeypatch,
) -> None:
    gpu = torch.device("cuda", 0)
    wrapped, model, _ = _wrap_as_two_ranks(monkeypatch, "dp", gpu, [0, 1])
    assert (type(wrapped), wrapped.module, wrapped.device_ids) == (_DataParallel, model, [0, 1])
    wrapped, model, calls = _wrap_as_two_ranks(monkeypatch, "ddp2", gpu, [0, 1])
    # no DDP around it: ddp2 averages the gradients after backward
    assert (type(wrapped), wrapped.module, wrapped.device_ids) == (_DataParallel, model, [0, 1])
    assert [(c[0], c[2]) for c in calls] == [("broadcast", 0)] * 2  # weight and bias, from rank 0
    assert [c[1].data_ptr() for c in calls] == [p.data_ptr() for p in model.parameters()]
    wrapped, model, _ = _wrap_as_two_ranks(monkeypatch, "ddp2", gpu, [0])
    assert wrapped is model  # one GPU: nothing to spread over


def test_fsdp_shards_each_policy_module_then_the_root(monkeypatch) -> None:
    cpu = torch.device("cpu")
    wrapped, model, calls = _wrap_as_two_ranks(monkeypatch, "fsdp", cpu, [], wrap=(nn.Linear,))
    mesh = ("mesh", "cpu", (2,))  # the run's device, one dimension of all ranks
    assert wrapped is model
    assert calls == [("fully_shard", model.layer, mesh), ("fully_shard", model, mesh)]


@pytest.mark.parametrize("fake_group", [(0, 6)], indirect=True)
def test_fsdp_keeps_a_cpu_run_on_the_cpu_where_cuda_is_available(fake_group, monkeypatch) -> None:
    """A run on the CPU (``--gpus 0``, gloo) on a GPU node: fully_shard's default mesh is CUDA's
    whenever CUDA is available, which moves every rank's model to cuda:0 (seen on a lent H200:
    "target is on cpu, different from other tensors on cuda:0"). CUDA is faked available here
    (no GPU): asking for a CUDA mesh fails, and the model must stay on the CPU."""
    from torch.distributed.tensor import DTensor

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"), raising=False)
    model = Strategy("fsdp", _ctx(world_size=6)).wrap(_net())
    params = list(model.parameters())
    assert params and all(isinstance(p, DTensor) for p in params)
    assert {p.device_mesh.device_type for p in params} == {"cpu"}
    assert {p.to_local().device.type for p in params} == {"cpu"}
