"""The checkpoint format, and the one module that knows it: file names, atomic writes,
keep-last-K, resume from the newest checkpoint that loads, run identity, RNG capture.

A folder holds one run: ``ckpt_step<step, 8 digits>.pt`` (sharded: the folder ``.dcp``, see
:func:`save_sharded`), ``run.json`` (:func:`write_run_file`) and the final model ``last.pt``
(``last.dcp``, :func:`save_final`). Every file is written under a temporary name beside it
and renamed once complete (:func:`atomic_write`): a process killed mid-save leaves a
temporary file, never half a checkpoint. :func:`load_latest` resumes the newest checkpoint
that loads and skips a damaged one with a warning.

A checkpoint is a dict with at least ``model`` and ``global_step`` (:data:`REQUIRED_KEYS`),
plus ``rng`` (one entry per rank, :func:`capture_rng`) and ``fingerprint``: the run's
arguments minus those its caller names resume-free (:func:`fingerprint`). A resume with
another fingerprint raises :class:`RunMismatch` before training; :func:`move_aside`
(``--fresh``) renames the folder and never deletes anything.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pickle
import random
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, BinaryIO

FORMAT_VERSION = 1
META_FILE = "meta.pt"  # a sharded checkpoint's non-tensor part, inside its folder
_NAME_RE = re.compile(r"^ckpt_step(\d+)\.(pt|dcp)$")
_TEMP_RE = re.compile(r"^\.ckpt_step(\d+)\.(pt|dcp)\.tmp\.\d+$")


def checkpoint_path(ckpt_dir: str, global_step: int, sharded: bool = False) -> str:
    """``ckpt_step<step>.pt``, or the folder ``ckpt_step<step>.dcp`` (:func:`save_sharded`)."""
    return os.path.join(ckpt_dir, f"ckpt_step{global_step:08d}.{'dcp' if sharded else 'pt'}")


def final_path(ckpt_dir: str, sharded: bool = False) -> str:
    """The run's final model: ``last.pt``, or the folder ``last.dcp`` (:func:`save_sharded`)."""
    return os.path.join(ckpt_dir, "last.dcp" if sharded else "last.pt")


def save_final(ckpt_dir: str, payload: dict[str, Any], sharded: bool = False) -> str:
    """Write ``payload`` (at least ``model`` and ``global_step``) to :func:`final_path`
    atomically and return the path; ``sharded``: every rank its part of ``payload["model"]``
    (:func:`save_sharded`, collective), else one process (``pieces.save_final``: rank 0)."""
    path = final_path(ckpt_dir, sharded)
    (save_sharded if sharded else atomic_save)(payload, path)
    return path


def final_step(ckpt_dir: str, sharded: bool = False) -> int | None:
    """The global step the final model (:func:`final_path`) holds; None if it is missing or
    unreadable (memory-mapped: the model's tensors are not read)."""
    path = final_path(ckpt_dir, sharded)
    meta = os.path.join(path, META_FILE) if sharded else path
    try:
        return int(_load_safely(meta, mmap=True)["global_step"])
    except Exception:  # noqa: BLE001 - any unreadable file is written again
        return None


