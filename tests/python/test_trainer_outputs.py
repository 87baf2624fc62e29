"""What a Trainer run leaves for its user, by exact value: the checkpoint's and last.pt's keys,
the epoch and progress lines, metrics.csv rows, a resumed finished run, seeding."""

from __future__ import annotations

import contextlib
import csv
import glob
import os
import random
import signal
import time
import types

import numpy as np
import pytest
import torch
from conftest import cpu_context
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness import checkpoint as ckpt
from hpc_harness import trainer as trainer_mod
from hpc_harness.metrics import MetricsLogger
from hpc_harness.trainer import TrainConfig, Trainer, seed_everything


def classes(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g))


def make_trainer(ck: str, **cfg_kw) -> Trainer:
    """8 samples, batch 2: 4 steps per epoch; evaluated on 5 samples (test_loss, test_acc)."""
    cfg = TrainConfig(
        **{"epochs": 1, "ckpt_dir": ck, "log_every": 0, "checkpoint_every_s": 0, **cfg_kw}
    )
    torch.manual_seed(0)
    return Trainer(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        DataLoader(classes(8, 0), batch_size=2, shuffle=True),
        cpu_context(),
        cfg,
        eval_data=classes(5, 1),
    )


def csv_rows(ck: str) -> list[dict[str, str]]:
    with open(os.path.join(ck, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def test_a_run_writes_the_documented_checkpoint_last_pt_lines_and_rows(tmp_path, capsys) -> None:
    ck = str(tmp_path / "ck")
    trainer = make_trainer(ck, log_every=2, hparams={"lr": 0.1})
    assert trainer.train() == "finished"
    out = capsys.readouterr().out
    m = trainer.metrics
    assert sorted(m) == ["test_acc", "test_loss"]
    assert (
        f"hpc_harness: epoch 0 test_acc {m['test_acc']:.4f} test_loss {m['test_loss']:.4f}\n" in out
    )
    assert "hpc_harness: step 2/4 epoch 0 loss " in out
    # the epoch's metrics in metrics.csv at the epoch's last step, with the epoch number
    evals = [
        (r["step"], r["epoch"], r["name"]) for r in csv_rows(ck) if r["name"].startswith("test")
    ]
    assert evals == [("4", "0", "test_acc"), ("4", "0", "test_loss")]

    path = os.path.join(ck, "ckpt_step00000004.pt")
    assert trainer.last_checkpoint == path
    state = torch.load(path, weights_only=False)
    assert state["format_version"] == ckpt.FORMAT_VERSION
    assert (state["world_size"], state["strategy"], state["precision"]) == (1, "ddp", "32")
    assert state["fingerprint"] == trainer.fingerprint
    assert state["metrics"] == m
    # the default sampler replays an epoch by itself: no epoch-start RNG is kept
    assert sorted(state["rng"][0]) == ["cuda", "numpy", "python", "torch"]

    final = torch.load(os.path.join(ck, "last.pt"), weights_only=False)
    assert sorted(final) == ["epoch", "global_step", "hparams", "metrics", "model"]
    assert (final["global_step"], final["epoch"], final["hparams"]) == (4, 1, {"lr": 0.1})
    assert final["metrics"] == m


def test_a_finished_run_resumed_keeps_last_pt_or_writes_it_when_missing(tmp_path, capsys) -> None:
    ck = str(tmp_path / "ck")
    assert make_trainer(ck).train() == "finished"
    last = os.path.join(ck, "last.pt")
    torch.save({"kept": True, "global_step": 4}, last)  # stands for the run's own last.pt
    capsys.readouterr()
    assert make_trainer(ck).train() == "finished"
    assert torch.load(last) == {"kept": True, "global_step": 4}
    checkpoint = os.path.join(ck, "ckpt_step00000004.pt")
    assert capsys.readouterr().out.endswith(
        f"hpc_harness: already finished (finished) at global step 4: {checkpoint} and {last} "
        "are kept as they are\n"
    )
    os.remove(last)  # the job died between the last checkpoint and last.pt
    assert make_trainer(ck).train() == "finished"
    assert torch.load(last, weights_only=False)["global_step"] == 4
    assert capsys.readouterr().out.endswith(f"{last} written again from it (it was missing)\n")
    with open(last, "wb") as f:
        f.write(b"cut short")  # unreadable: written again too
    assert make_trainer(ck).train() == "finished"
    assert torch.load(last, weights_only=False)["global_step"] == 4


# one process, no group: torch.distributed.checkpoint says it saves/loads as a single process
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_sharded_checkpoint_run_writes_folders_and_resumes_from_them(tmp_path, capsys) -> None:
    ck = str(tmp_path / "ck")
    trainer = make_trainer(ck, sharded_checkpoint=True, max_steps=3)
    asked, state = [], trainer.strategy.state
    trainer.strategy.state = lambda *args: asked.append(args[2:]) or state(*args)
    assert trainer.train() == "max_steps"
    # every rank's own part (fsdp's shards), never full state dicts gathered on rank 0
    assert asked == [(True,), (True,)]  # the checkpoint at step 3, then last.dcp
    assert trainer.last_checkpoint == os.path.join(ck, "ckpt_step00000003.dcp")
    assert os.path.isfile(os.path.join(ck, "ckpt_step00000003.dcp", "meta.pt"))
    assert not os.path.exists(os.path.join(ck, "ckpt_step00000003.pt"))
    resumed = make_trainer(ck, sharded_checkpoint=True)
    assert resumed.train() == "finished" and resumed.global_step == 4
    assert os.path.isfile(os.path.join(ck, "last.dcp", "meta.pt"))
    whole = make_trainer(str(tmp_path / "whole"))
    assert whole.train() == "finished"
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # run again: last.dcp/meta.pt says step 4, the run's last: kept
    capsys.readouterr()
    assert make_trainer(ck, sharded_checkpoint=True).train() == "finished"
    assert capsys.readouterr().out.endswith("last.dcp are kept as they are\n")


def fixed_clock(monkeypatch, now: list[float]) -> None:
    """The trainer module's clock reads now[0]."""
    fake = types.SimpleNamespace(perf_counter=lambda: now[0])
    monkeypatch.setattr(trainer_mod, "time", fake)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(59.6, "00:01:00"), (1938, "00:32:18"), (3600, "01:00:00"), (96800, "1d 02:53:20")],
)
def test_a_duration_shows_its_days_from_one_day_on(seconds: float, shown: str) -> None:
    assert trainer_mod.duration(seconds) == shown


