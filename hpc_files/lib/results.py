#!/usr/bin/env python3
"""Read submissions back: a live status table (status.sh) and a results table (results.sh).

Runs on the login node, called by the thin entry points ``hpc_files/status.sh`` and
``hpc_files/results.sh``; it reads files and runs ``scontrol show job -o`` (once per job),
and ``sacct`` for a job SLURM's controller has forgotten, where accounting keeps it (it is
off on many small clusters: then the logs tell)::

    python3 hpc_files/lib/results.py status|results|failed --project NAME [ARG...]

with the arguments (and ``-h``) of USAGE below. ``--curves`` draws training curves (one panel
per metric, value against global step, one line per trial); with ``--run`` they are one run's
outside SLURM (a laptop run), no submission or ``$SCRATCH`` needed. This module is the one
reader of the harness's metrics.csv; it needs only the standard library (matplotlib for the
PNGs), so it runs where hpc_harness and torch are not installed.

Where things are (written by job_submitter.sh and the batch script):

* a submission folder ``$SCRATCH/<project>/<exp>/<YYYYmmdd-HHMMSS-XXXX>/`` holds
  ``job.sbatch`` (``#SBATCH --array=`` for an array), ``job_id``, ``trials.jsonl`` (one
  trial per line: ``trial``, ``params``, ``argv``) and ``sweep.yml`` for a sweep;
* the log of a plain job is ``$SCRATCH/<project>/hpc_outputs/<project>_<exp>_<id>.out``,
  of array task K ``..._<arrayid>_K.out``; every run appends ``hpc: job KEY (trial K) on
  NODES, restart N, started DATE`` and ends with ``hpc: training step ended with exit code
  N at DATE`` or ``hpc: requeued KEY (restart N ...)``; the harness prints ``hpc_harness:
  step S/T epoch E loss L ...``;
* results: a plain job's folder is ``$SCRATCH/<project>/<exp>/``, array task K's is
  ``.../<exp>/trials/K/``; the harness's ``metrics.csv`` (long format: time, step, epoch,
  name, value) is there or one folder below (``checkpoints/`` by default).

Errors: one line ``PROG: error: MESSAGE`` on stderr; exit 2 for bad input (unknown
experiment, unknown metric, --watch without a terminal, a --run path without metrics), 1
for a failure to write.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import trials as trials_mod  # noqa: E402  (trials.py beside this file: the manifest)

STAMP = re.compile(r"^\d{8}-\d{6}-[A-Za-z0-9]+$")
# SLURM states of a task that may still write its metrics.csv.
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING")
# A row's time is the node's clock, the log's last write the file server's (NTP keeps them
# within milliseconds): how far apart they may be before a row counts as written after the
# task ended. A later job's first row comes seconds after its start, at the earliest.
ROW_CLOCK_SLACK_S = 2.0
START = re.compile(r"^hpc: job (\S+) \(trial (\d+)\) on (\S+), restart (\d+), started (.+)$")
ENDED = re.compile(r"^hpc: training step ended with exit code (\d+) at (.+)$")
REQUEUED = re.compile(r"^hpc: requeued (\S+) \(restart (\d+)")
KILLED = re.compile(r"\*\*\* JOB \S+ ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))? \*\*\*")
# slurmstepd's line when the cgroup's memory limit killed a task of a step.
OOM_KILLED = re.compile(r"^slurmstepd\S*: error: Detected \d+ oom[_-]kill event")
PROGRESS = re.compile(r"^hpc_harness: step (\d+)/(\d+) epoch (\d+) loss (\S+)")
IMAGE_TYPES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")  # what --plot and --curves write
LOWER_IS_BETTER = re.compile(r"loss|err|perplex|mse|mae|rmse|time|regret", re.IGNORECASE)
SCONTROL_FIELDS = ("JobId", "ArrayJobId", "ArrayTaskId", "JobState", "Restarts", "RunTime")


# The help of status.sh and results.sh, beside the parsers it describes ({project}: the
# default project, the first --project run_results_py passes).
USAGE = {
    "status": """\
usage: status.sh [EXP | JOBID] [--watch [SECONDS]] [--project NAME]

One row per task of the newest submission (of experiment EXP, or the one whose
job id is JOBID or JOBID_TASK; default: the newest under $SCRATCH/{project}/ across
experiments): task, state (SLURM's while it knows the job, else from the log:
finished, failed (exit N), requeued), restarts, elapsed, last progress line
(the harness's 'step S/T epoch E loss L', else the last metrics.csv row).

  --watch [SECONDS]  clear and redraw every SECONDS (default 5) until Ctrl-C;
                     (a number after --watch is SECONDS: give a JOBID first);
                     stdout must be a terminal
  --project NAME     the project folder under $SCRATCH (default: {project},
                     the folder holding hpc_files/)
  -h, --help         show this help
""",
    "results": """\
usage: results.sh EXP|JOBID [--sort METRIC[:max|min]] [--no-group] [--metrics A,B]
                  [--csv FILE] [--plot FILE.png] [--curves FILE.png] [--project NAME]
       results.sh --run RUN_DIR|CSV --curves FILE.png [--metrics A,B]

One row per configuration of the newest submission of experiment EXP (or the
submission whose job id is JOBID) under $SCRATCH/{project}/: its trials, its
parameters, n, state, and for every metric its final and best value (mean ± std
over the seeds of the configuration; failed trials are listed but left out of
the mean unless all failed; a configuration whose every trial failed sorts
last). Metrics come from each trial's metrics.csv; for a wandb sweep array
(-w), from each task's run (<exp>/runs/<run id>/), its parameters from the
run's run.json.

  -s, --sort METRIC[:max|min]  sort by METRIC's final value (default: the sweep
                     file's metric: name and goal when it was logged, else
                     the first of --metrics, else the first logged metric;
                     max unless the name says loss/error)
  --no-group         one row per trial (seeds not grouped)
  -m, --metrics A,B  show only these metrics (default: every logged metric)
  --csv FILE         also write the table as CSV (mean and std in own columns)
  --plot FILE.png    draw the sort metric of the finished trials against each
                     parameter that varies (matplotlib)
  --curves FILE.png  draw the training curves: one panel per metric (those of
                     --metrics), value against global step, one line per trial
  --run RUN_DIR|CSV  instead of EXP: one run outside SLURM (a laptop run), its
                     folder (metrics.csv in it or one folder below, e.g.
                     checkpoints/) or its metrics.csv; takes --curves and
                     --metrics only, needs no $SCRATCH
  --project NAME     the project folder under $SCRATCH (default: {project},
                     the folder holding hpc_files/)
  -h, --help         show this help
