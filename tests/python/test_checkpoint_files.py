"""The files the checkpoint module writes and deletes, in-process: ``run.json``'s exact text,
what ``read_run_file`` accepts, the run-identity message read from ``run.json``, the
fingerprint's JSON form, what ``prune`` deletes, how ``atomic_write`` writes (temp file beside
the target, the pause, the folder's fsync), the CUDA RNG capture (CUDA faked: no GPU here),
and ``pieces``' view of the process group (torch.distributed faked in this process)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_pieces import TwoRanks

from hpc_harness import checkpoint as ckpt
from hpc_harness import pieces as hp

FROZEN = (2026, 11, 23, 20, 5, 9, 0, 327, 0)  # a Monday evening, UTC


def _freeze_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setattr(ckpt.time, "gmtime", lambda *_: time.struct_time(FROZEN))


# --------------------------------------------------------------------------- run.json


def test_run_json_holds_the_sorted_fingerprint_the_utc_time_and_the_job_id(
    tmp_path, monkeypatch
) -> None:
    """run.json is indented by one, keys sorted at every level, the time in UTC ISO form,
    the SLURM job id from $SLURM_JOB_ID (null outside a job), this process's writer mark, and
    a final newline."""
    _freeze_utc(monkeypatch)
    monkeypatch.setattr(ckpt, "RUN_MARK", "0123456789abcdef")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    ckpt.write_run_file(str(tmp_path), {"lr": 0.1, "hidden": [8, 4]})
    assert (tmp_path / "run.json").read_text() == (
        "{\n"
        ' "fingerprint": {\n'
        '  "hidden": [\n'
        "   8,\n"
        "   4\n"
        "  ],\n"
        '  "lr": 0.1\n'
        " },\n"
        ' "slurm_job_id": "4242",\n'
        ' "slurm_restart_count": 0,\n'
        ' "writer": "0123456789abcdef",\n'
        ' "written": "2026-11-23T20:05:09Z"\n'
        "}\n"
    )
    assert os.listdir(tmp_path) == ["run.json"]  # no temp file left behind

    monkeypatch.delenv("SLURM_JOB_ID")
    ckpt.write_run_file(str(tmp_path), {"lr": 0.2})
    assert ckpt.read_run_file(str(tmp_path)) == {
        "fingerprint": {"lr": 0.2},
        "slurm_job_id": None,
        "slurm_restart_count": 0,
        "writer": "0123456789abcdef",
        "written": "2026-11-23T20:05:09Z",
    }


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2]",  # JSON, but not an object
        '{"written": "2026-11-23T20:05:09Z"}',  # no fingerprint
        '{"fingerprint": ["lr", 0.1]}',  # a fingerprint that is not an object
        '{"fingerprint": null}',
        '{"fingerprint": ',  # cut short
    ],
)
def test_a_run_json_without_a_fingerprint_object_counts_as_none(tmp_path, text: str) -> None:
    """read_run_file gives None for a run.json it cannot use, so identity is not checked
    against it (and --fresh of a requeued job does not trust it)."""
    (tmp_path / "run.json").write_text(text)
    assert ckpt.read_run_file(str(tmp_path)) is None
    assert ckpt.identity_error(str(tmp_path), {"lr": 0.1}, None) is None


def test_without_a_checkpoints_fingerprint_run_json_decides_with_the_whole_message(
    tmp_path,
) -> None:
    """With no fingerprint from a checkpoint (saved=None), the one in run.json is compared;
    the message names each differing key in sorted order ('<unset>' for a missing one) and
    says what to do."""
    folder = str(tmp_path / "ck")
    assert ckpt.identity_error(folder, {"lr": 0.2}, None) is None  # nothing recorded yet
    ckpt.write_run_file(folder, {"lr": 0.1, "layers": 2})
    assert ckpt.identity_error(folder, {"layers": 2, "lr": 0.1}, None) is None
    assert ckpt.identity_error(folder, {"lr": 0.2, "seed": 3, "layers": 2}, None) == (
        f"{folder} holds checkpoints of another run: lr (0.1 -> 0.2), seed ('<unset>' -> 3) "
        "differ; use another experiment (-e NEW, or another --ckpt-dir), or --fresh to start "
        "over (the old files are moved aside, not deleted)"
    )


# --------------------------------------------------------------------------- fingerprint


def test_the_fingerprint_is_plain_json_with_sorted_keys_and_classes_as_their_repr() -> None:
    """What JSON cannot hold (a class) becomes its repr, tuples become lists, and the keys
    come out sorted at every level whatever order the arguments were given in, so the same
    run stores the same fingerprint (and it loads with weights_only=True)."""
    config = {
        "model": torch.nn.Linear,
        "lr": 0.1,
        "ckpt_dir": "/scratch/ck",  # free to change across a resume: left out
        "betas": (0.9, 0.99),
        "sched": {"warmup": 5, "kind": "cos"},
    }
    fp = ckpt.fingerprint(config, resume_free=["ckpt_dir"])
    assert fp == {
        "betas": [0.9, 0.99],
        "lr": 0.1,
        "model": "<class 'torch.nn.modules.linear.Linear'>",
        "sched": {"kind": "cos", "warmup": 5},
    }
    assert list(fp) == ["betas", "lr", "model", "sched"]
    assert list(fp["sched"]) == ["kind", "warmup"]


# --------------------------------------------------------------------------- the final model


def test_final_step_is_last_pts_step_read_memory_mapped(tmp_path, monkeypatch) -> None:
    """A resumed run that had finished compares it with its checkpoint's step; the model's
    tensors are not read for it (mmap)."""
    assert ckpt.final_path(str(tmp_path)) == str(tmp_path / "last.pt")  # plain by default
    assert ckpt.final_step(str(tmp_path)) is None  # missing: written again
    ckpt.save_final(str(tmp_path), {"model": {"w": torch.zeros(3)}, "global_step": 7})
    mmaps, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: mmaps.append(kw["mmap"]) or load(*a, **kw))
    assert ckpt.final_step(str(tmp_path)) == 7  # last.pt, not last.dcp, by default
    assert mmaps == [True]


# --------------------------------------------------------------------------- prune


def _checkpoints(folder: str, steps: tuple[int, ...]) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = [ckpt.checkpoint_path(folder, s) for s in steps]
    for p in paths:
        with open(p, "wb") as f:
            f.write(b"ckpt")
    return paths


def test_keep_last_zero_or_less_keeps_every_checkpoint_and_one_keeps_the_newest(
    tmp_path,
) -> None:
    d = str(tmp_path)
    paths = _checkpoints(d, (1, 2, 3))
    for keep_last in (0, -1, -2):
        assert ckpt.prune(d, keep_last) == []
        assert ckpt.list_checkpoints(d) == paths
    assert ckpt.prune(d, 1) == paths[:2]
    assert ckpt.list_checkpoints(d) == paths[2:]


def test_without_a_complete_checkpoint_prune_keeps_every_temp_file(tmp_path) -> None:
    """A temp file is only stale once a save of the same or a later step completed: with no
    complete checkpoint, not even the temp files of steps 0 and 1 are deleted."""
    d = str(tmp_path)
    temps = [os.path.join(d, f".ckpt_step{s:08d}.pt.tmp.7") for s in (0, 1, 2)]
    for t in temps:
        with open(t, "wb") as f:
            f.write(b"half")
    assert ckpt.prune(d, 3) == []
    assert ckpt.stale_temp_files(d) == temps
    assert ckpt.prune(str(tmp_path / "absent"), 3) == []
    _checkpoints(d, (1,))
    assert ckpt.prune(d, 3) == temps[:2]  # steps 0 and 1 <= 1: killed saves
    assert ckpt.stale_temp_files(d) == temps[2:]


def _sharded(folder: str, step: int, names: tuple[str, ...]) -> str:
    path = ckpt.checkpoint_path(folder, step, sharded=True)
    os.makedirs(path)
    for name in names:
        with open(os.path.join(path, name), "wb") as f:
            f.write(b"part")
    return path


def test_old_sharded_checkpoints_are_deleted_as_whole_folders(tmp_path) -> None:
    d = str(tmp_path)
    old = _sharded(d, 1, (".metadata", "__0_0.distcp", "meta.pt"))
    new = _sharded(d, 2, (".metadata", "__0_0.distcp", "meta.pt"))
    assert ckpt.prune(d, 1) == [old]
    assert os.listdir(d) == [os.path.basename(new)]


def test_a_sharded_folder_that_cannot_be_emptied_does_not_stop_the_run(
    tmp_path, monkeypatch
) -> None:
    """A file that cannot be deleted inside an old .dcp folder (on NFS, a .nfs* file that
    another process still holds open: EBUSY; faked here) leaves that file behind, but prune
    deletes the rest and returns normally: the run goes on."""
    d = str(tmp_path)
    old = _sharded(d, 1, ("__0_0.distcp", ".nfs0000000000000001", "meta.pt"))
    _sharded(d, 2, ("meta.pt",))
    real_unlink = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if os.path.basename(path).startswith(".nfs"):
            raise OSError(errno.EBUSY, "Device or resource busy", path)
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    assert ckpt.prune(d, 1) == [old]
    assert os.listdir(old) == [".nfs0000000000000001"]


# --------------------------------------------------------------------------- atomic_write


def test_the_temp_file_is_beside_the_target_whatever_the_current_folder(
    tmp_path, monkeypatch
) -> None:
    """The temp file is ``.<name>.tmp.<pid>`` in the target's folder (same file system, so
    os.replace is atomic), not in the current folder; it is gone once the file is there."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "ck"
    target = folder / "ckpt_step00000001.pt"
    names: list[str] = []

    def write(f: Any) -> None:
        names.append(f.name)
        f.write(b"data")

    ckpt.atomic_write(str(target), write)
    assert names == [str(folder / f".ckpt_step00000001.pt.tmp.{os.getpid()}")]
    assert os.listdir(folder) == ["ckpt_step00000001.pt"] and target.read_bytes() == b"data"
    assert os.listdir(tmp_path) == ["ck"]