def test_the_progress_line_and_rows_by_value(tmp_path, monkeypatch, capsys) -> None:
    """Two ranks (the other one's sums added by a stand-in all-reduce), batch 2, accumulate 3."""
    ck = str(tmp_path / "ck")
    trainer = make_trainer(ck, accumulate=3, log_every=10)
    trainer.logger = MetricsLogger(ck)
    trainer.world_size, trainer.total_steps = 2, 1000
    reduced = []

    def all_reduce(t):  # the other rank's sums: known 10 and train_loss 4+4+4 (sorted names)
        reduced.append(t.clone())
        t += torch.tensor([10.0, 12.0][: len(t)])

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    now = [100.5]
    fixed_clock(monkeypatch, now)
    trainer._log_step, trainer._log_time, trainer.global_step = 10, 100.0, 30
    for loss in (1.0, 2.0, 3.0):
        trainer.log("train_loss", torch.tensor(loss))
    trainer.log("known", 6.0)
    trainer._log_progress(3)
    # 20 steps in 0.5 s: 40 steps/s x 2 x 3 x 2 ranks = 480 samples/s; (1000 - 30) / 40 = 24 s
    assert capsys.readouterr().out == (
        "hpc_harness: step 30/1000 epoch 3 loss 3.0000 lr 0.1 samples/s 480 eta 00:00:24\n"
    )
    assert torch.equal(reduced[0], torch.tensor([6.0, 6.0]))
    # a slow pace (below one step a second) and no train_loss logged since: loss nan
    now[0], trainer.global_step = 102.5, 31
    trainer.log("known", 1.0)
    trainer._log_progress(3)
    # 1 step in 2 s: 0.5 steps/s, 6 samples/s; (1000 - 31) / 0.5 = 1938 s
    assert capsys.readouterr().out == (
        "hpc_harness: step 31/1000 epoch 3 loss nan lr 0.1 samples/s 6 eta 00:32:18\n"
    )
    # 1 step in 100 s: (1000 - 32) / 0.01 = 96800 s, over a day (not shown modulo 24 h)
    now[0], trainer.global_step = 202.5, 32
    trainer.log("known", 2.0)
    trainer._log_progress(3)
    assert capsys.readouterr().out.endswith(" eta 1d 02:53:20\n")
    trainer.logger.close()
    rows = [(r["step"], r["epoch"], r["name"], r["value"]) for r in csv_rows(ck)]
    assert rows == [
        ("30", "3", "known", "8"),  # (6 + 10) / (1 x 2 ranks)
        ("30", "3", "train_loss", "3"),  # (6 + 12) / (3 x 2 ranks)
        ("30", "3", "lr", "0.1"),
        ("30", "3", "samples_per_s", "480"),
        ("31", "3", "known", "5.5"),  # (1 + 10) / 2
        ("31", "3", "lr", "0.1"),
        ("31", "3", "samples_per_s", "6"),
        ("32", "3", "known", "6"),
        ("32", "3", "lr", "0.1"),
        ("32", "3", "samples_per_s", "0.12"),
    ]


