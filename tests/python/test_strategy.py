"""Strategies at world size 2 (gloo, CPU): what each wrap promises, and checkpoints that move
between ddp and fsdp (name-keyed, world-size independent) with a GPT-2 style tied model."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from conftest import bitwise_equal, cpu_context, gloo_context, load_model, spawn_gloo
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness.trainer import TrainConfig, Trainer

VOCAB, DIM, SEQ = 17, 8, 6


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(DIM)
        self.fc = nn.Linear(DIM, 4 * DIM)
        self.proj = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(torch.relu(self.fc(self.ln(x))))


class TinyGPT(nn.Module):
    """Token embedding tied to the output head (GPT-2's ``lm_head.weight = wte.weight``)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(Block(), Block())
        self.ln_f = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(self.blocks(self.wte(idx))))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _trainer(ctx, ck: str, strategy: str, max_steps: int | None = None, **kw) -> Trainer:
    tokens = torch.randint(0, VOCAB, (32, SEQ + 1), generator=torch.Generator().manual_seed(3))
    data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    cfg = TrainConfig(
        epochs=2,
        ckpt_dir=ck,
        log_every=0,
        checkpoint_every_s=0,
        strategy=strategy,
        fsdp_wrap=(Block,),  # a custom policy (the default finds no ModuleList: root only)
        max_steps=max_steps,
        **kw,
    )
    torch.manual_seed(0)
    return Trainer(
        TinyGPT(),
        lambda p: torch.optim.AdamW(p, lr=1e-2),
        DataLoader(data, batch_size=4, shuffle=True),
        ctx,
        cfg,
        loss_fn=lm_loss,
    )


def _switch_run(
    rank: int, world_size: int, tmp: str, first: str, then: str, sharded: bool = False
) -> None:
    """Uninterrupted run under ``first``; another run under ``first`` stopped at step 5 (of 8)
    and finished under ``then``. Rank 0 compares the switch-point states and the final models."""
    ctx = gloo_context(rank, world_size)
    assert _trainer(ctx, f"{tmp}/ref", first).train() == "finished"
    part = _trainer(ctx, f"{tmp}/switch", first, max_steps=5, sharded_checkpoint=sharded)
    assert part.train() == "max_steps"
    saved_model, saved_optim = part.strategy.state(part.model, part.optimizer)
    rest = _trainer(ctx, f"{tmp}/switch", then, sharded_checkpoint=sharded)
    assert rest._resume() and rest.global_step == 5
    loaded_model, loaded_optim = rest.strategy.state(rest.model, rest.optimizer)
    if rank == 0:  # (on CPU these tensors are the live parameters: compare before training)
        assert bitwise_equal(saved_model, loaded_model)
        assert sorted(saved_optim["state"]) == sorted(loaded_optim["state"])  # names
        for name, entry in saved_optim["state"].items():
            assert bitwise_equal(entry, loaded_optim["state"][name]), name
    assert rest.train() == "finished"  # resumes again, from the same checkpoint
    if sharded:  # the final save is sharded too: a model that fits no rank is never gathered
        meta = f"{tmp}/switch/last.dcp/meta.pt"
        written = os.stat(meta).st_mtime_ns
        again = _trainer(ctx, f"{tmp}/switch", then, sharded_checkpoint=True)
        assert again.train() == "finished"  # already finished: last.dcp is kept as it is
        assert os.stat(meta).st_mtime_ns == written
    if rank != 0:
        return
    ref = load_model(f"{tmp}/ref/last.pt")
    assert "lm_head.weight" in ref and torch.equal(ref["lm_head.weight"], ref["wte.weight"])
    assert bitwise_equal(
        load_model(f"{tmp}/switch/last.pt")
        if not sharded
        else _dcp_model(f"{tmp}/switch/last.dcp"),
        ref,
    )


