"""Signal -> flag -> save -> marker -> exit 42, and the failure path (not 42, no marker)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch
from conftest import clean_env, job_log, module_command, run_example, run_interrupted
from test_stop_agreement_details import FakeClock

from hpc_harness import signals
from hpc_harness.examples import faults
from hpc_harness.signals import (
    REQUEUE_EXIT_CODE,
    StopAgreement,
    exit_code,
    write_requeue_marker,
)
from hpc_harness.trainer import TrainConfig, Trainer


def test_contract_constants() -> None:
    assert REQUEUE_EXIT_CODE == 42
    assert exit_code("requeue") == 42
    assert exit_code("finished") == exit_code("max_steps") == 0


def test_handler_only_sets_a_flag() -> None:
    stop = StopAgreement().install()
    try:
        assert stop.signum is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.signum == signal.SIGUSR1 and stop.signal_name == "SIGUSR1"
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_marker_is_written_only_when_asked(tmp_path, monkeypatch) -> None:
    assert write_requeue_marker(3, 1, "/x.pt") is None
    marker = tmp_path / "m" / "requeue.json"
    monkeypatch.setenv("HPC_REQUEUE_MARKER", str(marker))
    assert write_requeue_marker(3, 1, "/x.pt", "SIGTERM") == str(marker)
    text = marker.read_text()
    assert text.count("\n") == 1
    assert json.loads(text) == {"step": 3, "epoch": 1, "checkpoint": "/x.pt", "signal": "SIGTERM"}
    assert os.listdir(marker.parent) == ["requeue.json"]  # temp file renamed away


def test_the_requeue_line_is_in_the_job_log_before_the_ranks_meet(monkeypatch) -> None:
    # requeue_exit then waits at a barrier for the other ranks: a job killed there (a rank
    # that hangs, SLURM's KillWait) must still show why it stopped.
    monkeypatch.delenv("HPC_REQUEUE_MARKER", raising=False)
    log = job_log(monkeypatch, signals)
    write_requeue_marker(5, 0, "/ck/a.pt", "SIGUSR1")
    assert log.shown == (
        "hpc_harness: SIGUSR1 received: checkpointed at global step 5 to /ck/a.pt; "
        "exiting 42 (requeue me)\n"
    )


def test_a_marker_write_that_fails_leaves_no_temp_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HPC_REQUEUE_MARKER", str(tmp_path / "requeue.json"))

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        write_requeue_marker(3, 1, "/x.pt")
    assert os.listdir(tmp_path) == []


def test_sigterm_to_the_example_saves_marks_and_exits_42(tmp_path, digits_dir: str) -> None:
    marker = tmp_path / "requeue.json"
    ck = tmp_path / "ck"
    args = ["--data-dir", digits_dir, "--ckpt-dir", str(ck), "--epochs", "50"]
    args += ["--step-sleep", "0.01", "--log-every", "1", "--signal-check-every", "4"]
    interrupted = run_interrupted(
        module_command("hpc_harness.train", args),
        clean_env(HPC_REQUEUE_MARKER=str(marker)),
        "hpc_harness: step 3/",
        signum=signal.SIGTERM,
    )
    assert interrupted.returncode == 42, interrupted.stdout
    info = json.loads(marker.read_text())
    assert info["signal"] == "SIGTERM"
    assert info["step"] % 4 == 0, "stops only at a flag-check boundary"
    state = torch.load(info["checkpoint"], weights_only=False)
    assert state["global_step"] == info["step"] and state["epoch"] == info["epoch"]
    assert not (ck / "last.pt").exists()


def test_failure_exits_nonzero_without_marker(tmp_path, digits_dir: str) -> None:
    marker = tmp_path / "requeue.json"
    r = run_example(
        ["--data-dir", digits_dir, "--ckpt-dir", str(tmp_path / "ck"), "--fail-at-step", "3"],
        cwd=str(tmp_path),
        HPC_REQUEUE_MARKER=str(marker),
    )
    assert r.returncode not in (0, REQUEUE_EXIT_CODE)
    assert "--fail-at-step 3 on rank 0" in r.stderr
    assert not marker.exists()


def _tiny_trainer(tmp_path, step_sleep: float = 0.0, **config) -> Trainer:
    from torch.utils.data import DataLoader, TensorDataset

    from hpc_harness import dist as hdist

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    ctx = hdist.setup(gpus=None, env={}, verbose=False)
    return faults.trainer(
        faults.Faults(step_sleep=step_sleep),
        torch.nn.Linear(4, 2),
        lambda params: torch.optim.SGD(params, lr=0.1),
        DataLoader(data, batch_size=4, shuffle=True),
        ctx,
        TrainConfig(epochs=1, ckpt_dir=str(tmp_path), log_every=0, **config),
    )


class _StepClock(FakeClock):
    """A fake clock that a step's sleep moves: steps take exactly what they sleep, however
    loaded the machine is."""

    def sleep(self, seconds: float) -> None:
        self.perf += seconds
        self.mono += seconds


def test_adaptive_check_interval_follows_the_step_time(tmp_path, monkeypatch) -> None:
    # A check every 1/8 s: 1/64 s steps give 8 steps between checks, 1/256 s steps 32, whatever
    # the step count (a fixed count would react in 10 x the step time). Binary fractions keep
    # the clock's sums exact.
    clock = _StepClock()
    monkeypatch.setattr(signals, "time", clock)
    monkeypatch.setattr(faults, "time", clock)
    trainer = _tiny_trainer(tmp_path, 1 / 64, signal_check_s=1 / 8)
    assert trainer.train() == "finished"
    assert trainer.agreement._interval == 8
    fast = _tiny_trainer(tmp_path / "fast", 1 / 256, signal_check_s=1 / 8)
    assert fast.train() == "finished"
    assert fast.agreement._interval == 32


def test_a_fixed_check_interval_is_kept(tmp_path) -> None:
    trainer = _tiny_trainer(tmp_path, 0.02, signal_check_every=7)
    assert trainer.train() == "finished"
    assert trainer.agreement._interval == 7


def _shielded_worker(ready) -> None:
    from hpc_harness.signals import shielded_worker_init

    shielded_worker_init(
        lambda worker_id: ready.set(), 0
    )  # the user's worker_init_fn runs after the shield
    time.sleep(60)


def test_a_shielded_worker_outlives_every_signal_but_its_parents_sigterm() -> None:
    import multiprocessing
    import subprocess

    from hpc_harness.signals import signals_blocked

    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    worker = ctx.Process(target=_shielded_worker, args=(ready,), daemon=True)
    # Born with the signals blocked, as a shielded loader starts its workers: threads that
    # at-fork hooks start in the child before its init (wandb's OpenTelemetry exporters,
    # once wandb ran in this process) inherit the block; born without it, they take a TERM.
    with signals_blocked():
        worker.start()
    assert ready.wait(30)
    subprocess.run(["kill", "-TERM", str(worker.pid)], check=True)  # not its parent: SLURM's
    subprocess.run(["kill", "-USR1", str(worker.pid)], check=True)
    os.kill(worker.pid, signal.SIGUSR1)  # the parent's USR1: not a request to end
    worker.join(1.0)
    assert worker.is_alive()
    worker.terminate()  # the parent's SIGTERM: how torch ends a worker that does not exit
    worker.join(30)
    assert worker.exitcode == 0


def test_without_sigwaitinfo_a_worker_is_not_shielded(monkeypatch) -> None:
    """macOS has no sigwaitinfo: nothing is blocked (nothing could end the worker then), the
    user's worker_init_fn still runs."""
    from hpc_harness.signals import shielded_worker_init

    monkeypatch.delattr(signal, "sigwaitinfo")
    blocked: list = []
    monkeypatch.setattr(signal, "pthread_sigmask", lambda *a: blocked.append(a))
    ran: list[int] = []
    shielded_worker_init(ran.append, 3)
    assert ran == [3] and blocked == []


