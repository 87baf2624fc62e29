"""Checkpoint details a user or a resume relies on, in-process: what ``load_file`` accepts and
where it puts tensors, a sharded save at world size 1, the identity message for keys set in one
run only, the name ``--fresh`` gives the old folder, and the CUDA RNG hand-back."""

from __future__ import annotations

import errno
import os
import pickle
import re
import time

import pytest
import torch
from conftest import threaded_ranks
from torch import nn

from hpc_harness import checkpoint as ckpt


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((3,), float(step))}, "global_step": step}


# --------------------------------------------------------------------------- load_file


def test_a_file_missing_model_or_global_step_is_refused_with_its_reason(tmp_path) -> None:
    folder = str(tmp_path)
    ckpt.atomic_save({"global_step": 3}, ckpt.checkpoint_path(folder, 3))  # no model
    ckpt.atomic_save({"model": {}}, ckpt.checkpoint_path(folder, 2))  # no global_step
    ckpt.atomic_save([1, 2], ckpt.checkpoint_path(folder, 1))  # not a dict
    for step in (1, 2, 3):
        with pytest.raises(ValueError) as err:
            ckpt.load_file(ckpt.checkpoint_path(folder, step))
        assert str(err.value) == "not a hpc_harness checkpoint (missing keys)"
    said: list[str] = []
    assert ckpt.load_latest(folder, log=said.append) == (None, None)
    assert said[0] == (
        f"hpc_harness: warning: skipping unreadable checkpoint {ckpt.checkpoint_path(folder, 3)}"
        ": ValueError('not a hpc_harness checkpoint (missing keys)')"
    )


def test_tensors_saved_on_a_gpu_load_onto_the_cpu(tmp_path, monkeypatch) -> None:
    """A checkpoint written by a GPU job resumes on a CPU-only node (and on a GPU node it
    loads on the CPU first, not onto whatever GPU it was saved from)."""
    path = ckpt.checkpoint_path(str(tmp_path), 1)
    with monkeypatch.context() as m:  # tag the storages as torch.save does on cuda:0
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        ckpt.atomic_save(_state(1), path)
    state = ckpt.load_file(path)
    assert state["model"]["w"].device == torch.device("cpu")
    assert torch.equal(state["model"]["w"], torch.ones(3))


def test_a_user_turning_off_weights_only_loading_does_not_unpickle_code(
    tmp_path, monkeypatch
) -> None:
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD changes torch.load's default only: the checkpoint
    loader passes weights_only=True itself."""

    class Payload:
        def __reduce__(self):
            return (open, (str(tmp_path / "code-ran"), "w"))

    path = ckpt.checkpoint_path(str(tmp_path), 1)
    torch.save({**_state(1), "extra": Payload()}, path)  # atomic_save refuses to write it
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(ckpt.UnsafeCheckpoint, match="refuses it"):
        ckpt.load_file(path)
    assert not (tmp_path / "code-ran").exists()


def test_a_refusal_naming_no_global_is_shown_by_its_first_line_at_most_200_characters() -> None:
    """torch's refusal is a page long; when it names no global, its first line is the reason."""
    first = "Weights only load failed. Unsupported operand 149 " + "x" * 300
    refusal = pickle.UnpicklingError(f"{first}\nCheck the documentation of torch.load.")
    assert ckpt._refusal(refusal) == first[:200]


# --------------------------------------------------------------------------- save_sharded