def _dcp_model(folder: str) -> dict:
    """The model of a sharded final save, whole (the conversion the trainer docstring names)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(folder, f"{folder}.pt")
    meta = torch.load(f"{folder}/meta.pt", weights_only=True)
    assert meta["model"] is None and meta["global_step"] == 8 and meta["epoch"] == 2, meta
    return load_model(f"{folder}.pt")


def test_fsdp_checkpoint_resumes_under_ddp_bitwise(tmp_path) -> None:
    spawn_gloo(_switch_run, 2, str(tmp_path), "fsdp", "ddp")


def test_ddp_checkpoint_resumes_under_fsdp_bitwise(tmp_path) -> None:
    spawn_gloo(_switch_run, 2, str(tmp_path), "ddp", "fsdp")


def test_sharded_checkpoint_resumes_under_fsdp_and_ddp_bitwise(tmp_path) -> None:
    for then in ("fsdp", "ddp"):
        tmp = tmp_path / then
        spawn_gloo(_switch_run, 2, str(tmp), "fsdp", then, True)
        folder = tmp / "switch" / "ckpt_step00000005.dcp"  # every rank wrote its shard there
        shards = [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
        assert sorted(os.listdir(folder)) == shards
        assert sorted(os.listdir(folder.with_name("last.dcp"))) == shards
        assert not (tmp / "switch" / "last.pt").exists()


def _check_fsdp_wrap(rank: int, world_size: int, tmp: str) -> None:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    trainer = _trainer(gloo_context(rank, world_size), os.path.join(tmp, "ck"), "fsdp")
    model = trainer.model
    sharded = [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    assert sharded == ["", "blocks.0", "blocks.1"], sharded
    assert model.lm_head.weight is model.wte.weight  # still one parameter
    assert all(isinstance(p, DTensor) for p in model.parameters())


def test_fsdp_wraps_the_policy_classes_and_keeps_tied_weights(tmp_path) -> None:
    spawn_gloo(_check_fsdp_wrap, 2, str(tmp_path))


def _resume_counting_reads(rank: int, world_size: int, tmp: str) -> tuple[int, bool]:
    ctx = gloo_context(rank, world_size)
    part = _trainer(ctx, tmp, "fsdp", max_steps=5)
    assert part.train() == "max_steps"
    saved = part.strategy.state(part.model, part.optimizer)[0]
    opened = []
    real_load = torch.load
    torch.load = lambda f, *a, **kw: opened.append(f) or real_load(f, *a, **kw)
    try:
        rest = _trainer(ctx, tmp, "fsdp")
        assert rest._resume() and rest.global_step == 5
    finally:
        torch.load = real_load
    loaded = rest.strategy.state(rest.model, rest.optimizer)[0]
    files = [f for f in opened if isinstance(f, str)]  # (broadcasts unpickle from buffers)
    return len(files), rank != 0 or bitwise_equal(saved, loaded)


def test_only_rank_0_reads_the_checkpoint_file(tmp_path) -> None:
    assert spawn_gloo(_resume_counting_reads, 2, str(tmp_path)) == [(1, True), (0, True)]


def _one_step(rank: int, world_size: int, name: str) -> tuple[bool, bool]:
    """One SGD step on rank-different data; returns (parameters identical on every rank,
    parameters are DTensors)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from hpc_harness.strategy import Strategy, average_gradients

    strategy = Strategy(name, gloo_context(rank, world_size))
    # ddp and ddp2 promise to start every rank from rank 0's weights: rank-different inits
    # test that; fsdp shards what every rank holds, so it starts from the same init
    torch.manual_seed(0 if name == "fsdp" else rank)
    model = strategy.wrap(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(100 + rank))
    model(x).pow(2).mean().backward()
    if strategy.needs_grad_sync:
        average_gradients(model, world_size)
    opt.step()
    params = list(model.parameters())
    dtensors = all(isinstance(p, DTensor) for p in params)
    mine = torch.cat(
        [(p.full_tensor() if isinstance(p, DTensor) else p).reshape(-1) for p in params]
    )
    every: list = [None] * world_size
    dist.all_gather_object(every, mine.detach())
    return all(torch.equal(every[0], t) for t in every), dtensors