def test_a_shielded_worker_blocks_the_signals_and_starts_its_daemon_waiter_then_the_users_init(
    monkeypatch,
) -> None:
    """In this process (the fork test above runs in a child, out of reach of mutmut's
    coverage): what shielded_worker_init asks of signal and threading, in order."""
    calls: list = []
    monkeypatch.setattr(signal, "pthread_sigmask", lambda *a: calls.append(("mask", *a)))

    class Thread:
        def __init__(self, target=None, daemon=None) -> None:
            calls.append(("thread", target, daemon))

        def start(self) -> None:
            calls.append(("start",))

    monkeypatch.setattr(signals.threading, "Thread", Thread)
    signals.shielded_worker_init(lambda worker_id: calls.append(("init", worker_id)), 3)
    assert calls == [
        ("mask", signal.SIG_BLOCK, (signal.SIGUSR1, signal.SIGTERM)),
        ("thread", signals._exit_at_parents_sigterm, True),
        ("start",),
        ("init", 3),
    ]
    calls.clear()
    signals.shielded_worker_init(None, 0)  # no user init: nothing else
    assert [c[0] for c in calls] == ["mask", "thread", "start"]


def test_the_waiter_ends_the_worker_only_at_its_parents_sigterm(monkeypatch) -> None:
    from types import SimpleNamespace

    arrivals = [
        SimpleNamespace(si_signo=signal.SIGUSR1, si_pid=100),  # the parent's USR1
        SimpleNamespace(si_signo=signal.SIGTERM, si_pid=555),  # slurmstepd's TERM
        SimpleNamespace(si_signo=signal.SIGTERM, si_pid=100),  # the parent's TERM
    ]
    asked: list = []
    monkeypatch.setattr(signal, "sigwaitinfo", lambda s: asked.append(s) or arrivals.pop(0))
    monkeypatch.setattr(os, "getppid", lambda: 100)

    def exit_(code) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_)
    with pytest.raises(SystemExit) as ended:
        signals._exit_at_parents_sigterm()
    assert ended.value.code == 0 and arrivals == []
    assert asked == [(signal.SIGUSR1, signal.SIGTERM)] * 3
