"""Submission folders, as job_submitter.sh writes them, read back.

A submission folder ``$SCRATCH/<project>/<exp>/<YYYYmmdd-HHMMSS-XXXX>/`` holds
``job.sbatch`` (``#SBATCH --array=`` for an array), ``job_id``, the manifest
(manifest.py) and ``sweep.yml`` for a sweep. A plain job's results folder is
``$SCRATCH/<project>/<exp>/``, array task K's is ``.../<exp>/trials/K/``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from hpc_tools.errors import ToolError
from hpc_tools.manifest import manifest_of
from hpc_tools.slurm import slurm_tasks

STAMP = re.compile(r"^\d{8}-\d{6}-[A-Za-z0-9]+$")


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


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def load_submission(path: str) -> Submission:
    trials: list[dict] = []
    text = manifest_of(path)
    for line in text.splitlines():
        if line.strip():
            try:
                trials.append(json.loads(line))
            except ValueError:
                raise ToolError(f"{path}/trials.jsonl: a line is not JSON", 1) from None
    if not trials:
        trials = [{"trial": 0, "params": {}, "argv": []}]
    job_id = (read_text(os.path.join(path, "job_id")) or "").strip() or None
    sbatch = read_text(os.path.join(path, "job.sbatch")) or ""
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
        for line in (read_text(os.path.join(path, name)) or "").splitlines():
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
        raise ToolError(f"no submissions under {project_dir}")
    if target is None:
        return load_submission(subs[-1])
    job = re.fullmatch(r"(\d+)(?:_\d+)?", target)  # 500, or an array task: 500_3
    if job:
        for sub in reversed(subs):
            if (read_text(os.path.join(sub, "job_id")) or "").strip() == job.group(1):
                return load_submission(sub)
        for sub in reversed(subs):  # a job that ran it before a newer one (by hand, again)
            if any(str(ran) == job.group(1) for ran, _ in jobs_that_ran(sub)):
                return load_submission(sub)
    of_exp = [s for s in subs if os.path.basename(os.path.dirname(s)) == target]
    if of_exp:
        return load_submission(of_exp[-1])
    exps = sorted({os.path.basename(os.path.dirname(s)) for s in subs})
    raise ToolError(
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


def study_rounds(exp_dir: str, study: str | None) -> dict[int, str]:
    """{round: submission folder} of a method-bayes study's rounds that sbatch accepted: the
    folders of the experiment whose bayes.json names the study (written before sbatch) and
    that hold a job_id (written after it)."""
    rounds: dict[int, str] = {}
    for name in sorted(os.listdir(exp_dir)) if study else []:
        folder = os.path.join(exp_dir, name)
        try:
            info = json.loads(read_text(os.path.join(folder, "bayes.json")) or "{}")
        except ValueError:
            continue
        queued = (read_text(os.path.join(folder, "job_id")) or "").strip()
        if STAMP.match(name) and info.get("study") == study and queued:
            rounds[info.get("round")] = folder
    return rounds
