"""Atomic checkpoints: temp + rename, keep-last-K, corrupt/partial newest skipped, RNG."""

from __future__ import annotations

import glob
import os
import random
import re
import signal
import subprocess
import textwrap

import numpy as np
import pytest
import torch
from conftest import HANG_GUARD_S, PY, clean_env, wait_for

from hpc_harness import checkpoint as ckpt


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((3,), float(step))}, "global_step": step}


def test_atomic_save_and_keep_last(tmp_path) -> None:
    d = str(tmp_path)
    for step in (5, 10, 15, 20):
        ckpt.atomic_save(_state(step), ckpt.checkpoint_path(d, step))
        ckpt.prune(d, keep_last=2)
    names = sorted(os.listdir(d))
    assert names == ["ckpt_step00000015.pt", "ckpt_step00000020.pt"]  # no temp files left
    state, path = ckpt.load_latest(d)
    assert state["global_step"] == 20 and path.endswith("ckpt_step00000020.pt")


def test_corrupt_newest_is_skipped_with_a_warning(tmp_path) -> None:
    d = str(tmp_path)
    ckpt.atomic_save(_state(1), ckpt.checkpoint_path(d, 1))
    ckpt.atomic_save(_state(2), ckpt.checkpoint_path(d, 2))
    with open(ckpt.checkpoint_path(d, 2), "r+b") as f:  # truncate: a half-copied file
        f.truncate(40)
    said: list[str] = []
    state, path = ckpt.load_latest(d, log=said.append)
    assert state["global_step"] == 1
    assert any("skipping unreadable checkpoint" in s and "00000002" in s for s in said)


def test_empty_folder_has_nothing_to_resume(tmp_path) -> None:
    assert ckpt.load_latest(str(tmp_path / "none")) == (None, None)


def test_kill_9_mid_save_leaves_previous_checkpoint_usable(tmp_path) -> None:
    d = tmp_path / "ck dir"  # a space in the path on purpose
    script = textwrap.dedent(
        """
        import sys, torch
        from hpc_harness import checkpoint as ckpt
        d = sys.argv[1]
        ckpt.atomic_save({"model": {"w": torch.zeros(1)}, "global_step": 1},
                         ckpt.checkpoint_path(d, 1))
        big = torch.randn(40_000_000)  # 160 MB: the save takes a while
        step = 2
        while True:
            ckpt.atomic_save({"model": {"w": big}, "global_step": step},
                             ckpt.checkpoint_path(d, step))
            step += 1
        """
    )
    proc = subprocess.Popen([PY, "-c", script, str(d)], env=clean_env())
    try:
        # Kill only while a save runs AFTER a complete one: the temp file of the
        # first (tiny) save can also be seen, and killing then leaves nothing to resume.
        wait_for(
            lambda: (
                bool(ckpt.list_checkpoints(str(d)))
                and any(".ckpt_step00000001." not in t for t in ckpt.stale_temp_files(str(d)))
            ),
            HANG_GUARD_S,
            "a complete checkpoint, then a .tmp file of a later save mid-write",
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    tmps = ckpt.stale_temp_files(str(d))
    assert tmps, "the kill should have left the partial temp file behind"
    complete = ckpt.list_checkpoints(str(d))
    said: list[str] = []
    state, path = ckpt.load_latest(str(d), log=said.append)
    assert path == complete[-1], "resume must use the newest COMPLETE checkpoint"
    assert state["global_step"] == int(os.path.basename(path)[9:17])
    assert any("ignoring incomplete checkpoint" in s and tmps[0] in s for s in said)


def test_rng_capture_and_restore_round_trip() -> None:
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    saved = ckpt.capture_rng()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(100)
    np.random.rand(100)
    random.random()
    ckpt.restore_rng(saved)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], got[0])
    assert np.array_equal(expected[1], got[1]) and expected[2] == got[2]


def test_prune_removes_temp_files_of_killed_saves_once_a_later_save_completes(tmp_path) -> None:
    d = str(tmp_path)
    ckpt.atomic_save(_state(10), ckpt.checkpoint_path(d, 10))
    for step, pid in ((20, 111), (30, 222)):  # what two saves killed mid-write leave behind
        with open(os.path.join(d, f".ckpt_step{step:08d}.pt.tmp.{pid}"), "wb") as f:
            f.write(b"partial")
    ckpt.prune(d, keep_last=0)
    assert len(ckpt.stale_temp_files(d)) == 2, "no save past those steps yet: keep them"
    ckpt.atomic_save(_state(20), ckpt.checkpoint_path(d, 20))
    removed = ckpt.prune(d, keep_last=3)
    assert removed == [os.path.join(d, ".ckpt_step00000020.pt.tmp.111")]
    assert ckpt.stale_temp_files(d) == [os.path.join(d, ".ckpt_step00000030.pt.tmp.222")]
    assert [os.path.basename(p) for p in ckpt.list_checkpoints(d)] == [
        "ckpt_step00000010.pt",
        "ckpt_step00000020.pt",
    ]


