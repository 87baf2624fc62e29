"""hpc_harness.pieces from a user's own loop, in this process (world size 1, no process group):
save / load-latest with the RNG states, pruning, the requeue exit and its marker."""

from __future__ import annotations

import copy
import json
import os
import random
import signal

import numpy as np
import pytest
import torch

from hpc_harness import checkpoint as ckpt
from hpc_harness import pieces as hp


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((2,), float(step))}, "global_step": step}


def _draws() -> tuple[float, float, float]:
    return torch.rand(1).item(), float(np.random.rand()), random.random()


def test_save_then_load_returns_the_state_and_continues_every_rng(tmp_path, capsys) -> None:
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    model = torch.nn.Linear(3, 2)
    path = hp.save_checkpoint(str(tmp_path), {"model": model.state_dict(), "global_step": 7}, 7)
    assert path == os.path.join(str(tmp_path), "ckpt_step00000007.pt")
    assert os.listdir(tmp_path) == ["ckpt_step00000007.pt"]  # no temp file left behind
    expected = _draws()  # what an uninterrupted run draws next
    _draws()
    state = hp.load_checkpoint(str(tmp_path))
    assert state is not None and state["global_step"] == 7
    assert all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items())
    assert _draws() == expected
    out = capsys.readouterr().out
    assert out == f"hpc_harness: resumed from {path} (global step 7)\n"


@pytest.mark.parametrize("sharded", [False, True])
def test_a_state_load_checkpoint_would_skip_is_refused_before_anything_is_written(
    tmp_path, sharded: bool
) -> None:
    """nanoGPT's step is ``iter_num``: such a file saved, and every resume then skipped it as
    unreadable (load_file's keys) and started the run over."""
    with pytest.raises(ValueError) as err:
        hp.save_checkpoint(str(tmp_path), {"model": {}, "iter_num": 3}, 3, sharded=sharded)
    assert str(err.value) == (
        "save_checkpoint: the state has no 'global_step'; a checkpoint needs 'model' and "
        "'global_step' (load_checkpoint skips a file without them)"
    )
    assert os.listdir(tmp_path) == []
    with pytest.raises(
        ValueError, match="^save_checkpoint: the state has no 'model', 'global_step';"
    ):
        hp.save_checkpoint(str(tmp_path), {}, 3, sharded=sharded)


def test_load_without_restoring_rng_leaves_the_generators_alone(tmp_path) -> None:
    hp.save_checkpoint(str(tmp_path), _state(1), 1)
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    expected = _draws()
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    assert hp.load_checkpoint(str(tmp_path), restore_rng=False)["global_step"] == 1
    assert _draws() == expected


def test_rng_of_another_world_size_is_not_restored(tmp_path) -> None:
    # A checkpoint saved by 2 ranks resumed by 1: whose RNG would it be? Neither.
    two = [ckpt.capture_rng(), ckpt.capture_rng()]
    ckpt.atomic_save({**_state(3), "rng": two}, ckpt.checkpoint_path(str(tmp_path), 3))
    torch.manual_seed(9)
    expected = torch.rand(1).item()
    torch.manual_seed(9)
    assert hp.load_checkpoint(str(tmp_path))["global_step"] == 3
    assert torch.rand(1).item() == expected


def test_an_empty_or_missing_folder_loads_nothing(tmp_path, capsys) -> None:
    assert hp.load_checkpoint(str(tmp_path)) is None
    assert hp.load_checkpoint(str(tmp_path / "missing")) is None
    assert "resumed" not in capsys.readouterr().out


def test_the_newest_checkpoint_wins_and_only_keep_last_stay(tmp_path) -> None:
    for step in (2, 4, 6, 8):
        hp.save_checkpoint(str(tmp_path), _state(step), step, keep_last=2)
    assert sorted(os.listdir(tmp_path)) == ["ckpt_step00000006.pt", "ckpt_step00000008.pt"]
    assert hp.load_checkpoint(str(tmp_path))["global_step"] == 8


