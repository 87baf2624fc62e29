"""hpc_tools.results and its parts: the tables behind status.sh and results.sh, on fabricated
submission folders, logs and metrics.csv files (no cluster)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hpc_tools import collect, logs, metrics, plots, results, slurm, submissions

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


fabricate = _load("hpc_results_fixture", REPO / "tests/bats/fixtures/results/fabricate.py")


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "scratch space"
    fabricate.fabricate(str(root), "proj")
    monkeypatch.setenv("SCRATCH", str(root))
    # SLURM has forgotten every fabricated job, and keeps no accounting: states come from
    # the logs.
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job_id: {})
    monkeypatch.setattr(slurm, "sacct_tasks", lambda job_id: {})
    return root


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, list[str], str]:
    code = results.main(list(argv))
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err


def rows(lines: list[str]) -> list[list[str]]:
    """Table rows (after the two heading lines and the header), split on 2+ spaces."""
    import re

    return [re.split(r"\s{2,}", line) for line in lines[3:] if not line.startswith("wrote ")]


def test_grouped_seeds_mean_std_sorted_by_sweep_metric_failed_kept(scratch, capsys) -> None:
    code, lines, err = run(capsys, "results", "--project", "proj", "grid", "-m", "test_acc")
    assert code == 0, err
    assert "20261123-120000-new2" in lines[0]  # the newest submission, not the older one
    assert lines[1] == "8 trial(s); sorted by test_acc (max)"
    assert lines[2].split() == "trials hidden lr n state test_acc best test_acc".split()
    table = rows(lines)
    assert [r[0] for r in table] == ["2,3", "0,1", "4,5", "6,7"]
    assert table[0] == ["2,3", "32", "0.01", "2", "finished, requeued 1x", "0.91 ± 0.01414"] + [
        "0.91 ± 0.01414"
    ]
    # The failed seed stays in the table, is named with its exit code, and is left out
    # of the mean (its 0.10 would drag 0.70 down to 0.40).
    assert table[2][3:6] == ["1", "1 finished, 1 failed (exit 3)", "0.7"]
    assert table[3][5] == "0.62 ± 0.02828"


def test_a_configuration_whose_every_trial_failed_sorts_last(scratch, capsys) -> None:
    for k in (0, 1):
        log = scratch / "proj" / "hpc_outputs" / f"proj_grid_500_{k}.out"
        log.write_text(log.read_text().replace("exit code 0", "exit code 3"))
    code, lines, _ = run(capsys, "results", "--project", "proj", "grid", "-m", "test_acc")
    table = rows(lines)
    # (0.01, 16) logged 0.81 before failing, above two finished configurations, yet last.
    assert [r[0] for r in table] == ["2,3", "4,5", "6,7", "0,1"]
    assert table[3][3:6] == ["2", "failed (exit 3)", "0.81 ± 0.01414"]


def test_no_group_one_row_per_trial_and_sort_override(scratch, capsys) -> None:
    code, lines, _ = run(
        capsys, "results", "--project", "proj", "grid", "--no-group", "--sort", "test_loss:max"
    )
    assert code == 0
    assert lines[1] == "8 trial(s); sorted by test_loss (max)"
    table = rows(lines)
    # A failed trial stays in the table, after the others.
    assert [r[0] for r in table] == ["6", "7", "4", "0", "1", "2", "3", "5"]
    assert table[7][1:5] == ["16", "0.1", "1", "failed (exit 3)"]
    code, lines, _ = run(
        capsys, "results", "--project", "proj", "grid", "--no-group", "-s", "test_loss"
    )
    assert [r[0] for r in rows(lines)][:2] == ["3", "2"]  # a loss sorts ascending by default


def test_unknown_sort_metric_is_a_usage_error(scratch, capsys) -> None:
    code, _, err = run(capsys, "results", "--project", "proj", "grid", "--sort", "val_acc")
    assert code == 2
    assert err == (
        "results.sh: error: --sort: no trial logged 'val_acc' "
        "(logged: train_loss, test_loss, test_acc)\n"
    )


def test_csv_has_mean_and_std_columns(scratch, tmp_path, capsys) -> None:
    out = tmp_path / "out dir" / "r.csv"
    out.parent.mkdir()
    code, lines, _ = run(
        capsys, "results", "--project", "proj", "grid", "-m", "test_acc", "--csv", str(out)
    )
    assert code == 0 and lines[-1] == f"wrote {out}"
    with open(out, newline="") as fh:
        table = list(csv.reader(fh))
    assert table[0] == "trials hidden lr n state test_acc test_acc_std".split() + [
        "best test_acc",
        "best test_acc_std",
    ]
    assert table[1][:5] == ["2,3", "32", "0.01", "2", "finished, requeued 1x"]
    assert float(table[1][5]) == pytest.approx(0.91)
    assert float(table[1][6]) == pytest.approx(0.0141421, rel=1e-4)
    assert table[3][4] == "1 finished, 1 failed (exit 3)" and table[3][6] == ""


def test_plot_writes_a_png(scratch, tmp_path, capsys) -> None:
    out = tmp_path / "r.png"
    code, _, err = run(capsys, "results", "--project", "proj", "grid", "--plot", str(out))
    assert code == 0, err
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_a_parameter_and_a_metric_of_one_name_get_prefixed_columns(scratch, tmp_path, capsys):
    for k in range(8):  # every trial also logs its learning rate as a metric "lr"
        path = scratch / "proj" / "grid" / "trials" / str(k) / "checkpoints" / "metrics.csv"
        with open(path, "a") as fh:
            fh.write("1.0,47,0,lr,0.003\n")
    out = tmp_path / "r.csv"
    code, lines, err = run(
        capsys, "results", "--project", "proj", "grid", "-m", "lr", "--csv", str(out)
    )
    assert code == 0, err
    header = [c for c in lines[2].split("  ") if c]
    assert [c.strip() for c in header][:3] == ["trials", "hidden", "param.lr"]
    assert "metric.lr" in lines[2] and "best metric.lr" in lines[2] and " lr " not in lines[2]
    assert rows(lines)[0][2] in ("0.01", "0.1") and rows(lines)[0][-1] == "0.003 ± 0"
    with open(out, newline="") as fh:
        header = next(csv.reader(fh))
    assert header[2] == "param.lr" and header[-4:-2] == ["metric.lr", "metric.lr_std"]
    # No clash: the plain names.
    code, lines, err = run(capsys, "results", "--project", "proj", "grid", "-m", "test_acc")
    assert lines[2].split()[:3] == ["trials", "hidden", "lr"]


def test_rows_come_from_the_submissions_own_jobs_not_an_earlier_run_holding_the_folder(scratch):
    # Trial 0's folder is still held by an earlier submission's job 450 (its run.json): the
    # newest submission's task ran as job 501 and failed before claiming it. Trial 1's run.json
    # is its own job's; trial 2's a later job's, resuming after it (own_metrics decides).
    exp = scratch / "proj" / "grid"
    sub = exp / "20261123-120000-new2"
    for k, (own, claimed) in enumerate([(501, 450), (502, 502), (503, 900)]):
        (sub / "runs" / f"500_{k}").mkdir(parents=True)
        (sub / "runs" / f"500_{k}" / "slurm_job_id").write_text(f"{own}\n")
        run_json = exp / "trials" / str(k) / "checkpoints" / "run.json"
        run_json.write_text(json.dumps({"slurm_job_id": str(claimed), "fingerprint": {}}))
    trials = collect.collect(submissions.load_submission(str(sub)), "proj")
    assert trials[0].metrics == {}
    assert trials[1].metrics["test_acc"][-1][1] == pytest.approx(0.82)
    assert trials[2].metrics["test_acc"][-1][1] == pytest.approx(0.90)
    # A folder without this task's job ids (a submission before batch.sh recorded them): as before.
    (sub / "runs" / "500_0" / "slurm_job_id").unlink()
    trials = collect.collect(submissions.load_submission(str(sub)), "proj")
    assert trials[0].metrics["test_acc"][-1][1] == pytest.approx(0.80)


def test_a_1500_trial_sweep_split_at_max_array_size_1001_lists_1500_rows(
    tmp_path, capsys, monkeypatch
):
    # Two arrays (job_submitter.sh's array_jobs): 900 runs trials 0-1000 as tasks 0-1000,
    # 901 runs trials 1001-1499 as tasks 0-498; each trial logs its own index as "k".
    root = tmp_path / "scratch"
    sub = root / "proj" / "big" / "20261127-120000-bigA"
    logs = root / "proj" / "hpc_outputs"
    sub.mkdir(parents=True)
    logs.mkdir(parents=True)
    (sub / "job.sbatch").write_text("#!/bin/bash\n#SBATCH --array=0-1000\n")
    (sub / "job_id").write_text("900\n")
    (sub / "array_jobs").write_text("900 0\n901 1001\n")
    with open(sub / "trials.jsonl", "w") as fh:
        for k in range(1500):
            fh.write(json.dumps({"trial": k, "params": {"seed": k}, "argv": ["x"]}) + "\n")
    for k in range(1500):
        job, task = ("900", k) if k < 1001 else ("901", k - 1001)
        (logs / f"proj_big_{job}_{task}.out").write_text(
            f"hpc: job {job}_{task} (trial {k}) on node1, restart 0, started 2026-11-27 12:00:00\n"
            "hpc: training step ended with exit code 0 at 2026-11-27 12:00:09\n"
        )
        trial = root / "proj" / "big" / "trials" / str(k)
        trial.mkdir(parents=True)
        (trial / "metrics.csv").write_text(f"time,step,epoch,name,value\n1,1,0,k,{k}\n")
    monkeypatch.setenv("SCRATCH", str(root))
    # SLURM forgot them: states from the logs.
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job_id: {})
    code, lines, err = run(
        capsys, "results", "--project", "proj", "big", "--no-group", "--sort", "k:min"
    )
    assert code == 0, err
    assert lines[1] == "1500 trial(s); sorted by k (min)"
    table = rows(lines)
    assert len(table) == 1500
    assert all(r[0] == r[1] == r[3] and r[2] == "finished" for r in table), table[:3]
    code, lines, err = run(capsys, "status", "--project", "proj", "big")
    assert lines[1] == "job 900 and 901 (arrays), 1500 task(s); states from logs"


def _trial(index: int, state: str, lr: float, acc: float | None) -> object:
    t = collect.Trial(index, {"lr": lr, "epochs": 1, "seed": 0}, (), state, "failed" in state, 0)
    t.metrics = {"acc": [(10, acc)]} if acc is not None else {}
    return t


def test_plot_draws_finished_trials_only_and_no_panel_for_a_constant_parameter() -> None:
    trials = [
        _trial(0, "finished", 0.1, 0.9),
        _trial(1, "running", 0.01, 0.5),
        _trial(2, "failed (exit 3)", 0.001, 0.1),
        _trial(3, "finished", 0.001, 0.8),
        _trial(4, "pending", 0.03, None),
    ]
    names, points = plots.plot_points(trials, "acc", "max")
    assert names == ["lr"]  # epochs is 1 in every trial; seeds are never a panel
    assert [(t.index, v) for t, v in points] == [(0, 0.9), (3, 0.8)]
    # Every parameter constant: one panel, by trial.
    names, _ = plots.plot_points([_trial(0, "finished", 0.1, 0.9)], "acc", "max")
    assert names == ["trial"]


def test_curves_one_line_per_trial_in_each_metrics_panel(scratch, tmp_path, capsys, monkeypatch):
    drawn = {}
    real = results.plot_curves
    monkeypatch.setattr(results, "plot_curves", lambda *a: drawn.update(real(*a)) or drawn)
    out = tmp_path / "out dir" / "c.png"
    out.parent.mkdir()
    code, lines, err = run(
        capsys, "results", "--project", "proj", "grid", "-m", "test_loss", "--curves", str(out)
    )
    assert code == 0 and lines[-1] == f"wrote {out}", err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The sort metric joins --metrics, as in the table; trial 5 (failed) is drawn too.
    assert list(drawn) == ["test_acc", "test_loss"]
    assert drawn["test_acc"][0] == "trial 0 (hidden=16, lr=0.01, seed=0)"
    assert drawn["test_acc"][5] == "trial 5 (hidden=16, lr=0.1, seed=1), failed"
    assert len(drawn["test_loss"]) == 8


def test_curves_of_one_run_outside_slurm(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("SCRATCH", raising=False)
    run_dir = tmp_path / "laptop run"
    (run_dir / "checkpoints").mkdir(parents=True)
    # Steps 10 and 20 logged again after a resume: the curve keeps the last of each.
    (run_dir / "checkpoints" / "metrics.csv").write_text(
        "time,step,epoch,name,value\n1,10,0,loss,2.0\n1,20,0,loss,1.8\n"
        "2,10,0,loss,1.5\n2,20,0,loss,1.2\n2,20,0,acc,0.5\n"
    )
    drawn = []
    real = results.plot_curves
    monkeypatch.setattr(results, "plot_curves", lambda *a: drawn.append(a) or real(*a))
    out = tmp_path / "c.png"
    for where in (run_dir, run_dir / "checkpoints" / "metrics.csv"):
        code, lines, err = run(capsys, "results", "--run", str(where), "--curves", str(out))
        assert (code, lines, err) == (0, [f"wrote {out}"], "")
        [run_trial], names, _ = drawn.pop()
        assert names == ["loss", "acc"]
        assert run_trial.metrics["loss"] == [(10, 1.5), (20, 1.2)]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run", "{missing}", "--curves", "{out}"], "--run: no metrics.csv at '{missing}'"),
        (["--run", "{empty}", "--curves", "{out}"], "--run: no metrics rows in '{empty}'"),
        (["--run", "{empty}"], "--run draws one run's curves: give --curves FILE.png too"),
        (["grid", "--run", "{empty}", "--curves", "{out}"], "give EXP ('grid') or --run, not"),
        (["--run", "{empty}", "--csv", "x", "--curves", "{out}"], "--csv is for an experiment's"),
        (["grid", "--curves="], "--curves expects a file name, got ''"),
        (["--run=", "--curves", "{out}"], "--run expects a run folder or its metrics.csv, got"),
        # matplotlib's traceback, 23 lines and exit 1, once the table was printed
        (["grid", "--plot", "x.txt"], "--plot expects a .png, .pdf, .svg or .jpg file, got"),
        (["--run", "{empty}", "--curves", "c.jpgg"], "--curves expects a .png, .pdf, .svg or"),
    ],
)
def test_curves_refusals_exit_2_one_line_nothing_written(tmp_path, capsys, args, message):
    empty = tmp_path / "metrics.csv"
    empty.write_text("time,step,epoch,name,value\n")
    names = {"missing": tmp_path / "nope", "empty": empty, "out": tmp_path / "c.png"}
    code, lines, err = run(capsys, "results", *[a.format(**names) for a in args])
    assert (code, lines) == (2, [])
    assert err.startswith("results.sh: error: " + message.format(**names))
    assert err.count("\n") == 1 and not (tmp_path / "c.png").exists()


def test_curves_that_cannot_be_written_exit_1(tmp_path, capsys) -> None:
    (tmp_path / "metrics.csv").write_text("time,step,epoch,name,value\n1,1,0,loss,1\n")
    out = tmp_path / "no such folder" / "c.png"
    code, _, err = run(capsys, "results", "--run", str(tmp_path), "--curves", str(out))
    assert code == 1
    assert err == f"results.sh: error: --curves: cannot write '{out}': No such file or directory\n"


def test_single_job_and_configs_array(scratch, capsys) -> None:
    code, lines, _ = run(capsys, "results", "--project", "proj", "single")
    assert code == 0
    assert rows(lines) == [["0", "finished", "0.5", "0.5", "0.4", "0.4", "0.75", "0.75"]]
    # Configs-file lines carry no params: the words that differ between lines are shown.
    code, lines, _ = run(capsys, "results", "--project", "proj", "configs", "-m", "test_acc")
    assert lines[2].split() == "trial lr state test_acc best test_acc".split()
    assert rows(lines) == [
        ["0", "0.1", "finished", "0.5", "0.5"],
        ["1", "0.01", "stopped (no end line in its log)", "-", "-"],
    ]


def test_status_from_logs_shows_requeued_and_failed_tasks(scratch, capsys) -> None:
    code, lines, _ = run(capsys, "status", "--project", "proj")  # newest of all: grid
    assert code == 0
    assert lines[1] == "job 500, 8 task(s); states from logs"
    table = rows(lines)
    assert table[2] == ["2", "finished", "1", "00:00:42", "-", "step 40/47 epoch 0 loss 0.4000"]
    assert table[5][:3] == ["5", "failed (exit 3)", "0"]
    code, lines, _ = run(capsys, "status", "--project", "proj", "600")  # by job id
    assert "single" in lines[0] and rows(lines)[0][:2] == ["0", "finished"]


def test_status_from_scontrol_one_call_for_all_tasks(scratch, capsys, monkeypatch) -> None:
    calls = []
    text = (
        "JobId=501 ArrayJobId=500 ArrayTaskId=3-7%2 JobState=PENDING Restarts=0 "
        "ExitCode=0:0 RunTime=00:00:00\n"
        "JobId=502 ArrayJobId=500 ArrayTaskId=2 JobState=RUNNING Restarts=1 ExitCode=0:0 "
        "RunTime=00:01:05\n"
        "JobId=503 ArrayJobId=500 ArrayTaskId=1 JobState=FAILED Restarts=0 ExitCode=3:0 "
        "RunTime=00:00:09\n"
        "JobId=500 ArrayJobId=500 ArrayTaskId=0 JobState=COMPLETED Restarts=0 ExitCode=0:0 "
        "RunTime=00:00:30\n"
    )

    def fake(job_id: str) -> dict:
        calls.append(job_id)
        return slurm.parse_scontrol(text)

    monkeypatch.setattr(slurm, "scontrol_tasks", fake)
    code, lines, _ = run(capsys, "status", "--project", "proj", "grid")
    assert code == 0 and calls == ["500"]
    table = rows(lines)
    assert table[0][:4] == ["0", "COMPLETED", "0", "00:00:30"]
    assert table[1][:4] == ["1", "FAILED (exit 3)", "0", "00:00:09"]
    assert table[2] == ["2", "RUNNING", "1", "00:01:05", "-", "step 40/47 epoch 0 loss 0.4000"]
    assert [r[1] for r in table[3:]] == ["PENDING"] * 5


def test_a_task_the_cgroup_killed_for_memory_shows_out_of_memory_with_its_exit_code(
    tmp_path, monkeypatch
) -> None:
    log = tmp_path / "task.out"
    log.write_text(
        "hpc: job 7 (trial 0) on node1, restart 0, started 2026-11-27 10:00:00\n"
        "slurmstepd: error: Detected 1 oom_kill event in StepId=7.0. Some of the step tasks"
        " have been OOM Killed.\n"
        "srun: error: node1: task 0: Out Of Memory\n"
        "hpc: training step ended with exit code 137 at 2026-11-27 10:00:09\n"
    )
    assert logs.trial_state(None, logs.read_log(str(log)))[:2] == (
        "out of memory (exit 137)",
        True,
    )
    fields = {"JobState": "OUT_OF_MEMORY", "ExitCode": "0:125", "Restarts": "0"}
    assert logs.trial_state(fields, None)[:2] == ("out of memory (exit 0)", True)


def test_status_shows_a_task_slurm_ended_out_of_memory(scratch, capsys, monkeypatch) -> None:
    text = (
        "JobId=600 ArrayJobId=600 ArrayTaskId=0 JobState=OUT_OF_MEMORY Restarts=0 "
        "ExitCode=0:125 RunTime=00:00:09\n"
    )
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job_id: slurm.parse_scontrol(text))
    code, lines, _ = run(capsys, "status", "--project", "proj", "600")
    assert code == 0
    assert rows(lines)[0][:2] == ["0", "out of memory (exit 0)"]


def _rerun_task_by_hand(scratch: Path, task: int, job: str, end: str) -> Path:
    """The grid submission (job 500, whose tasks each made runs/500_K) after
    ``sbatch --array=TASK job.sbatch``: job JOB ran that task alone and, being the newest,
    became the folder's job_id (node/batch.sh record_job_id)."""
    sub = scratch / "proj" / "grid" / "20261123-120000-new2"
    for k in range(8):
        (sub / "runs" / f"500_{k}").mkdir(parents=True)
    (sub / "runs" / f"{job}_{task}").mkdir()
    (sub / "job_id").write_text(f"{job}\n")
    log = scratch / "proj" / "hpc_outputs" / f"proj_grid_{job}_{task}.out"
    log.write_text(fabricate._log(f"{job}_{task}", task, [end]))
    return sub


