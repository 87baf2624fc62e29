"""What SLURM says about a job's tasks: ``scontrol show job -o`` while the controller knows
the job, else ``sacct`` where accounting keeps it (off on many small clusters: then the
logs tell, logs.py). Fields are scontrol's names, by task index."""

from __future__ import annotations

import shutil
import subprocess

# SLURM states of a task that may still write its metrics.csv.
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING")

SCONTROL_FIELDS = ("JobId", "ArrayJobId", "ArrayTaskId", "JobState", "Restarts", "RunTime")

SACCT_FORMAT = "JobID,State,ExitCode,Elapsed"


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