def list_checkpoints(ckpt_dir: str) -> list[str]:
    """Complete checkpoints in ``ckpt_dir``, oldest first (temporary files are not listed): by
    step, and of one step by the time each was written. The one order of "newest": prune keeps
    its end and load_latest tries it from the end.

    Two checkpoints of one step are a plain file and a sharded folder (an earlier run's, and a
    run restarted over the folder with the other kind): the one written last is this run's,
    whatever the names' order. Equal times (a coarse clock) fall back to the name."""
    names = os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []
    found = []
    for m in filter(None, map(_NAME_RE.match, names)):
        with contextlib.suppress(FileNotFoundError):  # gone since the listing
            written = os.stat(os.path.join(ckpt_dir, m.group(0))).st_mtime_ns
            found.append((int(m.group(1)), written, m.group(0)))
    return [os.path.join(ckpt_dir, name) for *_, name in sorted(found)]


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot fsync a folder
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(
    path: str,
    write: Callable[[BinaryIO], Any],
    check: Callable[[str], None] | None = None,
) -> None:
    """Write ``path`` through ``write(file)`` into a temp file in the same folder, fsync,
    ``check(temp file)`` (raises to keep the old file), ``os.replace``, fsync the folder:
    readers see the old file or the new one, never half."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def atomic_save(obj: Any, path: str) -> None:
    """``torch.save`` through :func:`atomic_write`, checked to load with ``weights_only`` (as
    :func:`load_file` loads it; memory-mapped: the tensors are not read) before it takes the
    name: a state that would not load stops the save, not a resume that then starts over."""
    import torch

    def check_it_loads(tmp: str) -> None:
        try:
            try:
                _load_safely(tmp, mmap=True)
            except (OSError, RuntimeError):  # a file system that cannot map files: read it
                _load_safely(tmp)
        except pickle.UnpicklingError as exc:
            raise ValueError(
                f"{path}: torch.load(weights_only=True) refuses this state ({_refusal(exc)}); "
                "keep to tensors and plain python types (float(x) for a numpy number)"
            ) from None

    atomic_write(path, lambda f: torch.save(obj, f), check_it_loads)


def _load_safely(path: str, mmap: bool = False) -> Any:
    """``torch.load`` onto the CPU with ``weights_only``: tensors and plain python types only,
    so a file on shared scratch cannot run code when unpickled; numpy's RNG state (an array)
    is allow-listed by name."""
    import torch

    with torch.serialization.safe_globals(_numpy_globals()):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def _refusal(exc: BaseException) -> str:
    """What torch's refusal names (its message is a page long)."""
    named = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
    return f"it holds {named.group(1)}" if named else f"{str(exc).splitlines()[0]:.200}"


class UnsafeCheckpoint(ValueError):
    """An intact checkpoint holding a type ``torch.load(weights_only=True)`` refuses."""


# What stops a resume rather than skip the checkpoint as damaged: the file may be fine.
RESUME_STOPPERS = (OSError, MemoryError, UnsafeCheckpoint)


def save_sharded(state: dict[str, Any], path: str) -> None:
    """Collective: every rank's ``state["model"]`` and ``state["optimizer"]`` (sharded state
    dicts, ``Strategy.state(..., sharded=True)``) go through ``torch.distributed.checkpoint``
    into the folder ``path``, each rank writing its own part; rank 0 writes the rest of its
    ``state`` to :data:`META_FILE` in it. Atomic like :func:`atomic_save`: everything is
    written into ``.<name>.tmp.0`` beside it, renamed to ``path`` once complete, before any
    rank returns."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp.0")
    main = not dist.is_initialized() or dist.get_rank() == 0
    if main:
        _remove_folder(tmp)
        os.makedirs(tmp)
    if dist.is_initialized():
        dist.barrier()
    # a tensor every rank holds (DDP's buffers) is written from rank 0: the default plan
    # spreads those writes over the ranks, and rank 1's BatchNorm statistics are its own
    planner = dcp.DefaultSavePlanner(dedup_save_to_lowest_rank=True)
    parts = {k: state.pop(k) for k in ("model", "optimizer") if k in state}
    dcp.save(parts, checkpoint_id=tmp, planner=planner)
    if main:  # dcp.save returned: every rank's part is written
        atomic_save({**state, "model": None, "optimizer": None}, os.path.join(tmp, META_FILE))
        old = _rename_aside(path)
        os.replace(tmp, path)
        _fsync_dir(os.path.dirname(os.path.abspath(path)))
        if old:  # deleted once the new one has the name: a kill in a long rmtree loses nothing
            shutil.rmtree(old, ignore_errors=True)
    if dist.is_initialized():  # every rank returns once ``path`` is complete
        dist.barrier()


def _rename_aside(path: str) -> str | None:
    """Rename ``path`` (if there) to a temporary name beside it and return that: its name is
    free at once, even with a file inside held open (on NFS a .nfs* file stays until closed;
    rmtree then leaves the folder); a checkpoint's leftover goes with prune's temporary files
    (_TEMP_RE)."""
    if not os.path.exists(path):
        return None
    name = f".{os.path.basename(path)}.tmp.{secrets.randbelow(10**9) + 1}"
    aside = os.path.join(os.path.dirname(path), name)
    os.replace(path, aside)
    return aside


def _remove_folder(path: str) -> None:
    """:func:`_rename_aside`, then delete it."""
    if aside := _rename_aside(path):
        shutil.rmtree(aside, ignore_errors=True)


def _step(path: str) -> int:
    return int(_NAME_RE.match(os.path.basename(path)).group(1))  # type: ignore[union-attr]


def prune(
    ckpt_dir: str, keep_last: int, saved_step: int | None = None, log: Any = print
) -> list[str]:
    """Delete all but the newest ``keep_last`` checkpoints (0 or less keeps all), and the
    temporary files of interrupted saves of steps up to the newest complete checkpoint.

    Called by the one writer right after a save: a run's saves follow one another, so a
    temporary file of an earlier (or the same) step belongs to a save that was killed. With
    ``saved_step`` (the step just saved) checkpoints of later steps go too, with a line each:
    they are not this run's newest (a run started over them with ``resume=False``, or they did
    not load), yet by step they outrank it: kept, they would take the newest places, pruning
    the save just written, and a resume would choose them.
    """
    complete = list_checkpoints(ckpt_dir)
    later = [p for p in complete if saved_step is not None and _step(p) > saved_step]
    for p in later:  # aside, not deleted: one that did not load may be a mistake to mend
        aside = aside_name(p)
        os.replace(p, aside)
        log(
            f"hpc_harness: moving {p} aside to {aside}: a later step than this run's newest "
            f"({saved_step})"
        )
    complete = complete[: len(complete) - len(later)]
    old = complete[:-keep_last] if keep_last > 0 else []
    newest = _step(complete[-1]) if complete else -1
    for tmp in stale_temp_files(ckpt_dir):
        m = _TEMP_RE.match(os.path.basename(tmp))
        if m and int(m.group(1)) <= newest:
            old.append(tmp)
    for p in old:
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.exists(p):
            os.unlink(p)
    return old


def stale_temp_files(ckpt_dir: str) -> list[str]:
    """Temporary files left by a save that never finished (process killed mid-save)."""
    return sorted(glob.glob(os.path.join(glob.escape(ckpt_dir), ".ckpt_step*.tmp.*")))


def _numpy_globals() -> list[Any]:
    """What ``np.random.get_state()`` pickles to, for ``torch.load(weights_only=True)``."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    found: list[Any] = [_reconstruct, np.ndarray, np.dtype]
    if hasattr(np, "dtypes"):
        found.append(np.dtypes.UInt32DType)
    return found