def test_a_task_rerun_by_hand_is_its_own_jobs_and_the_others_stay_their_jobs(
    scratch, capsys, monkeypatch
) -> None:
    # Task 5 failed in job 500 and was run again alone as job 700: task 5 is job 700's
    # (finished), every other task still job 500's, not "not started".
    _rerun_task_by_hand(scratch, 5, "700", "exit 0")
    code, lines, _ = run(capsys, "status", "--project", "proj", "grid")
    assert code == 0
    table = rows(lines)
    assert [r[1] for r in table] == ["finished"] * 8
    assert table[2][:3] == ["2", "finished", "1"]  # its requeue in job 500 still counted
    assert lines[1] == "job 700 (tasks it did not run: job 500), 8 task(s); states from logs"
    code, lines, _ = run(capsys, "results", "--project", "proj", "grid", "--no-group")
    states = {str(k): "finished" for k in range(8)}
    assert {r[0]: r[4] for r in rows(lines)} == {**states, "2": "finished, requeued 1x"}
    # SLURM still knows both jobs: each task's state is its own job's.
    texts = {
        "700": "JobId=701 ArrayJobId=700 ArrayTaskId=5 JobState=RUNNING Restarts=0 "
        "ExitCode=0:0 RunTime=00:00:07\n",
        "500": "JobId=500 ArrayJobId=500 ArrayTaskId=0 JobState=COMPLETED Restarts=0 "
        "ExitCode=0:0 RunTime=00:00:30\n"
        "JobId=505 ArrayJobId=500 ArrayTaskId=5 JobState=FAILED Restarts=0 "
        "ExitCode=3:0 RunTime=00:00:09\n",
    }
    monkeypatch.setattr(
        slurm, "scontrol_tasks", lambda job_id: slurm.parse_scontrol(texts.get(job_id, ""))
    )
    code, lines, _ = run(capsys, "status", "--project", "proj", "grid")
    table = rows(lines)
    assert table[0][:4] == ["0", "COMPLETED", "0", "00:00:30"]
    assert table[5][:4] == ["5", "RUNNING", "0", "00:00:07"]
    # The job that ran the other tasks still finds the submission.
    code, lines, _ = run(capsys, "status", "--project", "proj", "500")
    assert code == 0 and "20261123-120000-new2" in lines[0]


