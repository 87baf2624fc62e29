"""Trainer.train() from start to end, in-process: ``fresh`` and a requeue of the same SLURM job,
``run.json``, a run resumed past its end, per-rank seeding (fresh and on a resume with another
world size, that world faked in this process with test_pieces.TwoRanks), what a resume restores
(metrics, scheduler), what the logger is given, the final line by exact text, and what the
constructor hands on (strategy, stop agreement, the user's own loader, the disabled scaler)."""

from __future__ import annotations

import glob
import itertools
import json
import os
import signal
from typing import Any

import pytest
import torch
from conftest import FakeRun, cpu_context, gloo_context
from test_pieces import TwoRanks
from test_trainer_outputs import classes, fixed_clock, make_trainer
from test_trainer_requeue import SignalAtStep
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from hpc_harness import checkpoint as ckpt
from hpc_harness import pieces
from hpc_harness import trainer as trainer_mod
from hpc_harness.trainer import TrainConfig, Trainer


def build(
    ck: str,
    ctx: Any = None,
    trainer_cls: type[Trainer] = Trainer,
    make_scheduler: Any = None,
    loader: DataLoader | None = None,
    **cfg_kw: Any,
) -> Trainer:
    """test_trainer_outputs.make_trainer's run (8 samples, batch 2: 4 steps per epoch, evaluated
    on 5), with the rank's context, the Trainer class, a scheduler or the loader given."""
    cfg = TrainConfig(
        **{"epochs": 1, "ckpt_dir": ck, "log_every": 0, "checkpoint_every_s": 0, **cfg_kw}
    )
    torch.manual_seed(0)
    return trainer_cls(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        loader or DataLoader(classes(8, 0), batch_size=2, shuffle=True),
        ctx or cpu_context(),
        cfg,
        make_scheduler=make_scheduler,
        eval_data=classes(5, 1),
    )


def ckpt_files(ck: str) -> list[str]:
    return sorted(f for f in os.listdir(ck) if f.startswith("ckpt_step"))


def read_run_json(ck: str) -> dict[str, Any]:
    with open(os.path.join(ck, ckpt.RUN_FILE)) as f:
        return json.load(f)


def draws(seed: int) -> torch.Tensor:
    return torch.rand(4, generator=torch.Generator().manual_seed(seed))


def metrics_text(metrics: dict[str, float]) -> str:
    return "".join(f" {k}={v:.4f}" for k, v in metrics.items())


# --------------------------------------------------------------------------- fresh, run.json


def test_fresh_moves_an_earlier_jobs_folder_aside_but_keeps_its_own_jobs(
    tmp_path, monkeypatch, capsys
) -> None:
    """A requeued job runs its command again, --fresh included: the folder whose run.json this
    same SLURM job wrote is resumed, not moved; another job's is moved aside, and said so."""
    ck = str(tmp_path / "ck")
    monkeypatch.setenv("SLURM_JOB_ID", "111")
    assert make_trainer(ck).train() == "finished"
    capsys.readouterr()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert make_trainer(ck, fresh=True).train() == "finished"  # the same job, requeued
    out = capsys.readouterr().out
    assert "starting fresh" not in out and "hpc_harness: already finished (finished)" in out
    assert glob.glob(f"{ck}.old-*") == []

    monkeypatch.setenv("SLURM_JOB_ID", "222")  # a new job with --fresh
    trainer = make_trainer(ck, fresh=True)
    assert trainer.train() == "finished" and trainer.global_step == 4
    [aside] = glob.glob(f"{ck}.old-*")
    out = capsys.readouterr().out
    assert out.startswith(f"hpc_harness: starting fresh; the earlier run's files are in {aside}\n")
    assert "resumed from" not in out  # trained from scratch
    assert ckpt_files(aside) == ["ckpt_step00000004.pt"]
    assert read_run_json(ck)["slurm_job_id"] == "222"


