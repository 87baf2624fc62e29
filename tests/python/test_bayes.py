"""hpc_tools.bayes and hpc_tools.study: method bayes offline (Optuna TPE rounds, journal
file storage), on fabricated submission folders and metrics.csv files (no cluster)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

optuna = pytest.importorskip("optuna")

from optuna.distributions import (  # noqa: E402
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState  # noqa: E402

from hpc_tools import bayes, slurm, trials  # noqa: E402
from hpc_tools.errors import ToolError  # noqa: E402
from hpc_tools.manifest import render  # noqa: E402
from hpc_tools.study import (  # noqa: E402
    open_study,
    rounds_manifest,
    sampler,
    search_space,
    tell_round,
)
from hpc_tools.sweep import load_sweep  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_accounting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rounds here are made up: SLURM's accounting (a cluster of the test machine) knows
    none of their jobs, and is not asked (the tests fake what scontrol says)."""
    monkeypatch.setattr(slurm, "sacct_tasks", lambda job_id: {})


def _sweep(tmp_path: Path, body: str, name: str = "bayes.yml") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


SWEEP = """\
program: train.py
method: bayes
metric: {name: test_acc, goal: maximize}
parameters:
  lr: {distribution: log_uniform_values, min: 0.0001, max: 0.1}
  hidden: {values: [16, 32, 64]}
"""


def test_search_space_maps_wandb_distributions(tmp_path: Path) -> None:
    spec = load_sweep(
        _sweep(
            tmp_path,
            """\
program: t.py
method: bayes
metric: {name: loss}
parameters:
  opt: {values: [adam, sgd]}
  fixed: {value: 3}
  layers: {min: 1, max: 4}
  drop: {min: 0.0, max: 0.5}
  lr: {distribution: log_uniform_values, min: 1.0e-4, max: 1.0e-1}
  wd: {distribution: log_uniform, min: -4, max: 0}
  bs: {distribution: q_uniform, min: 16, max: 128, q: 16}
  inv: {distribution: inv_log_uniform_values, min: 0.01, max: 1}
""",
        )
    )
    assert spec["goal"] == "minimize"  # wandb's default goal
    space = search_space(spec)
    assert space["opt"] == CategoricalDistribution(["adam", "sgd"])
    assert space["fixed"] == CategoricalDistribution([3])
    assert space["layers"] == IntDistribution(1, 4)
    assert space["drop"] == FloatDistribution(0.0, 0.5)
    assert space["lr"] == FloatDistribution(1e-4, 1e-1, log=True)
    assert space["wd"].log and math.isclose(space["wd"].low, math.exp(-4))
    assert space["wd"].high == pytest.approx(1.0)
    assert space["bs"] == IntDistribution(16, 128, step=16)
    assert space["inv"] == FloatDistribution(0.01, 1.0, log=True)


@pytest.mark.parametrize(
    "param, message",
    [
        ("{distribution: normal, mu: 0, sigma: 1}", "not supported by method bayes"),
        ("{values: [[1, 2], [3]]}", "numbers, strings"),
        ("{values: [a, b], probabilities: [0.5, 0.5]}", "probabilities"),
    ],
)
def test_search_space_refuses_what_optuna_cannot_sample(
    tmp_path: Path, param: str, message: str
) -> None:
    spec = load_sweep(
        _sweep(
            tmp_path,
            f"program: t.py\nmethod: bayes\nmetric: {{name: m}}\nparameters:\n  x: {param}\n",
        )
    )
    with pytest.raises(ToolError, match=message):
        search_space(spec)


def test_bayes_needs_a_metric_and_a_known_goal(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="needs metric"):
        load_sweep(
            _sweep(tmp_path, "program: t.py\nmethod: bayes\nparameters: {x: {values: [1]}}\n")
        )
    with pytest.raises(ToolError, match="goal must be minimize or maximize"):
        load_sweep(
            _sweep(
                tmp_path,
                "program: t.py\nmethod: bayes\nmetric: {name: m, goal: up}\n"
                "parameters: {x: {values: [1]}}\n",
            )
        )


def test_round_one_in_memory_equals_round_one_in_the_journal(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, SWEEP))
    memory = rounds_manifest(spec, 3, 7)
    journal = str(tmp_path / "optuna.journal")
    stored = rounds_manifest(spec, 3, 7, 1, journal, "s1")
    assert memory == stored
    assert len({json.dumps(t["params"], sort_keys=True) for t in stored}) == 3
    assert stored[0]["argv"][:3] == ["/usr/bin/env", "python", "train.py"]
    assert stored[0]["argv"][3].startswith("--hidden=")
    # Asking again (a re-run) adds no trial.
    assert rounds_manifest(spec, 3, 7, 1, journal, "s1") == stored
    study = open_study(journal, "s1", "maximize", sampler(7, 1, 3))
    assert len(study.get_trials()) == 3