""",
}


class UsageError(Exception):
    """Bad input: one line, exit 2."""


class RuntimeFailure(Exception):
    """A failure to read or write: one line, exit 1."""


# ---------------------------------------------------------------- submissions


@dataclass
class Submission:
    path: str
    exp: str
    job_id: str | None
    array: bool
    trials: list[dict]
    # A sweep above MaxArraySize went as several array jobs: {job: its first trial}.
    chunks: dict[str, int] = field(default_factory=dict)
    # Those and the jobs --retry-failed queued for them: {job: the trial of its task 0}.
    offsets: dict[str, int] = field(default_factory=dict)

    def chunk_job(self, index: int) -> str | None:
        """The array job that holds trial ``index`` as submitted (the folder's job_id
        unless the sweep was split)."""
        starts = [(first, job) for job, first in self.chunks.items() if first <= index]
        return max(starts)[1] if starts else self.job_id

    @property
    def project_dir(self) -> str:
        return os.path.dirname(os.path.dirname(self.path))

    def log_path(self, project: str, task: int, job_id: str | None = None) -> str | None:
        job_id = job_id or self.job_id
        if not job_id:
            return None
        key = f"{job_id}_{task - self.offsets.get(job_id, 0)}" if self.array else job_id
        return os.path.join(self.project_dir, "hpc_outputs", f"{project}_{self.exp}_{key}.out")

    def trial_dir(self, task: int) -> str:
        exp_dir = os.path.dirname(self.path)
        return os.path.join(exp_dir, "trials", str(task)) if self.array else exp_dir


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def load_submission(path: str) -> Submission:
    trials: list[dict] = []
    text = trials_mod.manifest_of(path)
    for line in text.splitlines():
        if line.strip():
            try:
                trials.append(json.loads(line))
            except ValueError:
                raise RuntimeFailure(f"{path}/trials.jsonl: a line is not JSON") from None
    if not trials:
        trials = [{"trial": 0, "params": {}, "argv": []}]
    job_id = (_read_text(os.path.join(path, "job_id")) or "").strip() or None
    sbatch = _read_text(os.path.join(path, "job.sbatch")) or ""
    array = re.search(r"^#SBATCH --array=", sbatch, re.MULTILINE) is not None
    exp = os.path.basename(os.path.dirname(path))
    chunks = array_offsets(path, ("array_jobs",))
    return Submission(path, exp, job_id, array, trials, chunks, array_offsets(path))


def array_offsets(path: str, names: tuple[str, ...] = ("array_jobs", "retry_jobs")):
    """{array job: the trial its task 0 runs} from the submission's ``array_jobs`` (the
    arrays of a sweep above MaxArraySize) and ``retry_jobs`` (--retry-failed's for them),
    lines ``JOB FIRST`` written by the submitter; {} for one array."""
    offsets = {}
    for name in names:
        for line in (_read_text(os.path.join(path, name)) or "").splitlines():
            words = line.split()
            if len(words) == 2 and words[0].isdigit() and words[1].isdigit():
                offsets[words[0]] = int(words[1])
    return offsets


def submissions(project_dir: str) -> list[str]:
    """Every submission folder under the project's scratch folder, oldest first."""
    found = []
    try:
        exps = sorted(os.listdir(project_dir))
    except OSError:
        return []
    for exp in exps:
        exp_dir = os.path.join(project_dir, exp)
        if exp == "hpc_outputs" or exp.startswith(".") or not os.path.isdir(exp_dir):
            continue
        for name in os.listdir(exp_dir):
            sub = os.path.join(exp_dir, name)
            if STAMP.match(name) and os.path.isfile(os.path.join(sub, "job.sbatch")):
                found.append(sub)
    return sorted(found, key=lambda p: (os.path.basename(p)[:15], os.path.getmtime(p)))


def find_submission(project_dir: str, target: str | None) -> Submission:
    """The newest submission of experiment TARGET, the one whose job id is TARGET, or the
    newest of all (TARGET None)."""
    subs = submissions(project_dir)
    if not subs:
        raise UsageError(f"no submissions under {project_dir}")
    if target is None:
        return load_submission(subs[-1])
    job = re.fullmatch(r"(\d+)(?:_\d+)?", target)  # 500, or an array task: 500_3
    if job:
        for sub in reversed(subs):
            if (_read_text(os.path.join(sub, "job_id")) or "").strip() == job.group(1):
                return load_submission(sub)
        for sub in reversed(subs):  # a job that ran it before a newer one (by hand, again)
            if any(str(ran) == job.group(1) for ran, _ in jobs_that_ran(sub)):
                return load_submission(sub)
    of_exp = [s for s in subs if os.path.basename(os.path.dirname(s)) == target]
    if of_exp:
        return load_submission(of_exp[-1])
    exps = sorted({os.path.basename(os.path.dirname(s)) for s in subs})
    raise UsageError(
        f"no experiment or job id {target!r} under {project_dir} (experiments: {', '.join(exps)})"
    )


def jobs_that_ran(path: str) -> list[tuple[int, int]]:
    """(job, task) of every job that started in submission folder ``path``: node/batch.sh
    makes ``runs/<job>_<task>`` (an array task) or ``runs/<job>`` (task 0) at its start."""
    try:
        names = os.listdir(os.path.join(path, "runs"))
    except OSError:
        return []
    offsets = array_offsets(path)  # a later array's task K is trial first + K
    found = (re.fullmatch(r"(\d+)(?:_(\d+))?", name) for name in names)
    return [(int(m[1]), int(m[2] or 0) + offsets.get(m[1], 0)) for m in found if m]


def task_jobs(sub: Submission) -> dict[int, tuple[str | None, dict[str, str] | None]]:
    """{task: (its job, SLURM's fields of that task or None when SLURM forgot it)}. A task's
    job is the folder's ``job_id`` (the newest job that started there), unless that job
    is not known to hold the task and an earlier one ran it: ``sbatch --array=K job.sbatch``
    runs task K again alone, and the other tasks stay their own job's."""
    known: dict[str | None, dict[int, dict[str, str]]] = {}

    def tasks_of(job: str | None) -> dict[int, dict[str, str]]:  # keyed by trial
        if job not in known:
            first = sub.offsets.get(job or "", 0)
            known[job] = {k + first: v for k, v in slurm_tasks(job).items()}
        return known[job]

    newest: dict[int, int] = {}
    for job, task in jobs_that_ran(sub.path):
        newest[task] = max(job, newest.get(task, job))
    out = {}
    for k, record in enumerate(sub.trials):
        index = int(record.get("trial", k))
        job = sub.chunk_job(index)
        if index not in tasks_of(job) and index in newest and str(newest[index]) != job:
            job = str(newest[index])
        out[index] = (job, tasks_of(job).get(index) if sub.array or index == 0 else None)
    return out


# ---------------------------------------------------------------- SLURM and logs


def parse_scontrol(text: str) -> dict[int, dict[str, str]]:
    """``scontrol show job -o`` output -> {task index: fields}; a pending range
    (``ArrayTaskId=2-7%2``, ``4,6-7``) gives one entry per task; a plain job is task 0."""
    tasks: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for word in line.split(" "):
            key, eq, value = word.partition("=")
            if eq and key in SCONTROL_FIELDS + ("ExitCode",):
                fields[key] = value
        if "JobState" not in fields:
            continue
        spec = fields.get("ArrayTaskId")
        if spec is None:
            tasks[0] = fields
            continue
        for part in spec.split("%")[0].split(","):
            low, _, high = part.partition("-")
            if low.isdigit():
                for k in range(int(low), int(high or low) + 1):
                    tasks.setdefault(k, fields)
    return tasks


def parse_sacct(text: str) -> dict[int, dict[str, str]]:
    """``sacct -n -P -D -o JobID,State,ExitCode,Elapsed`` output -> {task index: fields}, in
    ``scontrol``'s names (JobState, ExitCode, RunTime, Restarts). Every run of a requeued task
    is a line of its own (``-D``): the last is its state, the others its restarts. Steps
    (``JOB.batch``, ``JOB.0``) are skipped; a pending range (``5_[2-7%2]``) gives one entry
    per task; a plain job is task 0."""
    tasks: dict[int, dict[str, str]] = {}
    runs: dict[int, int] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 4 or "." in parts[0]:
            continue
        job, _, spec = parts[0].partition("_")
        indices = [0]
        if spec:
            indices = []
            for part in spec.strip("[]").split("%")[0].split(","):
                low, _, high = part.partition("-")
                if low.isdigit():
                    indices += range(int(low), int(high or low) + 1)
        for k in indices:
            runs[k] = runs.get(k, 0) + 1
            tasks[k] = {
                "JobId": job,
                "JobState": parts[1].split(" ")[0],  # "CANCELLED by 0"
                "ExitCode": parts[2],
                "RunTime": parts[3],
                "Restarts": str(runs[k] - 1),
                "Source": "sacct",
            }
    return tasks


def sacct_tasks(job_id: str | None) -> dict[int, dict[str, str]]:
    """One ``sacct`` call for the whole job; {} where accounting is off or does not know it."""
    if not job_id:
        return {}
    text = slurm_output(["sacct", "-n", "-P", "-D", "-j", job_id, "-o", SACCT_FORMAT])
    return parse_sacct(text) if text is not None else {}


SACCT_FORMAT = "JobID,State,ExitCode,Elapsed"


def slurm_output(argv: list[str]) -> str | None:
    """A SLURM command's output; None when it is not installed, failed or took over 30 s."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def slurm_tasks(job_id: str | None) -> dict[int, dict[str, str]]:
    """SLURM's fields of the job's tasks: the controller's while it knows the job (MinJobAge
    after its end), then accounting's; {} when neither knows it."""
    return scontrol_tasks(job_id) or sacct_tasks(job_id)