def test_fresh_moves_a_separate_run_dir_aside_with_the_checkpoints(
    tmp_path, monkeypatch, capsys
) -> None:
    """metrics.csv and wandb_run_id live in --run-dir: left in place, the fresh run appended
    to the earlier run's rows and logged into its W&B run."""
    ck, runs = str(tmp_path / "ck"), str(tmp_path / "runs")
    monkeypatch.setenv("SLURM_JOB_ID", "111")
    assert make_trainer(ck, run_dir=runs, log_every=1).train() == "finished"
    capsys.readouterr()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert make_trainer(ck, run_dir=runs, fresh=True).train() == "finished"  # requeued
    assert glob.glob(f"{runs}.old-*") == [] and "starting fresh" not in capsys.readouterr().out
    monkeypatch.setenv("SLURM_JOB_ID", "222")
    assert make_trainer(ck, run_dir=runs, fresh=True, log_every=1).train() == "finished"
    [ck_aside], [runs_aside] = glob.glob(f"{ck}.old-*"), glob.glob(f"{runs}.old-*")
    assert f"the earlier run's files are in {ck_aside} and {runs_aside}\n" in (
        capsys.readouterr().out
    )
    for folder in (runs, runs_aside):  # 4 steps logged by each run, each in its own file
        with open(os.path.join(folder, "metrics.csv")) as f:
            assert f.read().count(",train_loss,") == 4


def test_run_json_is_this_runs_claim_written_at_every_start(tmp_path) -> None:
    ck = str(tmp_path / "ck")
    trainer = make_trainer(ck)
    assert trainer.train() == "finished"
    first = read_run_json(ck)
    assert first["fingerprint"] == trainer.fingerprint and first["writer"] == ckpt.RUN_MARK
    with open(os.path.join(ck, ckpt.RUN_FILE), "w") as f:
        json.dump({**first, "writer": "an earlier process"}, f)
    assert make_trainer(ck).train() == "finished"  # resumed: the same run, claimed again
    assert read_run_json(ck)["writer"] == ckpt.RUN_MARK
    # another run's run.json, not resumed (resume=False skips the identity check): replaced
    with open(os.path.join(ck, ckpt.RUN_FILE), "w") as f:
        json.dump({"fingerprint": {"lr": 5}, "note": "other run"}, f)
    trainer = make_trainer(ck, resume=False)
    assert trainer.train() == "finished"
    assert read_run_json(ck)["fingerprint"] == trainer.fingerprint
    assert "note" not in read_run_json(ck)


class TakenOverAtStep3(Trainer):
    """At step 3 another run takes the folder: a later job claims it (``how="job"``: its
    run.json), or a job with --fresh moves it aside (``how="fresh"``)."""

    how = "job"

    def _run_batch(self, batches: Any) -> None:
        super()._run_batch(batches)
        if self.global_step + 1 == 3:
            ck = self.cfg.ckpt_dir
            if self.how == "job":
                record = {**read_run_json(ck), "writer": "job 2's", "slurm_job_id": "2"}
                with open(os.path.join(ck, ckpt.RUN_FILE), "w") as f:
                    json.dump(record, f)
            else:
                os.rename(ck, ck + ".old-20261124T000000Z")


@pytest.mark.parametrize("how", ["job", "fresh"])
def test_a_run_whose_folder_another_run_took_over_stops_without_saving(tmp_path, how) -> None:
    """Two runs saving into one folder interleave their checkpoints (and prune each other's);
    a resume then picks whichever is newest. The run that lost the folder stops at its next
    save (RunMismatch: exit 2 in the examples), before writing anything."""
    ck = str(tmp_path / "ck")
    trainer = build(ck, trainer_cls=TakenOverAtStep3, checkpoint_every=2)
    trainer.how = how
    with pytest.raises(ckpt.RunMismatch) as stopped:
        trainer.train()
    by = "SLURM job 2" if how == "job" else "run.json is gone: --fresh?"
    assert str(stopped.value) == (
        f"{ck} was taken over by another run ({by}) since this one started: stopping without "
        "saving (one folder holds one run's checkpoints)"
    )
    assert trainer.global_step == 4
    if how == "job":
        assert ckpt_files(ck) == ["ckpt_step00000002.pt"]
    else:
        assert not os.path.exists(ck)  # not made again by the save


@pytest.mark.parametrize("resume", [True, False])
def test_rank_1_seeds_its_own_stream_and_writes_nothing(tmp_path, monkeypatch, resume) -> None:
    """Rank 1 of 2, faked in this process (pieces' collectives by TwoRanks, rank 0 having
    found no checkpoint): it seeds seed + 1, and leaves run.json and every file to rank 0."""
    ck = str(tmp_path / "ck")
    # rank 0's answers: no checkpoint (when resuming), then (at the final save) the folder is
    # still this run's
    nothing = [((None, None), None)]  # on_rank0's (result, error): no path, no state
    rank1 = TwoRanks(rank=1, sent=[(None, None)], replies=[nothing] if resume else [])
    monkeypatch.setattr(pieces, "_group", lambda: rank1)
    seeds: list[int] = []
    real = trainer_mod.seed_everything
    monkeypatch.setattr(trainer_mod, "seed_everything", lambda s: seeds.append(s) or real(s))
    trainer = build(ck, gloo_context(1, 2), seed=5, resume=resume)
    assert trainer.train() == "finished" and trainer.global_step == 2  # 4 samples of 8
    assert seeds == [6]
    assert not os.path.exists(ck)  # no run.json, no checkpoint, no last.pt, no metrics.csv


