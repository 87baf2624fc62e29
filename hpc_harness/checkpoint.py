"""Atomic checkpoints, keep-last-K, resume from the newest one that loads, RNG capture.

Files are ``<ckpt_dir>/ckpt_step<global step, 8 digits>.pt``. Each is written to a temporary
file in the same folder (``.ckpt_step....pt.tmp.<pid>``), flushed and fsync'ed, then renamed
with ``os.replace`` (atomic on POSIX), and the folder is fsync'ed. A process killed mid-save
leaves only a temporary file, never a half checkpoint under the final name; the next save that
completes past that step removes it (``prune``). On resume the
newest checkpoint that loads wins; a corrupt or partial newest is skipped with a warning.

Checkpoint dict keys (``FORMAT_VERSION`` 1): model, optimizer, scheduler, scaler, epoch,
step_in_epoch, global_step, sampler ({"epoch", "start_batch", "seed"}), rng (a list with one
entry per rank: torch, cuda, numpy, python states), world_size, extra.
"""

from __future__ import annotations

import glob
import os
import random
import re
import sys
from typing import Any

FORMAT_VERSION = 1
_NAME_RE = re.compile(r"^ckpt_step(\d+)\.pt$")
_TEMP_RE = re.compile(r"^\.ckpt_step(\d+)\.pt\.tmp\.\d+$")


def checkpoint_path(ckpt_dir: str, global_step: int) -> str:
    return os.path.join(ckpt_dir, f"ckpt_step{global_step:08d}.pt")


def list_checkpoints(ckpt_dir: str) -> list[str]:
    """Complete checkpoints in ``ckpt_dir``, oldest first (temporary files are not listed)."""
    if not os.path.isdir(ckpt_dir):
        return []
    found = []
    for name in os.listdir(ckpt_dir):
        m = _NAME_RE.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(ckpt_dir, name)))
    return [p for _, p in sorted(found)]


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_save(obj: Any, path: str, pause_before_rename: float = 0.0) -> None:
    """torch.save to a temp file in the same folder, fsync, os.replace, fsync the folder.

    ``pause_before_rename`` (seconds) is a testing aid: it holds the written temp file
    before the rename, so a test can kill the process mid-save at a known moment.
    """
    import time

    import torch

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        if pause_before_rename > 0:
            time.sleep(pause_before_rename)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def prune(ckpt_dir: str, keep_last: int) -> list[str]:
    """Delete all but the newest ``keep_last`` checkpoints (0 or less keeps all), and the
    temporary files of interrupted saves of steps up to the newest complete checkpoint.

    Called by the one writer right after a save: a run's saves follow one another, so a
    temporary file of an earlier (or the same) step belongs to a save that was killed.
    """
    complete = list_checkpoints(ckpt_dir)
    old = complete[:-keep_last] if keep_last > 0 else []
    newest = int(_NAME_RE.match(os.path.basename(complete[-1])).group(1)) if complete else -1
    for tmp in stale_temp_files(ckpt_dir):
        m = _TEMP_RE.match(os.path.basename(tmp))
        if m and int(m.group(1)) <= newest:
            old.append(tmp)
    for p in old:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    return old


def stale_temp_files(ckpt_dir: str) -> list[str]:
    """Temporary files left by a save that never finished (process killed mid-save)."""
    return sorted(glob.glob(os.path.join(glob.escape(ckpt_dir), ".ckpt_step*.pt.tmp.*")))


def load_file(path: str) -> dict[str, Any]:
    """Load one checkpoint onto the CPU; raises if it is not a readable hpc_harness checkpoint."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or "model" not in state or "global_step" not in state:
        raise ValueError("not a hpc_harness checkpoint (missing keys)")
    return state


def load_latest(ckpt_dir: str, log: Any = print) -> tuple[dict[str, Any] | None, str | None]:
    """Load the newest checkpoint that loads; warn about and skip any that do not.

    Returns ``(state, path)`` or ``(None, None)`` when there is nothing usable. One process's
    view: in a distributed job use :func:`load_latest_shared`.
    """
    for tmp in stale_temp_files(ckpt_dir):
        log(f"hpc_harness: warning: ignoring incomplete checkpoint {tmp} (a save was interrupted)")
    for path in reversed(list_checkpoints(ckpt_dir)):
        try:
            state = load_file(path)
        except Exception as exc:  # corrupt, truncated, or foreign file
            log(f"hpc_harness: warning: skipping unreadable checkpoint {path}: {exc!r:.200}")
            continue
        return state, path
    return None, None


def load_latest_shared(ckpt_dir: str, log: Any = print) -> tuple[dict[str, Any] | None, str | None]:
    """:func:`load_latest` for every rank of a process group: rank 0 chooses the checkpoint
    (the newest one that loads in its view of ``ckpt_dir``) and broadcasts its path; every
    other rank loads that same file, so all ranks resume the same step even when their
    listings differ (a stale NFS listing). Collective when a process group exists: call it on
    every rank. A rank that cannot read the chosen file makes every rank raise RuntimeError.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return load_latest(ckpt_dir, log)
    rank = dist.get_rank()
    state, path = load_latest(ckpt_dir, log) if rank == 0 else (None, None)
    box: list[Any] = [path]
    dist.broadcast_object_list(box, src=0)
    path = box[0]
    if path is None:
        return None, None
    error = ""
    if rank != 0:
        try:
            state = load_file(path)
        except Exception as exc:
            error = f"rank {rank} cannot read {path}: {exc!r:.200}"
    errors: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    errors = [e for e in errors if e]
    if errors:
        raise RuntimeError(f"checkpoint chosen by rank 0 is not readable everywhere: {errors[0]}")
    return state, path


# --------------------------------------------------------------------------- RNG


def capture_rng() -> dict[str, Any]:
    """This process's RNG states: torch CPU, CUDA (if any), numpy, python."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "cuda": None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        try:
            torch.cuda.set_rng_state_all(state["cuda"])
        except Exception as exc:  # different GPU count after requeue
            print(f"hpc_harness: warning: CUDA RNG not restored: {exc}", file=sys.stderr)
