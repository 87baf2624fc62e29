"""Shared helpers for the hpc_harness tests: a clean environment, the digits files, runs in
subprocesses (to their end, or stopped by a signal mid-run), process groups of ranks and a
stand-in wandb module."""

from __future__ import annotations

import contextlib
import importlib.machinery
import io
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# The folder of the login-node tools' package, hpc_tools: on sys.path here (pyproject's pytest
# pythonpath), on PYTHONPATH for a subprocess (tools_env).
HPC_FILES = REPO / "hpc_files"

# Subprocesses run with OMP_NUM_THREADS=1; in-process runs must use the same thread count,
# because CPU matmuls round differently with another number of threads (bitwise comparisons).
os.environ["OMP_NUM_THREADS"] = "1"
try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass
PY = sys.executable

# How long a test waits on a subprocess, a rank or a file before it calls it hung. It only ends
# a hang, so it is far above any run's time: under load (two pytest workers beside the cluster's
# jobs, on two cores) a run takes several times what it takes on an idle machine. A bound that
# is the point of a test (a process must still be alive after 1 s) is that test's own.
HANG_GUARD_S = 600.0

# Launcher variables that would make the harness think it is inside a job.
_LAUNCH_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HPC_REQUEUE_MARKER",
    "HPC_WANDB",
    "WANDB_API_KEY",
    "scratch_dir",
    "exp_name",
)


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without launcher/SLURM variables, one thread, the repo on PYTHONPATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCH_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_"))
    }
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["WANDB_MODE"] = env.get("WANDB_MODE", "disabled")
    env.update(extra)
    return env


def tools_env(**extra: str) -> dict[str, str]:
    """os.environ with hpc_files/ alone on PYTHONPATH, for ``python -m hpc_tools.MODULE``."""
    return {**os.environ, "PYTHONPATH": str(HPC_FILES), **extra}


def fit_processes(nproc: int) -> dict[str, str]:
    """What clean_env adds for a run of ``nproc`` processes on one machine: no GPU where it has
    fewer than ``nproc`` (the harness refuses two processes on one GPU), so such a run trains
    on the CPU there, as on a machine without one (tools/gpu_check.sh runs these on a GPU)."""
    import torch

    return {"CUDA_VISIBLE_DEVICES": ""} if 0 < torch.cuda.device_count() < nproc else {}


def cpu_context():  # noqa: ANN201
    """dist.setup() on the CPU, for tests whose expectations are computed on the CPU (one
    thread, bitwise): on a machine with a GPU, setup() would train on it."""
    from hpc_harness import dist as hdist

    return hdist.setup(gpus=0, verbose=False)


def _launch_keys() -> list[str]:
    return [k for k in os.environ if k in _LAUNCH_VARS or k.startswith(("SLURM_", "TORCHELASTIC_"))]


@pytest.fixture(autouse=True)
def _no_launch_env(monkeypatch: pytest.MonkeyPatch):
    for k in _launch_keys():
        monkeypatch.delenv(k)
    yield
    # dist.setup() exports MASTER_ADDR, RANK, LOCAL_RANK, ... (os.environ.setdefault): a test
    # that calls it in-process must not hand them to the next test's module-scoped fixtures,
    # which run before this one (test_resume's reference run then waited for local rank 0).
    for k in _launch_keys():
        del os.environ[k]


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The example's dataset, written once per test session."""
    from hpc_harness.digits import write_digits

    d = tmp_path_factory.mktemp("data") / "digits"
    write_digits(str(d))
    return str(d)


def module_command(module: str, args: list[str], nproc: int = 1) -> list[str]:
    """``python -m MODULE ARGS``; with ``nproc`` over 1, under torchrun on this machine."""
    if nproc == 1:
        return [PY, "-m", module, *args]
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [PY, *torchrun, "-m", module, *args]


