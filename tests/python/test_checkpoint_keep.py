"""A run's checkpoints are never lost to a mistake found late: a state that cannot be loaded
safely is refused when it is saved; an intact file that cannot be loaded safely, or a read
error, stops the resume instead of counting as damage; later-step checkpoints are moved aside,
not deleted; a sharded checkpoint saved again at its step is never absent."""

from __future__ import annotations

import errno
import os
import pathlib
import re

import numpy as np
import pytest
import torch

from hpc_harness import checkpoint as ckpt
from hpc_harness import pieces as hp


def _state(step: int, **extra) -> dict:
    return {"model": {"w": torch.full((3,), float(step))}, "global_step": step, **extra}


def test_a_state_that_weights_only_loading_refuses_is_refused_at_its_save(tmp_path) -> None:
    # a numpy float (an easy slip: np.mean of a loss history) loaded nowhere: every resume
    # skipped the run's checkpoints as damaged and started over at step 0
    path = ckpt.checkpoint_path(str(tmp_path), 100)
    with pytest.raises(ValueError) as info:
        ckpt.atomic_save(_state(100, best=np.float64(0.5)), path)
    message = str(info.value)
    assert message.startswith(f"{path}: torch.load(weights_only=True) refuses this state (")
    assert re.search(r"refuses this state \(it holds numpy\.\S+\); ", message)
    assert message.endswith("keep to tensors and plain python types (float(x) for a numpy number)")
    assert "\n" not in message
    assert os.listdir(tmp_path) == []  # neither the file nor its temporary file


def test_the_saves_check_maps_the_file_and_where_files_cannot_be_mapped_reads_it(
    tmp_path, monkeypatch
) -> None:
    """The check that a save loads maps the file (a checkpoint of many GB is not read back);
    on a file system that cannot map files (faked: torch's mapping call fails) it reads the
    file instead, and a resume reads checkpoints without mapping them there too."""
    mapped: list[str] = []
    map_file = torch.UntypedStorage.from_file

    def recorded(path, *args, **kwargs):
        mapped.append(os.path.basename(path))
        return map_file(path, *args, **kwargs)

    monkeypatch.setattr(torch.UntypedStorage, "from_file", recorded)
    ckpt.atomic_save(_state(1), ckpt.checkpoint_path(str(tmp_path), 1))
    assert len(mapped) == 1 and ".tmp." in mapped[0]  # the temporary file, before its rename

    def cannot_map(*args, **kwargs):
        raise RuntimeError("unable to mmap 2432 bytes from file: Operation not supported")

    monkeypatch.setattr(torch.UntypedStorage, "from_file", cannot_map)
    path = ckpt.checkpoint_path(str(tmp_path), 2)
    ckpt.atomic_save(_state(2), path)
    loaded = ckpt.load_file(path)
    assert loaded["global_step"] == 2 and torch.equal(loaded["model"]["w"], torch.full((3,), 2.0))


def test_an_intact_checkpoint_that_weights_only_refuses_stops_the_resume(tmp_path) -> None:
    d = str(tmp_path)
    ckpt.atomic_save(_state(1), ckpt.checkpoint_path(d, 1))
    torch.save(_state(2, best=np.float64(0.5)), ckpt.checkpoint_path(d, 2))  # an older writer
    said: list[str] = []
    with pytest.raises(ckpt.UnsafeCheckpoint) as info:
        ckpt.load_latest(d, log=said.append)
    assert str(info.value).startswith(
        f"{ckpt.checkpoint_path(d, 2)} is intact but torch.load(weights_only=True) refuses it ("
    )
    assert said == []  # not skipped as damaged: a resume from step 1 would drop it


@pytest.mark.parametrize("error", [OSError(errno.EIO, "Input/output error"), MemoryError()])
def test_a_read_error_stops_the_resume_rather_than_skip_the_checkpoint(
    tmp_path, monkeypatch, error: BaseException
) -> None:
    d = str(tmp_path)
    for step in (1, 2):
        ckpt.atomic_save(_state(step), ckpt.checkpoint_path(d, step))

    def load_file(path: str) -> dict:
        if path.endswith("2.pt"):
            raise error
        return {"global_step": 1}

    monkeypatch.setattr(ckpt, "load_file", load_file)
    with pytest.raises(type(error)):
        ckpt.load_latest(d, log=print)