def test_ddp_and_ddp2_keep_every_rank_identical_after_a_step() -> None:
    # a no-op wrap() fails both: the ranks start from different weights and see other data
    assert spawn_gloo(_one_step, 2, "ddp") == [(True, False)] * 2
    assert spawn_gloo(_one_step, 2, "ddp2") == [(True, False)] * 2


def _buffers_after_wrap(rank: int, world_size: int, name: str) -> bool:
    """Rank-different BatchNorm statistics before wrap(); True if every rank holds rank 0's
    after it."""
    import torch.distributed as dist

    from hpc_harness.strategy import Strategy

    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model[1].running_mean.fill_(rank)
    model[1].num_batches_tracked.fill_(rank)
    model = Strategy(name, gloo_context(rank, world_size)).wrap(model)
    mine = [b.detach().clone() for b in model.buffers()]
    every: list = [None] * world_size
    dist.all_gather_object(every, mine)
    return all(torch.equal(a, b) for other in every for a, b in zip(every[0], other))


def test_ddp_and_ddp2_start_every_rank_from_rank_0s_buffers() -> None:
    # ddp2's wrap broadcast the parameters only: each node kept its own BatchNorm statistics
    assert spawn_gloo(_buffers_after_wrap, 2, "ddp") == [True, True]
    assert spawn_gloo(_buffers_after_wrap, 2, "ddp2") == [True, True]


def _buffers_after_training(rank: int, world_size: int, name: str, ck: str) -> list:
    """A BatchNorm model trained on rank-different data (each rank's running statistics move
    apart); returns this rank's buffers and its evaluated test_loss."""
    torch.manual_seed(0)
    x = torch.randn(16, 4) + 3.0 * rank
    data = TensorDataset(x, torch.randint(0, 2, (16,)))
    cfg = TrainConfig(epochs=1, ckpt_dir=ck, log_every=0, checkpoint_every_s=0, strategy=name)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    loader = DataLoader(data, batch_size=4)
    trainer = Trainer(
        model,
        lambda p: torch.optim.SGD(p, lr=0.1),
        loader,
        gloo_context(rank, world_size),
        cfg,
        eval_data=data,
    )
    assert trainer.train() == "finished"
    return [[b.tolist() for b in trainer.model.buffers()], trainer.metrics["test_loss"]]


def test_ddp2_keeps_rank_0s_buffers_on_every_rank_while_training(tmp_path) -> None:
    # ddp2 broadcast the buffers at wrap() only: each rank's BatchNorm statistics drifted with
    # its own data, and the evaluation averaged ranks holding different models
    for name in ("ddp", "ddp2"):
        rank0, rank1 = spawn_gloo(_buffers_after_training, 2, name, str(tmp_path / name))
        assert rank0 == rank1, name


def test_fsdp_shards_parameters_and_keeps_ranks_identical_after_a_step() -> None:
    assert spawn_gloo(_one_step, 2, "fsdp") == [(True, True)] * 2


def test_a_checkpoint_with_the_optimizer_keyed_by_position_still_resumes(tmp_path) -> None:
    """Checkpoints of earlier versions hold optimizer.state_dict() (keyed by position)."""
    ctx = cpu_context()
    assert _trainer(ctx, str(tmp_path / "ref"), "ddp").train() == "finished"
    part = _trainer(ctx, str(tmp_path / "old"), "ddp", max_steps=5)
    assert part.train() == "max_steps"
    path = tmp_path / "old" / "ckpt_step00000005.pt"
    state = torch.load(path, weights_only=False)
    state["optimizer"] = part.optimizer.state_dict()
    torch.save(state, path)
    assert _trainer(ctx, str(tmp_path / "old"), "ddp").train() == "finished"
    assert bitwise_equal(
        load_model(f"{tmp_path}/old/last.pt"), load_model(f"{tmp_path}/ref/last.pt")
    )