def test_tell_is_idempotent_and_failed_trials_are_told_as_fail(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, SWEEP))
    journal = str(tmp_path / "optuna.journal")
    rounds_manifest(spec, 3, 0, 1, journal, "s")
    study = open_study(journal, "s", "maximize", sampler(0, 2, 3))
    assert tell_round(study, 1, {0: 0.5, 1: None, 2: float("nan")}) == (1, 2, 0)
    assert tell_round(study, 1, {0: 0.9, 1: 0.9, 2: 0.9}) == (0, 0, 0)
    states = [t.state for t in sorted(study.get_trials(), key=lambda t: t.user_attrs["index"])]
    assert states == [TrialState.COMPLETE, TrialState.FAIL, TrialState.FAIL]
    assert study.best_trial.value == 0.5
    # Round 2 is asked after round 1 was told: its trials follow in global numbering.
    records = rounds_manifest(spec, 3, 0, 2, journal, "s")
    assert [r["source"] for r in records] == ["bayes:round 1"] * 3 + ["bayes:round 2"] * 3
    assert len(rounds_manifest(spec, 3, 0, 2, journal, "s")) == 6
    assert len(study.get_trials()) == 6


def test_pruned_trials_are_counted_and_told_pruned_where_their_program_did_not(
    tmp_path: Path,
) -> None:
    spec = load_sweep(_sweep(tmp_path, SWEEP))
    journal = str(tmp_path / "optuna.journal")
    rounds_manifest(spec, 3, 0, 1, journal, "s")
    study = open_study(journal, "s", "maximize", sampler(0, 2, 3))
    # Trial 1's program told the journal itself (hpc_harness.pruning); trial 2's only left
    # its pruned file, and its metric at the prune step must not count as its result.
    told = next(t for t in study.get_trials() if t.user_attrs["index"] == 1)
    study.tell(told.number, state=TrialState.PRUNED)
    values = {0: 0.5, 1: 0.2, 2: 0.1}
    assert tell_round(study, 1, values, frozenset({1, 2})) == (1, 0, 2)
    assert tell_round(study, 1, values, frozenset({1, 2})) == (0, 0, 2)
    states = [t.state for t in sorted(study.get_trials(), key=lambda t: t.user_attrs["index"])]
    assert states == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.PRUNED]


@pytest.mark.parametrize("goal, best", [("maximize", 0.9), ("minimize", 0.1)])
def test_goal_is_respected(tmp_path: Path, goal: str, best: float) -> None:
    spec = load_sweep(_sweep(tmp_path, SWEEP.replace("maximize", goal)))
    journal = str(tmp_path / "optuna.journal")
    rounds_manifest(spec, 3, 0, 1, journal, "s")
    study = open_study(journal, "s", goal, sampler(0, 2, 3))
    tell_round(study, 1, {0: 0.1, 1: 0.5, 2: 0.9})
    assert study.best_value == best


# ---------------------------------------------------------------- the controller


def _submission(tmp_path: Path, rounds: int, argv: list[str]) -> Path:
    """A fabricated round-1 folder of experiment 'exp' under project 'proj'; the trials
    0 and 1 finished with test_acc 0.4 and 0.8, trial 2 failed (exit 1)."""
    sweep = _sweep(tmp_path, SWEEP)
    project = tmp_path / "scratch" / "proj"
    sub = project / "exp" / "20261123-140000-AbCd"
    sub.mkdir(parents=True)
    (sub / "sweep.yml").write_text(Path(sweep).read_text())
    spec = load_sweep(sweep)
    journal = str(project / "exp" / "optuna.journal")
    jsonl, commands = render(rounds_manifest(spec, 3, 0, 1, journal, sub.name))
    (sub / "trials.jsonl").write_text(jsonl)
    (sub / "commands.txt").write_text(commands)
    (sub / "job.sbatch").write_text("#!/bin/bash\n#SBATCH --array=0-2\n")
    (sub / "job_id").write_text("500\n")
    assert (
        bayes.main(
            [
                "start",
                "--submission",
                str(sub),
                "--journal",
                journal,
                "--study",
                sub.name,
                "--round",
                "1",
                "--rounds",
                str(rounds),
                "--trials",
                "3",
                "--sweep-seed",
                "0",
                "--cwd",
                str(tmp_path),
                "--",
                *argv,
            ]
        )
        == 0
    )
    logs = project / "hpc_outputs"
    logs.mkdir()
    for k, (value, code) in enumerate([(0.4, 0), (0.8, 0), (0.99, 1)]):
        folder = project / "exp" / "trials" / str(k) / "checkpoints"
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(
            f"time,step,epoch,name,value\n1,10,0,test_acc,0.1\n2,20,1,test_acc,{value}\n"
        )
        (logs / f"proj_exp_500_{k}.out").write_text(
            f"hpc: job 500_{k} (trial {k}) on node1, restart 0, started now\n"
            f"hpc: training step ended with exit code {code} at now\n"
        )
    return sub