def check_shards(folder: str) -> None:
    """Raise ValueError when a sharded checkpoint's ``.metadata`` or :data:`META_FILE` is
    missing, or a file that ``.metadata`` names is missing or shorter than the data it holds:
    damaged after the save (which is atomic), found before the checkpoint is chosen rather
    than in ``dcp.load`` at every requeue (or as a FileNotFoundError, which stops the resume)."""
    from torch.distributed.checkpoint import FileSystemReader

    for name in (".metadata", META_FILE):
        if not os.path.isfile(os.path.join(folder, name)):
            raise ValueError(f"damaged: {name} is missing")
    sizes: dict[str, int] = {}
    for info in FileSystemReader(folder).read_metadata().storage_data.values():
        name, end = info.relative_path, info.offset + info.length
        if name not in sizes:
            shard = os.path.join(folder, name)
            if not os.path.isfile(shard):
                raise ValueError(f"damaged: {name} is missing")
            sizes[name] = os.path.getsize(shard)
        if sizes[name] < end:
            raise ValueError(f"damaged: {name} is {sizes[name]} bytes, its data end at byte {end}")


REQUIRED_KEYS = ("model", "global_step")  # what load_file accepts (pieces.save_checkpoint)


def load_file(path: str) -> dict[str, Any]:
    """Load one checkpoint onto the CPU; raises if it is not a readable hpc_harness checkpoint.
    Of a sharded one (a folder) only the small part: ``model`` and ``optimizer`` are None and
    ``sharded`` is the folder, for ``Strategy.load``."""

    if os.path.isdir(path):
        check_shards(path)
        return {**load_file(os.path.join(path, META_FILE)), "sharded": path}

    try:
        state = _load_safely(path)
    except pickle.UnpicklingError as exc:
        if "Unsupported global" not in str(exc):  # else damaged: not a pickle torch can read
            raise
        raise UnsafeCheckpoint(
            f"{path} is intact but torch.load(weights_only=True) refuses it ({_refusal(exc)}): "
            "another program or an older hpc_harness wrote it; if you trust it, load it with "
            "weights_only=False and save its state again with plain types, or move it away"
        ) from None
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        raise ValueError("not a hpc_harness checkpoint (missing keys)")
    return state


