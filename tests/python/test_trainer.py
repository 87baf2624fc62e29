"""Trainer behaviour checked by value: the logged loss, resume agreement across ranks."""

from __future__ import annotations

import csv
import os

import pytest
import torch
from conftest import cpu_context, gloo_context, spawn_gloo
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness.trainer import TrainConfig, Trainer


class KnownLossTrainer(Trainer):
    """The loss of global step s (1-based) on rank r is ``s + 10 r``: known values to log."""

    def training_step(self, batch):
        inputs, _ = batch
        value = float(self.global_step + 1 + 10 * self.rank)
        return self.model(inputs).sum() * 0.0 + value


def _logged_losses(run_dir: str) -> dict[int, float]:
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r["name"] == "train_loss"]
    return {int(r["step"]): float(r["value"]) for r in rows}


def _train_known_losses(ctx, ckpt_dir: str) -> None:
    # 10 samples, batch 2: 5 steps per epoch; logs at steps 3, 6, 9 (6 is in epoch 1).
    data = TensorDataset(torch.zeros(10, 3), torch.zeros(10, dtype=torch.long))
    cfg = TrainConfig(epochs=2, ckpt_dir=ckpt_dir, log_every=3, checkpoint_every_s=0)
    torch.manual_seed(0)
    trainer = KnownLossTrainer(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        DataLoader(data, batch_size=2, shuffle=True),
        ctx,
        cfg,
    )
    assert trainer.train() == "finished"


def test_logged_loss_is_the_mean_since_the_last_log_across_an_epoch_boundary(tmp_path) -> None:
    ck = str(tmp_path / "ck")
    _train_known_losses(cpu_context(), ck)
    # steps 1-3 -> 2; steps 4-6 (5 of epoch 0, 6 of epoch 1) -> 5; steps 7-9 -> 8
    assert _logged_losses(ck) == {3: 2.0, 6: 5.0, 9: 8.0}


def _known_losses_rank(rank: int, world_size: int, ck: str) -> None:
    # 2 ranks x batch 2 over 10 samples: 3 steps per epoch; logs at 3 and 6.
    _train_known_losses(gloo_context(rank, world_size), ck)


def test_logged_loss_is_the_mean_across_ranks(tmp_path) -> None:
    ck = str(tmp_path / "ck")
    spawn_gloo(_known_losses_rank, 2, ck)
    # rank 0 logs steps 1-3 -> 2 and rank 1 -> 12: the mean is 7; steps 4-6 -> 5 and 15: 10
    assert _logged_losses(ck) == {3: 7.0, 6: 10.0}


def _small_trainer(ctx, ckpt_dir: str, **cfg_kw) -> Trainer:
    data = TensorDataset(
        torch.randn(16, 3, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2
    )
    cfg = TrainConfig(epochs=2, ckpt_dir=ckpt_dir, log_every=0, checkpoint_every_s=0, **cfg_kw)
    torch.manual_seed(0)
    return Trainer(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        DataLoader(data, batch_size=2, shuffle=True),
        ctx,
        cfg,
    )


def _resume_with_a_stale_listing_on_rank_1(rank: int, world_size: int, ck: str) -> int:
    from hpc_harness import checkpoint as ckpt

    if rank == 1:  # this rank's view of the folder is stale: it lists no checkpoint
        ckpt.list_checkpoints = lambda ckpt_dir: []
    trainer = _small_trainer(gloo_context(rank, world_size), ck)
    trainer._resume()
    return trainer.global_step


def test_every_rank_resumes_the_checkpoint_rank_0_chose(tmp_path) -> None:
    ck = str(tmp_path / "ck")
    assert _small_trainer(cpu_context(), ck, max_steps=5).train() == "max_steps"
    assert spawn_gloo(_resume_with_a_stale_listing_on_rank_1, 2, ck) == [5, 5]


class RecordingTrainer(Trainer):
    """Records the sample indices of every batch it trains on."""

    seen: list[int]

    def training_step(self, batch):
        inputs, idx = batch
        self.seen.extend(idx.tolist())
        return self.model(inputs).pow(2).mean()


def _own_sampler_run(ck: str, seen: list[int], max_steps: int | None = None) -> str:
    data = TensorDataset(
        torch.randn(16, 3, generator=torch.Generator().manual_seed(1)), torch.arange(16)
    )
    cfg = TrainConfig(
        epochs=2,
        ckpt_dir=ck,
        log_every=0,
        checkpoint_every_s=0,
        replace_sampler=False,
        max_steps=max_steps,
    )
    torch.manual_seed(0)
    trainer = RecordingTrainer(
        nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5), nn.Linear(4, 1)),
        lambda p: torch.optim.SGD(p, lr=0.1),
        DataLoader(data, batch_size=2, shuffle=True),  # the user's own RandomSampler
        cpu_context(),
        cfg,
    )
    trainer.seen = seen
    return trainer.train()