def run_command(
    command: list[str], env: dict[str, str], timeout: float = HANG_GUARD_S, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end, its stdout and stderr captured as text."""
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def run_example(args: list[str], cwd: str, timeout: float = HANG_GUARD_S, **env: str):
    """Run ``python -m hpc_harness.train ARGS`` to completion; returns CompletedProcess."""
    return run_command(module_command("hpc_harness.train", args), clean_env(**env), timeout, cwd)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll ``predicate`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def torchrun_workers(parent: int) -> dict[int, int]:
    """{rank: pid} of torchrun's worker children, read from /proc."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            found[int(env[b"RANK"])] = int(pid)
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return found


def run_interrupted(
    command: list[str],
    env: dict[str, str],
    at_line: str,
    *,
    signum: int = signal.SIGUSR1,
    torchrun_rank: int | None = None,
    timeout: float = HANG_GUARD_S,
) -> subprocess.CompletedProcess[str]:
    """Start ``command``, send it ``signum`` once a line of its output starts with ``at_line``,
    and read its output to the end. With ``torchrun_rank`` the signal goes to torchrun's worker
    of that rank alone (the ranks must agree to stop), not to the process started. Returns its
    exit code and its stdout and stderr as one text; fails the test where the line does not
    come, or the run does not end, within ``timeout`` seconds (each)."""
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    line_or_end = threading.Event()

    def read_output() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(at_line):
                line_or_end.set()
        line_or_end.set()

    # a thread reads, so that a run that hangs before the line fails the test, not blocks it
    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        line_or_end.wait(timeout)
        if not any(line.startswith(at_line) for line in lines):
            out = "".join(lines)
            pytest.fail(f"no line starting {at_line!r} (waited up to {timeout} s):\n{out}")
        if torchrun_rank is None:
            proc.send_signal(signum)
        else:
            wait_for(
                lambda: torchrun_rank in torchrun_workers(proc.pid),
                10,
                f"torchrun's rank {torchrun_rank} worker in /proc",
            )
            os.kill(torchrun_workers(proc.pid)[torchrun_rank], signum)
        reader.join(timeout)  # the output ends when the process and its workers have exited
        if reader.is_alive():
            pytest.fail(f"the run did not end within {timeout} s of the signal:\n{''.join(lines)}")
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            # torchrun killed outright leaves its workers running: they go first
            for pid in torchrun_workers(proc.pid).values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
    return subprocess.CompletedProcess(command, proc.returncode, "".join(lines))


def load_model(path: str) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def bitwise_equal(a: dict, b: dict) -> bool:
    import torch

    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


class FakeRun:
    """What MetricsLogger uses of a ``wandb.Run``, recorded; its folder is made as offline
    wandb makes it, and ``fail`` makes its calls raise."""

    def __init__(self, **settings: Any) -> None:
        self.settings, self.id = settings, settings["id"]
        self.dir = os.path.join(settings["dir"], "wandb", f"offline-run-{self.id}", "files")
        os.makedirs(self.dir, exist_ok=True)
        self.logged: list[tuple[dict, int | None]] = []
        self.commits: list[bool | None] = []
        self.finished: list[int | None] = []
        self.preempting = False
        self.fail: Exception | None = None

    def log(self, values: dict, step: int | None = None, commit: bool | None = None) -> None:
        self.logged.append((values, step))
        self.commits.append(commit)

    def mark_preempting(self) -> None:
        if self.fail:
            raise self.fail
        self.preempting = True

    def finish(self, exit_code: int | None = None) -> None:
        if self.fail:
            raise self.fail
        self.finished.append(exit_code)


@pytest.fixture
def wandb_runs(tmp_path, monkeypatch: pytest.MonkeyPatch) -> list[FakeRun]:
    """A stand-in ``wandb`` module in sys.modules (nothing imported or sent): the runs its
    ``init`` started, in order. No key, sweep, run id, mode or names in the environment."""
    from hpc_harness import metrics

    runs: list[FakeRun] = []
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # find_spec finds it
    module.init = lambda **settings: runs.append(FakeRun(**settings)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", module)
    for name in (
        "WANDB_SWEEP_ID",
        "WANDB_RUN_ID",
        "WANDB_API_KEY",
        "WANDB_BASE_URL",
        "WANDB_MODE",
        "HPC_WANDB",
        "project_name",
        "exp_name",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    # Recorded as absent, so that what the logger sets is undone after the test.
    monkeypatch.setenv(metrics.FLUSH_INTERVAL_ENV, "")
    monkeypatch.delenv(metrics.FLUSH_INTERVAL_ENV)
    return runs


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What a rank imports at its first optimizer (torch.optim imports torch._dynamo and sympy),
# DDP or FSDP step and distributed checkpoint: about 1.3 s of CPU in each rank, where the
# server imports it once a session.
_RANK_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.nn.parallel",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint.state_dict",
]


def _gloo_context():  # noqa: ANN202
    """Fresh processes forked from one server that imported torch once per session: each rank
    is a new process, as with "spawn", without the ~2 s of CPU its torch import costs (the
    server runs no torch op and starts no thread before it forks: _RANK_PRELOAD's imports
    start none)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_RANK_PRELOAD)
    return ctx


def spawn_gloo(fn, world_size: int, *args, timeout_s: float | None = None) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes joined by a gloo group
    on CPU (collectives time out after ``timeout_s``: torch's default when None); returns what
    each rank returned, in rank order. Results are read as they come: the first rank that
    fails, or exits without a result, fails the call at once and the others are ended."""
    import shutil
    import tempfile

    # a file store, not a TCP port: a free port can be taken by another test before rank 0
    # listens on it (EADDRINUSE on this shared machine)
    store = os.path.join(tempfile.mkdtemp(prefix="gloo"), "store")
    ctx = _gloo_context()
    results_queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=_gloo_worker, args=(fn, rank, world_size, store, results_queue, args, timeout_s)
        )
        for rank in range(world_size)
    ]
    deadline = time.monotonic() + HANG_GUARD_S
    results: dict[int, object] = {}
    try:
        for p in procs:
            p.start()
        while len(results) < world_size:
            rank, ok, value = _next_result(results_queue, procs, results, deadline)
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
        # ranks that returned end on their own, their DataLoader workers with them
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        # a rank still waiting on a failed one is ended now: left alive, it would hold pytest's
        # exit (multiprocessing joins its children) until its collective timed out
        for p in procs:
            if p.is_alive():
                p.kill()
        shutil.rmtree(os.path.dirname(store), ignore_errors=True)
    return [results[r] for r in range(world_size)]