def test_keep_last_defaults_to_three(tmp_path) -> None:
    for step in range(1, 6):
        hp.save_checkpoint(str(tmp_path), _state(step), step)
    assert len(os.listdir(tmp_path)) == 3


def test_every_rank_rng_is_saved_in_rank_order(tmp_path) -> None:
    torch.manual_seed(3)
    rng = hp.gather_rng()
    assert len(rng) == 1 and torch.equal(rng[0]["torch"], torch.get_rng_state())
    path = hp.save_checkpoint(str(tmp_path), _state(5), 5)
    saved = torch.load(path, weights_only=False)
    assert set(saved) == {"model", "global_step", "rng"} and len(saved["rng"]) == 1


def test_requeue_exit_writes_the_marker_and_exits_42(tmp_path, monkeypatch) -> None:
    marker = tmp_path / "requeue.json"
    monkeypatch.setenv("HPC_REQUEUE_MARKER", str(marker))
    stop = hp.StopAgreement()
    stop.signum = signal.SIGUSR1
    with pytest.raises(SystemExit) as exited:
        hp.requeue_exit(12, 3, "/ck/ckpt_step00000012.pt", stop)
    assert exited.value.code == hp.REQUEUE_EXIT_CODE == 42
    assert json.loads(marker.read_text()) == {
        "step": 12,
        "epoch": 3,
        "checkpoint": "/ck/ckpt_step00000012.pt",
        "signal": "SIGUSR1",
    }


def test_announce_requeue_returns_only_once_rank_0_has_written_the_marker(
    tmp_path, monkeypatch
) -> None:
    # every rank waits for rank 0's broadcast, sent after it wrote the marker: torchrun stops
    # the other workers when one exits 42, and a marker not yet written is no requeue
    marker = tmp_path / "requeue.json"
    monkeypatch.setenv("HPC_REQUEUE_MARKER", str(marker))
    at_broadcast: list[bool] = []
    monkeypatch.setattr(hp, "from_rank0", lambda obj: at_broadcast.append(marker.exists()) or obj)
    assert hp.announce_requeue(7, 1, "/ck/a.pt", hp.StopAgreement()) is None
    assert at_broadcast == [True]
    with pytest.raises(SystemExit):
        hp.requeue_exit(8, 1, "/ck/b.pt", hp.StopAgreement())
    assert at_broadcast == [True, True] and json.loads(marker.read_text())["step"] == 8


def test_requeue_exit_says_what_it_did_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    marker = tmp_path / "requeue.json"
    monkeypatch.setenv("HPC_REQUEUE_MARKER", str(marker))
    stop = hp.StopAgreement()
    stop.signum = signal.SIGTERM
    with pytest.raises(SystemExit):
        hp.requeue_exit(5, 0, "/ck/a.pt", stop)
    assert capsys.readouterr().out == (
        "hpc_harness: SIGTERM received: checkpointed at global step 5 to /ck/a.pt; "
        f"exiting 42 (requeue me); marker {marker}\n"
    )


def test_requeue_exit_without_a_signal_or_a_marker(monkeypatch, capsys) -> None:
    monkeypatch.delenv("HPC_REQUEUE_MARKER", raising=False)
    with pytest.raises(SystemExit) as exited:
        hp.requeue_exit(5, 0, "/ck/a.pt", hp.StopAgreement())
    assert exited.value.code == 42
    assert capsys.readouterr().out == (
        "hpc_harness: signal received: checkpointed at global step 5 to /ck/a.pt; "
        "exiting 42 (requeue me)\n"
    )


def test_a_marker_written_without_a_signal_name_says_none(tmp_path, monkeypatch) -> None:
    from hpc_harness.signals import write_requeue_marker

    marker = tmp_path / "m.json"
    monkeypatch.setenv("HPC_REQUEUE_MARKER", str(marker))
    assert write_requeue_marker(3, 1, "/x.pt") == str(marker)
    assert json.loads(marker.read_text())["signal"] == ""