def scontrol_tasks(job_id: str | None) -> dict[int, dict[str, str]]:
    """One ``scontrol show job -o`` call for the whole job; {} when SLURM forgot it."""
    if not job_id:
        return {}
    text = slurm_output(["scontrol", "show", "job", "-o", job_id])
    return parse_scontrol(text) if text is not None else {}


@dataclass
class LogInfo:
    restart: int = 0
    exit_code: int | None = None
    requeued: bool = False
    started: str | None = None
    ended: str | None = None
    progress: str | None = None
    error: str | None = None
    killed: str | None = None
    out_of_memory: bool = False


def read_log(path: str | None) -> LogInfo | None:
    """What a task's log says about its runs (None: no log yet)."""
    text = _read_text(path) if path else None
    if text is None:
        return None
    info = LogInfo()
    for line in text.splitlines():
        if m := START.match(line):
            info.restart = int(m.group(4))
            info.started, info.ended = m.group(5), None
            info.exit_code, info.requeued, info.error, info.killed = None, False, None, None
            info.out_of_memory = False
        elif m := ENDED.match(line):
            info.exit_code, info.ended = int(m.group(1)), m.group(2)
        elif m := REQUEUED.match(line):
            info.requeued = True
        elif OOM_KILLED.match(line):
            info.out_of_memory = True
        elif m := KILLED.search(line):
            info.killed = "timeout" if m.group(1) == "TIME LIMIT" else "cancelled"
        elif line.startswith("hpc: error: "):
            info.error = line[len("hpc: error: ") :]
        elif m := PROGRESS.match(line):
            info.progress = f"step {m.group(1)}/{m.group(2)} epoch {m.group(3)} loss {m.group(4)}"
    return info


