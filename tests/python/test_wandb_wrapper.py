"""hpc_files/node/wandb_agent.sh (the sweep task's wrapper) with the real ``wandb agent`` and
the fake backend: signals are forwarded to the run and waited for, and a run that checkpointed
at the signal makes the wrapper exit 42 (the requeue protocol), not die with 138.

Slow (a real agent: ~10 s each).
Run with: .venv/bin/python -m pytest tests/python/test_wandb_wrapper.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S
from fake_wandb import FakeWandb

pytest.importorskip("wandb")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "hpc_files" / "node" / "wandb_agent.sh"

# Like the harness: a handler that only sets a flag, checked between "steps"; at the flag it
# "checkpoints" (sleeps: a save takes time), tells W&B it is preempting, and exits 42.
PROGRAM = """\
import json, os, signal, sys, time
import wandb
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append("USR1"))
signal.signal(signal.SIGTERM, lambda s, f: got.append("TERM"))
run = wandb.init(dir=os.environ["HPC_TRIAL_DIR"], resume="allow")
folder = os.environ["HPC_TRIAL_DIR"]
open(os.path.join(os.environ["WORK"], "ready"), "w").close()
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1.5)  # the checkpoint being written: the wrapper must wait for it
with open(os.path.join(folder, "saved.json"), "w") as fh:
    json.dump({"signals": got, "run_id": os.environ["WANDB_RUN_ID"], "folder": folder}, fh)
try:  # a TERM to the whole process tree also ends wandb's own service process
    run.mark_preempting()
    run.finish(exit_code=42)
except Exception as exc:
    print("could not tell wandb:", exc)
sys.exit(42 if got else 0)
"""

SWEEP = """\
program: program.py
method: grid
parameters:
  lr: {values: [0.1, 0.2]}
"""


def descendants(pid: int) -> list[int]:
    """pid's process tree (SLURM's proctrack/linuxproc signals all of a step's processes)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


@pytest.fixture
def work(tmp_path):
    (tmp_path / "program.py").write_text(PROGRAM)
    (tmp_path / "sweep.yml").write_text(SWEEP)
    (tmp_path / "task").mkdir()
    return tmp_path


def start_wrapper(fake: FakeWandb, work: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        **fake.env(),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "WORK": str(work),
        "HPC_TRIAL_DIR": str(work / "task"),
        "scratch_dir": str(work / "scratch"),
        "exp_name": "exp",
        "WANDB_DIR": str(work),
        "SLURM_ARRAY_JOB_ID": "700",  # the job wandb_runs.txt names
    }
    return subprocess.Popen(
        ["bash", str(WRAPPER), "agent", "--count", "1", fake.sweep_path],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_file(path: Path, proc: subprocess.Popen, seconds: float = HANG_GUARD_S) -> None:
    """Until ``path`` exists; fails at once where the wrapper exits first (conftest's wait_for
    would wait out its bound)."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"wrapper exited {proc.returncode} early: {proc.stdout.read()}")
        assert time.monotonic() < deadline, f"{path} not written within {seconds} s"
        time.sleep(0.1)


def saved(work: Path) -> dict:
    [found] = list((work / "scratch" / "exp" / "runs").glob("*/saved.json"))
    return json.loads(found.read_text())


# "tree twice": SLURM's own signal to every process, then batch.sh's, forwarded by srun.
@pytest.mark.parametrize("to", ["wrapper", "tree", "tree twice"])
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=["USR1", "TERM"])
def test_a_signal_reaches_the_run_which_checkpoints_and_the_wrapper_exits_42(work, sig, to):
    with FakeWandb(work / "sweep.yml", lifetime=120, offline_root=work) as fake:
        proc = start_wrapper(fake, work)
        wait_for_file(work / "ready", proc)
        for _ in range(2 if to == "tree twice" else 1):
            for pid in [proc.pid] if to == "wrapper" else descendants(proc.pid):
                os.kill(pid, sig)
            time.sleep(0.3)
        out, _ = proc.communicate(timeout=HANG_GUARD_S)
        fake.refresh()
        [(run_id, run)] = fake.runs.items()
    assert proc.returncode == 42, out
    name = sig.name.removeprefix("SIG")
    assert f"received SIG{name}; forwarding it to the wandb run" in out
    assert f"wandb run {run_id} checkpointed at SIG{name}; exiting 42" in out
    info = saved(work)
    assert info["run_id"] == run_id and name in info["signals"]
    # The run's files are under its run id, not the array task's folder.
    assert info["folder"] == str(work / "scratch" / "exp" / "runs" / run_id)
    assert (work / "task" / "wandb_runs.txt").read_text() == f"{run_id} 42 700\n"
    if sig == signal.SIGUSR1 or to == "wrapper":
        assert run["state"] == "preempted"  # it told W&B, which will hand it out again
    else:  # SLURM's TERM (preemption) also reaches wandb's service: W&B sees a crash
        assert run["state"] in ("preempted", "running")  # running: until W&B times it out


def test_a_signal_before_the_run_installed_its_handler_is_repeated_until_it_is_taken(work):
    with FakeWandb(work / "sweep.yml", lifetime=120, offline_root=work) as fake:
        proc = start_wrapper(fake, work)
        time.sleep(1.0)  # the agent is starting: no run yet
        assert proc.poll() is None
        for pid in descendants(proc.pid):
            os.kill(pid, signal.SIGUSR1)
        out, _ = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 42, out
    assert "USR1" in saved(work)["signals"]
