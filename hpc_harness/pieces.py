"""The pieces that make your own training loop survive SLURM (the user keeps the loop).

About ten added lines: the recipe is in docs/harness.md ("Your own loop: the pieces"), where a
test runs it as written; hpc_harness/examples/charlm.py is a whole program built on it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace
from typing import Any, NoReturn

import torch

from hpc_harness import checkpoint as ckpt
from hpc_harness import pruning
from hpc_harness.data import ResumableSampler, shield_workers
from hpc_harness.dist import DistContext, barrier, cleanup, say, setup
from hpc_harness.dist import group as _group
from hpc_harness.signals import (
    REQUEUE_EXIT_CODE,
    StopAgreement,
    signals_blocked,
    write_requeue_marker,
)
from hpc_harness.strategy import FixedOrderReduction, Strategy, average_gradients

__all__ = [
    "REQUEUE_EXIT_CODE",
    "DistContext",
    "FixedOrderReduction",
    "ResumableSampler",
    "StopAgreement",
    "announce_requeue",
    "average_gradients",
    "barrier",
    "cleanup",
    "from_rank0",
    "gather_rng",
    "load_checkpoint",
    "load_state",
    "on_rank0",
    "requeue_exit",
    "save_checkpoint",
    "save_final",
    "setup",
    "shield_workers",
    "should_stop_trial",
    "signals_blocked",
    "start_fresh",
    "state_dicts",
]


def _rank() -> int:
    return _group().get_rank() if _group() else 0


def from_rank0(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank. Collective when distributed."""
    if (dist := _group()) is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_rank0(work: Callable[[], Any]) -> Any:
    """``work()`` on rank 0 alone; its result on every rank, or its exception raised on every
    rank (raised on rank 0 alone, the others would wait in their next collective until rank
    0's process is gone, or NCCL's timeout). Collective when distributed."""
    result, error = None, None
    if _rank() == 0:
        try:
            result = work()
        except Exception as exc:  # noqa: BLE001 - every rank raises it below
            error = exc
    result, error = from_rank0((result, error))
    if error is not None:
        raise error
    return result