def _seconds(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None


def format_elapsed(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    s = int(seconds)
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


# ---------------------------------------------------------------- metrics


def find_metrics_csv(trial_dir: str, array: bool) -> str | None:
    """metrics.csv in the trial folder or one folder below (the harness: checkpoints/)."""
    return next(iter(metrics_csvs(trial_dir, array)), None)


def metrics_csvs(trial_dir: str, array: bool) -> list[str]:
    """Every metrics.csv in the trial folder or one folder below, the trial folder's first,
    then by folder name: a folder comes before the copies ``--fresh`` moved aside
    (``<folder>.old-<UTC time>``, oldest first)."""
    direct = os.path.join(trial_dir, "metrics.csv")
    found = [direct] if os.path.isfile(direct) else []
    try:
        names = sorted(os.listdir(trial_dir))
    except OSError:
        return found
    for name in names:
        if name == "trials" and not array or STAMP.match(name):
            continue
        candidate = os.path.join(trial_dir, name, "metrics.csv")
        if os.path.isfile(candidate):
            found.append(candidate)
    return found


def read_metrics(
    path: str | None, until: float | None = None
) -> dict[str, list[tuple[int, float]]]:
    """{name: [(step, value), ...]} by step, the last row per (name, step) kept (rows are
    logged again after a resume), in the order names first appear. With ``until`` (a time),
    rows whose ``time`` is later (by more than ROW_CLOCK_SLACK_S) are left out."""
    series: dict[str, dict[int, float]] = {}
    if not path:
        return {}
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            for row in csv.DictReader(fh):
                try:
                    step, value = int(row["step"]), float(row["value"])
                except (KeyError, TypeError, ValueError):
                    continue
                if until is not None and _row_time(row) > until + ROW_CLOCK_SLACK_S:
                    continue
                if row.get("name"):
                    series.setdefault(row["name"], {})[step] = value
    except OSError:
        return {}
    return {name: sorted(points.items()) for name, points in series.items()}


def _row_time(row: dict[str, str]) -> float:
    """A metrics.csv row's ``time`` (seconds since the epoch); -inf without one."""
    try:
        return float(row.get("time") or "-inf")
    except ValueError:
        return -math.inf


def lower_is_better(name: str) -> bool:
    return LOWER_IS_BETTER.search(name) is not None


def final_and_best(points: list[tuple[int, float]], name: str, goal: str | None = None):
    values = [v for _, v in points if not math.isnan(v)]
    if not values:
        return None, None
    minimize = goal == "min" if goal else lower_is_better(name)
    return points[-1][1], (min(values) if minimize else max(values))


# ---------------------------------------------------------------- trials and state


@dataclass
class Trial:
    index: int
    params: dict[str, Any]
    config: tuple
    state: str
    failed: bool
    restarts: int
    metrics: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


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


def trial_state(fields: dict[str, str] | None, log: LogInfo | None) -> tuple[str, bool, int]:
    """(state text, failed?, restarts) from SLURM (when it still knows the task) or the log."""
    restarts = log.restart if log else 0
    if fields:
        restarts = max(restarts, int(fields.get("Restarts", "0") or 0))
        state = fields["JobState"]
        code = fields.get("ExitCode", "0:0").split(":")[0]
        if state == "COMPLETED":
            return "finished", False, restarts
        if state in ACTIVE_STATES:
            return state.lower(), False, restarts
        if state == "FAILED" and log and log.out_of_memory:  # the batch script passed 137 on
            return f"out of memory (exit {code})", True, restarts
        return f"{state.lower().replace('_', ' ')} (exit {code})", True, restarts
    if log is None:
        return "not started", False, 0
    if log.exit_code is not None:
        if log.exit_code == 0:
            return "finished", False, restarts
        if log.out_of_memory:
            return f"out of memory (exit {log.exit_code})", True, restarts
        return f"failed (exit {log.exit_code})", True, restarts
    if log.out_of_memory:
        return "out of memory", True, restarts
    if log.requeued:
        return "requeued", False, restarts
    if log.killed:
        return log.killed, True, restarts
    if log.error:
        return "failed", True, restarts
    return "stopped (no end line in its log)", True, restarts


def with_restarts(state: str, restarts: int) -> str:
    if state == "requeued":
        return f"requeued {max(restarts, 1)}x"
    return f"{state}, requeued {restarts}x" if restarts else state


def wandb_run(trial_dir: str, job_id: str | None) -> str | None:
    """The wandb run task K of a wandb sweep array job ``job_id`` ran: the last line of its
    ``trials/K/wandb_runs.txt`` (run id, exit status, job id) of that job; ``trials/K`` is
    shared by every submission of the experiment, whose runs are not this one's. None for
    any other submission, or before the task ran a run."""
    text = _read_text(os.path.join(trial_dir, "wandb_runs.txt")) or ""
    lines = [line.split() for line in text.splitlines()]
    mine = [fields[0] for fields in lines if len(fields) == 3 and fields[2] == job_id]
    return mine[-1] if mine and job_id else None


def run_fingerprint(run_dir: str) -> dict[str, Any]:
    """The harness's ``run.json`` fingerprint (the run's arguments) in RUN_DIR or one below."""
    for folder in (run_dir, os.path.join(run_dir, "checkpoints")):
        text = _read_text(os.path.join(folder, "run.json"))
        if text:
            try:
                data = json.loads(text)
            except ValueError:
                continue
            if isinstance(data, dict) and isinstance(data.get("fingerprint"), dict):
                return data["fingerprint"]
    return {}


def study_rounds(exp_dir: str, study: str | None) -> dict[int, str]:
    """{round: submission folder} of a method-bayes study's rounds that sbatch accepted: the
    folders of the experiment whose bayes.json names the study (written before sbatch) and
    that hold a job_id (written after it)."""
    rounds: dict[int, str] = {}
    for name in sorted(os.listdir(exp_dir)) if study else []:
        folder = os.path.join(exp_dir, name)
        try:
            info = json.loads(_read_text(os.path.join(folder, "bayes.json")) or "{}")
        except ValueError:
            continue
        queued = (_read_text(os.path.join(folder, "job_id")) or "").strip()
        if STAMP.match(name) and info.get("study") == study and queued:
            rounds[info.get("round")] = folder
    return rounds


def bayes_round_jobs(sub: Submission) -> dict[str, dict[int, tuple[str | None, dict | None]]]:
    """A method-bayes round lists the trials of every round so far (hpc_files/lib/bayes.py);
    the earlier rounds ran as other jobs: {"bayes:round R": task_jobs of that round's
    folder} for the other rounds of the same study."""
    try:
        study = json.loads(_read_text(os.path.join(sub.path, "bayes.json")) or "{}").get("study")
    except ValueError:
        return {}
    return {
        f"bayes:round {r}": task_jobs(load_submission(folder))
        for r, folder in study_rounds(os.path.dirname(sub.path), study).items()
        if folder != sub.path
    }


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


def pruned_at(sub: Submission, index: int, since: float | None) -> str | None:
    """The step a finished trial was pruned at (the sweep's early_terminate), from the
    ``pruned`` file hpc_harness/pruning.py writes in its folder; an earlier run's is ignored."""
    path = os.path.join(sub.trial_dir(index), "pruned")
    text = _read_text(path)
    if not text or (since is not None and os.stat(path).st_mtime < since):
        return None
    return text.split()[0]


def ended_in_exception(metrics: dict[str, list[tuple[int, float]]]) -> bool:
    """The harness's ``failed`` row is its last (a resume that went on after it logs later
    steps); the row is taken out of ``metrics``, it is no metric."""
    failed = metrics.pop("failed", [])
    later = max((step for points in metrics.values() for step, _ in points), default=-1)
    return bool(failed) and failed[-1][0] >= later


def submitted_at(sub: Submission) -> float | None:
    """When the submission was written: its job.sbatch's modification time (None if absent)."""
    try:
        return os.stat(os.path.join(sub.path, "job.sbatch")).st_mtime
    except OSError:
        return None


def own_metrics(
    sub: Submission, index: int, since: float | None, finished: bool, until: float | None
) -> dict[str, list[tuple[int, float]]]:
    """Task ``index``'s metrics (read_metrics), the rows this submission's run wrote. Every
    submission of an experiment shares trials/K (the folder resumes across submissions): a
    file last written before this submission (``since``) holds an earlier run's rows, shown
    only once this task finished (a run resumed at its end writes nothing again). Rows written
    after the task ended (``until``, ended_at) are a later run's, resuming here; when none is
    left, a later run's ``--fresh`` moved this one's folder aside: the newest copy aside
    that would count (written since this submission, or this task finished) is read instead."""
    paths = metrics_csvs(sub.trial_dir(index), sub.array)
    if paths and claimed_by_earlier_job(sub, index, os.path.dirname(paths[0])):
        return {}

    def counts(path: str) -> bool:
        try:
            return finished or since is None or os.stat(path).st_mtime >= since
        except OSError:
            return False

    if not paths or not counts(paths[0]):
        return {}
    series = read_metrics(paths[0], until)
    if series or until is None:
        return series
    folder = os.path.dirname(paths[0])
    for aside in reversed(paths[1:]):
        if os.path.dirname(aside).startswith(folder + ".old-") and counts(aside):
            if series := read_metrics(aside, until):
                return series
    return {}


def task_slurm_ids(sub: Submission, index: int) -> set[int]:
    """The SLURM job ids task ``index`` of this submission ran as (every job of the folder,
    requeues and 'sbatch job.sbatch' again): batch.sh's ``runs/<job key>/slurm_job_id``."""
    pattern = f"*_{index}" if sub.array else "*"
    ids = set()
    for path in glob.glob(os.path.join(glob.escape(sub.path), "runs", pattern, "slurm_job_id")):
        text = (_read_text(path) or "").strip()
        if text.isdigit():
            ids.add(int(text))
    return ids


def claimed_by_earlier_job(sub: Submission, index: int, folder: str) -> bool:
    """The harness's ``run.json`` in ``folder`` names a job older than every job this task
    ran as: an earlier submission's run still holds the folder, and this task's run never
    claimed it (it failed first, e.g. refusing another run's checkpoint); its rows are not
    this submission's. A later job there is a run resuming after this one (own_metrics)."""
    text = _read_text(os.path.join(folder, "run.json"))
    mine = task_slurm_ids(sub, index)
    if not text or not mine:
        return False
    try:
        claimed = json.loads(text).get("slurm_job_id")
    except (ValueError, AttributeError):
        return False
    return str(claimed).isdigit() and int(claimed) < min(mine)


def ended_at(log_path: str | None, log: LogInfo | None, state: str) -> float | None:
    """When an ended task's run stopped writing: its log's last write (the file server's
    clock), or the end its log names (the node's, as the rows' times) if later. None while it
    may still write (a state in ACTIVE_STATES, SLURM's or trial_state's) or without its log."""
    if log_path is None or log is None or state.split(" ")[0].upper() in ACTIVE_STATES:
        return None
    try:
        written = os.stat(log_path).st_mtime
    except OSError:
        return None
    return max(written, _seconds(log.ended) or written)


# ---------------------------------------------------------------- tables


def render_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header] + rows]
    return "\n".join(lines) + "\n"


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"