def test_a_fresh_run_seeds_seed_plus_rank_and_a_resumed_one_does_not(tmp_path, monkeypatch) -> None:
    ck = str(tmp_path / "ck")
    seeds: list[int] = []
    real = trainer_mod.seed_everything
    monkeypatch.setattr(trainer_mod, "seed_everything", lambda s: seeds.append(s) or real(s))
    assert make_trainer(ck, seed=5, max_steps=2).train() == "max_steps"
    assert seeds == [5]  # rank 0
    assert make_trainer(ck, seed=5).train() == "finished"
    assert seeds == [5]  # resumed: its RNG states come from the checkpoint instead


# --------------------------------------------------------------------------- resume


def test_a_run_resumed_past_its_max_steps_is_already_finished_and_draws_nothing(
    tmp_path, capsys
) -> None:
    ck = str(tmp_path / "ck")
    assert make_trainer(ck, max_steps=3).train() == "max_steps"
    capsys.readouterr()
    trainer = make_trainer(ck, max_steps=3)
    torch.manual_seed(123)
    assert trainer.train() == "max_steps"
    # the process's random streams are as the caller left them (the checkpoint's are not loaded)
    drawn = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(drawn, torch.rand(3))
    checkpoint, last = os.path.join(ck, "ckpt_step00000003.pt"), os.path.join(ck, "last.pt")
    assert capsys.readouterr().out.endswith(
        f"hpc_harness: already finished (max_steps) at global step 3: {checkpoint} and {last} "
        "are kept as they are\n"
    )


def test_a_resume_with_another_world_size_seeds_each_rank_and_sends_no_model(
    tmp_path, monkeypatch
) -> None:
    """A checkpoint of one rank resumed by two, both faked here (TwoRanks): rank 0 broadcasts
    the state without model and optimizer (Strategy.load sends those itself); the saved RNG
    states are for another world size, so each rank seeds seed + rank."""
    ck = str(tmp_path / "ck")
    assert make_trainer(ck, seed=5, max_steps=2).train() == "max_steps"
    rank0 = TwoRanks(rank=0)
    monkeypatch.setattr(pieces, "_group", lambda: rank0)
    trainer = build(ck, gloo_context(0, 2), seed=5)
    assert trainer._resume() is True and trainer.global_step == 2
    assert torch.equal(torch.rand(4), draws(5))
    [((path, rest), error)] = rank0.sent
    assert (path, error) == (os.path.join(ck, "ckpt_step00000002.pt"), None)
    assert "model" not in rest and "optimizer" not in rest
    assert {"global_step", "epoch", "scheduler", "metrics"} <= set(rest)

    rank1 = TwoRanks(rank=1, sent=rank0.sent)
    monkeypatch.setattr(pieces, "_group", lambda: rank1)
    trainer = build(ck, gloo_context(1, 2), seed=5)
    loaded: list[dict] = []
    monkeypatch.setattr(trainer.strategy, "load", lambda m, o, state: loaded.append(state))
    assert trainer._resume() is True and trainer.global_step == 2
    assert torch.equal(torch.rand(4), draws(6))
    assert (loaded[0]["model"], loaded[0]["optimizer"]) == (None, None)  # rank 0 sends them