def test_status_progress_falls_back_to_metrics_csv(scratch, capsys) -> None:
    log = scratch / "proj" / "hpc_outputs" / "proj_single_600.out"
    log.write_text("hpc: job 600 (trial 0) on node1, restart 0, started 2026-11-23 12:00:00\n")
    code, lines, _ = run(capsys, "status", "--project", "proj", "single")
    assert rows(lines)[0][5] == "step 47 train_loss 0.5 test_loss 0.4 test_acc 0.75"


def test_watch_refuses_a_non_terminal(scratch, capsys) -> None:
    code, _, err = run(capsys, "status", "--project", "proj", "--watch", "2")
    assert code == 2
    assert err == (
        "status.sh: error: --watch redraws a terminal; stdout is not one (drop --watch)\n"
    )


def test_unknown_experiment_names_the_known_ones(scratch, capsys) -> None:
    code, _, err = run(capsys, "results", "--project", "proj", "nope")
    assert code == 2
    assert err.startswith("results.sh: error: no experiment or job id 'nope' under ")
    assert err.endswith("(experiments: configs, grid, single)\n")


def test_status_from_sacct_once_the_controller_has_forgotten_the_job(
    scratch, capsys, monkeypatch
) -> None:
    # Task 2 ran twice (requeued once), task 1 failed, 3-7 never started (a pending range).
    text = (
        "500_0|COMPLETED|0:0|00:00:30|\n"
        "500_0.batch|COMPLETED|0:0|00:00:30|5120K\n"
        "500_0.0|COMPLETED|0:0|00:00:29|1536M\n"
        "500_1|FAILED|3:0|00:00:09|\n"
        "500_2|REQUEUED|0:0|00:00:40|\n"
        "500_2.0|CANCELLED|0:15|00:00:40|900M\n"
        "500_2|CANCELLED by 0|0:15|00:01:05|\n"
        "500_2.0|CANCELLED|0:15|00:01:05|300M\n"
        "500_[3-7%2]|PENDING|0:0|00:00:00|\n"
    )
    calls = []

    def fake(job_id: str) -> dict:
        calls.append(job_id)
        return slurm.parse_sacct(text)

    monkeypatch.setattr(slurm, "sacct_tasks", fake)
    code, lines, _ = run(capsys, "status", "--project", "proj", "grid")
    assert code == 0 and calls == ["500"]
    assert lines[1].endswith("states from sacct")
    table = rows(lines)
    # Peak memory: the largest step's of the task's last run.
    assert table[0][:5] == ["0", "COMPLETED", "0", "00:00:30", "1.5G"]
    assert table[1][:5] == ["1", "FAILED (exit 3)", "0", "00:00:09", "-"]
    assert table[2][:5] == ["2", "CANCELLED (exit 0)", "1", "00:01:05", "300M"]
    assert [r[1] for r in table[3:]] == ["PENDING"] * 5
    monkeypatch.setattr(
        slurm,
        "scontrol_tasks",
        lambda job_id: slurm.parse_scontrol(
            "JobId=500 ArrayJobId=500 ArrayTaskId=0-7 JobState=RUNNING Restarts=0 RunTime=1"
        ),
    )
    # The controller's answer, while it has one, is taken first; accounting's peak memory
    # joins it.
    code, lines, _ = run(capsys, "status", "--project", "proj", "grid")
    assert lines[1].endswith("states from SLURM") and calls == ["500", "500"]
    assert rows(lines)[0][1:5] == ["RUNNING", "0", "1", "1.5G"]


