"""The requeue protocol, harness side: signal -> flag -> agree -> save -> marker -> exit 42.

SLURM sends SIGUSR1 shortly before the wall time (``#SBATCH --signal=B:USR1@lead``, forwarded
to the step by the batch script) and SIGTERM on preemption. The handlers here only set a flag.
:class:`StopAgreement` looks at the flag at step boundaries (about every ``check_s`` seconds);
when distributed, ranks agree with an asynchronous all-reduce (MAX), read at the next check, so
that all of them stop at the same step. Then they save a checkpoint, wait at a barrier, rank 0
writes the requeue marker, and every rank exits with ``REQUEUE_EXIT_CODE``.

Exit codes (the contract with hpc_files/):
    0   training finished
    42  REQUEUE_EXIT_CODE: stopped at a signal after a complete checkpoint; requeue me
    *   anything else: failure (do not requeue)

Because torchrun exits 1 when it forwards a signal (the workers' 42 is lost), rank 0 also
writes the file named by env ``HPC_REQUEUE_MARKER`` (if set), atomically, after the checkpoint
is complete and before exiting: one line of JSON,
``{"step": 120, "epoch": 2, "checkpoint": "/path/ckpt_step00000120.pt", "signal": "SIGUSR1"}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from hpc_harness.checkpoint import atomic_write
from hpc_harness.dist import group

REQUEUE_EXIT_CODE = 42
MARKER_ENV = "HPC_REQUEUE_MARKER"
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


@contextlib.contextmanager
def signals_blocked(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Block ``signals`` in this thread while the body starts processes: DataLoader workers
    (and a forkserver) are then born with them blocked, through the seconds a spawned worker
    takes to start. Here a signal that came meanwhile is handled on leaving. (A process's first
    spawn or forkserver starts Python's resource tracker, which unblocks SIGTERM inside the
    body: a shielded loader starts it before, see data.shield_workers.)"""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def shielded_worker_init(init_fn: Callable[[int], None] | None, worker_id: int) -> None:
    """A DataLoader worker's start (data.shield_workers): SLURM signals every process of a
    step, and a worker that dies of it (torch's worker handler ends on a SIGTERM not sent by
    its parent; a spawned worker has no handler for SIGUSR1) crashes the training before it
    can checkpoint. The worker blocks them; a thread takes them and ends the worker only at
    its parent's SIGTERM (how torch stops a worker that does not exit)."""
    if hasattr(signal, "sigwaitinfo"):  # Linux (not macOS, a laptop: no SLURM to shield from)
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        threading.Thread(target=_exit_at_parents_sigterm, daemon=True).start()
    if init_fn is not None:
        init_fn(worker_id)


def _exit_at_parents_sigterm() -> None:
    while True:
        info = signal.sigwaitinfo(STOP_SIGNALS)
        if info.si_signo == signal.SIGTERM and info.si_pid == os.getppid():
            os._exit(0)


