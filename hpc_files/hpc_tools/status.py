"""status.sh: one row per task of a submission, its state, restarts, elapsed time and last
progress line, from SLURM (slurm.py) while it knows the job, else the task's log."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from hpc_tools.cli import Parser, project_folder
from hpc_tools.errors import ToolError
from hpc_tools.logs import ended_at, format_elapsed, log_time, read_log, trial_state
from hpc_tools.metrics import own_metrics, pruned_at, submitted_at
from hpc_tools.submissions import Submission, find_submission, task_jobs
from hpc_tools.tables import fmt, render_table

# status.sh's help, beside the parser it describes ({project}: the default project, the
# --project that run_results_py passes first).
USAGE = """\
usage: status.sh [EXP | JOBID] [--watch [SECONDS]] [--project NAME]

One row per task of the newest submission (of experiment EXP, or the one whose
job id is JOBID or JOBID_TASK; default: the newest under $SCRATCH/{project}/ across
experiments): task, state (SLURM's while it knows the job, else from the log:
finished, failed (exit N), requeued), restarts, elapsed, peak memory (the
largest step's, from sacct where the cluster keeps accounting), last progress
line (the harness's 'step S/T epoch E loss L', else the last metrics.csv row).

  --watch [SECONDS]  clear and redraw every SECONDS (default 5) until Ctrl-C;
                     (a number after --watch is SECONDS: give a JOBID first);
                     stdout must be a terminal
  --project NAME     the project folder under $SCRATCH (default: {project},
                     the folder holding hpc_files/)
  -h, --help         show this help
"""


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
                raise ToolError(f"--watch expects seconds > 0, got {text!r}")
        else:
            target = p.target(name, inline, target)
    project, project_dir = project_folder(project)
    if watch is not None and not sys.stdout.isatty():
        raise ToolError("--watch redraws a terminal; stdout is not one (drop --watch)")
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
            start = log_time(log.started) if log else None
            end = log_time(log.ended) if log and log.ended else None
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
        peak = format_memory(fields.get("PeakRSS") if fields else None)
        rows.append([str(index), state, str(restarts), elapsed, peak, progress])
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
    return head + render_table(
        ["task", "state", "restarts", "elapsed", "peak mem", "progress"], rows
    )


def format_memory(text: str | None) -> str:
    """Bytes as sacct's units show them (``512K``, ``38M``, ``1.2G``); "-" when unknown."""
    if not text:
        return "-"
    size, unit = float(text), ""
    for bigger in ("K", "M", "G", "T"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{size:.0f}{unit}" if size >= 10 or not unit else f"{size:.1f}{unit}"


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