@pytest.mark.parametrize("world_size, initialized", [(1, True), (2, False)])
def test_progress_needs_no_collective_without_a_group_of_several_ranks(
    tmp_path, monkeypatch, capsys, world_size: int, initialized: bool
) -> None:
    trainer = make_trainer(str(tmp_path), log_every=10)
    trainer.logger = MetricsLogger(str(tmp_path), enabled=False)
    trainer.world_size = world_size

    def all_reduce(t):
        raise AssertionError("no all-reduce expected")

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: initialized)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: world_size)
    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    trainer._log_step, trainer._log_time = 0, time.perf_counter()
    trainer.log("train_loss", 2.0 * world_size)
    trainer._log_progress(0)
    assert " loss 2.0000 " in capsys.readouterr().out


def _progress_of(tmp_path, values: list, default_device: str | None = None) -> None:
    """The log line of ``values`` logged as train_loss, made with ``default_device`` as
    torch's default device."""
    trainer = make_trainer(str(tmp_path), log_every=10)
    trainer.logger = MetricsLogger(str(tmp_path), enabled=False)
    trainer._log_step, trainer._log_time = 0, time.perf_counter()
    for value in values:
        trainer.log("train_loss", value)
    with torch.device(default_device) if default_device else contextlib.nullcontext():
        trainer._log_progress(0)


def test_bfloat16_values_are_averaged_in_float32(tmp_path, capsys) -> None:
    """A loss logged in bf16 (autocast): 256 + 1 is 257 in float32, and 256 in bfloat16."""
    _progress_of(tmp_path, [torch.tensor(v, dtype=torch.bfloat16) for v in (256.0, 1.0)])
    assert " loss 128.5000 " in capsys.readouterr().out


def test_numbers_are_put_on_the_runs_device_whatever_torchs_default_device(
    tmp_path, capsys
) -> None:
    """A user's script may change torch's default device (torch.set_default_device); the
    values logged as Python numbers go where the run trains ("meta" stands for another device:
    the only one there is without a GPU)."""
    _progress_of(tmp_path, [2.0], default_device="meta")
    assert " loss 2.0000 " in capsys.readouterr().out


def test_seed_everything_seeds_python_numpy_and_torch() -> None:
    seed = 2**32 + 7  # numpy takes 32 bits: it gets 7
    seed_everything(seed)
    drawn = random.random(), np.random.rand(), torch.rand(1).item()
    random.seed(seed)
    np.random.seed(7)
    torch.manual_seed(seed)
    assert drawn == (random.random(), np.random.rand(), torch.rand(1).item())