def gather_rng(extra: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every rank's RNG states (torch, cuda, numpy, python; plus ``extra``), in rank order.
    Collective."""
    mine = {**ckpt.capture_rng(), **(extra or {})}
    if (dist := _group()) is None:
        return [mine]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def save_checkpoint(
    ckpt_dir: str,
    state: dict[str, Any] | None,
    step: int,
    keep_last: int = 3,
    rng_extra: Mapping[str, Any] | None = None,
    write: Callable[[dict[str, Any], str], None] = ckpt.atomic_save,
    sharded: bool = False,
) -> str:
    """Rank 0 writes ``state`` (other ranks may pass None; at least ``model`` and
    ``global_step``, plain tensors and python types: it is loaded with ``weights_only=True``)
    with every rank's RNG states atomically to ``<ckpt_dir>/ckpt_step<step>.pt`` (the name is
    checkpoint.checkpoint_path's) and keeps the newest ``keep_last``; returns
    the path once every rank is past the write. With ``sharded`` every rank passes its own part
    of ``model`` and ``optimizer`` (``Strategy.state(..., sharded=True)``) and writes it into the
    folder ``ckpt_step<step>.dcp`` (checkpoint.save_sharded). Collective: call on every rank at
    the same step."""

    def check() -> None:  # rank 0's state: the others may pass None
        if missing := [key for key in ckpt.REQUIRED_KEYS if key not in (state or {})]:
            needs = " and ".join(repr(key) for key in ckpt.REQUIRED_KEYS)
            raise ValueError(
                f"save_checkpoint: the state has no {', '.join(map(repr, missing))}; a checkpoint "
                f"needs {needs} (load_checkpoint skips a file without them)"
            )
        if error := ckpt.takeover_error(ckpt_dir):
            raise ckpt.RunMismatch(error)

    on_rank0(check)
    rng = gather_rng(rng_extra)
    path = ckpt.checkpoint_path(ckpt_dir, step, sharded)
    if sharded:
        ckpt.save_sharded({**(state or {}), "rng": rng}, path)

    def write_and_prune() -> None:
        if not sharded:
            write({**(state or {}), "rng": rng}, path)
        ckpt.prune(ckpt_dir, keep_last, step, log=say)

    on_rank0(write_and_prune)  # every rank is past the write (a sharded one: save_sharded)
    return path


def save_final(ckpt_dir: str, state: dict[str, Any] | None, sharded: bool = False) -> str:
    """The run's final model: rank 0 writes ``state`` (at least ``model`` and ``global_step``;
    the others may pass None) atomically to ``<ckpt_dir>/last.pt``; with ``sharded`` every rank
    writes its part of ``state["model"]`` into the folder ``last.dcp``. Returns the path once
    it is written. Collective."""
    if sharded:
        return ckpt.save_final(ckpt_dir, state or {}, sharded=True)
    return on_rank0(lambda: ckpt.save_final(ckpt_dir, state or {}))


def load_checkpoint(
    ckpt_dir: str,
    restore_rng: bool = True,
    fingerprint: Mapping[str, Any] | None = None,
    rank0_only: tuple[str, ...] = (),
    resume_free: Iterable[str] = (),
) -> dict[str, Any] | None:
    """The newest checkpoint that loads, as chosen and read by rank 0 alone (in its view of
    ``ckpt_dir``: a stale NFS listing elsewhere does not matter), on every rank; None if there
    is none. ``state["path"]`` is its path and ``state["rng"]`` this rank's RNG states, restored
    (unless ``restore_rng`` is False) when the world size is the one that saved them, else None
    with a warning: dropout then goes on as if uninterrupted, provided nothing else draws from
    the global RNG before the next step (give the DataLoader a ``generator`` of its own, seeded
    with ``sampler.worker_seed()`` at each epoch's start). The keys in ``rank0_only`` are not
    sent (None on the other ranks): ``("model", "optimizer")`` for ``Strategy.load``, which
    broadcasts them itself. With
    ``fingerprint`` (checkpoint.fingerprint of the run's arguments), a checkpoint or ``run.json``
    of another run raises checkpoint.RunMismatch on every rank, before anything is loaded into
    the model; keys in ``resume_free`` are not compared (checkpoint.identity_error).
    Collective: call on every rank."""
    rank, world = _rank(), _group().get_world_size() if _group() else 1
    state: dict[str, Any] | None = None

    def choose() -> tuple[str | None, dict[str, Any] | None]:
        nonlocal state
        state, path = ckpt.load_latest(ckpt_dir, log=say)
        if fingerprint is not None:
            saved = state.get("fingerprint") if state is not None else None
            if state is not None and saved is None:
                say(
                    f"hpc_harness: warning: {path} has no run fingerprint (an older hpc_harness "
                    "wrote it): resuming without checking that it belongs to this run"
                )
            if mismatch := ckpt.identity_error(ckpt_dir, fingerprint, saved, resume_free):
                raise ckpt.RunMismatch(mismatch)
            ckpt.write_run_file(ckpt_dir, fingerprint)  # claimed: see save_checkpoint
        return path, {k: v for k, v in state.items() if k not in rank0_only} if state else None

    path, rest = on_rank0(choose)  # what stops the resume stops it on every rank
    if rest is None:
        return None
    state = state if rank == 0 else {**rest, **dict.fromkeys(rank0_only)}
    rng = state.get("rng") or []
    if len(rng) != world and rank == 0:
        say(
            f"hpc_harness: warning: {path} has RNG states for {len(rng)} ranks, world size is "
            f"{world}: not restored (the run will not match an uninterrupted one)"
        )
    mine = rng[rank] if len(rng) == world else None
    if restore_rng and mine is not None:
        ckpt.restore_rng(mine)
    if rank == 0:
        say(f"hpc_harness: resumed from {path} (global step {state['global_step']})")
    return {**state, "path": path, "rng": mine}


def _saving_half() -> Strategy:
    """A Strategy for its save and load alone: the user's loop wrapped the model itself."""
    world = _group().get_world_size() if _group() else 1
    where = SimpleNamespace(world_size=world, local_world_size=1, device=torch.device("cpu"))
    return Strategy("ddp", where)


def state_dicts(model: Any, optimizer: Any) -> dict[str, Any]:
    """``{"model", "optimizer"}`` for :func:`save_checkpoint`: keyed by parameter name, whole
    tensors on rank 0's CPU (empty on the others), under DDP, FSDP or none
    (Strategy.state). Collective."""
    model_state, optim_state = _saving_half().state(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}


def load_state(model: Any, optimizer: Any, state: dict[str, Any]) -> None:
    """Rank 0's ``state["model"]`` and ``state["optimizer"]`` (:func:`state_dicts`; from
    ``load_checkpoint(..., rank0_only=("model", "optimizer"))``) into every rank: the tensors
    are broadcast from rank 0 (torch's ``broadcast_from_rank0``), not pickled whole into every
    rank's memory. Collective."""
    _saving_half().load(model, optimizer, state)


def start_fresh(ckpt_dir: str, run_dir: str | None = None) -> None:
    """``--fresh``: rank 0 moves an earlier run's ``ckpt_dir`` aside (renamed, never deleted;
    not this same job's own folder at a requeue, see checkpoint.move_aside), and with it
    ``run_dir`` (metrics.csv, the W&B run id) when it is a folder of its own, and says where
    they are. Collective: call on every rank before :func:`load_checkpoint`."""

    def move() -> None:
        moved = [ckpt.move_aside(ckpt_dir, ckpt.slurm_attempt())]
        if moved[0] is None:
            return
        ck, run = os.path.abspath(ckpt_dir), os.path.abspath(run_dir or ckpt_dir)
        if os.path.commonpath([run, ck]) not in (run, ck):  # neither holds the other
            moved.append(ckpt.move_aside(run))
        where = " and ".join(m for m in moved if m)
        say(f"hpc_harness: starting fresh; the earlier run's files are in {where}")

    on_rank0(move)


def announce_requeue(step: int, epoch: int, checkpoint: str, stop: StopAgreement) -> None:
    """After a complete checkpoint at a signal: rank 0 writes the requeue marker
    (``$HPC_REQUEUE_MARKER``) and says so; every rank returns once it is written. torchrun's
    agent takes a worker's exit 42 for a failure and stops the others (SIGTERM): a rank that
    left sooner could stop rank 0 before the marker exists, and the job would not be requeued.
    Collective."""
    on_rank0(lambda: write_requeue_marker(step, epoch, checkpoint, stop.signal_name))


def requeue_exit(step: int, epoch: int, checkpoint: str, stop: StopAgreement) -> NoReturn:
    """:func:`announce_requeue`, then every rank leaves the process group and exits 42."""
    announce_requeue(step, epoch, checkpoint, stop)
    cleanup()
    sys.exit(REQUEUE_EXIT_CODE)


def should_stop_trial(value: Any, step: int) -> bool:
    """True when the sweep's ``early_terminate`` prunes this trial at ``step`` (epochs done, from
    1): save a checkpoint and exit 0. ``value``: the sweep's metric, or a dict holding it; rank
    0's counts. False at once outside such a sweep. Collective in one (hpc_harness/pruning.py)."""
    if pruning.config() is None:  # the same on every rank: no collective
        return False
    return bool(on_rank0(lambda: pruning.report(value, step)))