def test_a_resume_with_another_world_size_goes_on_from_the_epochs_samples_all_ranks_read(
    tmp_path, monkeypatch, capsys
) -> None:
    """Rank r reads every W-th sample of the epoch's order from r, so k steps of batch B read
    its first k*B*W samples (test_sampler_contract). Under another world size the resume goes
    on after as many of them as whole steps of the new world cover: none skipped, fewer than
    one step's samples read twice. Counted per rank as before, 1 -> 2 ranks at step 3 read 6
    samples twice, and 2 -> 1 skipped 6."""
    ck = str(tmp_path / "ck")
    data = DataLoader(classes(24, 0), batch_size=2, shuffle=True)  # 12 steps of 1 rank, 6 of 2
    assert build(ck, loader=data, max_steps=3).train() == "max_steps"
    monkeypatch.setattr(pieces, "_group", lambda: TwoRanks(rank=0))
    two = build(ck, gloo_context(0, 2), loader=data)
    assert two._resume() is True and (two.global_step, two.step_in_epoch) == (3, 1)
    assert (
        "hpc_harness: warning: world size 1 -> 2 in epoch 0: 6 of its samples were read; "
        "going on after 4 (step 1 of 2 ranks), 2 read again\n"
    ) in capsys.readouterr().out

    path = os.path.join(ck, "ckpt_step00000003.pt")
    state = torch.load(path, weights_only=False)
    ckpt.atomic_save({**state, "world_size": 2}, path)  # as if 2 ranks had saved it
    monkeypatch.setattr(pieces, "_group", lambda: None)
    one = build(ck, loader=data)
    assert one._resume() is True and (one.global_step, one.step_in_epoch) == (3, 6)
    assert "world size 2 -> 1 in epoch 0: 12 of its samples were read; going on after 12 " in (
        capsys.readouterr().out
    )


def test_a_resume_on_more_ranks_past_their_epoch_length_goes_on_in_the_epoch(
    tmp_path, monkeypatch, capsys
) -> None:
    """1 rank saved at step 8 of 12; 2 ranks have 6 steps an epoch. Before, step 8 >= 6 read
    as the epoch's end, unrescaled and unannounced: 8 of its 24 samples never trained."""
    ck = str(tmp_path / "ck")
    data = DataLoader(classes(24, 0), batch_size=2, shuffle=True)
    assert build(ck, loader=data, max_steps=8).train() == "max_steps"
    capsys.readouterr()
    monkeypatch.setattr(pieces, "_group", lambda: TwoRanks(rank=0))
    two = build(ck, gloo_context(0, 2), loader=data)
    assert two._resume() is True and (two.epoch, two.step_in_epoch) == (0, 4)
    assert "world size 1 -> 2 in epoch 0: 16 of its samples were read" in capsys.readouterr().out


def test_an_epoch_ended_under_another_world_size_stays_ended(tmp_path) -> None:
    """A checkpoint at the last of an epoch's 7 steps on 2 ranks (stored: steps_per_epoch),
    resumed on 1 rank (13 steps an epoch): the epoch is over, step 13 of 13."""
    ck = str(tmp_path / "ck")
    data = DataLoader(classes(25, 0), batch_size=2, shuffle=True)
    first = build(ck, loader=data, max_steps=3)
    first.train()
    path = os.path.join(ck, "ckpt_step00000003.pt")
    state = torch.load(path, weights_only=False)
    assert state["steps_per_epoch"] == first.steps_per_epoch == 13
    saved = {"world_size": 2, "step_in_epoch": 7, "steps_per_epoch": 7}
    ckpt.atomic_save({**state, **saved}, path)
    one = build(ck, loader=data)
    assert one._resume() is True and (one.epoch, one.step_in_epoch) == (0, 13)


@pytest.mark.parametrize(
    "saved_world, saved_step, at",
    [
        (1, 3, 3),  # mid-epoch, the same world size
        (2, 12, 12),  # at the epoch's end (2 ranks would not get there; the bound is tested)
        (2, 0, 0),  # at an epoch's start
        (2, 1, 2),  # after one step: 2 samples of each of 2 ranks are 2 steps of 1
        (2, None, 6),  # a checkpoint without steps_per_epoch (older): rescaled from step 3
    ],
)
def test_only_a_mid_epoch_resume_under_another_world_size_is_rescaled(
    tmp_path, capsys, saved_world, saved_step, at
) -> None:
    ck = str(tmp_path / "ck")
    data = DataLoader(classes(24, 0), batch_size=2, shuffle=True)  # 12 steps of 1 rank
    build(ck, loader=data, max_steps=3).train()
    path = os.path.join(ck, "ckpt_step00000003.pt")
    state = torch.load(path, weights_only=False)
    if saved_step is None:  # written before checkpoints held steps_per_epoch
        del state["steps_per_epoch"]
    ckpt.atomic_save(
        {
            **state,
            "world_size": saved_world,
            "step_in_epoch": 3 if saved_step is None else saved_step,
        },
        path,
    )
    capsys.readouterr()
    one = build(ck, loader=data)
    assert one._resume() is True and one.step_in_epoch == at
    assert ("world size" in capsys.readouterr().out) == (saved_step in (1, None))