def test_load_checkpoint_with_a_fingerprint_claims_the_folder_for_this_run(tmp_path) -> None:
    """run.json names this run (fingerprint, writer mark), so a later run that takes the
    folder over is seen at this run's next save."""
    d = str(tmp_path / "ck")
    assert hp.load_checkpoint(d, fingerprint={"lr": 0.1}) is None
    run = ckpt.read_run_file(d)
    assert run is not None and (run["fingerprint"], run["writer"]) == ({"lr": 0.1}, ckpt.RUN_MARK)
    hp.save_checkpoint(d, _state(1), 1)
    with open(os.path.join(d, ckpt.RUN_FILE), "w") as f:
        json.dump({**run, "writer": "another job's"}, f)
    with pytest.raises(ckpt.RunMismatch, match="taken over"):
        hp.save_checkpoint(d, _state(2), 2)
    assert ckpt.list_checkpoints(d) == [ckpt.checkpoint_path(d, 1)]
    assert hp.load_checkpoint(str(tmp_path / "other")) is None  # no fingerprint: no claim
    assert not os.path.exists(tmp_path / "other")


def test_only_rank_0_reads_run_json_before_a_save(tmp_path, monkeypatch) -> None:
    """Rank 0 reads run.json and sends its verdict (TwoRanks: rank 1 of a faked pair)."""
    read: list[str] = []
    monkeypatch.setattr(ckpt, "takeover_error", lambda d: read.append(d))
    monkeypatch.setattr(hp, "_group", lambda: TwoRanks(rank=1, sent=[(None, None)]))
    hp.save_checkpoint(str(tmp_path), None, 1)
    assert read == [] and os.listdir(tmp_path) == []


def test_an_unreadable_newer_checkpoint_is_skipped_with_a_warning(tmp_path, capsys) -> None:
    hp.save_checkpoint(str(tmp_path), _state(4), 4)
    broken = ckpt.checkpoint_path(str(tmp_path), 6)
    with open(broken, "wb") as f:
        f.write(b"truncated")
    state = hp.load_checkpoint(str(tmp_path))
    assert state["global_step"] == 4
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"hpc_harness: warning: skipping unreadable checkpoint {broken}: ")
    assert out[1].startswith("hpc_harness: resumed from ") and len(out) == 2


class TwoRanks:
    """torch.distributed as one rank of two sees it, for the object collectives pieces uses:
    faked in this process (no second process). ``other_rank`` is what rank 1 contributes to a
    gather; ``sent`` is what rank 0 broadcast (recorded by its own fake), handed to rank 1's,
    after ``replies``: what rank 0 sent at rank 1's first broadcasts, in order."""

    def __init__(
        self,
        other_rank: object = None,
        rank: int = 0,
        sent: list | None = None,
        replies: list[list] | None = None,
    ):
        self.other_rank, self.rank, self.sent = other_rank, rank, sent
        self.replies = list(replies or [])

    def get_world_size(self) -> int:
        return 2

    def get_rank(self) -> int:
        return self.rank

    def all_gather_object(self, out: list, obj: object) -> None:
        assert out == [None, None]  # one slot per rank, filled in place
        out[:] = [obj, self.other_rank]

    def broadcast_object_list(self, box: list, src: int = 0) -> None:
        # the rank src sends its list; every other rank's list is overwritten in place
        if self.rank == src:
            self.sent = copy.deepcopy(box)
        else:
            box[:] = copy.deepcopy(self.replies.pop(0) if self.replies else self.sent)


def test_gather_rng_collects_every_ranks_states_in_rank_order(monkeypatch) -> None:
    other = {"torch": torch.zeros(1), "from": "rank 1"}
    monkeypatch.setattr(hp, "_group", lambda: TwoRanks(other))
    torch.manual_seed(3)
    mine, theirs = hp.gather_rng({"sampler": 7})
    assert torch.equal(mine["torch"], torch.get_rng_state()) and mine["sampler"] == 7
    assert theirs is other


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_sharded_save_at_world_size_one_is_a_folder_that_loads(tmp_path) -> None:
    torch.manual_seed(2)
    model = torch.nn.Linear(3, 2)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    rng_at_save = torch.get_rng_state()
    state = {"model": model.state_dict(), "global_step": 5, "epoch": 1}
    path = hp.save_checkpoint(str(tmp_path), state, 5, sharded=True)
    assert path == os.path.join(str(tmp_path), "ckpt_step00000005.dcp")
    assert os.path.isdir(path) and os.listdir(tmp_path) == ["ckpt_step00000005.dcp"]
    loaded = hp.load_checkpoint(str(tmp_path))
    assert (loaded["global_step"], loaded["epoch"], loaded["sharded"]) == (5, 1, path)
    assert torch.equal(loaded["rng"]["torch"], rng_at_save)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    import torch.distributed.checkpoint as dcp

    target = {"model": model.state_dict()}
    dcp.load(target, checkpoint_id=path)
    assert all(torch.equal(target["model"][k], v) for k, v in saved.items())