def load_latest(ckpt_dir: str, log: Any = print) -> tuple[dict[str, Any] | None, str | None]:
    """Load the newest checkpoint that loads; warn about and skip any that do not.

    Returns ``(state, path)`` or ``(None, None)`` when there is nothing usable. One process's
    view: in a distributed job ``pieces.load_checkpoint`` calls it on rank 0 alone.
    """
    for tmp in stale_temp_files(ckpt_dir):
        log(f"hpc_harness: warning: ignoring incomplete checkpoint {tmp} (a save was interrupted)")
    for path in reversed(list_checkpoints(ckpt_dir)):
        try:
            state = load_file(path)
        except RESUME_STOPPERS:
            raise
        except Exception as exc:  # corrupt, truncated, or foreign file
            log(f"hpc_harness: warning: skipping unreadable checkpoint {path}: {exc!r:.200}")
            continue
        return state, path
    return None, None


# --------------------------------------------------------------------------- run identity

RUN_FILE = "run.json"
# This process's mark in the run.json it writes: the folder is this run's while run.json holds
# it; another mark (a later job resuming there) or no run.json (--fresh moved the folder aside)
# means another run took it over (takeover_error).
RUN_MARK = secrets.token_hex(8)
_claimed: set[str] = set()  # the folders this process wrote run.json into


class RunMismatch(ValueError):
    """The checkpoints in a folder belong to a run with other arguments (message says which)."""


def fingerprint(config: Mapping[str, Any], resume_free: Iterable[str] = ()) -> dict[str, Any]:
    """What defines the run: ``config`` without the keys in ``resume_free`` (the caller's
    arguments that may change across a resume: paths, logging, hardware, where it stops), as
    plain JSON types (:func:`plain`: a class of ``fsdp_wrap`` becomes its ``repr``), so it is
    compared as JSON and loads with ``weights_only=True``."""
    free = set(resume_free)
    return plain({k: v for k, v in config.items() if k not in free})


def plain(obj: Any) -> Any:
    """``obj`` as plain JSON types (sorted keys; what JSON cannot hold, see :func:`_as_text`):
    it loads with ``weights_only=True`` and reads the same in every process."""
    return json.loads(json.dumps(obj, sort_keys=True, default=_as_text))


def _as_text(value: Any) -> Any:
    """A value JSON cannot hold, as the same text in every process: a set sorted, a function
    by its name, anything else by its ``repr``, refused (ValueError) if that names a memory
    address (a set's order follows the hash seed, an address the process: each resume of the
    run would be refused as another run's)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if callable(value) and not isinstance(value, type) and hasattr(value, "__qualname__"):
        return f"{value.__module__}.{value.__qualname__}"
    text = repr(value)
    if " at 0x" in text:
        raise ValueError(
            f"{text} names a memory address, which differs in every process: give the run's "
            "arguments by name or number"
        )
    return text


def read_run_file(ckpt_dir: str) -> dict[str, Any] | None:
    """The folder's ``run.json``, or None when there is none (or it cannot be read)."""
    try:
        with open(os.path.join(ckpt_dir, RUN_FILE)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("fingerprint"), dict) else None


def slurm_attempt() -> tuple[str | None, int]:
    """This run of a SLURM job: its id and how often it was requeued (0 on the first)."""
    return os.environ.get("SLURM_JOB_ID"), int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def write_run_file(ckpt_dir: str, fp: Mapping[str, Any]) -> None:
    """Claim ``ckpt_dir`` for this run: write ``run.json`` (the fingerprint, the time, the SLURM
    job id, :data:`RUN_MARK`) atomically."""
    job_id, restarts = slurm_attempt()
    record = {
        "fingerprint": dict(fp),
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "slurm_job_id": job_id,
        "slurm_restart_count": restarts,
        "writer": RUN_MARK,
    }
    text = json.dumps(record, indent=1, sort_keys=True)
    atomic_write(os.path.join(ckpt_dir, RUN_FILE), lambda f: f.write(text.encode() + b"\n"))
    _claimed.add(os.path.abspath(ckpt_dir))


