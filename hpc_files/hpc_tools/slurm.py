"""What SLURM says about a job's tasks: ``scontrol show job -o`` while the controller knows
the job, else ``sacct`` where accounting keeps it (off on many small clusters: then the
logs tell, logs.py). Fields are scontrol's names, by task index."""

from __future__ import annotations

import shutil
import subprocess

# SLURM states of a task that may still write its metrics.csv.
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING")

SCONTROL_FIELDS = ("JobId", "ArrayJobId", "ArrayTaskId", "JobState", "Restarts", "RunTime")

SACCT_FORMAT = "JobID,State,ExitCode,Elapsed,MaxRSS"


def slurm_tasks(job_id: str | None) -> dict[int, dict[str, str]]:
    """SLURM's fields of the job's tasks: the controller's while it knows the job (MinJobAge
    after its end), then accounting's; {} when neither knows it. Accounting's peak memory
    (PeakRSS) joins the controller's fields: only accounting keeps it."""
    known = scontrol_tasks(job_id)
    accounted = sacct_tasks(job_id)
    if not known:
        return accounted
    for k, fields in accounted.items():
        if k in known and "PeakRSS" in fields:
            known[k] = {**known[k], "PeakRSS": fields["PeakRSS"]}
    return known


def scontrol_tasks(job_id: str | None) -> dict[int, dict[str, str]]:
    """One ``scontrol show job -o`` call for the whole job; {} when SLURM forgot it."""
    if not job_id:
        return {}
    text = slurm_output(["scontrol", "show", "job", "-o", job_id])
    return parse_scontrol(text) if text is not None else {}


def sacct_tasks(job_id: str | None) -> dict[int, dict[str, str]]:
    """One ``sacct`` call for the whole job; {} where accounting is off or does not know it."""
    if not job_id:
        return {}
    text = slurm_output(["sacct", "-n", "-P", "-D", "-j", job_id, "-o", SACCT_FORMAT])
    return parse_sacct(text) if text is not None else {}


def slurm_output(argv: list[str]) -> str | None:
    """A SLURM command's output; None when it is not installed, failed or took over 30 s."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


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
    """``sacct -n -P -D -o JobID,State,ExitCode,Elapsed,MaxRSS`` output -> {task index:
    fields}, in ``scontrol``'s names (JobState, ExitCode, RunTime, Restarts) and PeakRSS
    (bytes: the largest MaxRSS of the last run's steps). Every run of a requeued task is a
    line of its own (``-D``), followed by its steps (``JOB.batch``, ``JOB.0``): the last run
    is its state, the others its restarts. A pending range (``5_[2-7%2]``) gives one entry
    per task; a plain job is task 0."""
    tasks: dict[int, dict[str, str]] = {}
    runs: dict[int, int] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 4:
            continue
        name, dot, _ = parts[0].partition(".")
        job, _, spec = name.partition("_")
        indices = [0]
        if spec:
            indices = []
            for part in spec.strip("[]").split("%")[0].split(","):
                low, _, high = part.partition("-")
                if low.isdigit():
                    indices += range(int(low), int(high or low) + 1)
        if dot:  # a step of the task's run above it
            rss = memory_bytes(parts[4] if len(parts) > 4 else "")
            for k in indices:
                if k in tasks and rss is not None:
                    tasks[k]["PeakRSS"] = str(max(rss, int(tasks[k].get("PeakRSS", "0"))))
            continue
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


def memory_bytes(text: str) -> int | None:
    """sacct's memory (``1234K``, ``56M``, ``0``) in bytes; None when empty or unreadable."""
    text = text.strip()
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    unit = text[-1:].upper() if text[-1:].isalpha() else ""
    if unit not in units:
        return None
    try:
        return int(float(text[: len(text) - len(unit)]) * units[unit])
    except ValueError:
        return None
