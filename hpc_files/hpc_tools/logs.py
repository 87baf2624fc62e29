"""A task's log, as the batch script and the harness write it: every run appends ``hpc: job
KEY (trial K) on NODES, restart N, started DATE`` and ends with ``hpc: training step ended
with exit code N at DATE`` or ``hpc: requeued KEY (restart N ...)``; the harness prints
``hpc_harness: step S/T epoch E loss L ...``. The log of a plain job is
``$SCRATCH/<project>/hpc_outputs/<project>_<exp>_<id>.out``, of array task K
``..._<arrayid>_K.out``."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from hpc_tools.slurm import ACTIVE_STATES
from hpc_tools.submissions import read_text

START = re.compile(r"^hpc: job (\S+) \(trial (\d+)\) on (\S+), restart (\d+), started (.+)$")

ENDED = re.compile(r"^hpc: training step ended with exit code (\d+) at (.+)$")

REQUEUED = re.compile(r"^hpc: requeued (\S+) \(restart (\d+)")

KILLED = re.compile(r"\*\*\* JOB \S+ ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))? \*\*\*")

# slurmstepd's line when the cgroup's memory limit killed a task of a step.
OOM_KILLED = re.compile(r"^slurmstepd\S*: error: Detected \d+ oom[_-]kill event")

PROGRESS = re.compile(r"^hpc_harness: step (\d+)/(\d+) epoch (\d+) loss (\S+)")


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
    text = read_text(path) if path else None
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


def log_time(text: str | None) -> float | None:
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
    return max(written, log_time(log.ended) or written)