def test_a_step_the_cgroup_killed_for_memory_reads_out_of_memory(scratch, capsys, monkeypatch):
    log = scratch / "proj" / "hpc_outputs" / "proj_single_600.out"
    log.write_text(
        "hpc: job 600 (trial 0) on node1, restart 0, started 2026-11-23 12:00:00\n"
        "srun: error: node1: task 0: Out Of Memory\n"
        "slurmstepd-node1: error: Detected 1 oom-kill event(s) in StepId=600.0. Some of your "
        "processes may have been killed by the cgroup out-of-memory handler.\n"
        "hpc: training step ended with exit code 137 at 2026-11-23 12:00:42\n"
    )
    code, lines, _ = run(capsys, "status", "--project", "proj", "single")
    assert rows(lines)[0][1] == "out of memory (exit 137)"
    # While SLURM still knows the job (FAILED: the batch script exits with the step's code).
    monkeypatch.setattr(
        slurm,
        "scontrol_tasks",
        lambda job_id: slurm.parse_scontrol("JobId=600 JobState=FAILED ExitCode=137:0 RunTime=1"),
    )
    code, lines, _ = run(capsys, "status", "--project", "proj", "single")
    assert rows(lines)[0][1] == "out of memory (exit 137)"
    code, lines, _ = run(capsys, "results", "--project", "proj", "single")
    assert "out of memory (exit 137)" in "\n".join(lines)