def test_the_check_sees_the_complete_temp_file_before_the_rename(tmp_path) -> None:
    """check(temp file) runs once the data is written and before the target takes the name;
    a check that raises keeps the old file."""
    d = str(tmp_path)
    seen: list = []

    def check(tmp: str) -> None:
        seen.append((os.path.basename(tmp), open(tmp, "rb").read(), sorted(os.listdir(d))))

    ckpt.atomic_write(os.path.join(d, "x.pt"), lambda f: f.write(b"1"), check)
    tmp = f".x.pt.tmp.{os.getpid()}"
    assert seen == [(tmp, b"1", [tmp])]

    def refuse(tmp: str) -> None:
        raise ValueError("no")

    with pytest.raises(ValueError):
        ckpt.atomic_write(os.path.join(d, "x.pt"), lambda f: f.write(b"2"), refuse)
    assert os.listdir(d) == ["x.pt"] and open(os.path.join(d, "x.pt"), "rb").read() == b"1"


def test_a_failed_write_leaves_no_temp_file_and_raises(tmp_path) -> None:
    def write(f: Any) -> None:
        f.write(b"half")
        raise RuntimeError("disk quota exceeded")

    with pytest.raises(RuntimeError, match="disk quota exceeded"):
        ckpt.atomic_write(str(tmp_path / "x.pt"), write)
    assert os.listdir(tmp_path) == []


