"""The harness's metrics.csv (long format: time, step, epoch, name, value), the one reader
of it: in a trial's results folder or one folder below (``checkpoints/`` by default), and
which of its rows a submission's task wrote. Standard library only, so it runs where
hpc_harness and torch are not installed."""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import re

from hpc_tools.submissions import STAMP, Submission, read_text

# A row's time is the node's clock, the log's last write the file server's (NTP keeps them
# within milliseconds): how far apart they may be before a row counts as written after the
# task ended. A later job's first row comes seconds after its start, at the earliest.
ROW_CLOCK_SLACK_S = 2.0

LOWER_IS_BETTER = re.compile(r"loss|err|perplex|mse|mae|rmse|time|regret", re.IGNORECASE)


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


def claimed_by_earlier_job(sub: Submission, index: int, folder: str) -> bool:
    """The harness's ``run.json`` in ``folder`` names a job older than every job this task
    ran as: an earlier submission's run still holds the folder, and this task's run never
    claimed it (it failed first, e.g. refusing another run's checkpoint); its rows are not
    this submission's. A later job there is a run resuming after this one (own_metrics)."""
    text = read_text(os.path.join(folder, "run.json"))
    mine = task_slurm_ids(sub, index)
    if not text or not mine:
        return False
    try:
        claimed = json.loads(text).get("slurm_job_id")
    except (ValueError, AttributeError):
        return False
    return str(claimed).isdigit() and int(claimed) < min(mine)


def task_slurm_ids(sub: Submission, index: int) -> set[int]:
    """The SLURM job ids task ``index`` of this submission ran as (every job of the folder,
    requeues and 'sbatch job.sbatch' again): batch.sh's ``runs/<job key>/slurm_job_id``."""
    pattern = f"*_{index}" if sub.array else "*"
    ids = set()
    for path in glob.glob(os.path.join(glob.escape(sub.path), "runs", pattern, "slurm_job_id")):
        text = (read_text(path) or "").strip()
        if text.isdigit():
            ids.add(int(text))
    return ids


def ended_in_exception(metrics: dict[str, list[tuple[int, float]]]) -> bool:
    """The harness's ``failed`` row is its last (a resume that went on after it logs later
    steps); the row is taken out of ``metrics``, it is no metric."""
    failed = metrics.pop("failed", [])
    later = max((step for points in metrics.values() for step, _ in points), default=-1)
    return bool(failed) and failed[-1][0] >= later


def pruned_at(sub: Submission, index: int, since: float | None) -> str | None:
    """The step a finished trial was pruned at (the sweep's early_terminate), from the
    ``pruned`` file hpc_harness/pruning.py writes in its folder; an earlier run's is ignored."""
    path = os.path.join(sub.trial_dir(index), "pruned")
    text = read_text(path)
    if not text or (since is not None and os.stat(path).st_mtime < since):
        return None
    return text.split()[0]


def submitted_at(sub: Submission) -> float | None:
    """When the submission was written: its job.sbatch's modification time (None if absent)."""
    try:
        return os.stat(os.path.join(sub.path, "job.sbatch")).st_mtime
    except OSError:
        return None
