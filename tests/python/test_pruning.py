"""hpc_harness/pruning.py: each report goes to the trial's Optuna trial in the journal, pruned
trials stop (should_stop_trial on every rank, the Trainer, the command and the file protocol),
a no-op outside a sweep with early_terminate; prune.py start writes what the trials read."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import HANG_GUARD_S

from hpc_tools import prune

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

optuna = pytest.importorskip("optuna")

from test_trainer_outputs import make_trainer  # noqa: E402

from hpc_harness import pieces, pruning  # noqa: E402

HYPERBAND = {"type": "hyperband", "min_iter": 1, "eta": 3}


def start(tmp_path, monkeypatch, goal: str = "maximize", study: str = "sub") -> str:
    """A submission folder with early_terminate.json (prune.py start), as a trial sees it."""
    sub = tmp_path / "exp" / study
    sub.mkdir(parents=True)
    (sub / "sweep.yml").write_text(
        f"program: p.py\nmethod: grid\nmetric: {{name: val_acc, goal: {goal}}}\n"
        f"parameters: {{lr: {{values: [0.1]}}}}\nearly_terminate: {json.dumps(HYPERBAND)}\n"
    )
    journal = str(tmp_path / "exp" / "optuna.journal")
    args = ["start", "--submission", str(sub), "--journal", journal, "--study", study]
    assert prune.main(args) == 0
    monkeypatch.setenv("HPC_SUBMISSION_DIR", str(sub))
    return str(sub)


def as_trial(monkeypatch, tmp_path, index: int) -> str:
    """The environment of array task ``index`` (a new process: nothing cached)."""
    folder = tmp_path / "exp" / "trials" / str(index)
    folder.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HPC_TRIAL_INDEX", str(index))
    monkeypatch.setenv("HPC_TRIAL_DIR", str(folder))
    pruning._state.clear()
    return str(folder)


def test_no_sweep_is_a_no_op(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("HPC_SUBMISSION_DIR", raising=False)
    assert pieces.should_stop_trial(0.1, 1) is False
    monkeypatch.setenv("HPC_SUBMISSION_DIR", str(tmp_path))  # a sweep without the block
    monkeypatch.setenv("HPC_TRIAL_INDEX", "0")
    assert pieces.should_stop_trial(0.1, 1) is False
    assert not os.path.exists(tmp_path / "optuna.journal")


def test_a_worse_trial_is_pruned_at_the_first_rung_and_the_best_goes_on(
    tmp_path, monkeypatch
) -> None:
    sub = start(tmp_path, monkeypatch)
    with open(os.path.join(sub, "early_terminate.json")) as fh:
        cfg = json.load(fh)
    assert cfg["journal"] == str(tmp_path / "exp" / "optuna.journal")
    assert (cfg["min_resource"], cfg["reduction_factor"], cfg["metric"]) == (1, 3, "val_acc")
    as_trial(monkeypatch, tmp_path, 0)
    assert [pieces.should_stop_trial(v, s) for s, v in ((1, 0.5), (2, 0.6), (3, 0.7))] == [
        False
    ] * 3
    bad = as_trial(monkeypatch, tmp_path, 1)
    assert pieces.should_stop_trial({"val_acc": 0.2, "loss": 1.0}, 1) is True
    with open(os.path.join(bad, "pruned")) as fh:
        assert fh.read() == "1 0.2\n"
    # Requeued after it was pruned: stopped again at its next report.
    pruning._state.clear()
    assert pieces.should_stop_trial(0.9, 2) is True
    better = as_trial(monkeypatch, tmp_path, 2)
    assert pieces.should_stop_trial(0.55, 1) is False
    assert not os.path.exists(os.path.join(better, "pruned"))
    study = optuna.load_study(study_name="sub", storage=pruning._state["study"]._storage)
    states = {t.user_attrs["trial"]: t.state.name for t in study.get_trials()}
    assert states == {0: "RUNNING", 1: "PRUNED", 2: "RUNNING"}


def test_the_command_line_form_prints_and_exits_3_when_pruned(tmp_path, monkeypatch) -> None:
    start(tmp_path, monkeypatch, goal="minimize")
    env = dict(os.environ)
    for index, value, want in ((0, "0.5", "continue"), (1, "0.9", "prune")):
        folder = as_trial(monkeypatch, tmp_path, index)
        env.update(HPC_TRIAL_INDEX=str(index), HPC_TRIAL_DIR=folder)
        run = subprocess.run(
            [sys.executable, "-m", "hpc_harness.pruning", "1", value],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
        )
        assert (run.stdout.splitlines()[-1], run.returncode) == (want, 3 if want == "prune" else 0)
    run = subprocess.run(
        [sys.executable, "-m", "hpc_harness.pruning", "x"], capture_output=True, text=True, cwd=ROOT
    )
    assert run.returncode == 2 and "expects STEP VALUE" in run.stderr


def test_the_trainer_stops_a_pruned_trial_with_a_checkpoint(tmp_path, monkeypatch) -> None:
    start(tmp_path, monkeypatch, goal="minimize")
    as_trial(monkeypatch, tmp_path, 0)
    cfg = json.load(open(os.environ["HPC_SUBMISSION_DIR"] + "/early_terminate.json"))
    cfg["metric"] = "test_loss"  # what the Trainer's evaluation reports
    with open(os.environ["HPC_SUBMISSION_DIR"] + "/early_terminate.json", "w") as fh:
        json.dump(cfg, fh)
    assert pieces.should_stop_trial({"test_loss": 0.001}, 1) is False  # a far better trial
    folder = as_trial(monkeypatch, tmp_path, 1)
    trainer = make_trainer(str(tmp_path / "ck"), epochs=3)
    assert trainer.train() == "pruned"
    assert trainer.epoch == 1 and os.path.exists(tmp_path / "ck" / "last.pt")
    assert os.listdir(tmp_path / "ck")  # the checkpoint and last.pt
    assert open(os.path.join(folder, "pruned")).read().startswith("1 ")


# A program outside Python under watch: appends "STEP VALUE", waits until watch has judged
# the step (reported), stops with exit 0 once pruned exists.
PROGRAM = r"""
for step in 1 2 3; do
  echo "$step $VALUE" >>"$HPC_TRIAL_DIR/reports"
  until [[ "$(cat "$HPC_TRIAL_DIR/reported" 2>/dev/null)" == "$step" ]]; do sleep 0.05; done
  if [[ -e "$HPC_TRIAL_DIR/pruned" ]]; then echo "stopped at $step"; exit 0; fi