def sweep_metric(path: str) -> tuple[str | None, str | None]:
    """(metric name, 'max'|'min') from a wandb sweep file's ``metric:``."""
    text = _read_text(path)
    if text is None:
        return None, None
    try:
        import yaml

        spec = yaml.safe_load(text)
        metric = spec.get("metric") if isinstance(spec, dict) else None
    except ImportError:
        block = re.search(r"^metric:\s*\n((?:[ \t]+.*\n?)+)", text, re.MULTILINE)
        metric = {}
        for key in ("name", "goal"):
            m = re.search(
                rf"^\s+{key}:\s*['\"]?([^'\"\s#]+)", block.group(1) if block else "", re.M
            )
            if m:
                metric[key] = m.group(1)
    except Exception:  # a broken sweep file only loses the default sort
        return None, None
    if not isinstance(metric, dict) or not metric.get("name"):
        return None, None
    goal = str(metric.get("goal", "minimize"))  # W&B's default, and trials.py's
    return str(metric["name"]), ("min" if goal.startswith("min") else "max")


def param_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


@dataclass
class Row:
    trials: list[Trial]
    values: dict[str, tuple[list[float], list[float]]]  # metric -> (finals, bests)

    def mean(self, metric: str, which: int = 0) -> float | None:
        vals = self.values.get(metric, ([], []))[which]
        return statistics.fmean(vals) if vals else None


def build_rows(trials: list[Trial], metric_names: list[str], group: bool, goals: dict) -> list[Row]:
    buckets: dict[tuple, list[Trial]] = {}
    for t in trials:
        key = t.config if group else (t.index,)
        buckets.setdefault(key, []).append(t)
    rows = []
    for members in buckets.values():
        counted = [t for t in members if not t.failed] or members
        values = {}
        for name in metric_names:
            finals, bests = [], []
            for t in counted:
                final, best = final_and_best(t.metrics.get(name, []), name, goals.get(name))
                if final is not None:
                    finals.append(final)
                    bests.append(best)
            values[name] = (finals, bests)
        rows.append(Row(members, values))
    return rows


def state_summary(members: list[Trial]) -> str:
    if len(members) == 1:
        return with_restarts(members[0].state, members[0].restarts)
    counts: dict[str, int] = {}
    for t in members:
        counts[t.state] = counts.get(t.state, 0) + 1
    text = ", ".join(s if n == len(members) else f"{n} {s}" for s, n in counts.items())
    requeues = sum(t.restarts for t in members)
    return f"{text}, requeued {requeues}x" if requeues else text


def cell(vals: list[float], grouped: bool) -> str:
    if not vals:
        return "-"
    if not grouped:
        return fmt(vals[0])
    if len(vals) == 1:
        return fmt(vals[0])
    return f"{fmt(statistics.fmean(vals))} ± {fmt(statistics.stdev(vals))}"