def test_a_resume_that_switches_strategy_says_why_it_is_not_bitwise(tmp_path, capsys) -> None:
    ctx = cpu_context()
    assert _trainer(ctx, str(tmp_path), "fsdp", 2, grad_clip=1.0).train() == "max_steps"
    capsys.readouterr()
    assert _trainer(ctx, str(tmp_path), "ddp", grad_clip=1.0)._resume()
    out = capsys.readouterr()
    assert (
        "hpc_harness: warning: resuming a fsdp checkpoint under ddp: grad_clip's norm round "
        "differently" in out.out + out.err
    )


def _fsdp_five_steps(rank: int, world_size: int, tmp: str) -> None:
    for sharded in (False, True):
        ck = f"{tmp}/{'sharded' if sharded else 'full'}"
        trainer = _trainer(
            gloo_context(rank, world_size), ck, "fsdp", 5, sharded_checkpoint=sharded
        )
        assert trainer.train() == "max_steps"


def test_fsdp_checkpoints_of_world_size_2_resume_at_world_size_1(tmp_path) -> None:
    spawn_gloo(_fsdp_five_steps, 2, str(tmp_path))
    saved = torch.load(tmp_path / "full" / "ckpt_step00000005.pt", weights_only=False)
    ctx = cpu_context()
    for form in ("full", "sharded"):
        trainer = _trainer(ctx, str(tmp_path / form), "fsdp")
        assert trainer._resume() and trainer.global_step == 5
        model, optim = trainer.strategy.state(trainer.model, trainer.optimizer)
        assert bitwise_equal(model, saved["model"]), form
        for name, entry in saved["optimizer"]["state"].items():
            assert bitwise_equal(optim["state"][name], entry), (form, name)


@pytest.mark.parametrize(
    ("saved", "now", "world_size", "clip", "warned"),
    [
        ("ddp", "fsdp", 2, None, False),  # 2 ranks: a+b in any order, no clipping
        ("fsdp", "ddp", 2, 1.0, True),  # the norm: per parameter vs per shard
        ("ddp", "fsdp", 3, None, True),  # the sums: fixed order vs reduce-scatter
        ("ddp2", "fsdp", 2, 1.0, True),
        ("ddp", "ddp2", 4, 1.0, False),  # the same maths
        ("fsdp", "fsdp", 4, 1.0, False),
        (None, "fsdp", 4, 1.0, False),  # a checkpoint without its strategy
    ],
)
def test_a_resume_that_switches_strategy_warns_when_it_is_not_bitwise(
    saved, now, world_size, clip, warned
) -> None:
    from hpc_harness.strategy import Strategy

    strategy = Strategy.__new__(Strategy)  # only its name and world size matter here
    strategy.name, strategy.world_size = now, world_size
    line = strategy.switch_warning(saved, clip)
    assert (line is not None) == warned
    if warned:
        assert line.startswith(f"hpc_harness: warning: resuming a {saved} checkpoint under {now}")
        # what rounds differently: the clipping norm, else the sums over more than 2 ranks
        why = "grad_clip's norm" if clip else f"{world_size} ranks' gradient sums"
        assert f"{now}: {why} round differently" in line


def test_fsdp_options_reach_every_fully_shard_call_in_this_process() -> None:
    """fully_shard on a fake group of 2 (no second process): reshard_after_forward=False keeps
    every unit's parameters gathered after the forward (no post-forward mesh)."""
    import torch.distributed as dist

    from hpc_harness.strategy import Strategy

    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
    try:
        ctx = cpu_context()
        ctx = type(ctx)(**{**vars(ctx), "world_size": 2})

        def resharded(**options) -> list[bool]:
            model = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))  # the norm: the root's
            strategy = Strategy("fsdp", ctx, fsdp_wrap=(nn.Linear,), fsdp_kwargs=options)
            units = [m for m in strategy.wrap(model).modules() if hasattr(m, "_get_fsdp_state")]
            groups = [u._get_fsdp_state()._fsdp_param_group for u in units]
            return [g.post_forward_mesh_info is not None for g in groups if g is not None]

        assert resharded() == [True, True]  # the root, then the Linear unit
        assert resharded(reshard_after_forward=False) == [False, False]
    finally:
        dist.destroy_process_group()