def test_parse_sacct_plain_job_and_steps() -> None:
    tasks = slurm.parse_sacct("7|TIMEOUT|0:0|00:05:00\n7.batch|CANCELLED|0:15|00:05:00\n")
    assert list(tasks) == [0]
    assert tasks[0]["JobState"] == "TIMEOUT" and tasks[0]["Restarts"] == "0"


def test_parse_scontrol_expands_ranges_and_plain_jobs() -> None:
    tasks = slurm.parse_scontrol(
        "JobId=9 ArrayJobId=9 ArrayTaskId=0,2-3 JobState=PENDING Restarts=0\n"
    )
    assert sorted(tasks) == [0, 2, 3]
    assert (
        slurm.parse_scontrol("JobId=7 JobState=RUNNING Restarts=2 RunTime=00:00:01")[0]["Restarts"]
        == "2"
    )


def test_metrics_keep_the_last_row_per_step_after_a_resume(tmp_path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text(
        "time,step,epoch,name,value\n1,10,0,loss,0.9\n1,20,0,loss,0.5\n"
        "2,20,0,loss,0.6\n2,30,0,loss,0.7\n"
    )
    series = metrics.read_metrics(str(path))
    assert series == {"loss": [(10, 0.9), (20, 0.6), (30, 0.7)]}
    assert metrics.final_and_best(series["loss"], "loss") == (0.7, 0.6)
    assert metrics.final_and_best(series["loss"], "loss", "max") == (0.7, 0.9)
    os.remove(path)


def test_requeued_trials_say_so_once(scratch, capsys, monkeypatch) -> None:
    # Task 2 pending again after its requeue (SLURM knows it); task 3's log ends with a
    # requeue and SLURM has forgotten it.
    log = scratch / "proj" / "hpc_outputs" / "proj_grid_500_3.out"
    log.write_text(
        "hpc: job 500_3 (trial 3) on node1, restart 0, started 2026-11-23 12:00:00\n"
        "hpc: requeued 500_3 (restart 1 of at most 10); it resumes from the checkpoint\n"
    )
    text = "JobId=502 ArrayJobId=500 ArrayTaskId=2 JobState=PENDING Restarts=1 ExitCode=0:0\n"
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job_id: slurm.parse_scontrol(text))
    code, lines, _ = run(capsys, "results", "--project", "proj", "grid", "--no-group")
    states = {r[0]: r[4] for r in rows(lines)}
    assert states["2"] == "pending, requeued 1x"
    assert states["3"] == "requeued 1x"