def _record_fsyncs(
    monkeypatch: pytest.MonkeyPatch, fsync: Callable[[int], None] | None = None
) -> list[tuple[str, Any]]:
    """os.open / os.fsync / os.close wrapped: records ("open", path), ("fsync", what) with
    what the path opened by os.open or "file", and ("close", path)."""
    calls: list[tuple[str, Any]] = []
    opened: dict[int, str] = {}
    real_open, real_fsync, real_close = os.open, os.fsync, os.close

    def fake_open(path: str, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, flags, *args, **kwargs)
        if flags == os.O_RDONLY:
            calls.append(("open", path))
            opened[fd] = path
        return fd

    def fake_fsync(fd: int) -> None:
        calls.append(("fsync", opened.get(fd, "file")))
        (fsync or real_fsync)(fd)

    def fake_close(fd: int) -> None:
        if fd in opened:
            calls.append(("close", opened.pop(fd)))
        real_close(fd)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "fsync", fake_fsync)
    monkeypatch.setattr(os, "close", fake_close)
    return calls


def test_the_file_then_its_folder_are_fsynced(tmp_path, monkeypatch) -> None:
    """The temp file is fsync'ed before the rename, then the folder (opened read-only, then
    closed), so the new name itself survives a crash of the node."""
    calls = _record_fsyncs(monkeypatch)
    ckpt.atomic_write(str(tmp_path / "x.pt"), lambda f: f.write(b"1"))
    assert calls == [
        ("fsync", "file"),
        ("open", str(tmp_path)),
        ("fsync", str(tmp_path)),
        ("close", str(tmp_path)),
    ]