def _next_result(results_queue, procs: list, results: dict, deadline: float) -> tuple:
    """The next (rank, ok, value) a rank sent; fails the test where a rank exited without one,
    or where none came by ``deadline``."""
    import queue

    while True:
        try:
            return results_queue.get(timeout=0.5)
        except queue.Empty:
            pass
        # a rank's result is in the pipe before the rank exits: one that has exited while the
        # queue is empty sent none
        exited = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in results]
        if exited and results_queue.empty():
            code = procs[exited[0]].exitcode
            raise AssertionError(f"rank {exited[0]} exited ({code}) without a result")
        if time.monotonic() > deadline:
            waiting = sorted(set(range(len(procs))) - set(results))
            raise AssertionError(f"ranks {waiting} sent nothing within {HANG_GUARD_S:.0f} s")


def threaded_ranks(fn, world_size: int, *args) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` threads of this process joined by
    torch's in-process "threaded" process group (its own testing backend): real collectives,
    no process started, so the mutation run's fast tests reach the distributed code. Returns
    what each rank returned, in rank order; a failing rank fails the call (and wakes the
    others from their collective)."""
    import threading

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed import multi_threaded_pg as threaded

    results: dict[int, object] = {}
    errors: dict[int, BaseException] = {}
    store = dist.HashStore()

    def rank_main(rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
        try:
            results[rank] = fn(rank, world_size, *args)
        except BaseException as exc:  # noqa: BLE001 (re-raised below, in the test's thread)
            errors[rank] = exc
            threaded.ProcessLocalGroup.exception_handle(exc)
        finally:
            dist.destroy_process_group()

    # process groups are registered by name for the whole process unless threads are isolated
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    threaded._install_threaded_pg()
    try:
        threads = [
            threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world_size)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(HANG_GUARD_S)
        assert not any(t.is_alive() for t in threads), f"a rank hung ({HANG_GUARD_S:.0f} s)"
    finally:
        threaded._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if errors:
        rank = min(errors)
        raise AssertionError(f"rank {rank} failed: {errors[rank]!r}") from errors[rank]
    return [results[r] for r in range(world_size)]


def gloo_context(rank: int, world_size: int):
    """A DistContext for a process already in a gloo group (CPU)."""
    import torch

    from hpc_harness.dist import DistContext

    return DistContext(
        "torchrun",
        rank=rank,
        local_rank=rank,
        world_size=world_size,
        local_world_size=world_size,
        device=torch.device("cpu"),
    )


def _gloo_worker(fn, rank: int, world_size: int, store: str, queue, args, timeout_s) -> None:
    import datetime
    import multiprocessing
    import signal
    import traceback

    import torch
    import torch.distributed as dist

    # a rank's DataLoader workers start as under torchrun, by the platform's default method:
    # a forkserver's child inherits "forkserver", whose workers would each import torch anew
    multiprocessing.set_start_method(None, force=True)

    # a rank starts with the stop signals deliverable, as under torchrun: a forkserver that a
    # shielded DataLoader started blocks them, and its children inherit the mask, so a signal
    # a test sends would never arrive
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGUSR1, signal.SIGTERM))
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    for k in list(os.environ):
        if k in _LAUNCH_VARS or k.startswith(("SLURM_", "TORCHELASTIC_")):
            del os.environ[k]
    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
    # a failure is sent before the group is destroyed: the other ranks' errors at the broken
    # connection come after it, and the call names the rank that failed first
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=timeout
        )
        queue.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class NodeStore:
    """Stands for the rendezvous store (TCPStore) of a node's tasks, where dist.setup learns
    which local ranks see the same GPUs: ``sets`` holds the CUDA_VISIBLE_DEVICES the other
    local ranks published; a rank not in it sees a set of its own."""

    def __init__(self, sets: dict[int, str]) -> None:
        self.keys = {f"hpc_harness/gpus/0/{rank}": s.encode() for rank, s in sets.items()}
        self.waited: list[str] = []

    def set(self, key: str, value: str) -> None:
        self.keys[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.keys.get(key, b"a set of its own")

    def add(self, key: str, amount: int) -> int:
        self.keys[key] = str(int(self.keys.get(key, b"0")) + amount).encode()
        return int(self.keys[key])

    def wait(self, keys: list[str]) -> None:
        """The other ranks are not here: returns at once, and remembers what was waited for."""
        self.waited += keys


class JobLog(io.StringIO):
    """stdout as a job's log file has it: ``shown`` is what was flushed (a job killed while it
    waits, at a barrier say, loses the rest)."""

    shown = ""

    def flush(self) -> None:
        self.shown = self.getvalue()


def job_log(monkeypatch: pytest.MonkeyPatch, module: object) -> JobLog:
    """What ``module`` prints, as a job log has it. Patches the module's ``print`` (pytest's
    capture replaces sys.stdout at each test phase, so a patched sys.stdout would not last)."""
    out = JobLog()
    monkeypatch.setattr(module, "print", lambda *a, **kw: print(*a, file=out, **kw), raising=False)
    return out
