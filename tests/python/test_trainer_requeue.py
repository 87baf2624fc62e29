"""The Trainer's signal path in-process: SIGUSR1 at a known step -> checkpoint, requeue marker,
the announcement, W&B told "preempting" and finished with 42, and the resume that follows."""

from __future__ import annotations

import importlib.machinery
import json
import os
import signal
import sys
import time
import types
from multiprocessing import forkserver

import pytest
import torch
from conftest import gloo_context, spawn_gloo
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness import dist as hdist
from hpc_harness.trainer import TrainConfig, Trainer


class CountingData(TensorDataset):
    """16 samples; counts every sample read (a skipped batch is read too)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(3)
        super().__init__(torch.randn(16, 3, generator=g), torch.arange(16) % 2)
        self.reads = 0

    def __getitem__(self, i):
        self.reads += 1
        return super().__getitem__(i)


class SignalAtStep(Trainer):
    """Sends itself SIGUSR1 while computing the loss of global step ``signal_at`` (1-based)."""

    signal_at = 0

    def training_step(self, batch):
        if self.global_step + 1 == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)
        return super().training_step(batch)


class FakeRun:
    id, dir = "fake0001", "."

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log(self, values, step=None) -> None:
        self.calls.append(("log", step))

    def mark_preempting(self) -> None:
        self.calls.append(("mark_preempting",))

    def finish(self, exit_code=None) -> None:
        self.calls.append(("finish", exit_code))


def fake_wandb(monkeypatch) -> list[FakeRun]:
    """A ``wandb`` module whose ``init`` hands out FakeRuns (returned list) and does nothing."""
    runs: list[FakeRun] = []
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    module.init = lambda **kw: runs.append(FakeRun()) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return runs


def make_trainer(ck: str, data: CountingData, signal_at: int = 0, **cfg_kw) -> SignalAtStep:
    cfg = TrainConfig(
        epochs=2,
        ckpt_dir=ck,
        log_every=0,
        checkpoint_every_s=0,
        signal_check_every=1,  # the flag is read at the step it was raised in
        replace_sampler=False,  # the user's own RandomSampler (replays an epoch on resume)
        **cfg_kw,
    )
    torch.manual_seed(0)
    trainer = SignalAtStep(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        DataLoader(data, batch_size=2, shuffle=True),  # 8 steps per epoch
        hdist.setup(verbose=False),
        cfg,
    )
    trainer.signal_at = signal_at
    return trainer


def test_a_signal_at_an_epochs_last_step_requeues_and_the_resume_reads_only_the_next_epoch(
    tmp_path, monkeypatch, capsys
) -> None:
    ck, marker = str(tmp_path / "ck"), str(tmp_path / "requeue.json")
    monkeypatch.setenv("HPC_REQUEUE_MARKER", marker)
    runs = fake_wandb(monkeypatch)
    trainer = make_trainer(ck, CountingData(), signal_at=8, wandb="offline")
    assert trainer.train() == "requeue"
    path = os.path.join(ck, "ckpt_step00000008.pt")
    assert trainer.last_checkpoint == path and os.path.isfile(path)
    with open(marker) as f:
        assert json.load(f) == {"step": 8, "epoch": 0, "checkpoint": path, "signal": "SIGUSR1"}
    assert (
        f"hpc_harness: SIGUSR1 received: checkpointed at global step 8 to {path}; "
        f"exiting 42 (requeue me); marker {marker}\n"
    ) in capsys.readouterr().out
    # W&B: preempting, then finished with the requeue exit code (a sweep hands it out again)
    assert runs[0].calls[-2:] == [("mark_preempting",), ("finish", 42)]
    state = torch.load(path, weights_only=False)
    assert (state["epoch"], state["step_in_epoch"], state["global_step"]) == (0, 8, 8)

    data = CountingData()
    resumed = make_trainer(ck, data)
    assert resumed.train() == "finished" and resumed.global_step == 16
    assert data.reads == 16  # epoch 0 was complete: none of its batches is read again


class CountingEvals(SignalAtStep):
    evals = 0

    def eval_step(self, batch):
        self.evals += 1
        return super().eval_step(batch)


def test_a_signal_not_yet_read_at_an_epochs_end_requeues_before_the_evaluation(
    tmp_path, monkeypatch
) -> None:
    # the evaluation (and the epochs after it) may outlast the signal's lead before the wall
    # time: the epoch's end asks every rank at once instead of waiting for the next check
    monkeypatch.delenv("HPC_REQUEUE_MARKER", raising=False)
    data = CountingData()
    cfg = TrainConfig(epochs=2, ckpt_dir=str(tmp_path), log_every=0, checkpoint_every_s=0)
    cfg.signal_check_every = 1000  # no check inside these epochs
    trainer = CountingEvals(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        DataLoader(data, batch_size=2, shuffle=True),
        hdist.setup(verbose=False),
        cfg,
        eval_data=data,
    )
    trainer.signal_at = 5
    assert trainer.train() == "requeue"
    assert (trainer.global_step, trainer.evals) == (8, 0)
    state = torch.load(trainer.last_checkpoint, weights_only=False)
    assert (state["epoch"], state["step_in_epoch"]) == (0, 8)  # the resume evaluates epoch 0


def _requeue_with_a_slow_marker(rank: int, world_size: int, ck: str, marker: str):
    """Both ranks signalled at step 3; rank 0's marker takes a second to write (a slow shared
    file system). Returns the status and whether the marker existed when train() returned."""
    from hpc_harness import signals

    os.environ["HPC_REQUEUE_MARKER"] = marker
    if rank == 0:
        write = signals.atomic_write
        signals.atomic_write = lambda *args: (time.sleep(1.0), write(*args))[1]
    cfg = TrainConfig(epochs=2, ckpt_dir=ck, log_every=0, checkpoint_every_s=0)
    cfg.signal_check_every = 1  # the flag is read at the step it was raised in
    torch.manual_seed(0)
    trainer = SignalAtStep(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        DataLoader(CountingData(), batch_size=2, shuffle=True),
        gloo_context(rank, world_size),
        cfg,
    )
    trainer.signal_at = 3
    status = trainer.train()
    return status, os.path.exists(marker)


def test_no_rank_returns_from_a_requeue_before_rank_0_has_written_the_marker(tmp_path) -> None:
    # torchrun's agent takes a worker's exit 42 for a failure and stops the other workers
    # (SIGTERM): a rank that returned (and exited 42) before rank 0 wrote the marker would cost
    # the job its requeue. Rank 1 returned at once here before the fix.
    marker = str(tmp_path / "requeue.json")
    results = spawn_gloo(_requeue_with_a_slow_marker, 2, str(tmp_path / "ck"), marker)
    assert results == [("requeue", True), ("requeue", True)]


class SignalsEveryone(TensorDataset):
    """Reading sample 0 sends ``signum`` to the training process, the worker's parent (a
    forkserver's server) and the worker itself, once (a marker file): SLURM signals every
    process of a step, DataLoader workers included."""

    def __init__(self, marker: str, signum: int) -> None:
        g = torch.Generator().manual_seed(3)
        super().__init__(torch.randn(64, 3, generator=g), torch.arange(64) % 2)
        self.marker, self.signum, self.training_pid = marker, signum, os.getpid()

    def __getitem__(self, i):
        if i == 0 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            for pid in dict.fromkeys([self.training_pid, os.getppid(), os.getpid()]):
                os.kill(pid, self.signum)
        return super().__getitem__(i)


def _signal_reaches_the_workers(tmp_path, signum: int, context: str | None) -> str:
    data = SignalsEveryone(str(tmp_path / "signalled"), signum)
    loader = DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context=context)
    cfg = TrainConfig(epochs=2, ckpt_dir=str(tmp_path / "ck"), signal_check_every=1)
    model = nn.Linear(3, 2)
    trainer = Trainer(
        model, lambda p: torch.optim.SGD(p, lr=0.1), loader, hdist.setup(verbose=False), cfg
    )
    return trainer.train()


@pytest.mark.parametrize(
    ("signum", "context"),
    [
        (signal.SIGTERM, None),
        (signal.SIGTERM, "spawn"),
        (signal.SIGUSR1, "spawn"),
        (signal.SIGUSR1, "forkserver"),
        (signal.SIGTERM, "forkserver"),
    ],
)
def test_a_signal_to_the_dataloader_workers_too_checkpoints_and_requeues(
    tmp_path, signum: int, context: str | None
) -> None:
    """Before, each of these crashed the training ("DataLoader worker ... exited
    unexpectedly"): torch's worker handler takes a SIGTERM not sent by its parent as fatal; a
    spawned worker has no handler for SIGUSR1; a forkserver's server died of it too; and
    the forkserver's workers took SIGTERM when Python's resource tracker, started with the
    server, had unblocked it (see data.shield_workers)."""
    if context == "forkserver":
        # A rank's first forkserver is its loader's, as under torchrun. The session's, started
        # by spawn_gloo with the signals deliverable, would die of the signal and take the
        # workers with it (their watchdog quits when their parent changes): a race the
        # training wins or loses by load.
        forkserver._forkserver._stop()
    try:
        assert _signal_reaches_the_workers(tmp_path, signum, context) == "requeue"
        if context == "forkserver":
            assert _alive(forkserver._forkserver._forkserver_pid), "the forkserver died"
    finally:
        if context == "forkserver":
            forkserver._forkserver._stop()  # spawn_gloo's later ranks get its preload again
    assert any(n.startswith("ckpt_step") for n in os.listdir(tmp_path / "ck"))


def _alive(pid: int) -> bool:
    """Whether ``pid``, a child of this process, runs (a dead child stays a zombie)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