def test_a_resume_restores_the_metrics_and_the_scheduler(tmp_path, monkeypatch, capsys) -> None:
    """The eval metrics of the last epoch end and the scheduler's state come back; a run
    resumed without a scheduler ignores the saved one. The final line shows the metrics."""
    ck = str(tmp_path / "ck")

    def step_lr(opt: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    first = build(ck, make_scheduler=step_lr, epochs=2, max_steps=5)
    assert first.train() == "max_steps"
    saved = first.metrics
    assert sorted(saved) == ["test_acc", "test_loss"]  # epoch 0 ended at step 4
    capsys.readouterr()
    fixed_clock(monkeypatch, [100.0])
    resumed = build(ck, make_scheduler=step_lr, epochs=2, max_steps=6)
    assert resumed.train() == "max_steps"
    assert resumed.metrics == saved  # epoch 1 has not ended: the restored metrics
    assert resumed.scheduler.last_epoch == 6
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**6)
    assert capsys.readouterr().out.endswith(
        f"hpc_harness: max_steps at global step 6 in 0.0s{metrics_text(saved)}\n"
    )
    without = build(ck, epochs=2, max_steps=7)
    assert without.train() == "max_steps" and without.scheduler is None
    # the optimizer's learning rate as saved, no longer halved at each step
    assert without.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**6)


def test_a_job_requeued_at_its_last_step_saves_the_epochs_end_and_a_rerun_keeps_it(
    tmp_path, monkeypatch, capsys
) -> None:
    """SIGUSR1 at the last step: the resumed job trains no step; it evaluates, saves that step
    again with the epoch's end and its metrics, and writes last.pt. Before, the checkpoint
    stayed the one of epoch 0 before its evaluation: every rerun of the finished run evaluated
    again, rewrote last.pt and logged the metrics again. The final line by exact text (a
    fixed clock)."""
    ck = str(tmp_path / "ck")
    monkeypatch.setenv("HPC_REQUEUE_MARKER", str(tmp_path / "requeue.json"))
    trainer = build(ck, trainer_cls=SignalAtStep, signal_check_every=1)
    trainer.signal_at = 4
    assert trainer.train() == "requeue"
    capsys.readouterr()
    fixed_clock(monkeypatch, [100.0])
    resumed = build(ck)
    assert resumed.train() == "finished" and resumed.global_step == 4
    assert ckpt_files(ck) == ["ckpt_step00000004.pt"]
    state = torch.load(os.path.join(ck, "ckpt_step00000004.pt"), weights_only=False)
    assert (state["epoch"], state["step_in_epoch"], state["metrics"]) == (1, 0, resumed.metrics)
    last = torch.load(os.path.join(ck, "last.pt"), weights_only=False)
    assert (last["global_step"], last["epoch"], last["metrics"]) == (4, 1, resumed.metrics)
    assert sorted(resumed.metrics) == ["test_acc", "test_loss"]
    assert capsys.readouterr().out.endswith(
        f"hpc_harness: finished at global step 4 in 0.0s{metrics_text(resumed.metrics)}\n"
    )
    written = os.stat(os.path.join(ck, "last.pt")).st_mtime_ns
    assert build(ck).train() == "finished"
    assert "already finished (finished) at global step 4" in capsys.readouterr().out
    assert os.stat(os.path.join(ck, "last.pt")).st_mtime_ns == written


def test_a_run_with_nothing_to_train_still_checkpoints_step_0(tmp_path, capsys) -> None:
    ck = str(tmp_path / "ck")
    trainer = make_trainer(ck, epochs=0)
    assert trainer.last_checkpoint is None
    assert trainer.train() == "finished"
    assert trainer.last_checkpoint == os.path.join(ck, "ckpt_step00000000.pt")
    assert ckpt_files(ck) == ["ckpt_step00000000.pt"]
    assert capsys.readouterr().out.startswith("hpc_harness: finished at global step 0 in ")