done
echo "ran to the end"
"""


def test_the_file_protocol_under_watch(tmp_path, monkeypatch) -> None:
    sub = start(tmp_path, monkeypatch)
    open(os.path.join(sub, "job.sbatch"), "w").close()
    env = dict(os.environ)
    for index, value, want in ((0, "0.5", "ran to the end"), (1, "0.1", "stopped at 1")):
        folder = as_trial(monkeypatch, tmp_path, index)
        # An earlier submission's reports and pruned file: neither is judged nor kept.
        with open(os.path.join(folder, "reports"), "w") as fh:
            fh.write("1 0.9\n")
        with open(os.path.join(folder, "pruned"), "w") as fh:
            fh.write("1 0.9\n")
        os.utime(os.path.join(folder, "pruned"), (1_000_000, 1_000_000))
        env.update(HPC_TRIAL_INDEX=str(index), HPC_TRIAL_DIR=folder, VALUE=value)
        run = subprocess.run(
            [sys.executable, "-m", "hpc_harness.pruning", "watch", "--", "bash", "-c", PROGRAM],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=HANG_GUARD_S,
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.splitlines()[-1] == want
    with open(os.path.join(folder, "pruned")) as fh:
        assert fh.read() == "1 0.1\n"


def test_every_rank_gets_rank_0s_decision(tmp_path, monkeypatch) -> None:
    from conftest import threaded_ranks

    start(tmp_path, monkeypatch)
    as_trial(monkeypatch, tmp_path, 0)
    assert pieces.should_stop_trial(0.5, 1) is False
    folder = as_trial(monkeypatch, tmp_path, 1)
    # Rank 1's better value is not reported: rank 0's 0.1 is, and prunes both.
    got = threaded_ranks(lambda rank, _w: pieces.should_stop_trial(0.1 if rank == 0 else 0.9, 1), 2)
    assert got == [True, True]
    with open(os.path.join(folder, "pruned")) as fh:
        assert fh.read() == "1 0.1\n"