def test_print_joins_its_arguments_like_print_on_rank_0_only(tmp_path, capsys) -> None:
    trainer = make_trainer(str(tmp_path))
    trainer._print("hpc_harness:", 3, "steps")
    trainer.is_main = False
    trainer._print("not", "shown")
    assert capsys.readouterr().out == "hpc_harness: 3 steps\n"


def test_a_run_that_resumes_nothing_starts_its_own_metrics_csv(tmp_path, capsys) -> None:
    """--no-resume over an earlier run's folder (or an attempt killed before its first
    checkpoint): the earlier rows go aside, never mixed with this run's steps; a resumed run
    goes on appending to its own."""
    ck = str(tmp_path / "ck")
    assert make_trainer(ck, log_every=1).train() == "finished"
    capsys.readouterr()
    assert make_trainer(ck, log_every=1, resume=False, epochs=3, max_steps=8).train() == (
        "max_steps"
    )
    [aside] = glob.glob(os.path.join(ck, "metrics.csv.old-*"))
    assert f"the earlier run's metrics are in {aside}\n" in capsys.readouterr().out
    steps = [r["step"] for r in csv_rows(ck) if r["name"] == "train_loss"]
    assert steps == ["1", "2", "3", "4", "5", "6", "7", "8"]  # this run's, once each
    with open(aside) as f:
        assert [r["step"] for r in csv.DictReader(f) if r["name"] == "train_loss"] == list("1234")
    assert make_trainer(ck, log_every=1, epochs=3).train() == "finished"  # resumed: appended
    assert [r["step"] for r in csv_rows(ck) if r["name"] == "train_loss"][8:] == list("9") + [
        "10",
        "11",
        "12",
    ]
    assert glob.glob(os.path.join(ck, "metrics.csv.old-*")) == [aside]


def test_a_signal_while_the_logger_closes_is_still_the_trainers(tmp_path, monkeypatch) -> None:
    """Under torchrun a rank that exits 42 first makes the agent SIGTERM the others, which may
    be finishing their W&B run: the handlers stay installed until the logger is closed, so
    that SIGTERM is a flag, not the default handler's death mid-upload."""
    seen: list[int] = []

    class SignalledWhileClosing(MetricsLogger):
        def close(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            super().close()

    monkeypatch.setattr(trainer_mod, "MetricsLogger", SignalledWhileClosing)
    previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        trainer = make_trainer(str(tmp_path / "ck"))
        assert trainer.train() == "finished"
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [] and trainer.agreement.signum == signal.SIGTERM


def test_the_epochs_evaluation_is_the_last_row_of_its_step_and_no_other_is(
    tmp_path, monkeypatch
) -> None:
    """With ``--wandb-sync login`` the logger commits a row marked last_at_step at once (W&B
    holds a step's row open otherwise): the evaluation is that row, the progress lines are not."""
    rows: list[tuple[list[str], bool]] = []
    log = MetricsLogger.log

    def spy(self, step, epoch, values, *, last_at_step=False) -> None:
        rows.append((sorted(values), last_at_step))
        log(self, step, epoch, values, last_at_step=last_at_step)

    monkeypatch.setattr(MetricsLogger, "log", spy)
    assert make_trainer(str(tmp_path / "ck"), log_every=2).train() == "finished"
    progress = ["lr", "samples_per_s", "train_loss"]
    assert rows == [(progress, False), (progress, False), (["test_acc", "test_loss"], True)]


def test_a_run_that_raises_leaves_a_failed_row_at_its_step_and_epoch(tmp_path) -> None:
    ck = str(tmp_path / "ck")
    trainer = make_trainer(ck, epochs=2)  # 4 steps an epoch
    train_step = trainer.training_step

    def fails_at_step_6(batch):
        if trainer.global_step == 5:
            raise RuntimeError("a bug in step 6")
        return train_step(batch)

    trainer.training_step = fails_at_step_6
    with pytest.raises(RuntimeError, match="a bug in step 6"):
        trainer.train()
    last = csv_rows(ck)[-1]
    assert (last["step"], last["epoch"], last["name"], last["value"]) == ("5", "1", "failed", "1")
