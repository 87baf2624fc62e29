"""The harness and W&B at a requeue: the run is marked preempting and finished with exit code 42
(what W&B needs to hand a sweep run out again), under the sweep agent's run id."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import clean_env, module_command, run_command, run_interrupted

pytest.importorskip("wandb")
from fake_wandb import read_records  # noqa: E402

RUN_ID = "swrun042"
# A bound on each training run, there to end a hang (a run takes about 10 s of CPU): make
# test runs pytest under nice beside the cluster suites, where a run may wait minutes.
RUN_TIMEOUT = 240


def records(ckpt: Path) -> list[tuple[str, int | None]]:
    """(kind, exit code) of the newest offline record file of RUN_ID under ckpt."""
    files = sorted(ckpt.rglob(f"run-{RUN_ID}.wandb"), key=lambda f: f.stat().st_mtime)
    assert files, f"no run-{RUN_ID}.wandb under {ckpt}"
    out = []
    for r in read_records(files[-1]):
        kind = r.WhichOneof("record_type")
        out.append((kind, r.exit.exit_code if kind == "exit" else None))
    return out


def test_sigusr1_in_a_sweep_run_marks_it_preempting_and_finishes_it_with_42(tmp_path, digits_dir):
    ckpt = tmp_path / "runs" / RUN_ID / "checkpoints"
    env = clean_env(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_SWEEP_ID="fakesw01",
        WANDB_RUN_ID=RUN_ID,
    )
    args = ["--epochs", "1", "--data-dir", digits_dir, "--ckpt-dir", str(ckpt)]
    args += ["--wandb", "offline"]
    interrupted = run_interrupted(
        module_command("hpc_harness.train", [*args, "--step-sleep", "0.02", "--log-every", "1"]),
        env,
        "hpc_harness: step 5/",
        timeout=RUN_TIMEOUT,
    )
    out = interrupted.stdout
    assert interrupted.returncode == 42, out
    assert f"hpc_harness: wandb run id {RUN_ID} mode offline" in out
    assert f"wandb run {RUN_ID} marked preempting" in out
    first = records(ckpt)
    assert ("preempting", None) in first
    assert ("exit", 42) in first
    assert (ckpt / "wandb_run_id").read_text() == RUN_ID + "\n"
    # W&B hands it out again (same id): it resumes and finishes, not preempting this time.
    done = run_command(module_command("hpc_harness.train", args), env, RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed from" in done.stdout
    second = records(ckpt)
    assert ("exit", 0) in second
    assert ("preempting", None) not in second


def test_a_crash_finishes_the_wandb_run_failed_and_marks_metrics_csv(tmp_path, digits_dir):
    """Trainer.train's ``finally`` finished the W&B run with exit code 0 while the exception
    went on: the fake server (W&B's rule) called the crashed trial finished."""
    ckpt = tmp_path / "runs" / RUN_ID / "checkpoints"
    env = clean_env(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_RUN_ID=RUN_ID)
    env["WANDB_SWEEP_ID"] = "fakesw01"
    args = ["--epochs", "1", "--data-dir", digits_dir, "--ckpt-dir", str(ckpt)]
    args += ["--wandb", "offline", "--fail-at-step", "3", "--log-every", "1"]
    proc = run_command(module_command("hpc_harness.train", args), env, RUN_TIMEOUT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "--fail-at-step 3 on rank 0" in proc.stderr
    exits = [code for kind, code in records(ckpt) if kind == "exit"]
    assert exits == [1]
    rows = (ckpt / "metrics.csv").read_text().splitlines()
    assert rows[-1].split(",")[1:] == ["2", "0", "failed", "1"]  # the steps done, epoch 0