def _draws_after(rng: dict) -> tuple[float, float, float]:
    """What a process draws next from the RNG states ``rng`` (restored, then drawn)."""
    saved = ckpt.capture_rng()
    ckpt.restore_rng(rng)
    try:
        return _draws()
    finally:
        ckpt.restore_rng(saved)


def _save_two_ranks(ckpt_dir: str, step: int = 5, **extra) -> tuple[str, list[dict]]:
    """A checkpoint as two ranks save it: rank 0's state with both ranks' RNG states."""
    rngs = []
    for seed in (10, 11):
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        rngs.append(ckpt.capture_rng())
    path = ckpt.checkpoint_path(ckpt_dir, step)
    state = {"model": {"w": torch.ones(2)}, "optimizer": {"state": {}}, "global_step": step}
    ckpt.atomic_save({**state, "epoch": 1, "rng": rngs, **extra}, path)
    return path, rngs


def test_rank_0_chooses_and_rank_1_resumes_the_same_step_with_its_own_rng(
    tmp_path, monkeypatch, capsys
) -> None:
    path, rngs = _save_two_ranks(str(tmp_path))
    rank0 = TwoRanks(rank=0)
    monkeypatch.setattr(hp, "_group", lambda: rank0)
    state = hp.load_checkpoint(str(tmp_path), rank0_only=("model", "optimizer"))
    assert torch.equal(state["model"]["w"], torch.ones(2)) and state["optimizer"] == {"state": {}}
    assert torch.equal(state["rng"]["torch"], rngs[0]["torch"])
    assert _draws() == _draws_after(rngs[0])  # rank 0's generators continue as saved
    # one broadcast: the path, the state without the rank-0-only keys, no error
    [((sent_path, rest), error)] = rank0.sent
    assert (sent_path, sorted(rest), error) == (path, ["epoch", "global_step", "rng"], None)
    assert capsys.readouterr().out == f"hpc_harness: resumed from {path} (global step 5)\n"

    # Rank 1 reads no file (its listing may be stale): everything comes from rank 0.
    rank1 = TwoRanks(rank=1, sent=rank0.sent)
    monkeypatch.setattr(hp, "_group", lambda: rank1)
    state = hp.load_checkpoint(str(tmp_path / "absent"), rank0_only=("model", "optimizer"))
    assert (state["path"], state["global_step"], state["epoch"]) == (path, 5, 1)
    assert state["model"] is None and state["optimizer"] is None  # Strategy.load sends them
    assert torch.equal(state["rng"]["torch"], rngs[1]["torch"])
    assert _draws() == _draws_after(rngs[1])
    assert capsys.readouterr().out == ""  # rank 0 alone says where it resumed


def test_rank_1_learns_that_there_is_nothing_to_resume(tmp_path, monkeypatch) -> None:
    rank0 = TwoRanks(rank=0)
    monkeypatch.setattr(hp, "_group", lambda: rank0)
    assert hp.load_checkpoint(str(tmp_path)) is None
    _save_two_ranks(str(tmp_path / "rank 1 sees one"))  # a listing rank 0 does not share
    monkeypatch.setattr(hp, "_group", lambda: TwoRanks(rank=1, sent=rank0.sent))
    assert hp.load_checkpoint(str(tmp_path / "rank 1 sees one")) is None