def test_wandb_sweep_array_reads_each_tasks_run(scratch, capsys) -> None:
    # -w sweep: 3 identical tasks; W&B chose each run; its files are under runs/<run id>.
    exp = scratch / "proj" / "wsweep"
    sub = exp / "20261123-130000-wand"
    sub.mkdir(parents=True)
    (sub / "job.sbatch").write_text("#SBATCH --array=0-2\n")
    (sub / "job_id").write_text("800\n")
    argv = '["bash","hpc_files/node/wandb_agent.sh","agent","--count","1","e/p/s"]'
    (sub / "trials.jsonl").write_text(
        "".join(f'{{"argv":{argv},"params":{{}},"trial":{k}}}\n' for k in range(3))
    )
    logs = scratch / "proj" / "hpc_outputs"
    for k, (run_id, lr, acc, code) in enumerate(
        [("aaaa1111", 0.01, 0.9, 0), ("bbbb2222", 0.1, 0.95, 0), ("cccc3333", 0.5, 0.2, 7)]
    ):
        (exp / "trials" / str(k)).mkdir(parents=True)
        (exp / "trials" / str(k) / "wandb_runs.txt").write_text(f"{run_id} {code} 800\n")
        ck = exp / "runs" / run_id / "checkpoints"
        ck.mkdir(parents=True)
        (ck / "run.json").write_text(
            json.dumps({"fingerprint": {"epochs": 2, "lr": lr, "seed": 0}, "written": "x"})
        )
        (ck / "metrics.csv").write_text(f"time,step,epoch,name,value\n1,45,0,test_acc,{acc}\n")
        (logs / f"proj_wsweep_800_{k}.out").write_text(
            f"hpc: job 800_{k} (trial {k}) on node1, restart 0, started 2026-11-23 13:00:00\n"
            f"hpc: training step ended with exit code {code} at 2026-11-23 13:00:30\n"
        )
    code, lines, err = run(capsys, "results", "--project", "proj", "wsweep")
    assert code == 0, err
    assert lines[2].split() == "trial run lr state test_acc best test_acc".split()
    assert rows(lines) == [
        ["1", "bbbb2222", "0.1", "finished", "0.95", "0.95"],
        ["0", "aaaa1111", "0.01", "finished", "0.9", "0.9"],
        ["2", "cccc3333", "0.5", "failed (exit 7)", "0.2", "0.2"],
    ]


def test_a_folder_without_trials_jsonl_has_one_trial_of_no_parameters(tmp_path: Path) -> None:
    # The submitter writes trials.jsonl for every source; commands.txt is not read.
    sub = tmp_path / "proj" / "inline" / "20261123-140000-inln"
    sub.mkdir(parents=True)
    (sub / "job.sbatch").write_text("#!/bin/bash\n")
    (sub / "commands.txt").write_text("python train.py --lr 0.1 --name 'a b'\n")
    assert submissions.load_submission(str(sub)).trials == [{"trial": 0, "params": {}, "argv": []}]


def test_a_new_submission_does_not_show_an_earlier_ones_metrics(scratch) -> None:
    """Every submission of an experiment shares trials/K: a metrics.csv last written before
    this submission (its job.sbatch) is an earlier run's, unless this task finished (a run
    resumed at its end writes nothing again). It showed the earlier run's values against the
    new submission's parameters, pending or refused (exit 2: another run's checkpoints)."""
    exp = scratch / "proj" / "configs"
    old_metrics = exp / "trials" / "0" / "metrics.csv"
    sub = exp / "20261124-100000-newr"
    sub.mkdir()
    (sub / "job.sbatch").write_text("#SBATCH --array=0-1\n")
    (sub / "job_id").write_text("900\n")
    (sub / "trials.jsonl").write_text(
        "".join(
            json.dumps({"trial": k, "params": {"lr": lr}, "argv": ["python", "train.py"]}) + "\n"
            for k, lr in enumerate((0.5, 0.9))
        )
    )
    submitted = (sub / "job.sbatch").stat().st_mtime
    os.utime(old_metrics, (submitted - 60, submitted - 60))
    log = scratch / "proj" / "hpc_outputs" / "proj_configs_900_0.out"

    def metrics() -> list[dict]:
        return [t.metrics for t in collect.collect(submissions.load_submission(str(sub)), "proj")]

    assert metrics() == [{}, {}]  # task 0 pending
    log.write_text(
        "hpc: job 900_0 (trial 0) on node1, restart 0, started 2026-11-24 10:00:05\n"
        "hpc: training step ended with exit code 2 at 2026-11-24 10:00:09\n"
    )
    assert metrics() == [{}, {}]  # refused: the earlier run's checkpoints
    log.write_text(log.read_text().replace("exit code 2", "exit code 0"))
    assert metrics()[0]["test_acc"] == [(40, 0.45), (47, 0.5)]  # resumed at its end
    os.utime(old_metrics)  # written by this submission's run
    log.write_text(log.read_text().replace("exit code 0", "exit code 1"))
    assert metrics()[0]["test_acc"] == [(40, 0.45), (47, 0.5)]