def results_table(
    trials: list[Trial],
    sort: tuple[str, str] | None,
    group: bool,
    metric_names: list[str],
) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """(header, rows as shown, rows for the CSV) sorted by the sort metric's final value
    (mean over a row's trials that did not fail); rows whose every trial failed go last."""
    goals = {sort[0]: sort[1]} if sort else {}
    rows = build_rows(trials, metric_names, group, goals)
    if sort:
        sign = -1 if sort[1] == "max" else 1

        def key(row: Row) -> tuple:
            mean = row.mean(sort[0])
            all_failed = all(t.failed for t in row.trials)
            value = sign * mean if mean is not None else 0
            return (all_failed, mean is None, value, row.trials[0].index)

        rows.sort(key=key)
    param_names: list[str] = []
    for t in trials:
        param_names += [k for k in t.params if k not in param_names and not (group and k == "seed")]
    grouped = group and any(len(r.trials) > 1 for r in rows)
    # A parameter and a metric of one name (--lr and a logged lr) get prefixed columns.
    clash = set(param_names) & set(metric_names)
    shown_params = [f"param.{k}" if k in clash else k for k in param_names]
    header = ["trial" + ("s" if grouped else "")] + shown_params + (["n"] if grouped else [])
    header.append("state")
    csv_header = list(header)
    for name in metric_names:
        label = f"metric.{name}" if name in clash else name
        header += [label, f"best {label}"]
        csv_header += [label, f"{label}_std", f"best {label}", f"best {label}_std"]
    shown, plain = [], []
    for row in rows:
        first = row.trials[0]
        ids = ",".join(str(t.index) for t in row.trials)
        params = [param_text(first.params.get(k, "")) for k in param_names]
        head = [ids] + params
        if grouped:
            n = len(row.values[sort[0]][0]) if sort and sort[0] in row.values else len(row.trials)
            head.append(str(n))
        head.append(state_summary(row.trials))
        line, cline = list(head), list(head)
        for name in metric_names:
            finals, bests = row.values[name]
            line += [cell(finals, grouped), cell(bests, grouped)]
            for vals in (finals, bests):
                cline.append(repr(statistics.fmean(vals)) if vals else "")
                cline.append(repr(statistics.stdev(vals)) if len(vals) > 1 else "")
        shown.append(line)
        plain.append(cline)
    return header, shown, [csv_header] + plain


def plot_points(
    trials: list[Trial], metric: str, goal: str
) -> tuple[list[str], list[tuple[Trial, float]]]:
    """(panels, points) of --plot: a panel per parameter that takes more than one value
    (else one panel, ``trial``), and (trial, final value of metric) for every finished
    trial that reported it: a running one's value is not final, a failed one's not a result."""
    names: list[str] = []
    for t in trials:
        names += [k for k in t.params if k not in names and k != "seed"]
    names = [k for k in names if len({param_text(t.params.get(k, "")) for t in trials}) > 1]
    points = []
    for t in trials:
        final, _ = final_and_best(t.metrics.get(metric, []), metric, goal)
        if final is not None and t.state == "finished":
            points.append((t, final))
    return names or ["trial"], points


def plot_results(trials: list[Trial], metric: str, goal: str, out: str) -> None:
    """One panel per varying parameter (plot_points): the metric's final value of every
    finished trial, with the mean per value."""
    names, points = plot_points(trials, metric, goal)
    fig, axes = panels(len(names), 3, 4.2)
    for ax, name in zip(axes.flat, names):
        xs = [t.index if name == "trial" else t.params.get(name) for t, _ in points]
        ys = [v for _, v in points]
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
        if not numeric:
            labels = sorted({str(x) for x in xs})
            xs = [labels.index(str(x)) for x in xs]
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=30, ha="right")
        ax.scatter(xs, ys, alpha=0.6)
        by_x: dict[Any, list[float]] = {}
        for x, y in zip(xs, ys):
            by_x.setdefault(x, []).append(y)
        mx = sorted(by_x)
        ax.plot(mx, [statistics.fmean(by_x[x]) for x in mx], color="C1", marker="_")
        if numeric and len(mx) >= 2 and min(mx) > 0 and max(mx) / min(mx) >= 100:
            ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel(f"{metric} ({goal})")
        ax.grid(alpha=0.3)
    save_panels(fig, axes, len(names), out, "--plot")