def test_the_final_line_gives_status_step_time_and_metrics(tmp_path, monkeypatch, capsys) -> None:
    now = [250.0]
    fixed_clock(monkeypatch, now)
    trainer = make_trainer(str(tmp_path / "ck"))
    real_end_epoch = trainer._end_epoch

    def end_epoch() -> bool:  # the epoch took 2.5 s of the fixed clock
        now[0] += 2.5
        return real_end_epoch()

    trainer._end_epoch = end_epoch
    assert trainer.train() == "finished"
    m = trainer.metrics
    assert capsys.readouterr().out.endswith(
        f"hpc_harness: finished at global step 4 in 2.5s test_acc={m['test_acc']:.4f} "
        f"test_loss={m['test_loss']:.4f}\n"
    )


# --------------------------------------------------------------------------- logger


def test_the_logger_gets_the_run_dir_hparams_and_wandb_project(
    tmp_path,
    wandb_runs: list[FakeRun],
) -> None:
    run_dir = str(tmp_path / "run")
    trainer = make_trainer(
        str(tmp_path / "ck"),
        run_dir=run_dir,
        wandb="offline",
        wandb_project="proj",
        hparams={"lr": 0.1, "hidden": 8},
    )
    assert trainer.train() == "finished"
    [run] = wandb_runs
    assert run.settings["project"] == "proj"
    assert run.settings["config"] == {"lr": 0.1, "hidden": 8}
    assert run.settings["dir"] == run_dir and os.path.isfile(os.path.join(run_dir, "metrics.csv"))
    assert run.finished == [0]


# --------------------------------------------------------------------------- construction


def test_the_strategy_and_the_stop_agreement_get_the_config(tmp_path) -> None:
    """Rank 1 of 2 (no process group: nothing is wrapped or reduced)."""
    trainer = build(
        str(tmp_path),
        gloo_context(1, 2),
        fsdp_wrap=(nn.Linear,),
        checkpoint_every_s=5.0,
        signal_check_s=0.25,
        signal_check_every=3,
    )
    assert (trainer.strategy.name, trainer.strategy.fsdp_wrap) == ("ddp", (nn.Linear,))
    agreement = trainer.agreement
    assert agreement.is_main is False  # from the context
    assert (agreement.check_s, agreement.check_every) == (0.25, 3)
    assert agreement.checkpoint_every_s == 5.0


def test_reduce_lr_on_plateau_without_eval_data_is_refused(tmp_path) -> None:
    cfg = TrainConfig(ckpt_dir=str(tmp_path), monitor="test_mae")
    with pytest.raises(ValueError) as info:
        Trainer(
            nn.Linear(3, 2),
            lambda p: torch.optim.SGD(p, lr=0.1),
            DataLoader(classes(8, 0), batch_size=2),
            cpu_context(),
            cfg,
            make_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau,
        )
    assert str(info.value) == (
        "ReduceLROnPlateau is stepped with test_mae at each epoch end: pass eval_data"
    )


def test_a_32_bit_run_has_a_disabled_scaler_also_where_cuda_is_available(
    tmp_path, monkeypatch
) -> None:
    """torch.cuda.is_available faked True (no GPU here): GradScaler would scale the loss there."""
    ctx = cpu_context()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    trainer = build(str(tmp_path), ctx)
    assert trainer.scaler.is_enabled() is False
    loss = torch.tensor(2.0)
    assert trainer.scaler.scale(loss) is loss


def test_the_users_loader_is_kept_when_asked_or_when_it_has_a_batch_sampler(tmp_path) -> None:
    """replace_sampler=False keeps a plain shuffling loader; a batch_sampler loader (its
    batch_size is None) is kept too, and the batch sampler's batch_size is the run's."""
    loader = DataLoader(classes(8, 0), batch_size=2, shuffle=True)
    trainer = build(str(tmp_path / "a"), loader=loader, replace_sampler=False)
    assert trainer.train_loader is loader and trainer.sampler is None

    batches = BatchSampler(SequentialSampler(range(8)), batch_size=4, drop_last=False)
    loader = DataLoader(classes(8, 0), batch_sampler=batches)
    trainer = build(str(tmp_path / "b"), loader=loader)
    assert trainer.train_loader is loader and trainer.sampler is None
    assert (trainer.batch_size, trainer.steps_per_epoch) == (4, 2)
    sizes: list[int] = []
    real_eval_step = trainer.eval_step
    trainer.eval_step = lambda batch: sizes.append(len(batch[1])) or real_eval_step(batch)
    trainer.evaluate()
    assert sizes == [4, 1]  # the 5 eval samples