def test_later_step_checkpoints_are_moved_aside_not_deleted(tmp_path, capsys) -> None:
    """Later steps than the one just saved are not this run's newest: a run started over them
    (--no-resume), or one that did not load. Kept, they took the newest keep_last places (the
    save just written was deleted at once) and a later resume would pick them. Deleted, a
    checkpoint that did not load for a reason its user could mend was lost."""
    d = str(tmp_path)
    for step in (12, 16):
        ckpt.atomic_save(_state(step), ckpt.checkpoint_path(d, step))
    path = hp.save_checkpoint(d, _state(2), 2, keep_last=2)
    assert ckpt.list_checkpoints(d) == [path]
    out = capsys.readouterr().out
    for step in (12, 16):
        later = ckpt.checkpoint_path(d, step)
        aside = [n for n in os.listdir(d) if n.startswith(os.path.basename(later) + ".old-")]
        assert len(aside) == 1
        assert ckpt.load_file(os.path.join(d, aside[0]))["global_step"] == step
        assert (
            f"hpc_harness: moving {later} aside to {os.path.join(d, aside[0])}: a later step "
            "than this run's newest (2)\n"
        ) in out
    hp.save_checkpoint(d, _state(4), 4, keep_last=2)
    assert ckpt.list_checkpoints(d) == [path, ckpt.checkpoint_path(d, 4)]


def test_a_sharded_checkpoint_saved_again_is_never_absent(tmp_path, monkeypatch) -> None:
    """Saved again at its step (the end of an epoch after a step-count save; last.dcp), the
    old folder was deleted before the new one took its name: a job killed in that rmtree (a
    large folder on Lustre: seconds) had no checkpoint of that step any more."""
    from types import SimpleNamespace

    from hpc_harness.strategy import Strategy

    ctx = SimpleNamespace(world_size=1, local_world_size=1, device=torch.device("cpu"), devices=[])
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = ckpt.checkpoint_path(str(tmp_path), 4, sharded=True)
    for marker in (1, 2):
        msd, osd = Strategy("ddp", ctx).state(model, opt, sharded=True)
        state = {"model": msd, "optimizer": osd, "global_step": 4, "saved": marker}
        if marker == 2:

            def killed(folder, *args, **kwargs) -> None:
                raise SystemExit("killed while deleting the old folder")

            monkeypatch.setattr(ckpt.shutil, "rmtree", killed)
        with pytest.raises(SystemExit) if marker == 2 else _nothing():
            ckpt.save_sharded(state, path)
    assert ckpt.load_file(path)["saved"] == 2


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> bool:
        return False


def test_last_pt_holds_hparams_as_plain_json(tmp_path) -> None:
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from hpc_harness import dist as hdist
    from hpc_harness.trainer import TrainConfig, Trainer

    data = TensorDataset(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))
    hparams = {"lr": 0.1, "data_dir": pathlib.Path("/data/x"), "layers": (2, 3)}
    cfg = TrainConfig(epochs=1, ckpt_dir=str(tmp_path), log_every=0, hparams=hparams)
    trainer = Trainer(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        DataLoader(data, batch_size=2),
        hdist.setup(verbose=False),
        cfg,
    )
    assert trainer.train() == "finished"  # a Path in hparams failed the save of last.pt
    saved = torch.load(tmp_path / "last.pt", weights_only=True)["hparams"]
    assert saved == {"lr": 0.1, "data_dir": "PosixPath('/data/x')", "layers": [2, 3]}


@pytest.mark.parametrize("keep_last", [1, 3])
@pytest.mark.parametrize("earlier_sharded", [False, True])
def test_of_two_checkpoints_of_one_step_the_one_written_last_is_kept_and_resumed(
    tmp_path, keep_last: int, earlier_sharded: bool
) -> None:
    """An earlier run's ckpt_step5.pt and this run's ckpt_step5.dcp (a restart over the folder
    with resume=False and sharded_checkpoint=True, both resume-free): checkpoints ranked by
    (step, name), and .dcp sorts before .pt, so with keep_last=1 the save deleted the folder
    it had just written (and returned its path), and with 3 a resume chose the earlier run's
    file."""
    d = str(tmp_path)
    earlier = hp.save_checkpoint(
        d, _state(5, optimizer={}, who="earlier"), 5, keep_last, sharded=earlier_sharded
    )
    os.utime(earlier, ns=(10**18, 10**18))  # written long before (2001)
    path = hp.save_checkpoint(
        d, _state(5, optimizer={}, who="this run"), 5, keep_last, sharded=not earlier_sharded
    )
    assert os.path.exists(path)
    assert ckpt.list_checkpoints(d) == [earlier, path][-keep_last:]
    state, chosen = ckpt.load_latest(d)
    assert chosen == path and state["who"] == "this run"


def test_a_checkpoint_gone_between_the_listing_and_its_stat_is_left_out(
    tmp_path, monkeypatch
) -> None:
    # a prune on another rank's view, or an earlier run's cleanup, removes it meanwhile
    (tmp_path / "ckpt_step00000004.pt").write_bytes(b"x")
    listing = os.listdir
    monkeypatch.setattr(ckpt.os, "listdir", lambda d: [*listing(d), "ckpt_step00000009.pt"])
    assert ckpt.list_checkpoints(str(tmp_path)) == [str(tmp_path / "ckpt_step00000004.pt")]