def test_fingerprint_leaves_out_what_may_change_across_a_resume() -> None:
    a = {"lr": 0.1, "hidden": 8, "precision": "32", "strategy": "ddp", "ckpt_dir": "a"}
    b = {"lr": 0.1, "hidden": 8, "precision": "bf16-mixed", "strategy": "fsdp", "ckpt_dir": "b"}
    free = ("precision", "strategy", "ckpt_dir")  # the caller's, nothing built in
    assert ckpt.fingerprint(a, free) == ckpt.fingerprint(b, free) == {"hidden": 8, "lr": 0.1}
    assert ckpt.fingerprint(a) == ckpt.plain(a)
    c = ckpt.fingerprint({**a, "lr": 0.2, "layers": 3}, free)
    error = ckpt.identity_error("ck", c, ckpt.fingerprint(a, free))
    assert error.startswith("ck holds checkpoints of another run: layers ('<unset>' -> 3), lr ")
    assert "lr (0.1 -> 0.2) differ; " in error
    assert ckpt.identity_error("ck", c, c) is None


def test_fresh_moves_the_folder_aside_but_not_for_a_requeue_of_the_same_job(
    tmp_path, monkeypatch
) -> None:
    folder = str(tmp_path / "ck")
    ckpt.atomic_save(_state(4), ckpt.checkpoint_path(folder, 4))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)  # the job's first run: 0
    ckpt.write_run_file(folder, {"lr": 0.1})
    assert ckpt.read_run_file(folder)["slurm_restart_count"] == 0
    assert ckpt.move_aside(folder, ("77", 1)) is None  # requeued: this job's own run
    assert ckpt.move_aside(folder, ("77", 2)) is None  # twice
    # the same job and run again in its allocation (a second srun --fresh): moved, as it
    # was not before (it resumed)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    ckpt.write_run_file(folder, {"lr": 0.1})
    assert ckpt.move_aside(folder, ("77", 1)) is not None
    os.rename(glob.glob(f"{folder}.old-*")[0], folder)
    aside = ckpt.move_aside(folder, ("78", 0))
    assert aside and os.path.basename(aside).startswith("ck.old-")
    assert not os.path.exists(folder)
    assert sorted(os.listdir(aside)) == ["ckpt_step00000004.pt", "run.json"]
    assert ckpt.move_aside(folder) is None  # nothing left to move


class _Payload:
    """Unpickling this runs code: what a hostile file on shared scratch could hold."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoints_load_without_running_pickled_code(tmp_path) -> None:
    folder = str(tmp_path / "ck")
    ckpt.atomic_save(_state(1), ckpt.checkpoint_path(folder, 1))
    marker = tmp_path / "code-ran"
    hostile = {**_state(2), "extra": _Payload(str(marker))}
    torch.save(hostile, ckpt.checkpoint_path(folder, 2))  # atomic_save refuses to write it
    with pytest.raises(ckpt.UnsafeCheckpoint) as refused:
        ckpt.load_latest(folder)  # stops: neither runs it nor resumes an earlier step
    assert re.fullmatch(  # torch 2.11 names it _io.open
        re.escape(ckpt.checkpoint_path(folder, 2))
        + r" is intact but torch.load\(weights_only=True\) refuses it \(it holds _?io.open\): "
        "another program or an older hpc_harness wrote it; if you trust it, load it with "
        "weights_only=False and save its state again with plain types, or move it away",
        str(refused.value),
    )
    assert not marker.exists(), "loading a checkpoint ran pickled code (weights_only=False)"


def test_slurm_attempt_is_the_job_id_and_its_restart_count(monkeypatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    assert ckpt.slurm_attempt() == ("5", 3)
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("SLURM_RESTART_COUNT")
    assert ckpt.slurm_attempt() == (None, 0)


def test_fresh_outside_slurm_moves_and_an_older_run_json_of_the_job_is_kept(
    tmp_path, monkeypatch
) -> None:
    """Outside SLURM (no job id on either side) --fresh always moves; a run.json written
    before restart counts were recorded, by this same job, is taken for a requeue's."""
    folder = str(tmp_path / "ck")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    ckpt.write_run_file(folder, {"lr": 0.1})
    assert ckpt.move_aside(folder, (None, 0)) is not None
    os.makedirs(folder)
    with open(os.path.join(folder, ckpt.RUN_FILE), "w") as f:
        f.write('{"fingerprint": {}, "slurm_job_id": "9"}')
    assert ckpt.move_aside(folder, ("9", 0)) is None