def test_an_ended_job_shows_its_own_rows_not_a_later_runs(scratch, capsys) -> None:
    """Every submission of an experiment shares its run folder: a later run writes there after
    this job ended, resuming and going on, or with --fresh after moving this job's files aside
    (checkpoints.old-*). Rows written after the job's log was last written are not the job's;
    results.sh 600 showed the later run's test_acc as job 600's."""
    single = scratch / "proj" / "single"
    ckpt = single / "checkpoints"
    ended = (scratch / "proj" / "hpc_outputs" / "proj_single_600.out").stat().st_mtime
    sub = submissions.load_submission(str(next(single.glob("2026*"))))
    own = [(40, 0.7), (47, 0.75)]
    assert collect.collect(sub, "proj")[0].metrics["test_acc"] == own
    with open(ckpt / "metrics.csv", "a") as f:  # a later job resumed the run and went on
        f.write(f"{ended + 100},60,1,test_acc,0.8\n")
    assert collect.collect(sub, "proj")[0].metrics["test_acc"] == own
    ckpt.rename(single / "checkpoints.old-20261127T050000Z")  # a later job's --fresh
    ckpt.mkdir()
    later = f"time,step,epoch,name,value\n{ended + 200},10,0,test_acc,0.99\n"
    (ckpt / "metrics.csv").write_text(later)
    assert collect.collect(sub, "proj")[0].metrics["test_acc"] == own
    log = scratch / "proj" / "hpc_outputs" / "proj_single_600.out"  # no progress line in it:
    log.write_text(  # status.sh's progress comes from metrics.csv
        "hpc: job 600 (trial 0) on node1, restart 0, started 2026-11-23 12:00:00\n"
        "hpc: training step ended with exit code 0 at 2026-11-23 12:00:42\n"
    )
    os.utime(log, (ended, ended))
    code, lines, _ = run(capsys, "status", "--project", "proj", "single")
    assert rows(lines)[0][5] == "step 47 train_loss 0.5 test_loss 0.4 test_acc 0.75"


def test_a_sweep_metric_without_a_goal_is_minimized_as_wandb_and_bayes_do(tmp_path) -> None:
    """W&B's default goal is minimize, and trials.py (bayes) uses it: results.sh ranks the
    same way, or its best row is the worst trial."""
    sweep = tmp_path / "sweep.yml"
    sweep.write_text("metric: {name: test_loss}\n")
    assert results.sweep_metric(str(sweep)) == ("test_loss", "min")
    sweep.write_text("metric:\n  name: test_acc\n  goal: maximize\n")
    assert results.sweep_metric(str(sweep)) == ("test_acc", "max")


def test_a_wandb_task_shows_only_a_run_of_its_own_job(tmp_path) -> None:
    """trials/K is shared by every W&B sweep submission of an experiment, and each task
    appends its runs to trials/K/wandb_runs.txt: a submission's task shows the last run of
    its own job, never an earlier submission's (before it runs: none)."""
    (tmp_path / "wandb_runs.txt").write_text("oldrunA 0 101\noldrunB 1 101\n")
    assert collect.wandb_run(str(tmp_path), "202") is None
    assert collect.wandb_run(str(tmp_path), "101") == "oldrunB"
    (tmp_path / "wandb_runs.txt").write_text("oldrunA 0 101\nnew1 42 202\nnew1 0 202\nx 0 2020\n")
    assert collect.wandb_run(str(tmp_path), "202") == "new1"
    assert collect.wandb_run(str(tmp_path), None) is None
    (tmp_path / "wandb_runs.txt").write_text("oldrun 0\n")  # no job: not this one's
    assert collect.wandb_run(str(tmp_path), "202") is None


def test_an_earlier_bayes_round_task_rerun_by_hand_stays_attributed_per_task(
    tmp_path, monkeypatch, capsys
) -> None:
    # Round 1 (job 500, trials 0-1) with trial 1 run again alone as job 700; round 2 (job
    # 600, trials 2-3). Round 2's folder lists all four: trial 0 is job 500's, trial 1 job
    # 700's, not "not started" because round 1's job_id names 700.
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job_id: {})
    exp = tmp_path / "proj" / "bo"
    rounds = [
        {"trial": k, "params": {"lr": 0.1 * (k + 1)}, "argv": [], "source": f"bayes:round {r}"}
        for k, r in ((0, 1), (1, 1), (2, 2), (3, 2))
    ]
    one = Path(fabricate._submission(str(exp), "20261123-120000-rnd1", "700", rounds[:2], True))
    two = Path(fabricate._submission(str(exp), "20261123-130000-rnd2", "600", rounds, True))
    for folder, r in ((one, 1), (two, 2)):
        (folder / "bayes.json").write_text(json.dumps({"study": one.name, "round": r}))
    for job, task, folder in (("500", 0, one), ("500", 1, one), ("700", 1, one)):
        (folder / "runs" / f"{job}_{task}").mkdir(parents=True)
    for job, task in (("600", 2), ("600", 3)):
        (two / "runs" / f"{job}_{task}").mkdir(parents=True)
    logs = tmp_path / "proj" / "hpc_outputs"
    for job, task in (("500", 0), ("700", 1), ("600", 2), ("600", 3)):
        fabricate._write(
            str(logs / f"proj_bo_{job}_{task}.out"),
            fabricate._log(f"{job}_{task}", task, ["exit 0"]),
        )
    monkeypatch.setenv("SCRATCH", str(tmp_path))
    code, lines, err = run(capsys, "results", "--project", "proj", "bo", "--no-group")
    assert code == 0, err
    assert {r[0]: r[2] for r in rows(lines)} == {str(k): "finished" for k in range(4)}