@pytest.mark.parametrize(
    "stops",
    [
        (3, 11, None),  # 8 steps per epoch: stops inside both epochs
        (1, 8, 11, None),  # one batch in; at the epoch end (the checkpoint is epoch 1's start)
    ],
)
def test_resume_with_the_users_own_sampler_sees_each_sample_once_per_epoch(tmp_path, stops) -> None:
    whole: list[int] = []
    _own_sampler_run(str(tmp_path / "a"), whole)
    pieces: list[int] = []
    for stop in stops:
        _own_sampler_run(str(tmp_path / "b"), pieces, max_steps=stop)
    for epoch in range(2):
        assert sorted(pieces[16 * epoch : 16 * (epoch + 1)]) == list(range(16)), pieces
    assert pieces == whole
    a = torch.load(tmp_path / "a" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


class DictData(torch.utils.data.Dataset):
    """Regression samples as dicts: needs the user's collate_fn, and a loss that is not CE."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i]}


def collate_dicts(items: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([it["x"] for it in items]), torch.stack([it["y"] for it in items])


def _regression_trainer(ck: str, **kw) -> Trainer:
    cfg = TrainConfig(
        epochs=kw.pop("epochs", 1),
        ckpt_dir=ck,
        log_every=0,
        checkpoint_every_s=0,
        monitor=kw.pop("monitor", "test_loss"),
    )
    torch.manual_seed(0)
    return kw.pop("cls", Trainer)(
        kw.pop("model", nn.Linear(3, 1)),
        kw.pop("make_optimizer", lambda p: torch.optim.SGD(p, lr=0.01)),
        DataLoader(DictData(20, 0), batch_size=4, shuffle=True, collate_fn=collate_dicts),
        cpu_context(),
        cfg,
        loss_fn=torch.nn.functional.mse_loss,
        eval_data=DictData(11, 1),
        **kw,
    )


def test_evaluate_uses_the_users_loss_fn_and_collate_fn(tmp_path) -> None:
    trainer = _regression_trainer(str(tmp_path / "ck"))
    metrics = trainer.evaluate()
    data = DictData(11, 1)
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(trainer.model(data.x), data.y).item()
    assert metrics["test_loss"] == pytest.approx(expected, rel=1e-5)
    assert "test_acc" not in metrics  # regression: no argmax accuracy


def test_reduce_lr_on_plateau_is_stepped_with_the_test_loss(tmp_path) -> None:
    trainer = _regression_trainer(
        str(tmp_path / "ck"),
        epochs=3,
        # gradient ascent: the test loss cannot improve
        make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1, maximize=True),
        make_scheduler=lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, patience=0, factor=0.5
        ),
    )
    assert trainer.train() == "finished"
    # epoch 0 sets the best loss; epochs 1 and 2 do not improve it: halved twice
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.025)


def test_a_monitor_eval_step_does_not_return_stops_before_training(tmp_path) -> None:
    trainer = _regression_trainer(
        str(tmp_path / "ck"),
        monitor="val_loss",
        make_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau,
    )
    with pytest.raises(ValueError) as info:
        trainer.train()
    assert str(info.value) == (
        "ReduceLROnPlateau is stepped with val_loss, which eval_step does not return "
        "(it returns test_loss): set TrainConfig.monitor"
    )
    assert trainer.global_step == 0  # not after an epoch of training
    assert not os.path.exists(tmp_path / "ck" / "run.json")  # the fixed run may use the folder


class NoisyEval(Trainer):
    """An evaluation that draws random numbers (a sampled metric, a random crop)."""

    def eval_step(self, batch):
        torch.rand(5)
        return super().eval_step(batch)


def test_the_monitor_check_leaves_the_random_streams_alone(tmp_path) -> None:
    # a model with dropout: the weights depend on the global RNG stream
    def final_weights(ck: str, make_scheduler) -> torch.Tensor:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Dropout(0.5), nn.Linear(3, 1))
        trainer = _regression_trainer(ck, cls=NoisyEval, model=model, make_scheduler=make_scheduler)
        assert trainer.train() == "finished"
        return trainer.model[1].weight.detach().clone()

    never = lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=10**6)  # noqa: E731
    constant = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)  # noqa: E731
    checked = final_weights(str(tmp_path / "a"), never)
    assert torch.equal(checked, final_weights(str(tmp_path / "b"), constant))


def _resume_with_another_lr(rank: int, world_size: int, ck: str) -> str:
    from hpc_harness import checkpoint as ckpt

    trainer = _small_trainer(gloo_context(rank, world_size), ck, hparams={"lr": 0.2})
    try:
        trainer.train()
    except ckpt.RunMismatch as exc:
        return str(exc)
    return "trained"


def test_a_run_mismatch_stops_every_rank_before_training(tmp_path) -> None:
    ck = str(tmp_path / "ck")
    first = _small_trainer(cpu_context(), ck, max_steps=5, hparams={"lr": 0.1})
    assert first.train() == "max_steps"
    messages = spawn_gloo(_resume_with_another_lr, 2, ck)
    assert all("lr (0.1 -> 0.2)" in m for m in messages), messages


def _sequential_trainer(ctx, ck: str, batch_size: int, accumulate: int, **kw) -> Trainer:
    """SGD on 32 fixed samples in order (no shuffling): which samples make a step is known."""
    g = torch.Generator().manual_seed(2)
    data = TensorDataset(torch.randn(32, 3, generator=g), torch.randint(0, 2, (32,), generator=g))
    cfg = TrainConfig(
        epochs=1, ckpt_dir=ck, log_every=0, checkpoint_every_s=0, accumulate=accumulate, **kw
    )
    torch.manual_seed(0)
    return Trainer(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.5),
        DataLoader(data, batch_size=batch_size),
        ctx,
        cfg,
    )


@pytest.mark.parametrize("batch_size, accumulate", [(2, 4), (4, 2)])
def test_accumulated_steps_equal_big_batch_steps(tmp_path, batch_size, accumulate) -> None:
    ctx = cpu_context()
    small = _sequential_trainer(ctx, str(tmp_path / "a"), batch_size, accumulate)
    big = _sequential_trainer(ctx, str(tmp_path / "b"), batch_size=8, accumulate=1)
    assert small.steps_per_epoch == big.steps_per_epoch == 4
    assert small.train() == big.train() == "finished"
    assert small.global_step == big.global_step == 4
    a, b = small.model.state_dict(), big.model.state_dict()
    assert all(torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-7) for k in a)
    torch.manual_seed(0)
    assert not torch.equal(a["weight"], nn.Linear(3, 2).weight)  # it trained


@pytest.mark.parametrize("accumulate", [0, -1])
def test_accumulate_below_one_is_refused_naming_it(tmp_path, accumulate: int) -> None:
    # without the check, 0 divides by zero (steps_per_epoch) and -1 trains no batch at all
    with pytest.raises(ValueError, match=f"accumulate expects 1 or more batches, got {accumulate}"):
        _sequential_trainer(cpu_context(), str(tmp_path), 2, accumulate)


def _ddp_accumulating_rank(rank: int, world_size: int, ck: str) -> tuple[int, dict]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    trainer = _sequential_trainer(gloo_context(rank, world_size), ck, batch_size=2, accumulate=4)
    calls = [0]

    def counting_allreduce(state, bucket):  # DDP calls it once per bucket it all-reduces
        calls[0] += 1
        return allreduce_hook(None, bucket)

    trainer.model.register_comm_hook(None, counting_allreduce)
    assert trainer.train() == "finished" and trainer.global_step == 2
    state = trainer.strategy.state(trainer.model, trainer.optimizer)[0]  # rank 0's is full
    return calls[0], {k: v.tolist() for k, v in state.items()}  # tensors do not cross the queue


def test_ddp_accumulation_all_reduces_only_at_the_last_micro_batch(tmp_path) -> None:
    results = spawn_gloo(_ddp_accumulating_rank, 2, str(tmp_path / "ddp"))
    # 2 optimizer steps of 4 micro-batches: one all-reduce (one bucket) per step, not per batch
    assert [calls for calls, _ in results] == [2, 2]
    # 2 ranks x 4 x 2 samples = the 16-sample batches of one process, in the same order
    big = _sequential_trainer(cpu_context(), str(tmp_path / "one"), 16, 1)
    assert big.train() == "finished" and big.global_step == 2
    ref = big.model.state_dict()
    ddp = {k: torch.tensor(v) for k, v in results[0][1].items()}
    assert all(torch.allclose(ddp[k], ref[k], rtol=1e-6, atol=1e-7) for k in ref)


class MaeTrainer(Trainer):
    """A user eval step with its own metric, and a custom training metric from the step."""

    def eval_step(self, batch):
        inputs, targets = batch
        return {"test_mae": (self.model(inputs) - targets).abs().mean(), "test_const": 3.0}

    def training_step(self, batch):
        self.log("known", float(self.global_step + 1))  # 1, 2, 3, ... at steps 1, 2, 3, ...
        return super().training_step(batch)


class Augmented(torch.utils.data.Dataset):
    """A random augmentation in the DataLoader worker: here the whole sample."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        return torch.rand(3), i % 2


class RecordsInputs(Trainer):
    def training_step(self, batch):
        self.seen = [*getattr(self, "seen", []), batch[0].tolist()]
        return super().training_step(batch)


def _augmentations(rank: int, world_size: int, ck: str) -> list:
    cfg = TrainConfig(epochs=2, ckpt_dir=ck, log_every=0, checkpoint_every_s=0)
    loader = DataLoader(Augmented(), batch_size=2, num_workers=1)
    trainer = RecordsInputs(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        loader,
        gloo_context(rank, world_size),
        cfg,
    )
    assert trainer.train() == "finished"
    return trainer.seen


def test_dataloader_workers_draw_other_augmentations_on_each_rank(tmp_path) -> None:
    # the workers' seeds came from a generator seeded alike on every rank: every rank's j-th
    # sample got the same crop, flip or noise
    rank0, rank1 = spawn_gloo(_augmentations, 2, str(tmp_path / "ck"))
    assert len(rank0) == len(rank1) == 4  # 2 epochs of 2 steps
    assert all(a != b for a, b in zip(rank0, rank1))
    assert rank0[:2] != rank0[2:]  # and other ones in each epoch


def test_dataloader_workers_draw_other_augmentations_in_every_epoch_whatever_the_seed(
    tmp_path,
) -> None:
    """Three epochs, each its own workers' seed (not only the next epoch's: a seed taken
    modulo 2 alternates), from a run seed of any size (2**50 makes the mixed seed exceed the
    64 bits a generator takes, unless reduced to them)."""
    cfg = TrainConfig(epochs=3, ckpt_dir=str(tmp_path), log_every=0, seed=2**50)
    loader = DataLoader(Augmented(), batch_size=2, num_workers=1)
    trainer = RecordsInputs(
        nn.Linear(3, 2), lambda p: torch.optim.SGD(p, lr=0.1), loader, cpu_context(), cfg
    )
    assert trainer.train() == "finished"
    epochs = [trainer.seen[i : i + 4] for i in range(0, 12, 4)]  # 8 samples: 4 steps of 2
    assert len(trainer.seen) == 12
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2] and epochs[0] != epochs[2]


