"""Adaptive search offline: ``method: bayes`` as rounds of array jobs driven by Optuna.

A login-node (or small CPU job) tool; nothing here runs in the training job. The study is
study.py's. With ``job_submitter.sh --sweep bayes.yml --rounds 3 --trials 4``, round 1 is
an array job of 4 trials (the sampler's random startup) and a controller job after it::

    python3 -m hpc_tools.bayes start --submission DIR --journal FILE --study NAME --round K
        --rounds R --trials N [--sweep-seed S] --cwd DIR -- SUBMITTER ARG...
    python3 -m hpc_tools.bayes controller --submission DIR [--project NAME]

``start`` (in the submitter) checks the round's manifest against the study and writes
``bayes.json``; the controller reads each finished trial's metrics.csv (collect.py, as
results.sh), tells Optuna (a failed task or a missing metric is told as FAIL) and re-runs
the submitter with HPC_BAYES_ROUND=K+1 (round K's folder lists rounds 1..K, trial =
global index); the last round's controller writes bayes_best.json. Re-running a controller
tells only trials not yet told and submits the next round only once (``next_round``).

Errors: one line ``bayes.py: error: MESSAGE`` on stderr; exit 2 for bad input, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from hpc_tools import collect, submissions
from hpc_tools.errors import ToolError, report
from hpc_tools.files import write_atomic
from hpc_tools.manifest import render
from hpc_tools.study import open_study, rounds_manifest, sampler, tell_round
from hpc_tools.sweep import load_sweep

# stop.sh's record in the experiment folder (STOP_RECORD in lib/experiment.sh): no next round.
STOP_RECORD = "stopped"


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise ToolError(f"cannot read {path}: {exc}", 1) from None


def _write_json(path: str, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def round_values(
    submission: str, project: str, metric: str, first: int, count: int
) -> tuple[dict[int, float | None], frozenset[int]]:
    """({global trial: final value of metric, or None for a failed or metric-less trial},
    the trials pruned by early termination), read by collect.py (results.sh's reader)."""
    sub = submissions.load_submission(submission)
    out: dict[int, float | None] = {}
    pruned = set()
    for trial in collect.collect(sub, project):
        if not first <= trial.index < first + count:
            continue
        points = trial.metrics.get(metric) or []
        final = points[-1][1] if points else None
        out[trial.index] = None if trial.failed or final is None else final
        if trial.state.startswith("PRUNED"):
            pruned.add(trial.index)
    return out, frozenset(pruned)


def cmd_start(argv: list[str]) -> int:
    """In the submitter, once the round's folder exists: the study in the journal holds
    this round's trials (asked now unless they were), and they are the folder's manifest."""
    opts, rest = _options(
        argv, ("submission", "journal", "study", "round", "rounds", "trials", "sweep-seed", "cwd")
    )
    sub = opts["submission"]
    spec = load_sweep(os.path.join(sub, "sweep.yml"))
    round_, rounds, per_round = int(opts["round"]), int(opts["rounds"]), int(opts["trials"])
    seed = int(opts.get("sweep-seed", "0"))
    records = rounds_manifest(spec, per_round, seed, round_, opts["journal"], opts["study"])
    jsonl, commands = render(records)
    for name, text in (("trials.jsonl", jsonl), ("commands.txt", commands)):
        with open(os.path.join(sub, name), encoding="utf-8") as fh:
            if fh.read() != text:
                raise ToolError(
                    f"{sub}/{name} differs from the study's round {round_}; not submitted", 1
                )
    _write_json(
        os.path.join(sub, "bayes.json"),
        {
            "study": opts["study"],
            "journal": opts["journal"],
            "round": round_,
            "rounds": rounds,
            "trials_per_round": per_round,
            "sweep_seed": seed,
            "metric": spec["metric"],
            "goal": spec["goal"],
            "cwd": opts["cwd"],
            "argv": rest,
        },
    )
    return 0


def cmd_controller(argv: list[str]) -> int:
    opts, _ = _options(argv, ("submission", "project"))
    sub = os.path.abspath(opts["submission"])
    info = _read_json(os.path.join(sub, "bayes.json"))
    round_, per_round = info["round"], info["trials_per_round"]
    project = opts.get("project") or os.path.basename(os.path.dirname(os.path.dirname(sub)))
    first = (round_ - 1) * per_round
    spec_path = os.path.join(sub, "sweep.yml")
    spec = load_sweep(spec_path)
    study = open_study(
        info["journal"],
        info["study"],
        info["goal"],
        sampler(info["sweep_seed"], round_ + 1, per_round),
    )
    values = round_values(sub, project, info["metric"], first, per_round)
    done, failed, pruned = tell_round(study, round_, *values)
    print(
        f"bayes: round {round_}/{info['rounds']}: told {done} complete, {failed} failed;"
        f" {pruned} pruned early"
    )
    stopped = os.path.join(os.path.dirname(sub), STOP_RECORD)
    if round_ >= info["rounds"] or os.path.exists(stopped):
        if round_ < info["rounds"]:
            print(f"bayes: {stopped} exists (stop.sh); round {round_ + 1} is not submitted")
        return record_best(sub, study, spec)
    marker = os.path.join(sub, "next_round")
    if not _claim(marker):
        return _already_submitted(marker, sub, info["study"], round_ + 1)
    env = dict(os.environ)
    env.update(
        HPC_BAYES_ROUND=str(round_ + 1),
        HPC_BAYES_STUDY=info["study"],
        HPC_BAYES_JOURNAL=info["journal"],
    )
    try:
        proc = subprocess.run(
            submitter_argv(info["argv"]),
            cwd=info["cwd"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:  # it did not start: nothing was queued
        os.unlink(marker)
        raise ToolError(f"cannot run the submitter for round {round_ + 1}: {exc}", 1) from None
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    folder = _queued_round(sub, info["study"], round_ + 1)
    if not folder:
        os.unlink(marker)  # nothing was queued: the next controller tries again
        raise ToolError(f"submitting round {round_ + 1} failed (exit {proc.returncode})", 1)
    write_atomic(marker, folder + "\n")
    if proc.returncode != 0:  # e.g. sbatch refused the round's own controller job
        raise ToolError(
            f"round {round_ + 1} was queued ({folder}), then its submitter failed "
            f"(exit {proc.returncode}; its message is above)",
            1,
        )
    return 0


PENDING = "pending: "


def _claim(marker: str) -> bool:
    """Create ``next_round`` before submitting, or find it there: a controller stopped
    between the submitter's sbatch and recording its folder leaves it pending, so no later
    controller (nor one running beside it) submits the round a second time."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f"{PENDING}controller pid {os.getpid()} on {os.uname().nodename}\n")
    return True


def _already_submitted(marker: str, sub: str, study: str, round_: int) -> int:
    with open(marker, encoding="utf-8") as fh:
        text = fh.read().strip()
    if not text.startswith(PENDING):
        print(f"bayes: round {round_} was already submitted: {text}")
        return 0
    folder = _queued_round(sub, study, round_)
    if not folder:
        raise ToolError(
            f"round {round_} is being submitted by another controller, or was by one that "
            f"stopped before recording it ({text[len(PENDING) :]}); no submission of it with a "
            f"job id is in {os.path.dirname(sub)} yet: once that controller has ended and "
            f"squeue shows no round {round_}, remove {marker} to submit it",
            1,
        )
    write_atomic(marker, folder + "\n")
    print(f"bayes: round {round_} was already submitted: {folder}")
    return 0


def _queued_round(sub: str, study: str, round_: int) -> str:
    """The folder of the study's round that sbatch accepted, in sub's experiment, or ''."""
    return submissions.study_rounds(os.path.dirname(sub), study).get(round_, "")


def submitter_argv(argv: list[str]) -> list[str]:
    """Round 1's submitter argv for the next round, less --wait (a controller job does
    not wait for the round it submits); words after '--' are the program's, kept."""
    if "--" in argv:
        cut = argv.index("--")
        return [a for a in argv[:cut] if a != "--wait"] + argv[cut:]
    return [a for a in argv if a != "--wait"]


def record_best(sub: str, study: Any, spec: dict) -> int:
    from optuna.trial import TrialState

    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    data: dict[str, Any] = {
        "metric": spec["metric"],
        "goal": spec["goal"],
        "trials": len(study.get_trials(deepcopy=False)),
        "complete": len(complete),
    }
    if complete:
        best = study.best_trial
        data.update(
            best_value=best.value, best_params=best.params, best_trial=best.user_attrs.get("trial")
        )
        print(
            f"bayes: best {spec['metric']} {best.value} (trial {data['best_trial']}): {best.params}"
        )
    _write_json(os.path.join(sub, "bayes_best.json"), data)
    return 0


def _options(argv: list[str], names: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return opts, argv[i + 1 :]
        key = arg[2:].partition("=")[0] if arg.startswith("--") else ""
        if key not in names:
            raise ToolError(f"unknown option {arg!r}")
        if "=" in arg:
            opts[key] = arg.partition("=")[2]
        elif i + 1 < len(argv):
            i += 1
            opts[key] = argv[i]
        else:
            raise ToolError(f"{arg} expects a value")
        i += 1
    return opts, []


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv or argv[0] not in ("start", "controller"):
            raise ToolError("usage: bayes.py start|controller ... (see the module docstring)")
        if argv[0] == "start":
            return cmd_start(argv[1:])
        return cmd_controller(argv[1:])
    except ToolError as exc:
        return report("bayes.py", exc)


if __name__ == "__main__":
    sys.exit(main())