def test_a_running_task_keeps_the_rows_written_after_its_logs_last_line(
    scratch, monkeypatch
) -> None:
    # a task that may still write has no end: nothing it writes is a later run's
    running = {1: {"JobState": "RUNNING", "ArrayTaskId": "1"}}
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job: running if job == "700" else {})
    log = scratch / "proj" / "hpc_outputs" / "proj_configs_700_1.out"
    rows_at = log.stat().st_mtime + 100
    csv_path = scratch / "proj" / "configs" / "trials" / "1" / "metrics.csv"
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    csv_path.write_text(f"time,step,epoch,name,value\n{rows_at},5,0,test_acc,0.3\n")
    sub = submissions.load_submission(str(next((scratch / "proj" / "configs").glob("2026*"))))
    assert collect.collect(sub, "proj")[1].metrics == {"test_acc": [(5, 0.3)]}
    info = logs.read_log(str(log))
    assert logs.ended_at(str(log), info, "running") is None
    assert logs.ended_at(str(log), info, "RUNNING") is None


def test_a_rows_time_counts_up_to_the_end_the_nodes_clock_wrote_in_the_log(scratch) -> None:
    # the rows' times and the log's end line come from the node's clock, the log's last write
    # from the file server's: a node clock ahead must not drop the task's last rows
    log = scratch / "proj" / "hpc_outputs" / "proj_single_600.out"
    end = logs.log_time("2026-11-23 12:00:42")
    os.utime(log, (end - 100, end - 100))
    csv_path = scratch / "proj" / "single" / "checkpoints" / "metrics.csv"
    csv_path.write_text(f"time,step,epoch,name,value\n{end - 1},47,0,test_acc,0.75\n")
    sub = submissions.load_submission(str(next((scratch / "proj" / "single").glob("2026*"))))
    assert collect.collect(sub, "proj")[0].metrics == {"test_acc": [(47, 0.75)]}


def test_of_the_copies_a_fresh_moved_aside_the_newest_that_counts_is_read(scratch) -> None:
    single = scratch / "proj" / "single"
    sub = submissions.load_submission(str(next(single.glob("2026*"))))
    ended = (scratch / "proj" / "hpc_outputs" / "proj_single_600.out").stat().st_mtime
    ckpt = single / "checkpoints"
    older = single / "checkpoints.old-20261101T000000Z"  # a run before this job's
    older.mkdir()
    (older / "metrics.csv").write_text("time,step,epoch,name,value\n1.0,9,0,test_acc,0.1\n")
    ckpt.rename(single / "checkpoints.old-20261127T050000Z")  # this job's, by a later --fresh
    ckpt.mkdir()
    later = f"time,step,epoch,name,value\n{ended + 200},10,0,test_acc,0.99\n"
    (ckpt / "metrics.csv").write_text(later)
    own = [(40, 0.7), (47, 0.75)]
    assert collect.collect(sub, "proj")[0].metrics["test_acc"] == own
    # not finished (failed) and written before the submission: not this task's, nor the
    # older copy's
    submitted = metrics.submitted_at(sub)
    for folder in (single / "checkpoints.old-20261127T050000Z", older):
        os.utime(folder / "metrics.csv", (submitted - 60, submitted - 60))
    log = scratch / "proj" / "hpc_outputs" / "proj_single_600.out"
    log.write_text(log.read_text().replace("exit code 0", "exit code 1"))
    assert collect.collect(sub, "proj")[0].metrics == {}


def test_a_pruned_trial_shows_pruned_with_its_step(scratch, capsys) -> None:
    """hpc_harness/pruning.py's ``pruned`` file in a finished trial's folder (early_terminate);
    one older than the submission is an earlier run's and is ignored."""
    trials = scratch / "proj" / "grid" / "trials"
    (trials / "6" / "pruned").write_text("3 0.6\n")
    (trials / "7" / "pruned").write_text("1 0.5\n")
    os.utime(trials / "7" / "pruned", (1_000_000, 1_000_000))
    code, lines, _ = run(capsys, "results", "--project", "proj", "grid", "--no-group")
    assert code == 0
    states = {r[0]: r[4] for r in rows(lines)}
    assert states["6"] == "PRUNED at step 3"
    assert states["7"] == "finished"
    code, lines, _ = run(capsys, "status", "--project", "proj")
    states = {r[0]: r[1] for r in rows(lines)}
    assert (states["6"], states["7"]) == ("PRUNED at step 3", "finished")


@pytest.mark.parametrize(
    ("failed_at", "last_other", "ended"),
    [(None, 5, False), (3, 3, True), (3, 2, True), (3, 7, False)],  # resumed past it: not
)
def test_a_runs_failed_row_makes_its_trial_failed_unless_later_steps_follow(
    failed_at, last_other, ended
) -> None:
    # a wandb agent's job exits 0 whatever its runs did: the row is what tells the run failed
    series = {"train_loss": [(1, 0.5), (last_other, 0.4)]}
    if failed_at is not None:
        series["failed"] = [(failed_at, 1.0)]
    assert metrics.ended_in_exception(series) is ended
    assert list(series) == ["train_loss"]  # no metric column named failed