def test_controller_of_the_last_round_records_results_and_reruns_tell_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job: {})
    sub = _submission(tmp_path, 1, ["false"])
    info = json.loads((sub / "bayes.json").read_text())
    assert info["round"] == 1 and info["metric"] == "test_acc" and info["argv"] == ["false"]
    for _ in range(2):
        assert bayes.main(["controller", "--submission", str(sub)]) == 0
        study = open_study(info["journal"], info["study"], "maximize", sampler(0, 2, 3))
        got = sorted(study.get_trials(), key=lambda t: t.user_attrs["index"])
        assert [t.state for t in got] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL]
        assert [t.value for t in got[:2]] == [0.4, 0.8]  # the final value, not the first
    best = json.loads((sub / "bayes_best.json").read_text())
    assert best["best_value"] == 0.8 and best["best_trial"] == 1 and best["complete"] == 2


def test_controller_submits_the_next_round_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job: {})
    calls = tmp_path / "calls.txt"
    fake = _round_two_submitter(tmp_path, calls, record='"$HPC_BAYES_ROUND $HPC_BAYES_STUDY $*"')
    sub = _submission(tmp_path, 2, [str(fake), "--sweep", "x.yml", "--wait", "--", "a", "--wait"])
    for _ in range(2):
        assert bayes.main(["controller", "--submission", str(sub)]) == 0
    # --wait is the user's, for round 1: the controller does not wait for round 2.
    assert calls.read_text() == f"2 {sub.name} --sweep x.yml -- a --wait\n"
    round2 = tmp_path / "scratch" / "proj" / "exp" / "20261123-150000-XyZw"
    assert (sub / "next_round").read_text() == f"{round2}\n"
    assert not (sub / "bayes_best.json").exists()


def test_trials_cli_lists_round_one_and_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = _sweep(tmp_path, SWEEP)
    assert trials.main(["--sweep", sweep, "--trials", "3", "--rounds", "2", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all('"source":"bayes:round 1"' in x for x in lines)
    assert trials.main(["--sweep", sweep, "--list"]) == 2
    assert "needs --trials N" in capsys.readouterr().err
    grid = _sweep(
        tmp_path, "program: t.py\nmethod: grid\nparameters: {x: {values: [1]}}\n", "g.yml"
    )
    assert trials.main(["--sweep", grid, "--rounds", "2", "--list"]) == 2
    assert "--rounds applies to method bayes only" in capsys.readouterr().err
    out = tmp_path / "out"
    assert trials.main(["--sweep", sweep, "--trials", "2", "--out-dir", str(out)]) == 0
    assert capsys.readouterr().out == "2 0\n"
    assert os.path.isfile(out / "commands.txt")


def test_the_controllers_json_files_are_written_whole_or_refused_in_one_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bayes.json"
    bayes._write_json(str(path), {"round": 2, "best_value": 0.5})
    assert path.read_text() == '{\n "best_value": 0.5,\n "round": 2\n}\n'
    assert os.listdir(tmp_path) == ["bayes.json"]  # no temporary file left beside it
    with pytest.raises(ToolError) as refused:
        bayes._write_json(str(tmp_path / "gone" / "bayes.json"), {})
    assert refused.value.code == 1 and "cannot write" in str(refused.value)


def _round_two_submitter(
    tmp_path: Path,
    calls: Path,
    code: int = 0,
    code_after: int = 0,
    record: str = '"$HPC_BAYES_ROUND"',
) -> Path:
    """A stand-in submitter that records its call (``record``) and, like the real one, leaves
    round 2's folder (bayes.json, then job_id once queued) in the experiment and prints it;
    it exits ``code`` before queuing anything, or ``code_after`` once it has."""
    fake = tmp_path / "round_two_submitter.sh"
    exp = tmp_path / "scratch" / "proj" / "exp"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'echo {record} >>"{calls}"\n'
        f"[ {code} = 0 ] || exit {code}\n"
        f'dir="{exp}/20261123-150000-XyZw"\n'
        'mkdir -p "$dir"\n'
        'printf \'{"round": %s, "study": "%s"}\\n\' "$HPC_BAYES_ROUND" "$HPC_BAYES_STUDY"'
        ' >"$dir/bayes.json"\n'
        'echo 501 >"$dir/job_id"\n'
        'echo "  submission: $dir"\n'
        f"exit {code_after}\n"
    )
    fake.chmod(0o755)
    return fake


def test_a_controller_stopped_after_submitting_the_next_round_never_submits_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The controller job killed (time limit, node failure) after the submitter queued round
    # 2 but before the controller recorded it: the next controller must not queue round 2
    # a second time (two array jobs would train the same trials/K folders at once).
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job: {})
    calls = tmp_path / "calls.txt"
    sub = _submission(tmp_path, 2, [str(_round_two_submitter(tmp_path, calls))])
    real_run = bayes.subprocess.run

    def killed_after_submitting(*args: Any, **kwargs: Any) -> Any:
        real_run(*args, **kwargs)
        raise KeyboardInterrupt  # stands for the SIGKILL: nothing after it runs

    monkeypatch.setattr(bayes.subprocess, "run", killed_after_submitting)
    with pytest.raises(KeyboardInterrupt):
        bayes.main(["controller", "--submission", str(sub)])
    monkeypatch.setattr(bayes.subprocess, "run", real_run)
    assert bayes.main(["controller", "--submission", str(sub)]) == 0
    assert calls.read_text() == "2\n"
    round2 = tmp_path / "scratch" / "proj" / "exp" / "20261123-150000-XyZw"
    assert (sub / "next_round").read_text() == f"{round2}\n"