def test_rng_states_of_another_world_size_are_not_restored_and_rank_0_alone_warns(
    tmp_path, monkeypatch, capsys
) -> None:
    path, _ = _save_two_ranks(str(tmp_path))
    state = ckpt.load_file(path)
    ckpt.atomic_save({**state, "rng": state["rng"][:1]}, path)  # saved by one rank
    rank0 = TwoRanks(rank=0)
    monkeypatch.setattr(hp, "_group", lambda: rank0)
    assert hp.load_checkpoint(str(tmp_path))["rng"] is None
    assert capsys.readouterr().out.splitlines()[0] == (
        f"hpc_harness: warning: {path} has RNG states for 1 ranks, world size is 2: not "
        "restored (the run will not match an uninterrupted one)"
    )
    monkeypatch.setattr(hp, "_group", lambda: TwoRanks(rank=1, sent=rank0.sent))
    assert hp.load_checkpoint(str(tmp_path))["rng"] is None
    assert capsys.readouterr().out == ""


def test_another_runs_checkpoint_is_refused_on_both_ranks_with_rank_0s_message(
    tmp_path, monkeypatch
) -> None:
    _save_two_ranks(str(tmp_path), fingerprint={"lr": 0.1})
    rank0 = TwoRanks(rank=0)
    monkeypatch.setattr(hp, "_group", lambda: rank0)
    with pytest.raises(ckpt.RunMismatch) as on_rank0:
        hp.load_checkpoint(str(tmp_path), fingerprint={"lr": 0.2})
    assert "lr (0.1 -> 0.2) differ" in str(on_rank0.value)
    monkeypatch.setattr(hp, "_group", lambda: TwoRanks(rank=1, sent=rank0.sent))
    with pytest.raises(ckpt.RunMismatch) as on_rank1:
        hp.load_checkpoint(str(tmp_path / "absent"), fingerprint={"lr": 0.2})
    assert str(on_rank1.value) == str(on_rank0.value)


@pytest.mark.parametrize("error", [ckpt.UnsafeCheckpoint("/x.pt refuses"), OSError(5, "EIO")])
def test_what_stops_rank_0s_resume_stops_every_rank(tmp_path, monkeypatch, error) -> None:
    # raised on rank 0 alone, the other ranks waited for its broadcast until a timeout
    def load_latest(ckpt_dir: str, log) -> tuple:
        raise error

    monkeypatch.setattr(ckpt, "load_latest", load_latest)
    rank0 = TwoRanks(rank=0)
    monkeypatch.setattr(hp, "_group", lambda: rank0)
    with pytest.raises(type(error)) as on_rank0:
        hp.load_checkpoint(str(tmp_path), fingerprint={"lr": 0.1})
    monkeypatch.setattr(hp, "_group", lambda: TwoRanks(rank=1, sent=rank0.sent))
    with pytest.raises(type(error)) as on_rank1:
        hp.load_checkpoint(str(tmp_path), fingerprint={"lr": 0.1})
    assert str(on_rank1.value) == str(on_rank0.value) == str(error)
    assert not os.path.exists(tmp_path / "run.json")  # not claimed


def test_a_checkpoint_without_a_fingerprint_resumes_with_one_warning(tmp_path, capsys) -> None:
    assert hp.load_checkpoint(str(tmp_path), fingerprint={"lr": 0.1}) is None
    assert capsys.readouterr().out == ""  # nothing to resume: nothing to warn about
    path = hp.save_checkpoint(str(tmp_path), _state(3), 3)  # written without a fingerprint
    assert hp.load_checkpoint(str(tmp_path), fingerprint={"lr": 0.1})["global_step"] == 3
    assert capsys.readouterr().out.splitlines() == [
        f"hpc_harness: warning: {path} has no run fingerprint (an older hpc_harness wrote it): "
        "resuming without checking that it belongs to this run",
        f"hpc_harness: resumed from {path} (global step 3)",
    ]
    path = hp.save_checkpoint(str(tmp_path), {**_state(4), "fingerprint": {"lr": 0.1}}, 4)
    assert hp.load_checkpoint(str(tmp_path), fingerprint={"lr": 0.1})["global_step"] == 4
    assert capsys.readouterr().out == f"hpc_harness: resumed from {path} (global step 4)\n"