class StopAgreement:
    """Every rank stops at the same step, soon after a signal reached any of them.

    Call :meth:`should_stop` once per step on every rank; it is True on all ranks at the same
    step. No host sync per step: about every ``check_s`` seconds (or every ``check_every``
    steps when that is set) the ranks start an asynchronous all-reduce (MAX) of [stop flag,
    timed checkpoint due, -(steps to the next check)], read at the next check, so training never
    waits for it. Each rank proposes the step count that takes ``check_s`` at its measured
    pace; the smallest wins, so a step reacts within about ``2 * max(check_s, one step)``:
    a flag raised after one check rides the reduction started at the next, read at the one
    after. With ``checkpoint_every_s`` > 0, ``checkpoint_due``
    turns True on every rank at the same step once that long has passed on rank 0's clock
    since the last :meth:`saved`.
    """

    def __init__(
        self,
        ctx: Any = None,
        check_s: float = 0.5,
        check_every: int = 0,
        checkpoint_every_s: float = 0.0,
    ) -> None:
        import torch

        self.is_main = ctx.is_main if ctx is not None else True
        self.signum: int | None = None  # set by the handler, which does nothing else
        self._previous: dict[int, Any] = {}  # the handlers install() replaced
        self.check_s, self.check_every = check_s, check_every
        self.checkpoint_every_s = checkpoint_every_s
        self.checkpoint_due = False
        self._flags = torch.zeros(3, device=ctx.device if ctx is not None else "cpu")
        self._work: Any = None  # the in-flight all-reduce of _flags
        self._unread = False  # a finished (drained) reduction the next check must read
        self._due_stale = False  # saved() since the reduction in flight proposed its due
        self._interval = max(check_every, 1)  # steps between checks, the same on every rank
        self._steps = 0  # steps since the last check
        self._check_time = time.perf_counter()  # this rank's clock at the last check
        self._saved_time = time.monotonic()

    @property
    def signal_name(self) -> str:
        """The signal that came (``"SIGUSR1"``), or ``""`` while none did."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handler(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def install(self, signals: tuple[int, ...] = STOP_SIGNALS) -> StopAgreement:
        """Install the handlers (main thread only); returns self. Installed again, the
        handlers it first replaced are still the ones :meth:`uninstall` puts back."""
        for s in signals:
            self._previous.setdefault(s, signal.signal(s, self._handler))
        return self

    def uninstall(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    def saved(self) -> None:
        """A checkpoint was written: the timed interval starts again."""
        self.checkpoint_due = False
        self._saved_time = time.monotonic()
        self._due_stale = True

    def should_stop(self) -> bool:
        """True (on every rank at the same step) when the ranks agreed to stop. Collective:
        call once per step on every rank."""
        self._steps += 1
        if self._steps < self._interval:
            return False
        now = time.perf_counter()  # propose the steps that take about check_s at this pace
        per_step = (now - self._check_time) / max(self._steps, 1)
        self._check_time, self._steps = now, 0
        proposal = self.check_every or int(min(max(self.check_s / max(per_step, 1e-9), 1), 1000))
        every = self.checkpoint_every_s
        elapsed = time.monotonic() - self._saved_time
        local = (self.signum is not None, self.is_main and every > 0 and elapsed >= every)
        if (dist := group()) is None:
            self._interval = proposal
            stop, due = local
        else:
            stop = due = False
            if self._work is not None or self._unread:
                self.drain()
                self._unread = False
                flags = self._flags.tolist()
                stop, due, self._interval = flags[0] > 0, flags[1] > 0, max(int(-flags[2]), 1)
                due = due and not self._due_stale  # proposed before a save since
            if not stop:
                # a due agreed now is saved at this step: proposing it again would save twice
                flags = [float(local[0]), float(local[1] and not due), -proposal]
                self._flags.copy_(self._flags.new_tensor(flags))
                self._work = dist.all_reduce(self._flags, op=dist.ReduceOp.MAX, async_op=True)
                self._due_stale = False
        self.checkpoint_due = self.checkpoint_due or due
        return stop

    def stop_now(self) -> bool:
        """True on every rank when a signal reached any of them, asked at once (one blocking
        all-reduce after :meth:`drain`): for the points after which training goes a long way
        before its next check, an epoch's evaluation. Collective."""
        if (dist := group()) is None:
            return self.signum is not None
        self.drain()
        flag = self._flags.new_tensor([float(self.signum is not None)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0

    def drain(self) -> None:
        """Finish an in-flight reduction (every rank has one at the same point) before other
        collectives wait on it; its result stays for the next check, so a stop is never lost
        when checks are further apart than the code that drains (an epoch end)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
            self._unread = True


def write_requeue_marker(
    step: int, epoch: int, checkpoint: str, signal_name: str = ""
) -> str | None:
    """Rank 0's part of ``pieces.announce_requeue``: the requeue marker named by
    ``$HPC_REQUEUE_MARKER`` (when set; its path is returned) and the log line."""
    marker = os.environ.get(MARKER_ENV) or None
    if marker:
        info = {"step": step, "epoch": epoch, "checkpoint": checkpoint, "signal": signal_name}
        line = json.dumps(info, sort_keys=True) + "\n"
        atomic_write(marker, lambda f: f.write(line.encode()))
    print(
        f"hpc_harness: {signal_name or 'signal'} received: checkpointed at global step {step} "
        f"to {checkpoint}; exiting 42 (requeue me)" + (f"; marker {marker}" if marker else ""),
        flush=True,
    )
    return marker


def exit_code(status: str) -> int:
    """Process exit code for a Trainer.train() status: 42 for "requeue", else 0."""
    return REQUEUE_EXIT_CODE if status == "requeue" else 0