def takeover_error(ckpt_dir: str) -> str | None:
    """Why this process must not save into ``ckpt_dir`` any more: it claimed the folder
    (:func:`write_run_file`) and another run has taken it over since (a later job resuming
    there, or ``--fresh`` moving it aside); None while it is this run's or was never claimed."""
    folder = os.path.abspath(ckpt_dir)
    if folder not in _claimed:  # never claimed: no run.json to read at every save
        return None
    run = read_run_file(folder)
    if run is not None and run.get("writer") == RUN_MARK:
        return None
    by = f"SLURM job {run.get('slurm_job_id')}" if run else "run.json is gone: --fresh?"
    return (
        f"{ckpt_dir} was taken over by another run ({by}) since this one started: stopping "
        "without saving (one folder holds one run's checkpoints)"
    )


def identity_error(
    ckpt_dir: str,
    fp: Mapping[str, Any],
    saved: Mapping[str, Any] | None,
    resume_free: Iterable[str] = (),
) -> str | None:
    """The one-line message naming every key whose value differs (or exists in one only)
    between ``saved`` (a checkpoint's fingerprint, or ``run.json``'s when None) and ``fp``;
    None when they agree or nothing was recorded. Keys in ``resume_free`` are not compared:
    a saved fingerprint may hold one that its writer did not leave out."""
    if saved is None:
        saved = (read_run_file(ckpt_dir) or {}).get("fingerprint")
    if saved is None:
        return None
    missing, free = "<unset>", set(resume_free)
    diff = [
        f"{k} ({saved.get(k, missing)!r} -> {fp.get(k, missing)!r})"
        for k in sorted((set(saved) | set(fp)) - free)
        if saved.get(k, missing) != fp.get(k, missing)
    ]
    if not diff:
        return None
    return f"{ckpt_dir} holds checkpoints of another run: {', '.join(diff)} differ; {WAYS_OUT}"


WAYS_OUT = (
    "use another experiment (-e NEW, or another --ckpt-dir), or --fresh to start over (the old "
    "files are moved aside, not deleted)"
)


def past_end_error(ckpt_dir: str, step: int, end_name: str, end: int) -> str:
    """The one-line refusal of a resumed checkpoint of global ``step`` past the run's last step
    (``end_name`` ``end``, which may grow across a resume): a longer run wrote it, and its
    results are not this run's."""
    return (
        f"{ckpt_dir} holds a checkpoint of global step {step}, past {end_name} {end}: it "
        f"belongs to a longer run; {WAYS_OUT}"
    )


def aside_name(path: str) -> str:
    """A free name beside ``path`` for an earlier run's files: ``<path>.old-<UTC time>``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = f"{path}.old-{stamp}"
    n = 1
    while os.path.exists(aside):
        n += 1
        aside = f"{path}.old-{stamp}-{n}"
    return aside


def move_aside(ckpt_dir: str, attempt: tuple[str | None, int] = (None, 0)) -> str | None:
    """``--fresh``: rename ``ckpt_dir`` to ``<ckpt_dir>.old-<UTC time>`` (never deletes);
    returns the new name, or None when there was nothing to move.

    A requeued job runs its command again, ``--fresh`` included: when ``run.json`` was written
    by an earlier run of this same SLURM job (``attempt``: :func:`slurm_attempt`, the job id
    and a higher restart count), the folder is this run's own and is left alone, so the
    requeued job resumes instead of starting over again. The same job and restart count is
    a command run again in the job's allocation (a second ``srun``): moved aside. Through a
    symlink (checkpoints on scratch), the folder it points to goes aside beside itself and
    an empty one takes its place: the link stays."""
    folder = os.path.realpath(ckpt_dir)
    if not os.path.isdir(folder) or not os.listdir(folder):
        return None
    run, (job_id, restarts) = read_run_file(folder), attempt
    if job_id and run is not None and run.get("slurm_job_id") == job_id:
        if run.get("slurm_restart_count", -1) < restarts:
            return None
    aside = aside_name(folder)
    os.rename(folder, aside)
    if os.path.islink(ckpt_dir.rstrip("/")):
        os.mkdir(folder)
    return aside


# --------------------------------------------------------------------------- RNG


def capture_rng() -> dict[str, Any]:
    """This process's RNG states: torch CPU, CUDA (if any), numpy, python."""
    import numpy as np
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if cuda else None,
    }


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
