"""The Trainer's optimizer factory: parameters with their names (optim.Params), nanoGPT's
weight-decay groups and warmup-cosine LR, several optimizers and schedulers, checkpointed."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import cpu_context, load_model, spawn_gloo
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness import checkpoint as ckpt
from hpc_harness.optim import Params, warmup_cosine, weight_decay_groups
from hpc_harness.trainer import TrainConfig, Trainer


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(self.norm(x))


NAMES = [n for n, _ in Net().named_parameters()]
DECAY = ["blocks.0.weight", "blocks.1.weight", "head.weight"]


def _loader(n: int = 16) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))
    return DataLoader(data, batch_size=4, shuffle=True)


def _config(tmp, **kw) -> TrainConfig:
    return TrainConfig(ckpt_dir=str(tmp), log_every=0, checkpoint_every_s=0, **kw)


def _groups_by_name(trainer: Trainer) -> list[list[str]]:
    name = {id(p): n for n, p in trainer.strategy._stateful(trainer.model).named_parameters()}
    return [[name[id(p)] for p in g["params"]] for g in trainer.optimizer.param_groups]


def test_the_factory_gets_the_parameters_with_their_names(tmp_path) -> None:
    seen = []

    def make(params):
        seen.append(params)
        return torch.optim.SGD(params, lr=0.1)  # a list of parameters, as before

    trainer = Trainer(Net(), make, _loader(), cpu_context(), _config(tmp_path))
    (params,) = seen
    assert isinstance(params, Params) and [n for n, _ in params.named] == NAMES
    assert list(params) == list(trainer.model.parameters())
    assert params.model is trainer.model


def test_weight_decay_groups_leave_biases_and_norms_undecayed(tmp_path) -> None:
    trainer = Trainer(
        Net(),
        lambda params: torch.optim.AdamW(weight_decay_groups(params, 0.1), lr=0.1),
        _loader(),
        cpu_context(),
        _config(tmp_path),
    )
    decay, rest = _groups_by_name(trainer)
    assert decay == DECAY and sorted(rest) == sorted(set(NAMES) - set(DECAY))
    assert [g["weight_decay"] for g in trainer.optimizer.param_groups] == [0.1, 0.0]
    net = Net()
    net.norm.weight.requires_grad_(False)  # frozen: in no group
    groups = weight_decay_groups(net.named_parameters(), 0.1, lambda n, p: n.startswith("head"))
    assert [len(g["params"]) for g in groups] == [1, 5]


def test_warmup_cosine_is_nanogpts_get_lr() -> None:
    f = warmup_cosine(warmup=4, total=14, min_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.2, 0.4, 0.6, 0.8]
    assert f(4) == 1.0 and f(14) == pytest.approx(0.1) and f(99) == 0.1
    assert f(9) == pytest.approx(0.1 + 0.5 * (1 + math.cos(math.pi / 2)) * 0.9)
    with pytest.raises(ValueError, match="warmup < total"):
        warmup_cosine(10, 10)


def test_warmup_cosine_without_warmup_starts_at_the_base_lr_and_ends_at_a_tenth() -> None:
    f = warmup_cosine(warmup=0, total=10)  # no warmup is allowed; min_ratio defaults to 0.1
    assert f(0) == 1.0 and f(10) == pytest.approx(0.1) and f(11) == 0.1
    with pytest.raises(ValueError, match="warmup < total"):
        warmup_cosine(-1, 10)


def test_a_checkpoint_holds_one_schedulers_state_as_is_and_several_as_a_list(tmp_path) -> None:
    """One scheduler's state is saved in the format of a single scheduler (checkpoints of runs
    before several were allowed, and readers of the file, expect it); none saves None."""

    def saved(make_optimizer, make_scheduler=None):
        return Trainer(
            Net(), make_optimizer, _loader(), cpu_context(), _config(tmp_path), make_scheduler
        )._scheduler_state()

    sgd = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    step_lr = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2)  # noqa: E731
    assert saved(sgd) is None
    one = saved(sgd, step_lr)
    assert isinstance(one, dict) and one["step_size"] == 2
    two = saved(_two_optimizers, _two_schedulers)
    assert isinstance(two, list) and [type(s) for s in two] == [dict, dict]


def test_a_resume_with_another_number_of_schedulers_stops(tmp_path) -> None:
    def trainer(make_scheduler) -> Trainer:
        cfg = _config(tmp_path, epochs=1)
        return Trainer(Net(), _two_optimizers, _loader(), cpu_context(), cfg, make_scheduler)

    assert trainer(_two_schedulers).train() == "finished"
    path = tmp_path / "ckpt_step00000004.pt"
    with pytest.raises(ckpt.RunMismatch) as stopped:
        trainer(lambda optimizers: _two_schedulers(optimizers)[:1]).train()
    assert str(stopped.value) == (
        f"{path} holds 2 schedulers' states, this run makes 1: resume with the same make_scheduler"
    )


def _named_under(rank: int, world_size: int, strategy: str, ck: str) -> list:
    from conftest import gloo_context

    names = []

    def make(params):
        names.append([n for n, _ in params.named])
        return torch.optim.AdamW(weight_decay_groups(params, 0.1), lr=0.1)

    cfg = _config(f"{ck}/{strategy}", strategy=strategy, epochs=1)
    trainer = Trainer(Net(), make, _loader(), gloo_context(rank, world_size), cfg)
    assert trainer.train() == "finished"
    return [names[0], _groups_by_name(trainer)]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_names_are_the_models_own_under_ddp_and_fsdp(tmp_path, strategy: str) -> None:
    for names, (decay, rest) in spawn_gloo(_named_under, 2, strategy, str(tmp_path)):
        assert names == NAMES  # no "module." (ddp), fsdp keeps them
        assert decay == DECAY and len(rest) == len(NAMES) - len(DECAY)


def _two_optimizers(params: Params) -> list[torch.optim.Optimizer]:
    blocks = [p for n, p in params.named if n.startswith("blocks.")]
    rest = [p for n, p in params.named if not n.startswith("blocks.")]
    return [torch.optim.AdamW(blocks, lr=0.05), torch.optim.SGD(rest, lr=0.1, momentum=0.9)]


def _two_schedulers(optimizers: list[torch.optim.Optimizer]) -> list:
    adamw, sgd = optimizers
    return [
        torch.optim.lr_scheduler.LambdaLR(adamw, warmup_cosine(3, 10)),
        torch.optim.lr_scheduler.StepLR(sgd, step_size=2, gamma=0.5),
    ]


def _train_two(rank: int, world_size: int, ck: str, signal_at: int, strategy: str) -> dict:
    """Two optimizers and two schedulers, signalled at step ``signal_at`` (0: never) and
    resumed; returns the learning rates."""
    from conftest import gloo_context
    from test_resume_world_sizes import SignalAtStep

    ctx = gloo_context(rank, world_size) if world_size > 1 else cpu_context()
    for _ in range(2 if signal_at else 1):
        cfg = _config(ck, epochs=3, seed=2, signal_check_every=1, strategy=strategy)
        trainer = SignalAtStep(Net(), _two_optimizers, _loader(), ctx, cfg, _two_schedulers)
        trainer.signal_at, status = signal_at, trainer.train()
        signal_at = 0
    assert status == "finished"
    return {"lrs": [o.param_groups[0]["lr"] for o in trainer.optimizers]}


@pytest.mark.parametrize(
    ("strategy", "world_size"), [("ddp", 1), ("ddp", 2), ("fsdp", 2), ("ddp", 3)]
)
def test_two_optimizers_and_schedulers_step_and_resume_bitwise(
    tmp_path, monkeypatch, strategy: str, world_size: int
) -> None:
    from conftest import bitwise_equal

    monkeypatch.delenv("HPC_REQUEUE_MARKER", raising=False)
    if world_size == 1:
        run = lambda ck, at: _train_two(0, 1, ck, at, strategy)  # noqa: E731
    else:
        run = lambda ck, at: spawn_gloo(_train_two, world_size, ck, at, strategy)[0]  # noqa: E731
    straight, resumed = run(str(tmp_path / "straight"), 0), run(str(tmp_path / "ck"), 5)
    for run_dir, result in (("straight", straight), ("ck", resumed)):
        result["weights"] = load_model(str(tmp_path / run_dir / "last.pt"))
    start = Net().state_dict()
    assert all(not torch.equal(start[k], straight["weights"][k]) for k in start)  # both stepped
    steps = 3 * math.ceil(4 / world_size)  # 16 samples, 4 a batch: 4 batches an epoch in all
    assert straight["lrs"] == [
        pytest.approx(0.05 * warmup_cosine(3, 10)(steps)),
        pytest.approx(0.1 * 0.5 ** (steps // 2)),
    ]
    assert bitwise_equal(straight["weights"], resumed["weights"])
    assert straight["lrs"] == resumed["lrs"]


class Indexed(torch.utils.data.Dataset):
    """Sample i: (a fixed input, target i % 3, i, 1 if a worker loaded it)."""

    def __len__(self) -> int:
        return 7

    def __getitem__(self, i: int):
        in_worker = torch.utils.data.get_worker_info() is not None
        x = torch.arange(4, dtype=torch.float32) * (i + 1) / 7
        return x, i % 3, i, float(in_worker)


class SeesIndices(Trainer):
    def eval_step(self, batch):
        x, y, idx, in_worker = batch
        self.sizes.append(len(idx))
        return {"idx": idx.double().mean(), "in_worker": in_worker.double().mean()}


def _eval_under(rank: int, world_size: int, ck: str, workers: int) -> tuple:
    from conftest import gloo_context

    ctx = gloo_context(rank, world_size) if world_size > 1 else cpu_context()
    loader = DataLoader(Indexed(), batch_size=3, num_workers=workers)
    trainer = SeesIndices(Net(), _two_optimizers, _loader(), ctx, _config(ck), eval_data=loader)
    trainer.sizes = []
    return trainer.evaluate(), trainer.sizes


def test_an_eval_dataloader_keeps_its_batch_size_and_workers(tmp_path) -> None:
    metrics, sizes = _eval_under(0, 1, str(tmp_path), 1)
    assert metrics == {"idx": 3.0, "in_worker": 1.0} and sizes == [3, 3, 1]


def test_an_eval_dataloader_is_sharded_by_rank_every_sample_once(tmp_path) -> None:
    (m0, sizes0), (m1, sizes1) = spawn_gloo(_eval_under, 2, str(tmp_path), 0)
    assert m0 == m1 == {"idx": 3.0, "in_worker": 0.0}  # the mean of 0..6: each sample once
    assert sizes0 == [3, 1] and sizes1 == [3, 3]  # 4 and 3 samples; rank 1 repeats a batch


def test_the_eval_loader_of_a_dataset_is_this_ranks_share_read_in_this_process(tmp_path) -> None:
    """Rank 1 of 2 (no group needed to build it): every second sample from 1, no workers even
    when the training loader has some; starting no worker, nothing is iterated here."""
    import dataclasses

    ctx = dataclasses.replace(cpu_context(), rank=1, world_size=2)
    loader = DataLoader(_loader().dataset, batch_size=4, num_workers=2)
    trainer = Trainer(
        Net(), _two_optimizers, loader, ctx, _config(tmp_path), eval_data=_loader(7).dataset
    )
    assert list(trainer.eval_loader.sampler) == [1, 3, 5]
    assert trainer.eval_loader.num_workers == 0 and trainer.eval_loader.batch_size == 4


def test_an_eval_loader_of_an_iterable_dataset_is_refused(tmp_path) -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([])

    with pytest.raises(ValueError) as refused:
        Trainer(
            Net(), _two_optimizers, _loader(), cpu_context(), _config(tmp_path), eval_data=Stream()
        )
    assert str(refused.value) == (
        "eval_data expects a map-style Dataset, or a DataLoader of one with a batch_size: the "
        "Trainer shards it by rank with its own sampler"
    )


def _options_under(rank: int, world_size: int, ck: str, strategy: str) -> dict:
    import torch.distributed.fsdp as fsdp
    from conftest import gloo_context

    calls, real = [], fsdp.fully_shard
    fsdp.fully_shard = lambda module, **kw: calls.append(sorted(kw)) or real(module, **kw)
    cfg = _config(ck, strategy=strategy, epochs=1)
    cfg.ddp_kwargs = {"find_unused_parameters": True, "bucket_cap_mb": 1}
    cfg.fsdp_kwargs = {"reshard_after_forward": False}
    trainer = Trainer(Net(), _two_optimizers, _loader(), gloo_context(rank, world_size), cfg)
    assert trainer.train() == "finished"
    model = trainer.model
    return {
        "fully_shard": calls,
        "find_unused": getattr(model, "find_unused_parameters", None),
        "bucket_bytes": getattr(model, "bucket_bytes_cap", None),
    }


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ddp_and_fsdp_options_reach_the_wrappers(tmp_path, strategy: str) -> None:
    seen = spawn_gloo(_options_under, 2, str(tmp_path), strategy)[0]
    if strategy == "ddp":
        assert seen == {"fully_shard": [], "find_unused": True, "bucket_bytes": 2**20}
    else:  # the three Linear layers (the ModuleList's class), then the root
        assert seen["fully_shard"] == [["mesh", "reshard_after_forward"]] * 4


@pytest.mark.parametrize(
    ("options", "named", "sets"),
    [
        ({"ddp_kwargs": {"device_ids": [0]}}, "ddp_kwargs: device_ids", "module, device_ids"),
        (
            {"ddp_kwargs": {"module": 1, "device_ids": [0]}},
            "ddp_kwargs: device_ids, module",
            "module, device_ids",
        ),
        ({"fsdp_kwargs": {"mesh": 1}}, "fsdp_kwargs: mesh", "module, mesh"),
        ({"fsdp_kwargs": {"module": 1}}, "fsdp_kwargs: module", "module, mesh"),
    ],
)
def test_options_the_strategy_sets_are_refused(
    tmp_path, options: dict, named: str, sets: str
) -> None:
    from hpc_harness.strategy import StrategyError

    with pytest.raises(StrategyError) as refused:
        Trainer(Net(), _two_optimizers, _loader(), cpu_context(), _config(tmp_path, **options))
    assert str(refused.value) == (
        f"TrainConfig.{named} is set by the strategy itself (the model, this process's device "
        f"or mesh); leave out {sets}"
    )