def _model_and_optimizer(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    return model, opt


@pytest.fixture(params=["alone", "gloo_group_of_1"])
def group(request):
    """save_sharded alone (no process group) and as rank 0 of a real gloo group of one."""
    import torch.distributed as dist

    if request.param == "gloo_group_of_1":
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield request.param
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_sharded_save_is_one_folder_that_resumes_the_model_and_optimizer(tmp_path, group) -> None:
    from types import SimpleNamespace

    from hpc_harness.strategy import Strategy

    ctx = SimpleNamespace(world_size=1, local_world_size=1, device=torch.device("cpu"), devices=[])
    strategy = Strategy("ddp", ctx)
    model, opt = _model_and_optimizer(0)
    msd, osd = strategy.state(model, opt, sharded=True)
    path = ckpt.checkpoint_path(str(tmp_path / "ck dir"), 7, sharded=True)
    os.makedirs(path)  # an older save of the same step, and an interrupted one: replaced
    (tmp_path / "ck dir" / "ckpt_step00000007.dcp" / "stale").write_text("old")
    os.makedirs(tmp_path / "ck dir" / ".ckpt_step00000007.dcp.tmp.0" / "half")
    state = {"model": msd, "optimizer": osd, "global_step": 7, "epoch": 1}
    ckpt.save_sharded(state, path)
    assert sorted(os.listdir(tmp_path / "ck dir")) == ["ckpt_step00000007.dcp"]
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp", "meta.pt"]
    assert ckpt.list_checkpoints(str(tmp_path / "ck dir")) == [path]
    later = ckpt.checkpoint_path(str(tmp_path / "ck dir"), 8, sharded=True)
    ckpt.save_sharded({**state, "model": msd, "optimizer": osd}, later)  # nothing to replace
    assert sorted(os.listdir(later)) == [".metadata", "__0_0.distcp", "meta.pt"]

    loaded = ckpt.load_file(path)
    assert loaded == {
        "model": None,
        "optimizer": None,
        "global_step": 7,
        "epoch": 1,
        "sharded": path,
    }
    other, other_opt = _model_and_optimizer(1)
    strategy.load(other, other_opt, loaded)
    for (name, p), q in zip(model.named_parameters(), other.parameters()):
        assert torch.equal(p, q), name
    for a, b in zip(opt.state.values(), other_opt.state.values()):
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def _save_rank_specific_copies(rank: int, world_size: int, path: str) -> None:
    """Every rank holds the same names (DDP's buffers: not sharded) with its own values."""
    model = {f"buffer{i}": torch.full((4,), 100.0 * rank + i) for i in range(6)}
    ckpt.save_sharded({"model": model, "global_step": 1}, path)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # the test reads it alone
def test_a_tensor_every_rank_holds_is_saved_from_rank_0(tmp_path) -> None:
    """torch.distributed.checkpoint's default plan spreads the writes of tensors every rank
    holds over the ranks: half the buffers were rank 1's (its own BatchNorm statistics), and
    a resume gave every rank a model no rank had. Ranks are threads (conftest.threaded_ranks)."""
    import torch.distributed.checkpoint as dcp

    path = ckpt.checkpoint_path(str(tmp_path), 1, sharded=True)
    threaded_ranks(_save_rank_specific_copies, 2, path)
    loaded = {f"buffer{i}": torch.zeros(4) for i in range(6)}
    dcp.load({"model": loaded}, checkpoint_id=path, no_dist=True)
    assert {k: v.tolist() for k, v in loaded.items()} == {
        f"buffer{i}": [float(i)] * 4 for i in range(6)
    }


def _save_then_look(rank: int, world_size: int, path: str, rank1_waits, seen: list) -> None:
    """Rank 1 looks at ``path`` as soon as save_sharded returns, then says it returned."""
    ckpt.save_sharded({"model": {f"w{rank}": torch.zeros(2)}, "global_step": 1}, path)
    if rank == 1:
        seen.append(sorted(os.listdir(path)) if os.path.isdir(path) else None)
        rank1_waits.set()


def test_no_rank_returns_from_a_sharded_save_before_its_folder_is_complete(
    tmp_path, monkeypatch
) -> None:
    """Rank 0 finishes the folder (meta.pt, the rename) after every part is written; the
    other ranks wait for it before they return (a rank that went on could read or requeue on
    a checkpoint not there yet). Rank 0 holds back its finish until rank 1 has either
    returned or waits in a barrier after its part: deterministic, no timing (the 60 s is a
    safety net: neither came)."""
    import threading

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    rank1_waits, parts_written = threading.Event(), set()
    real_save, real_barrier, real_atomic_save = dcp.save, dist.barrier, ckpt.atomic_save

    def save(*args, **kwargs):
        real_save(*args, **kwargs)
        parts_written.add(dist.get_rank())

    def barrier(*args, **kwargs):
        if dist.get_rank() in parts_written - {0}:
            rank1_waits.set()
        return real_barrier(*args, **kwargs)

    def finish(*args, **kwargs) -> None:  # rank 0's meta.pt, after every part is written
        rank1_waits.wait(60)
        real_atomic_save(*args, **kwargs)

    monkeypatch.setattr(dcp, "save", save)
    monkeypatch.setattr(dist, "barrier", barrier)
    monkeypatch.setattr(ckpt, "atomic_save", finish)
    path = ckpt.checkpoint_path(str(tmp_path), 1, sharded=True)
    seen: list = []
    threaded_ranks(_save_then_look, 2, path, rank1_waits, seen)
    assert seen == [[".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]]


def test_a_sharded_save_replaces_a_folder_holding_a_busy_file(tmp_path, monkeypatch) -> None:
    """The folder of the same name (a rewrite of last.dcp) and a leftover temporary folder each
    hold a file that cannot be deleted (on NFS, a .nfs* file another process holds open:
    EBUSY, faked). Before, the save deleted what it could and failed: "Directory not empty"
    at the rename (or at the next save, FileExistsError), the old model gone. Now each goes
    aside by a rename first (which a busy file does not stop) and the save completes."""
    from types import SimpleNamespace

    from hpc_harness.strategy import Strategy

    real_unlink = os.unlink

    def unlink(path, *args, **kwargs) -> None:
        if os.path.basename(path).startswith(".nfs"):
            raise OSError(errno.EBUSY, "Device or resource busy", path)
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    ctx = SimpleNamespace(world_size=1, local_world_size=1, device=torch.device("cpu"), devices=[])
    model, opt = _model_and_optimizer(0)
    msd, osd = Strategy("ddp", ctx).state(model, opt, sharded=True)
    path = str(tmp_path / "last.dcp")
    for folder in (path, str(tmp_path / ".last.dcp.tmp.0")):
        os.makedirs(folder)
        (tmp_path / folder / ".nfs0000000000000001").write_text("open elsewhere")
        (tmp_path / folder / "__0_0.distcp").write_text("an old shard")
    drawn: list[int] = []
    monkeypatch.setattr(ckpt.secrets, "randbelow", lambda n: drawn.append(n) or 0)
    ckpt.save_sharded({"model": msd, "optimizer": osd, "global_step": 3}, path)
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp", "meta.pt"]
    assert ckpt.load_file(path)["global_step"] == 3
    # each went aside beside itself, a temporary name of its own, emptied but for the busy file
    assert drawn == [10**9, 10**9]
    assert sorted(os.listdir(tmp_path)) == ["..last.dcp.tmp.0.tmp.1", ".last.dcp.tmp.1", "last.dcp"]
    for leftover in ("..last.dcp.tmp.0.tmp.1", ".last.dcp.tmp.1"):
        assert os.listdir(tmp_path / leftover) == [".nfs0000000000000001"]


def _three_sharded_checkpoints(tmp_path) -> list[str]:
    """Sharded checkpoints of steps 4, 8 and 12 in ``tmp_path``, oldest first."""
    from types import SimpleNamespace

    from hpc_harness.strategy import Strategy

    ctx = SimpleNamespace(world_size=1, local_world_size=1, device=torch.device("cpu"), devices=[])
    model, opt = _model_and_optimizer(0)
    msd, osd = Strategy("ddp", ctx).state(model, opt, sharded=True)
    paths = []
    for step in (4, 8, 12):
        paths.append(ckpt.checkpoint_path(str(tmp_path), step, sharded=True))
        state = {"model": dict(msd), "optimizer": dict(osd), "global_step": step}
        ckpt.save_sharded(state, paths[-1])
    return paths


def test_a_damaged_sharded_checkpoint_is_skipped_like_a_damaged_file(tmp_path, capsys) -> None:
    """load_file reads only meta.pt of a folder; the shards are read later, by Strategy.load.
    A shard missing or shorter than its data (damaged after the save) is found at the choice,
    so the resume falls back to the newest complete checkpoint instead of failing in dcp.load
    at every requeue."""
    paths = _three_sharded_checkpoints(tmp_path)
    shard = os.path.join(paths[2], "__0_0.distcp")
    size = os.path.getsize(shard)
    with open(shard, "r+b") as f:
        f.truncate(size - 1)  # the data of every entry ends by the file's end
    os.unlink(os.path.join(paths[1], "__0_0.distcp"))
    with pytest.raises(ValueError) as missing:
        ckpt.load_file(paths[1])
    assert str(missing.value) == "damaged: __0_0.distcp is missing"
    with pytest.raises(ValueError) as short:
        ckpt.load_file(paths[2])
    assert str(short.value) == (
        f"damaged: __0_0.distcp is {size - 1} bytes, its data end at byte {size}"
    )
    state, path = ckpt.load_latest(str(tmp_path))
    assert path == paths[0] and state["global_step"] == 4
    assert "skipping unreadable checkpoint " + paths[2] in capsys.readouterr().out


def test_a_sharded_checkpoint_without_its_metadata_or_meta_pt_is_skipped_as_damaged(
    tmp_path, capsys
) -> None:
    """The folder is renamed into place complete, so a ``.metadata`` or ``meta.pt`` missing in
    it is damage after the save (a partial copy, a hand clean-up): skipped like a missing
    shard, not a FileNotFoundError that stops every resume (an OSError is a read error, which
    stops it: the file may be fine)."""
    paths = _three_sharded_checkpoints(tmp_path)
    os.unlink(os.path.join(paths[2], "meta.pt"))
    os.unlink(os.path.join(paths[1], ".metadata"))
    with pytest.raises(ValueError) as no_meta:
        ckpt.load_file(paths[2])
    assert str(no_meta.value) == "damaged: meta.pt is missing"
    with pytest.raises(ValueError) as no_metadata:
        ckpt.load_file(paths[1])
    assert str(no_metadata.value) == "damaged: .metadata is missing"
    state, path = ckpt.load_latest(str(tmp_path))
    assert path == paths[0] and state["global_step"] == 4
    out = capsys.readouterr().out
    assert "skipping unreadable checkpoint " + paths[2] in out
    assert "skipping unreadable checkpoint " + paths[1] in out


# --------------------------------------------------------------------------- identity


def test_a_key_set_in_one_run_only_is_named_even_when_its_value_is_none() -> None:
    added = ckpt.identity_error("ck", {"lr": 0.1, "seed": None}, {"lr": 0.1})
    assert added is not None and added.startswith(
        "ck holds checkpoints of another run: seed ('<unset>' -> None) differ; "
    )
    dropped = ckpt.identity_error("ck", {"lr": 0.1}, {"lr": 0.1, "seed": None})
    assert dropped is not None and "seed (None -> '<unset>') differ; " in dropped
    gone = ckpt.identity_error("ck", {"lr": 0.1}, {"lr": 0.1, "layers": 3})
    assert gone is not None and "layers (3 -> '<unset>') differ; " in gone


# --------------------------------------------------------------------------- move_aside


def test_fresh_leaves_an_empty_folder_where_it_is(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the current folder is not empty
    (tmp_path / "ck").mkdir()
    assert ckpt.move_aside("ck") is None
    assert os.path.isdir(tmp_path / "ck")


@pytest.fixture
def tz_east_of_utc(monkeypatch):
    """Local time five hours ahead of UTC, so a local stamp differs from a UTC one."""
    monkeypatch.setenv("TZ", "XXX-05:00")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_fresh_names_the_old_folder_by_utc_time(tmp_path, tz_east_of_utc) -> None:
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "run.json").write_text("{}")
    before = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = ckpt.move_aside(str(folder))
    after = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    assert aside is not None and re.fullmatch(r".*/ck\.old-\d{8}T\d{6}Z", aside), aside
    assert aside[-len(before) :] in (before, after)
    assert sorted(os.listdir(aside)) == ["run.json"]


def test_fresh_numbers_the_old_folder_when_that_name_is_taken(tmp_path, monkeypatch) -> None:
    frozen = time.struct_time((2026, 11, 23, 20, 5, 9, 0, 327, 0))
    monkeypatch.setattr(ckpt.time, "gmtime", lambda *_: frozen)
    (tmp_path / "ck.old-20261123T200509Z").mkdir()
    for number in (2, 3):
        (tmp_path / "ck").mkdir()
        (tmp_path / "ck" / "run.json").write_text("{}")
        aside = ckpt.move_aside(str(tmp_path / "ck"))
        assert aside == str(tmp_path / f"ck.old-20261123T200509Z-{number}")


def test_fresh_through_a_symlink_moves_the_folder_it_points_to(tmp_path) -> None:
    """~/ckpts -> /scratch/exp1 (checkpoints on scratch): the data goes aside beside itself
    and the link keeps pointing at an empty folder. Before, the link was renamed and the
    fresh run wrote its checkpoints into a new folder on home (quota, slow file system)."""
    scratch, link = tmp_path / "scratch" / "exp1", tmp_path / "home" / "ckptsX"
    scratch.mkdir(parents=True)
    (scratch / "run.json").write_text("{}")
    link.parent.mkdir()
    link.symlink_to(scratch)
    aside = ckpt.move_aside(f"{link}/")  # as typed with a trailing slash
    assert aside is not None and os.path.dirname(aside) == str(scratch.parent)
    assert os.listdir(aside) == ["run.json"]
    assert os.path.islink(link) and os.path.samefile(link, scratch) and os.listdir(scratch) == []


# --------------------------------------------------------------------------- RNG


def _restored_cuda_states(monkeypatch, cuda_state, cuda_available: bool, fail: bool = False):
    handed: list = []

    def set_rng_state_all(states) -> None:
        if fail:
            raise RuntimeError("2 states for 1 device")
        handed.append(states)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_available)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_rng_state_all)
    ckpt.restore_rng({**ckpt.capture_rng(), "cuda": cuda_state})
    return handed


def test_cuda_rng_states_are_restored_only_when_saved_and_cuda_is_there(
    monkeypatch, capsys
) -> None:
    saved = [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]
    assert _restored_cuda_states(monkeypatch, saved, cuda_available=True) == [saved]
    assert _restored_cuda_states(monkeypatch, saved, cuda_available=False) == []
    assert _restored_cuda_states(monkeypatch, None, cuda_available=True) == []  # CPU run
    assert capsys.readouterr() == ("", "")


def test_cuda_rng_that_cannot_be_restored_is_a_warning_on_stderr(monkeypatch, capsys) -> None:
    saved = [torch.zeros(16, dtype=torch.uint8)] * 2  # e.g. requeued onto fewer GPUs
    assert _restored_cuda_states(monkeypatch, saved, cuda_available=True, fail=True) == []
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "hpc_harness: warning: CUDA RNG not restored: 2 states for 1 device\n"