def test_a_file_system_that_cannot_fsync_a_folder_still_gets_the_file(
    tmp_path, monkeypatch
) -> None:
    """Some file systems refuse fsync on a folder (EINVAL; faked here): the write still
    succeeds and the folder's descriptor is closed."""

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")

    calls = _record_fsyncs(monkeypatch, fsync)
    ckpt.atomic_write(str(tmp_path / "x.pt"), lambda f: f.write(b"1"))
    assert (tmp_path / "x.pt").read_bytes() == b"1"
    assert calls[-1] == ("close", str(tmp_path))


# --------------------------------------------------------------------------- RNG


@pytest.mark.parametrize(
    ("available", "initialized", "captured"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_cuda_rng_is_captured_only_once_cuda_is_in_use(
    monkeypatch, available: bool, initialized: bool, captured: bool
) -> None:
    """torch.cuda faked (no GPU here): the CUDA states are captured when CUDA is there and
    initialised (a process that never touched the GPU has nothing to save), else None."""
    states = [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    rng = ckpt.capture_rng()
    assert sorted(rng) == ["cuda", "numpy", "python", "torch"]
    assert rng["cuda"] is (states if captured else None)
    assert torch.equal(rng["torch"], torch.get_rng_state())


# --------------------------------------------------------------------------- pieces


class _RanksAsTorch(TwoRanks):
    """TwoRanks with torch's broadcast_object_list signature: src has no usable default."""

    def broadcast_object_list(self, box: list, src: int | None = None) -> None:
        if src is None:
            raise ValueError("Must specify global_rank or group_rank")
        super().broadcast_object_list(box, src=src)


@pytest.mark.parametrize(("initialized", "world_size"), [(True, 2), (True, 1), (False, 2)])
def test_from_rank0_broadcasts_only_in_a_group_of_more_than_one(
    monkeypatch, initialized: bool, world_size: int
) -> None:
    """torch.distributed faked in this process: a group of two makes pieces collective
    (rank 1 gets what rank 0 sent, from src 0); a group of one, or none, does not."""
    rank0 = _RanksAsTorch(rank=0)
    monkeypatch.setattr(dist, "is_initialized", lambda: initialized)
    monkeypatch.setattr(dist, "get_world_size", lambda: world_size)
    monkeypatch.setattr(dist, "broadcast_object_list", rank0.broadcast_object_list)
    distributed = initialized and world_size > 1
    assert hp._group() is (dist if distributed else None)
    assert hp.from_rank0({"step": 5}) == {"step": 5}
    assert rank0.sent == ([{"step": 5}] if distributed else None)
    rank1 = _RanksAsTorch(rank=1, sent=[{"step": 5}])
    monkeypatch.setattr(dist, "broadcast_object_list", rank1.broadcast_object_list)
    assert hp.from_rank0({"step": 0}) == {"step": 5 if distributed else 0}