class LogsInItsLoss(Trainer):
    """Logs a training metric in ``training_step``, which the default eval_step also calls."""

    def training_step(self, batch):
        self.log("in_training", 1.0 if self.model.training else 0.0)
        return super().training_step(batch)


def test_the_evaluation_adds_nothing_to_a_training_metric(tmp_path) -> None:
    ck = str(tmp_path / "ck")
    trainer = _regression_trainer(ck, cls=LogsInItsLoss, epochs=2, monitor="test_loss")
    trainer.cfg.log_every = 5  # one log line per epoch (5 steps), after the evaluation
    assert trainer.train() == "finished"
    # the evaluation's batches (after epoch 0) went into the mean of steps 6-10: 0.5
    assert _logged(ck, "in_training") == {5: 1.0, 10: 1.0}


def _logged(run_dir: str, name: str) -> dict[int, float]:
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return {int(r["step"]): float(r["value"]) for r in csv.DictReader(f) if r["name"] == name}


def test_a_user_eval_step_and_a_custom_metric_are_logged(tmp_path) -> None:
    ck = str(tmp_path / "ck")
    cfg = TrainConfig(epochs=2, ckpt_dir=ck, log_every=2, checkpoint_every_s=0, monitor="test_mae")
    torch.manual_seed(0)
    trainer = MaeTrainer(
        nn.Linear(3, 1),
        lambda p: torch.optim.SGD(p, lr=0.1),
        DataLoader(DictData(20, 0), batch_size=4, shuffle=True, collate_fn=collate_dicts),
        cpu_context(),
        cfg,
        make_scheduler=lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, patience=0, factor=0.5
        ),
        # Zero gradients: the model does not move, so epoch 1 cannot improve the metric.
        loss_fn=lambda out, y: torch.nn.functional.mse_loss(out, y) * 0.0,
        eval_data=DictData(11, 1),
    )
    assert trainer.train() == "finished"
    data = DictData(11, 1)
    with torch.no_grad():
        mae = (trainer.model(data.x) - data.y).abs().mean().item()
    assert trainer.metrics == pytest.approx({"test_mae": mae, "test_const": 3.0})
    # logged at each epoch end (5 steps per epoch), beside the training metrics
    assert _logged(ck, "test_mae") == pytest.approx({5: mae, 10: mae})
    assert _logged(ck, "test_const") == {5: 3.0, 10: 3.0}
    # the mean of the custom metric since the previous log line: (1+2)/2, (3+4)/2, ...
    assert _logged(ck, "known") == {2: 1.5, 4: 3.5, 6: 5.5, 8: 7.5, 10: 9.5}
    assert set(_logged(ck, "train_loss")) == {2, 4, 6, 8, 10}
    # ReduceLROnPlateau stepped with the monitored eval metric: epoch 1 did not improve it
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


class EpochRecordingSampler(torch.utils.data.DistributedSampler):
    """A user's sampler whose order depends on the epoch it is told (set_epoch)."""

    def set_epoch(self, epoch: int) -> None:
        self.told.append(epoch)
        super().set_epoch(epoch)


def test_the_users_own_sampler_is_told_every_epoch(tmp_path) -> None:
    data = TensorDataset(torch.randn(8, 3), torch.arange(8) % 2)
    sampler = EpochRecordingSampler(data, num_replicas=1, rank=0, seed=0)
    sampler.told = []
    cfg = TrainConfig(
        epochs=3, ckpt_dir=str(tmp_path), log_every=0, checkpoint_every_s=0, replace_sampler=False
    )
    trainer = Trainer(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        DataLoader(data, batch_size=2, sampler=sampler),
        cpu_context(),
        cfg,
    )
    assert trainer.train() == "finished"
    assert sampler.told == [0, 1, 2]