def _counting_writes(trainer: Trainer) -> list[str]:
    writes: list[str] = []

    def write(state: dict, path: str) -> None:
        writes.append(os.path.basename(path))
        ckpt.atomic_save(state, path)

    trainer._write = write  # type: ignore[method-assign]
    return writes


def test_a_state_already_saved_is_not_saved_again(tmp_path) -> None:
    """max_steps on a step checkpoint: saved once (before: twice, the second within the
    signal's lead at a requeue, and a .dcp rewrite left no checkpoint for a moment)."""
    ck = str(tmp_path / "ck")
    first = build(ck, epochs=3, max_steps=6, checkpoint_every=3)
    writes = _counting_writes(first)
    assert first.train() == "max_steps"
    assert writes == ["ckpt_step00000003.pt", "ckpt_step00000006.pt"]
    # a signal at an epoch's last step (4 of 4) saves before the evaluation; resumed with a
    # signal already there, the checkpoint it loaded is the one the marker names
    ck = str(tmp_path / "ck2")
    stopped = build(ck, trainer_cls=SignalAtStep4, epochs=3, signal_check_every=1)
    assert stopped.train() == "requeue" and (stopped.epoch, stopped.step_in_epoch) == (0, 4)
    again = build(ck, epochs=3)
    writes = _counting_writes(again)
    again.agreement.signum = signal.SIGUSR1
    assert again.train() == "requeue" and writes == []
    assert again.last_checkpoint == stopped.last_checkpoint


class SignalAtStep4(Trainer):
    def training_step(self, batch: Any) -> torch.Tensor:
        if self.global_step == 3:
            self.agreement.signum = signal.SIGUSR1
        return super().training_step(batch)


def test_the_end_of_an_epoch_is_saved_at_the_same_step_again(tmp_path) -> None:
    """Saved at an epoch's last step before its evaluation, the end of the run saves that step
    again: the epoch's end and its metrics are new."""
    ck = str(tmp_path / "ck")
    trainer = build(ck, epochs=1, checkpoint_every=4)
    writes = _counting_writes(trainer)
    assert trainer.train() == "finished"
    assert writes == ["ckpt_step00000004.pt", "ckpt_step00000004.pt"]
    assert torch.load(os.path.join(ck, writes[0]), weights_only=False)["epoch"] == 1


def test_a_finished_run_whose_last_pt_is_of_an_earlier_step_writes_it_again(
    tmp_path, capsys
) -> None:
    """last.pt of an earlier piece (max_steps 2), then a piece killed between its last
    checkpoint and its last.pt: the run finished again rewrites last.pt from that checkpoint.
    Before, "kept as they are": a model of step 2 published as the result of step 4."""
    ck = str(tmp_path / "ck")
    assert build(ck, max_steps=2).train() == "max_steps"
    killed = build(ck)
    killed._save_final = lambda: None  # type: ignore[method-assign]  # killed before last.pt
    assert killed.train() == "finished"
    capsys.readouterr()
    again = build(ck)
    assert again.train() == "finished"
    last = torch.load(os.path.join(ck, "last.pt"), weights_only=False)
    assert (last["global_step"], last["epoch"]) == (4, 1)
    for name, p in killed.model.state_dict().items():
        assert torch.equal(last["model"][name], p), name
    assert capsys.readouterr().out.endswith(
        f"{os.path.join(ck, 'last.pt')} written again from it (it was of step 2)\n"
    )


class SignalInEvaluation(Trainer):
    """The signal comes at the second evaluation batch of the first epoch's end."""

    evaluated = 0

    def eval_step(self, batch: Any) -> dict[str, Any]:
        self.evaluated += 1
        if self.evaluated == 2 and self.epoch == 0:
            self.agreement.signum = signal.SIGUSR1
        return super().eval_step(batch)


def test_a_signal_during_an_evaluation_stops_it_and_the_resume_evaluates_again(
    tmp_path, capsys
) -> None:
    """Before, the evaluation ran to its end and training went on to the next check: an
    evaluation longer than the signal's lead meant a kill with no checkpoint, no requeue."""
    ck = str(tmp_path / "ck")
    data = DataLoader(classes(8, 0), batch_size=1, shuffle=True)  # 8 steps; 5 eval batches
    stopped = build(ck, trainer_cls=SignalInEvaluation, loader=data, epochs=2, signal_check_every=1)
    assert stopped.train() == "requeue"
    assert stopped.evaluated < 5 and (stopped.epoch, stopped.step_in_epoch) == (0, 8)
    resumed = build(ck, loader=data, epochs=2)
    assert resumed.train() == "finished"
    whole = build(str(tmp_path / "whole"), loader=data, epochs=2)
    assert whole.train() == "finished" and resumed.metrics == whole.metrics
    for a, b in zip(resumed.model.parameters(), whole.model.parameters()):
        assert torch.equal(a, b)


