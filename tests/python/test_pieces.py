"""hpc_harness.pieces from a user's own loop, in this process (world size 1, no process group):
save / load-latest with the RNG states, pruning, the requeue exit and its marker."""

from __future__ import annotations

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
    path = hp.save_checkpoint(str(tmp_path), None, 5)
    saved = torch.load(path, weights_only=False)
    assert set(saved) == {"rng"} and len(saved["rng"]) == 1


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
    from hpc_harness.signals import announce_requeue

    marker = tmp_path / "m.json"
    monkeypatch.setenv("HPC_REQUEUE_MARKER", str(marker))
    assert announce_requeue(3, 1, "/x.pt") == str(marker)
    assert json.loads(marker.read_text())["signal"] == ""


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
    """torch.distributed as rank 0 of two sees it, for the object collectives pieces uses."""

    def __init__(self, other_rank: dict) -> None:
        self.other_rank = other_rank

    def get_world_size(self) -> int:
        return 2

    def get_rank(self) -> int:
        return 0

    def all_gather_object(self, out: list, obj: object) -> None:
        assert out == [None, None]  # one slot per rank, filled in place
        out[:] = [obj, self.other_rank]


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