def panels(count: int, per_row: int, width: float) -> tuple[Any, Any]:
    """A figure of COUNT panels, PER_ROW a row, each WIDTH inches wide (Agg: no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(per_row, count)
    rows = math.ceil(count / cols)
    return plt.subplots(rows, cols, figsize=(width * cols, 3.2 * rows), squeeze=False)


def save_panels(fig: Any, axes: Any, used: int, out: str, option: str) -> None:
    """Blank the panels past USED and write the PNG OUT (exit 1 naming OPTION if it cannot)."""
    import matplotlib.pyplot as plt

    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=100)
    except OSError as exc:
        raise RuntimeFailure(f"{option}: cannot write {out!r}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def run_metrics_csv(path: str) -> str:
    """--run's metrics file: PATH itself, or metrics.csv in the run folder PATH or one below
    (the harness writes ``checkpoints/metrics.csv``)."""
    found = path if os.path.isfile(path) else find_metrics_csv(path, array=False)
    if not found:
        raise UsageError(f"--run: no metrics.csv at {path!r} or one folder below")
    return found


def trial_label(t: Trial) -> str:
    params = ", ".join(f"{k}={param_text(v)}" for k, v in t.params.items())
    label = f"trial {t.index} ({params})" if params else f"trial {t.index}"
    return f"{label}, failed" if t.failed else label


def plot_curves(trials: list[Trial], names: list[str], out: str) -> dict[str, list[str]]:
    """One panel per metric in NAMES, its value against global step, one line per trial
    that logged it (a failed trial's dashed); a legend names the trials when there are
    several (in the first panel). Returns {metric: labels of its lines}, what was drawn."""
    fig, axes = panels(len(names), 2, 5)
    drawn: dict[str, list[str]] = {}
    legend_drawn = False
    for ax, name in zip(axes.flat, names):
        drawn[name] = []
        for t in trials:
            points = t.metrics.get(name)
            if not points:
                continue
            steps, values = zip(*points)
            label = trial_label(t)
            style = "--" if t.failed else "-"
            ax.plot(steps, values, style, marker="." if len(steps) < 50 else None, label=label)
            drawn[name].append(label)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(trials) > 1 and drawn[name] and not legend_drawn:  # once: same lines in each
            ax.legend(fontsize="x-small")
            legend_drawn = True
    save_panels(fig, axes, len(names), out, "--curves")
    return drawn


# ---------------------------------------------------------------- commands


def status_text(sub: Submission, project: str) -> str:
    jobs = task_jobs(sub)
    submitted = submitted_at(sub)
    rows = []
    for k, record in enumerate(sub.trials):
        index = int(record.get("trial", k))
        job, fields = jobs[index]
        log_path = sub.log_path(project, index, job)
        log = read_log(log_path)
        restarts = log.restart if log else 0
        if fields:
            state = fields["JobState"]
            restarts = max(restarts, int(fields.get("Restarts", "0") or 0))
            # Killed by the cgroup's memory limit: SLURM's state, or the batch script ended
            # FAILED with the step's code (137) and the log has slurmstepd's line.
            if state == "OUT_OF_MEMORY" or (state == "FAILED" and log and log.out_of_memory):
                state = "out of memory"
            if state not in ("PENDING", "RUNNING", "COMPLETED"):
                state += f" (exit {fields.get('ExitCode', '?').split(':')[0]})"
            elapsed = fields.get("RunTime", "-")
        else:
            state, _, restarts = trial_state(None, log)
            start = _seconds(log.started) if log else None
            end = _seconds(log.ended) if log and log.ended else None
            if log and not log.ended:  # SLURM forgot it and the log has no end: unknown
                start = None
            elapsed = format_elapsed(end - start if start and end else None)
        finished = state in ("COMPLETED", "finished")
        until = ended_at(log_path, log, state)
        if finished and (step := pruned_at(sub, index, submitted)):
            state = f"PRUNED at step {step}"
        progress = (
            (log.progress if log else None)
            or last_metrics_progress(sub, index, submitted, finished, until)
            or "-"
        )
        rows.append([str(index), state, str(restarts), elapsed, progress])
    sources = {fields.get("Source", "SLURM") for _, fields in jobs.values() if fields}
    where = " and ".join(sorted(sources)) if sources else "logs"
    earlier = sorted(
        {j for j, _ in jobs.values() if j and j != sub.job_id} - set(sub.chunks), key=int
    )
    also = f" (tasks it did not run: job {', '.join(earlier)})" if earlier else ""
    if len(sub.chunks) > 1:  # a sweep above MaxArraySize, as several arrays
        also = f" and {', '.join(j for j in sub.chunks if j != sub.job_id)} (arrays){also}"
    head = (
        f"{sub.exp}  {sub.path}\njob {sub.job_id or '(not submitted)'}{also}, "
        f"{len(sub.trials)} task(s); states from {where}\n"
    )
    return head + render_table(["task", "state", "restarts", "elapsed", "progress"], rows)


def last_metrics_progress(
    sub: Submission, index: int, since: float | None, finished: bool, until: float | None
) -> str | None:
    series = own_metrics(sub, index, since, finished, until)
    if not series:
        return None
    step = max(points[-1][0] for points in series.values())
    parts = [f"step {step}"]
    for name, points in series.items():
        if points[-1][0] == step:
            parts.append(f"{name} {fmt(points[-1][1])}")
    return " ".join(parts)


class Parser:
    """A small option parser: ``--opt value``, ``--opt=value``, errors as one line."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self.i = 0

    def __iter__(self):
        return self

    def __next__(self) -> tuple[str, str | None]:
        if self.i >= len(self.argv):
            raise StopIteration
        word = self.argv[self.i]
        self.i += 1
        if word == "--":
            rest = self.argv[self.i :]
            self.i = len(self.argv)
            if len(rest) > 1:
                raise UsageError(f"unexpected argument {rest[1]!r}")
            return ("", rest[0]) if rest else ("--", None)
        if word.startswith("--") and "=" in word:
            name, _, value = word.partition("=")
            return name, value
        if word.startswith("-") and word != "-":
            return word, None
        return "", word

    def value(self, name: str, inline: str | None) -> str:
        if inline is not None:
            return inline
        if self.i >= len(self.argv):
            raise UsageError(f"{name} expects a value")
        self.i += 1
        return self.argv[self.i - 1]

    def target(self, name: str, inline: str | None, target: str | None) -> str | None:
        """The one positional word (EXP or JOBID), given as NAME/INLINE by the loop;
        a second one, or an option the caller did not take, is an error."""
        if name == "" and target is None and inline is not None:
            return inline
        if name not in ("", "--"):
            raise UsageError(f"unknown option {name!r} (see --help)")
        if inline is not None:
            raise UsageError(f"unexpected argument {inline!r}")
        return target

    def optional_value(self, inline: str | None) -> str | None:
        if inline is not None:
            return inline
        if self.i < len(self.argv) and re.fullmatch(r"\d+(\.\d+)?", self.argv[self.i]):
            self.i += 1
            return self.argv[self.i - 1]
        return None


def _project_dir(project: str | None) -> tuple[str, str]:
    scratch = os.environ.get("SCRATCH", "")
    if not scratch:
        raise UsageError("SCRATCH is not set (the folder job_submitter.sh writes under)")
    if not project:
        raise UsageError("--project expects a name")
    return project, os.path.join(scratch, project)


def cmd_status(argv: Sequence[str], prog: str) -> int:
    project = target = None
    watch: float | None = None
    p = Parser(argv)
    for name, inline in p:
        if name == "--project":
            project = p.value(name, inline)
        elif name == "--watch":
            text = p.optional_value(inline) or "5"
            try:
                watch = float(text)
            except ValueError:
                watch = -1
            if not watch > 0:
                raise UsageError(f"--watch expects seconds > 0, got {text!r}")
        else:
            target = p.target(name, inline, target)
    project, project_dir = _project_dir(project)
    if watch is not None and not sys.stdout.isatty():
        raise UsageError("--watch redraws a terminal; stdout is not one (drop --watch)")
    while True:
        sub = find_submission(project_dir, target)
        text = status_text(sub, project)
        if watch is None:
            sys.stdout.write(text)
            return 0
        stamp = time.strftime("%H:%M:%S")
        sys.stdout.write(f"\033[H\033[2J{text}\n(every {watch:g} s, {stamp}; Ctrl-C ends)\n")
        sys.stdout.flush()
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            return 0


def parse_sort(text: str) -> tuple[str, str | None]:
    name, colon, goal = text.rpartition(":")
    if not colon or goal not in ("max", "min"):
        return text, None
    if not name:
        raise UsageError(f"--sort expects METRIC or METRIC:max|min, got {text!r}")
    return name, goal


def chosen_metrics(logged: list[str], metrics_filter: list[str] | None) -> list[str]:
    """--metrics A,B (each one logged by some trial), else every logged metric."""
    if metrics_filter is None:
        return logged
    unknown = [m for m in metrics_filter if m not in logged]
    if unknown:
        raise UsageError(
            f"--metrics: no trial logged {unknown[0]!r} (logged: {', '.join(logged) or '-'})"
        )
    return metrics_filter


def cmd_run_curves(run_path: str, curves_out: str | None, metrics_filter: list[str] | None) -> int:
    """--run: one run's curves, outside SLURM (no submission, no SCRATCH)."""
    if curves_out is None:
        raise UsageError("--run draws one run's curves: give --curves FILE.png too")
    csv_path = run_metrics_csv(run_path)
    run = Trial(0, {}, (), "", False, 0, read_metrics(csv_path))
    if not run.metrics:
        raise UsageError(f"--run: no metrics rows in {csv_path!r}")
    names = chosen_metrics(list(run.metrics), metrics_filter) or list(run.metrics)
    plot_curves([run], names, curves_out)
    sys.stdout.write(f"wrote {curves_out}\n")
    return 0


def cmd_results(argv: Sequence[str], prog: str) -> int:
    project = target = csv_out = plot_out = curves_out = run_path = None
    sort_text: str | None = None
    metrics_filter: list[str] | None = None
    group = True
    table_options: list[str] = []  # given options that only an experiment's table takes
    p = Parser(argv)
    for name, inline in p:
        if name == "--project":
            project = p.value(name, inline)
        elif name in ("-s", "--sort"):
            sort_text = p.value(name, inline)
            if not sort_text:
                raise UsageError("--sort expects METRIC or METRIC:max|min, got ''")
            table_options.append(name)
        elif name == "--no-group":
            group = False
            table_options.append(name)
        elif name in ("-m", "--metrics"):
            metrics_filter = [m for m in p.value(name, inline).split(",") if m]
        elif name == "--csv":
            csv_out = p.value(name, inline)
            table_options.append(name)
        elif name == "--plot":
            plot_out = p.value(name, inline)
            table_options.append(name)
        elif name == "--curves":
            curves_out = p.value(name, inline)
        elif name == "--run":
            run_path = p.value(name, inline)
        else:
            target = p.target(name, inline, target)
    for opt, path in (("--csv", csv_out), ("--plot", plot_out), ("--curves", curves_out)):
        if path == "":
            raise UsageError(f"{opt} expects a file name, got ''")
        if opt != "--csv" and path and os.path.splitext(path)[1].lower() not in IMAGE_TYPES:
            raise UsageError(f"{opt} expects a .png, .pdf, .svg or .jpg file, got {path!r}")
    if run_path is not None:
        if run_path == "":
            raise UsageError("--run expects a run folder or its metrics.csv, got ''")
        if target is not None:
            raise UsageError(f"give EXP ({target!r}) or --run, not both")
        if table_options:
            raise UsageError(f"{table_options[0]} is for an experiment's table, not --run")
        return cmd_run_curves(run_path, curves_out, metrics_filter)
    if target is None:
        raise UsageError("give the experiment (or job id) to show: results.sh EXP")
    project, project_dir = _project_dir(project)
    sub = find_submission(project_dir, target)
    trials = collect(sub, project)
    logged: list[str] = []
    for t in trials:
        logged += [m for m in t.metrics if m not in logged]
    sort: tuple[str, str] | None = None
    if sort_text is not None:
        name, goal = parse_sort(sort_text)
        if name not in logged:
            raise UsageError(
                f"--sort: no trial logged {name!r} (logged: {', '.join(logged) or 'nothing'})"
            )
        sort = (name, goal or ("min" if lower_is_better(name) else "max"))
    else:
        name, goal = sweep_metric(os.path.join(sub.path, "sweep.yml"))
        if name and name in logged:
            sort = (name, goal or "max")
        else:
            if name:
                sys.stderr.write(
                    f"{prog}: note: the sweep's metric {name!r} was not logged; "
                    "sorting by the first metric\n"
                )
            first = next((m for m in metrics_filter or [] if m in logged), None)
            first = first or (logged[0] if logged else None)
            if first:
                sort = (first, "min" if lower_is_better(first) else "max")
    shown_metrics = chosen_metrics(logged, metrics_filter)
    if metrics_filter is not None and sort and sort[0] not in shown_metrics:
        shown_metrics = [sort[0]] + shown_metrics
    for opt, path in (("--plot", plot_out), ("--curves", curves_out)):
        if path and not logged:
            raise UsageError(f"{opt}: no trial logged a metric yet")
    header, rows, csv_rows = results_table(trials, sort, group, shown_metrics)
    where = f"sorted by {sort[0]} ({sort[1]})" if sort else "no metrics logged yet"
    sys.stdout.write(f"{sub.exp}  {sub.path}\n{len(trials)} trial(s); {where}\n")
    sys.stdout.write(render_table(header, rows))
    if csv_out:
        try:
            with open(csv_out, "w", newline="", encoding="utf-8") as fh:
                csv.writer(fh, lineterminator="\n").writerows(csv_rows)
        except OSError as exc:
            raise RuntimeFailure(f"--csv: cannot write {csv_out!r}: {exc.strerror}") from None
        sys.stdout.write(f"wrote {csv_out}\n")
    if plot_out and sort:
        plot_results(trials, sort[0], sort[1], plot_out)
        sys.stdout.write(f"wrote {plot_out}\n")
    if curves_out:
        plot_curves(trials, shown_metrics, curves_out)
        sys.stdout.write(f"wrote {curves_out}\n")
    return 0


def cmd_failed(argv: Sequence[str]) -> int:
    """``failed --project NAME EXP``, for job_submitter.sh --retry-failed: the newest
    submission of EXP on the first line, then the trials to rerun, one a line: those that
    ended failed (a failed exit, cancelled, timed out), not those that finished, were pruned
    or are still queued or running."""
    project = target = None
    p = Parser(argv)
    for name, inline in p:
        if name == "--project":
            project = p.value(name, inline)
        else:
            target = p.target(name, inline, target)
    project, project_dir = _project_dir(project)
    if target is None or re.fullmatch(r"\d+(_\d+)?", target):
        raise UsageError("--retry-failed expects an experiment name")
    sub = find_submission(project_dir, target)
    failed = [t.index for t in collect(sub, project) if t.failed and "pruned" not in t.state]
    sys.stdout.write("".join(f"{line}\n" for line in [sub.path, *failed]))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else ""
    prog = os.environ.get("HPC_PROG", f"{command}.sh")
    before_end = args[: args.index("--")] if "--" in args else args
    if command in USAGE and ("-h" in before_end or "--help" in before_end):
        project = args[1] if args[:1] == ["--project"] and len(args) > 1 else "<project>"
        sys.stdout.write(USAGE[command].format(project=project))
        return 0
    try:
        if command == "status":
            return cmd_status(args, prog)
        if command == "results":
            return cmd_results(args, prog)
        if command == "failed":
            return cmd_failed(args)
        raise UsageError(f"expected 'status', 'results' or 'failed', got {command!r}")
    except UsageError as exc:
        sys.stderr.write(f"{prog}: error: {' '.join(str(exc).splitlines())}\n")
        return 2
    except RuntimeFailure as exc:
        sys.stderr.write(f"{prog}: error: {' '.join(str(exc).splitlines())}\n")
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