class NoisyEvaluation(SignalInEvaluation):
    """An evaluation that draws random numbers (sampling, a noisy metric)."""

    def eval_step(self, batch: Any) -> dict[str, Any]:
        metrics = super().eval_step(batch)
        return {**metrics, "test_loss": metrics["test_loss"] + torch.rand(())}


def test_a_signal_during_an_evaluation_that_draws_random_numbers_resumes_exactly(
    tmp_path,
) -> None:
    # the checkpoint held the RNG states of the moment the ranks stopped, two batches into the
    # evaluation: evaluated again from there, the resumed run drew other numbers
    ck = str(tmp_path / "ck")
    data = DataLoader(classes(8, 0), batch_size=1, shuffle=True)
    stopped = build(ck, trainer_cls=NoisyEvaluation, loader=data, epochs=2, signal_check_every=1)
    assert stopped.train() == "requeue" and stopped.evaluated == 2
    resumed = build(ck, trainer_cls=NoisyEvaluation, loader=data, epochs=2)
    resumed.evaluated = 2  # no signal this time
    assert resumed.train() == "finished"
    whole = build(str(tmp_path / "whole"), trainer_cls=NoisyEvaluation, loader=data, epochs=2)
    whole.evaluated = 2
    assert whole.train() == "finished" and resumed.metrics == whole.metrics


def test_a_run_resumed_at_max_steps_on_an_epochs_end_evaluates_with_the_checkpoints_rng(
    tmp_path,
) -> None:
    # stopped during the evaluation after max_steps (an epoch's last step): the resumed run
    # went straight to that evaluation without restoring the checkpoint's RNG states, and saved
    # them in its own checkpoint, which a longer run (max_steps may grow) resumes from
    ck = str(tmp_path / "ck")
    data = DataLoader(classes(8, 0), batch_size=1, shuffle=True)
    stopped = build(
        ck, trainer_cls=NoisyEvaluation, loader=data, epochs=2, max_steps=8, signal_check_every=1
    )
    assert stopped.train() == "requeue" and (stopped.epoch, stopped.step_in_epoch) == (0, 8)
    torch.manual_seed(12345)  # what the resumed process drew before: not the run's
    resumed = build(ck, trainer_cls=NoisyEvaluation, loader=data, epochs=2, max_steps=8)
    resumed.evaluated = 2  # no signal this time
    assert resumed.train() == "max_steps"
    whole = build(
        str(tmp_path / "whole"), trainer_cls=NoisyEvaluation, loader=data, epochs=2, max_steps=8
    )
    whole.evaluated = 2
    assert whole.train() == "max_steps" and resumed.metrics == whole.metrics
    saved = [torch.load(t.last_checkpoint, weights_only=False)["rng"] for t in (resumed, whole)]
    assert torch.equal(saved[0][0]["torch"], saved[1][0]["torch"])


class RecordsBatches(Trainer):
    """Keeps every (epoch, inputs) it trains on (not those it evaluates)."""

    def training_step(self, batch: Any) -> torch.Tensor:
        if not self._evaluating:
            self.seen = [*getattr(self, "seen", []), (self.epoch, batch[0].clone())]
        return super().training_step(batch)


def test_each_epoch_is_another_order_of_every_sample(tmp_path) -> None:
    # without the sampler's set_epoch every epoch repeats epoch 0's order: an interrupted and an
    # uninterrupted run repeat it alike, so the resume tests cannot see it
    data = DataLoader(classes(8, 0), batch_size=1, shuffle=True)
    trainer = build(str(tmp_path / "ck"), trainer_cls=RecordsBatches, loader=data, epochs=3)
    assert trainer.train() == "finished"
    orders = [[x for e, x in trainer.seen if e == epoch] for epoch in range(3)]
    assert all(len(order) == 8 for order in orders)
    for order in orders:  # every sample once
        assert sorted(x.flatten().tolist() for x in order) == sorted(
            x.tolist() for x, _ in classes(8, 0)
        )
    for a, b in itertools.combinations(orders, 2):
        assert not all(torch.equal(x, y) for x, y in zip(a, b))
