"""The requeue protocol, harness side: signal -> flag -> agree -> save -> marker -> exit 42.

SLURM sends SIGUSR1 shortly before the wall time (``#SBATCH --signal=B:USR1@lead``, forwarded
to the step by the batch script) and SIGTERM on preemption. The handlers here only set a flag.
The trainer looks at the flag at step boundaries (about every ``signal_check_s`` seconds); when
distributed, ranks agree with an asynchronous all-reduce (MAX), read at the next check, so that
all of them stop at the same step. Then they save a checkpoint, wait at a barrier, rank 0 writes the
requeue marker, and every rank exits with ``REQUEUE_EXIT_CODE``.

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

import json
import os
import signal
from typing import Any

REQUEUE_EXIT_CODE = 42
MARKER_ENV = "HPC_REQUEUE_MARKER"


class StopFlag:
    """Set by SIGUSR1/SIGTERM; read by the training loop. The handler does nothing else."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def is_set(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handler(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def install(self, signals: tuple[int, ...] = (signal.SIGUSR1, signal.SIGTERM)) -> StopFlag:
        """Install the handlers (main thread only); returns self."""
        for s in signals:
            self._previous[s] = signal.signal(s, self._handler)
        return self

    def uninstall(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()


def write_json_atomic(path: str, payload: dict[str, Any]) -> None:
    """Write one line of JSON to ``path`` via a temp file in the same folder and os.replace."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(json.dumps(payload, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_requeue_marker(
    step: int, epoch: int, checkpoint: str, signal_name: str = ""
) -> str | None:
    """Write the requeue marker named by ``$HPC_REQUEUE_MARKER`` (rank 0 only). Returns its path."""
    path = os.environ.get(MARKER_ENV)
    if not path:
        return None
    write_json_atomic(
        path, {"step": step, "epoch": epoch, "checkpoint": checkpoint, "signal": signal_name}
    )
    return path


def exit_code(status: str) -> int:
    """Process exit code for a Trainer.train() status: 42 for "requeue", else 0."""
    return REQUEUE_EXIT_CODE if status == "requeue" else 0
