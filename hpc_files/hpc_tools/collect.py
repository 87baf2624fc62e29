"""A submission's trials as results.sh and the bayes controller see them: each trial's
parameters, state (SLURM's, else its log's), restarts and metrics."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from hpc_tools.logs import ended_at, read_log, trial_state
from hpc_tools.metrics import (
    ended_in_exception,
    find_metrics_csv,
    own_metrics,
    pruned_at,
    read_metrics,
    submitted_at,
)
from hpc_tools.submissions import (
    Submission,
    load_submission,
    read_text,
    study_rounds,
    task_jobs,
)


@dataclass
class Trial:
    index: int
    params: dict[str, Any]
    config: tuple
    state: str
    failed: bool
    restarts: int
    metrics: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def collect(sub: Submission, project: str) -> list[Trial]:
    jobs = task_jobs(sub)
    submitted = submitted_at(sub)
    round_jobs = bayes_round_jobs(sub)
    raw_params = [{k: v for k, v in t.get("params", {}).items() if k != "seed"} for t in sub.trials]
    argvs = [strip_seed(list(t.get("argv", []))) for t in sub.trials]
    if not any(raw_params):
        raw_params = argv_params(argvs)
    # A wandb sweep array: K identical trials, each task's run (and its files, under
    # <exp>/runs/<run id>) chosen by the W&B server; the parameters are the run's.
    run_ids = [
        wandb_run(sub.trial_dir(index), jobs[index][0])
        for index in (int(t.get("trial", k)) for k, t in enumerate(sub.trials))
    ]
    run_dirs = [os.path.join(os.path.dirname(sub.path), "runs", r) if r else None for r in run_ids]
    if any(run_ids):
        prints = [run_fingerprint(d) if d else {} for d in run_dirs]
        keys: list[str] = []
        for fp in prints:
            keys += [k for k in fp if k not in keys]
        varying = [k for k in keys if len({json.dumps(fp.get(k)) for fp in prints}) > 1]
        raw_params = [
            {"run": r or "-", **{k: fp.get(k, "") for k in varying if k != "seed"}}
            for r, fp in zip(run_ids, prints)
        ]
        argvs = [[json.dumps(p, sort_keys=True, default=str)] for p in raw_params]
        for p, fp in zip(raw_params, prints):
            if "seed" in varying:
                p["seed"] = fp.get("seed", "")
    trials = []
    for k, record in enumerate(sub.trials):
        index = int(record.get("trial", k))
        other_round = round_jobs.get(str(record.get("source", "")))
        job, fields = other_round.get(index, (None, None)) if other_round else jobs[index]
        log_path = sub.log_path(project, index, job)
        log = read_log(log_path)
        state, failed, restarts = trial_state(fields, log)
        params = dict(raw_params[k])
        if "seed" in record.get("params", {}):
            params["seed"] = record["params"]["seed"]
        config = tuple(argvs[k])
        if run_ids[k]:  # a run's own arguments define its configuration, not the task's
            config = (json.dumps({x: v for x, v in params.items() if x not in ("run", "seed")}),)
        trial = Trial(index, params, config, state, failed, restarts)
        if run_dirs[k]:  # a run's own folder (wandb sweeps): no other run writes there
            trial.metrics = read_metrics(find_metrics_csv(run_dirs[k], sub.array))
        else:  # another round's trials ran before this round's folder was written
            since = None if other_round else submitted
            until = ended_at(log_path, log, state)
            trial.metrics = own_metrics(sub, index, since, state == "finished", until)
        if ended_in_exception(trial.metrics) and not trial.failed:  # a sweep's run: its job
            trial.state, trial.failed = "failed (exception)", True  # (the agent) exits 0
        if (
            state == "finished"
            and not trial.failed
            and (step := pruned_at(sub, index, None if other_round else submitted))
        ):
            trial.state = f"PRUNED at step {step}"
        trials.append(trial)
    return trials


def strip_seed(argv: list[str]) -> list[str]:
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--seed":
            skip = True
        elif not word.startswith("--seed="):
            out.append(word)
    return out


def argv_params(argvs: list[list[str]]) -> list[dict[str, str]]:
    """Parameters of configs-file trials (params {}): the --key value / --key=value words
    whose values differ between trials; a word that is no option is ``arg<N>``."""
    parsed = []
    for argv in argvs:
        params: dict[str, str] = {}
        i = 0
        while i < len(argv):
            word = argv[i]
            if word.startswith("--") and len(word) > 2:
                key, eq, value = word[2:].partition("=")
                if not eq:
                    if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                        value, i = argv[i + 1], i + 1
                    else:
                        value = "true"
                params[key] = value
            else:
                params[f"arg{i}"] = word
            i += 1
        parsed.append(params)
    keys: list[str] = []
    for p in parsed:
        keys += [k for k in p if k not in keys]
    varying = [k for k in keys if len({p.get(k) for p in parsed}) > 1]
    return [{k: p.get(k, "") for k in varying} for p in parsed]


def wandb_run(trial_dir: str, job_id: str | None) -> str | None:
    """The wandb run task K of a wandb sweep array job ``job_id`` ran: the last line of its
    ``trials/K/wandb_runs.txt`` (run id, exit status, job id) of that job; ``trials/K`` is
    shared by every submission of the experiment, whose runs are not this one's. None for
    any other submission, or before the task ran a run."""
    text = read_text(os.path.join(trial_dir, "wandb_runs.txt")) or ""
    lines = [line.split() for line in text.splitlines()]
    mine = [fields[0] for fields in lines if len(fields) == 3 and fields[2] == job_id]
    return mine[-1] if mine and job_id else None


def run_fingerprint(run_dir: str) -> dict[str, Any]:
    """The harness's ``run.json`` fingerprint (the run's arguments) in RUN_DIR or one below."""
    for folder in (run_dir, os.path.join(run_dir, "checkpoints")):
        text = read_text(os.path.join(folder, "run.json"))
        if text:
            try:
                data = json.loads(text)
            except ValueError:
                continue
            if isinstance(data, dict) and isinstance(data.get("fingerprint"), dict):
                return data["fingerprint"]
    return {}


def bayes_round_jobs(sub: Submission) -> dict[str, dict[int, tuple[str | None, dict | None]]]:
    """A method-bayes round lists the trials of every round so far (bayes.py);
    the earlier rounds ran as other jobs: {"bayes:round R": task_jobs of that round's
    folder} for the other rounds of the same study."""
    try:
        study = json.loads(read_text(os.path.join(sub.path, "bayes.json")) or "{}").get("study")
    except ValueError:
        return {}
    return {
        f"bayes:round {r}": task_jobs(load_submission(folder))
        for r, folder in study_rounds(os.path.dirname(sub.path), study).items()
        if folder != sub.path
    }