def test_a_controller_stopped_before_its_submission_shows_refuses_to_guess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Stopped before round 2's folder held a job id: whether sbatch ran is unknown, so the
    # next controller submits nothing and says how to go on, in one line.
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job: {})
    calls = tmp_path / "calls.txt"
    sub = _submission(tmp_path, 2, [str(_round_two_submitter(tmp_path, calls))])

    def killed_before_submitting(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(bayes.subprocess, "run", killed_before_submitting)
    with pytest.raises(KeyboardInterrupt):
        bayes.main(["controller", "--submission", str(sub)])
    capsys.readouterr()
    monkeypatch.undo()
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job: {})
    monkeypatch.setattr(slurm, "sacct_tasks", lambda job: {})
    assert bayes.main(["controller", "--submission", str(sub)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bayes.py: error: round 2 ")
    assert f"remove {sub}/next_round to submit it" in err and "another controller" in err
    assert not calls.exists()
    (sub / "next_round").unlink()  # as the line says: then round 2 is submitted once
    assert bayes.main(["controller", "--submission", str(sub)]) == 0
    assert calls.read_text() == "2\n"


def test_a_failed_submission_of_the_next_round_is_tried_again_by_the_next_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job: {})
    calls = tmp_path / "calls.txt"
    sub = _submission(tmp_path, 2, [str(_round_two_submitter(tmp_path, calls, code=3))])
    assert bayes.main(["controller", "--submission", str(sub)]) == 1
    assert not (sub / "next_round").exists()
    assert bayes.main(["controller", "--submission", str(sub)]) == 1
    assert calls.read_text() == "2\n2\n"


def test_a_round_queued_by_a_submitter_that_failed_after_is_not_queued_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The submitter queued round 2, then failed (sbatch refused round 2's controller job):
    # the round is recorded and the next controller does not queue it a second time.
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job: {})
    calls = tmp_path / "calls.txt"
    sub = _submission(tmp_path, 2, [str(_round_two_submitter(tmp_path, calls, code_after=1))])
    assert bayes.main(["controller", "--submission", str(sub)]) == 1
    assert "bayes.py: error: round 2 was queued (" in capsys.readouterr().err
    assert bayes.main(["controller", "--submission", str(sub)]) == 0
    assert calls.read_text() == "2\n"
    assert "round 2 was already submitted" in capsys.readouterr().out


def test_a_submitter_that_cannot_start_releases_the_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The submitter moved away (or the project folder): nothing was queued, so the next
    # controller tries again rather than refusing on a pending claim.
    monkeypatch.setattr(slurm, "scontrol_tasks", lambda job: {})
    sub = _submission(tmp_path, 2, [str(tmp_path / "moved_away" / "job_submitter.sh")])
    assert bayes.main(["controller", "--submission", str(sub)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bayes.py: error: cannot run the submitter for round 2: ")
    assert err.count("\n") == 1 and not (sub / "next_round").exists()


def test_the_template_sweep_optimises_a_metric_the_example_trainer_logs() -> None:
    """sweeper.yml is the template users start from: with a metric the example
    (python -m hpc_harness.train) never writes, method bayes counts every trial as failed.
    The Trainer's default evaluation writes test_loss and test_acc (Trainer.eval_step)."""
    import yaml

    sweep = yaml.safe_load((Path(__file__).resolve().parents[2] / "sweeper.yml").read_text())
    assert sweep["metric"]["name"] in {"test_acc", "test_loss"}