class Writes:
    """stdout recording each write() call: ranks sharing a pipe interleave between writes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_every_line_load_checkpoint_prints_is_one_write(tmp_path, monkeypatch) -> None:
    path = hp.save_checkpoint(str(tmp_path), _state(2), 2)
    stale = tmp_path / ".ckpt_step00000004.pt.tmp.77"  # a save killed midway
    stale.write_bytes(b"half")
    out = Writes()
    monkeypatch.setattr("sys.stdout", out)
    hp.load_checkpoint(str(tmp_path))
    assert out.calls == [
        f"hpc_harness: warning: ignoring incomplete checkpoint {stale} (a save was interrupted)\n",
        f"hpc_harness: resumed from {path} (global step 2)\n",
    ]


def test_start_fresh_moves_the_folder_and_a_separate_run_dir_aside_once(
    tmp_path, monkeypatch, capsys
) -> None:
    """A user's own loop with --fresh: the checkpoint folder goes aside, and a run_dir of its
    own with it; a run_dir inside the checkpoint folder (or holding it) goes with that one
    rename; nothing to move, nothing said."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    ck, runs = tmp_path / "ck", tmp_path / "runs"
    hp.start_fresh(str(ck), str(runs))
    assert os.listdir(tmp_path) == [] and capsys.readouterr().out == ""
    for folder in (ck, runs):
        folder.mkdir()
        (folder / "x").write_text(folder.name)
    hp.start_fresh(str(ck), str(runs))
    [moved_ck] = [p for p in os.listdir(tmp_path) if p.startswith("ck.old-")]
    [moved_runs] = [p for p in os.listdir(tmp_path) if p.startswith("runs.old-")]
    assert (tmp_path / moved_ck / "x").read_text() == "ck"
    assert (tmp_path / moved_runs / "x").read_text() == "runs"
    assert capsys.readouterr().out == (
        "hpc_harness: starting fresh; the earlier run's files are in "
        f"{tmp_path / moved_ck} and {tmp_path / moved_runs}\n"
    )
    (ck / "runs").mkdir(parents=True)
    hp.start_fresh(str(ck), str(ck / "runs"))  # inside: one rename moves both
    assert sorted(p.split(".old-")[0] for p in os.listdir(tmp_path)) == ["ck", "ck", "runs"]
    (ck / "inner").mkdir(parents=True)
    hp.start_fresh(str(ck / "inner"), str(ck))  # the run_dir holds the checkpoints: it stays
    assert sorted(p.split(".old-")[0] for p in os.listdir(tmp_path)) == ["ck", "ck", "ck", "runs"]
    assert sorted(p.split(".old-")[0] for p in os.listdir(ck)) == ["inner"]


def test_start_fresh_leaves_the_folder_of_this_same_job_requeued(tmp_path, monkeypatch) -> None:
    """A requeued job runs its command again, --fresh included: the folder this job claimed
    in an earlier attempt is its own and resumes; in a new job it goes aside."""
    ck = tmp_path / "ck"
    ck.mkdir()
    monkeypatch.setenv("SLURM_JOB_ID", "111")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    ckpt.write_run_file(str(ck), {"lr": 0.1})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    hp.start_fresh(str(ck))
    assert os.listdir(tmp_path) == ["ck"]
    monkeypatch.setenv("SLURM_JOB_ID", "222")
    hp.start_fresh(str(ck))
    assert [p.split(".old-")[0] for p in os.listdir(tmp_path)] == ["ck"]
    assert os.listdir(tmp_path) != ["ck"]


def test_the_state_helpers_broadcast_from_rank0_in_a_group_of_more_than_one() -> None:
    """state_dicts and load_state use a Strategy of the group's size: distributed in a group of
    2 (the tensors broadcast from rank 0), not alone."""
    import torch.distributed as dist

    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    assert not hp._saving_half().distributed
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
    try:
        assert hp._saving_half().distributed
    finally:
        dist.destroy_process_group()
