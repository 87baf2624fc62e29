"""What a sixth review found about whether a resumed run is the run it claims: the order of an
epoch drawn by the user's own sampler (numpy, the loader's generator, persistent workers, a
batch sampler), a changed batch size, a stop at max_steps on an epoch's last step, hparams
whose text changes between processes, and errors on rank 0 alone. Each test failed before."""

from __future__ import annotations

import os
import random
import re
import subprocess
from typing import Any

import numpy as np
import pytest
import torch
from conftest import PY, clean_env, spawn_gloo
from test_trainer_lifecycle import build
from test_trainer_requeue import SignalAtStep
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from hpc_harness import checkpoint as ckpt
from hpc_harness import pieces
from hpc_harness.trainer import Trainer

DATA = TensorDataset(
    torch.randn(8, 3, generator=torch.Generator().manual_seed(0)), torch.arange(8) % 2
)


class Recorded(Dataset):
    """DATA, recording which samples the training reads (in the main process)."""

    def __init__(self) -> None:
        self.read: list[int] = []

    def __len__(self) -> int:
        return len(DATA)

    def __getitem__(self, i: int):
        self.read.append(i)
        return DATA[i]


class NumpyShuffle(Sampler):
    """A user's sampler that shuffles with numpy's global RNG (a bucketing sampler, say)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(np.random.permutation(self.n).tolist())


class Ordered(Trainer):
    """Records the samples of each training batch (the third tensor of IndexedData)."""

    def training_step(self, batch):
        x, y, idx = batch
        self.order.extend(idx.tolist())
        return self.loss_fn(self.model(x), y)

    def eval_step(self, batch):
        return {"test_loss": self.loss_fn(self.model(batch[0]), batch[1])}


INDEXED = TensorDataset(*DATA.tensors, torch.arange(8))


def _ordered_run(ck: str, make_loader, max_steps: int | None = None) -> list[int]:
    trainer = build(
        ck,
        trainer_cls=Ordered,
        loader=make_loader(),
        epochs=2,
        replace_sampler=False,
        max_steps=max_steps,
    )
    trainer.order = []
    trainer.train()
    return trainer.order


def _same_order_after_a_resume(tmp_path, make_loader, stop_at: int) -> tuple[list, list]:
    whole = _ordered_run(str(tmp_path / "whole"), make_loader)
    cut = str(tmp_path / "cut")
    first = _ordered_run(cut, make_loader, max_steps=stop_at)
    return whole, first + _ordered_run(cut, make_loader)


def test_an_own_sampler_that_shuffles_with_numpy_replays_the_epoch_after_a_resume(
    tmp_path,
) -> None:
    """Only torch's RNG of the epoch's start was kept: the resumed epoch 0 read samples twice
    and others never (e.g. [6,2,1,7,0,4,2,5] for [6,2,1,7,3,0,5,4])."""

    def make_loader() -> DataLoader:
        return DataLoader(INDEXED, batch_size=2, sampler=NumpyShuffle(8))

    whole, resumed = _same_order_after_a_resume(tmp_path, make_loader, stop_at=2)
    assert sorted(whole[:8]) == list(range(8))
    assert resumed == whole


def test_an_own_loader_generator_replays_its_epoch_after_a_resume(tmp_path) -> None:
    """DataLoader(generator=g), PyTorch's way to a reproducible shuffle: its state was not
    saved, so epoch 1 resumed with epoch 0's permutation (a fresh generator's)."""

    def make_loader() -> DataLoader:
        generator = torch.Generator().manual_seed(1)
        return DataLoader(INDEXED, batch_size=2, shuffle=True, generator=generator)

    whole, resumed = _same_order_after_a_resume(tmp_path, make_loader, stop_at=6)
    assert whole[8:] != whole[:8]  # epoch 1 is another order
    assert resumed == whole


def test_an_own_loader_with_persistent_workers_replays_its_epoch_after_a_resume(tmp_path) -> None:
    """A persistent loader draws each later epoch's order at its iterator's reset, but a
    resumed process's first iter() drew the workers' base seed first: another order."""

    def make_loader() -> DataLoader:
        return DataLoader(
            INDEXED, batch_size=2, shuffle=True, num_workers=1, persistent_workers=True
        )

    whole, resumed = _same_order_after_a_resume(tmp_path, make_loader, stop_at=6)
    assert resumed == whole


class EpochBatches(Sampler):
    """A user's batch sampler whose order depends on the epoch it is told."""

    def __init__(self) -> None:
        self.batch_size, self.told = 4, []

    def set_epoch(self, epoch: int) -> None:
        self.told.append(epoch)

    def __len__(self) -> int:
        return 2

    def __iter__(self):
        order = torch.randperm(8, generator=torch.Generator().manual_seed(len(self.told)))
        return iter(order.view(2, 4).tolist())


def test_an_own_batch_sampler_is_told_every_epoch_and_gives_the_batch_size(tmp_path) -> None:
    """set_epoch went to DataLoader's placeholder sampler, never to the batch sampler (every
    epoch repeated epoch 0's order); the batch size was taken as 1."""
    batches = EpochBatches()
    trainer = build(
        str(tmp_path),
        loader=DataLoader(DATA, batch_sampler=batches),
        epochs=3,
        replace_sampler=False,
    )
    assert trainer.batch_size == 4
    assert trainer.train() == "finished"
    assert batches.told == [0, 1, 2]


class Unsized(Dataset):
    """A dataset without a length: the user's batch sampler alone knows what it draws."""

    def __getitem__(self, i: int):
        return DATA[i]


class BatchesOfUnknownSize(Sampler):
    """A user's batch sampler without a batch_size (batches of any size)."""

    def __len__(self) -> int:
        return 2

    def __iter__(self):
        return iter([[0, 1, 2, 3], [4, 5, 6, 7]])


def test_a_run_without_a_sample_count_or_batch_size_is_counted_in_steps(tmp_path) -> None:
    """No length to count samples by, no batch size: run.json records the run's unknowns as
    such (null), and a position is counted in batches of 1, the loader's own steps."""
    trainer = build(
        str(tmp_path),
        loader=DataLoader(Unsized(), batch_sampler=BatchesOfUnknownSize()),
        epochs=1,
        replace_sampler=False,
    )
    assert trainer.train() == "finished" and trainer.global_step == 2
    saved = ckpt.read_run_file(str(tmp_path))["fingerprint"]
    assert (saved["rank_batch_size"], saved["train_samples"]) == (1, None)


def test_a_resume_with_another_batch_size_is_refused(tmp_path) -> None:
    """The saved position (3 steps of 2 samples) was replayed in batches of 4 without a word:
    12 samples skipped where 6 were trained."""
    ck = str(tmp_path / "ck")
    first = build(ck, loader=DataLoader(DATA, batch_size=2, shuffle=True), epochs=2, max_steps=3)
    assert first.train() == "max_steps"
    again = build(ck, loader=DataLoader(DATA, batch_size=4, shuffle=True), epochs=2)
    with pytest.raises(ckpt.RunMismatch, match=r"batch_size \(2 -> 4\)"):
        again.train()
    fewer = DataLoader(TensorDataset(*DATA[:6]), batch_size=2, shuffle=True)
    with pytest.raises(ckpt.RunMismatch, match=r"train_samples \(8 -> 6\)"):
        build(ck, loader=fewer, epochs=2).train()


def test_max_steps_is_one_or_more(tmp_path) -> None:
    """max_steps=0 trained one step (0 was taken as unset, and the check follows the step)."""
    with pytest.raises(ValueError, match="max_steps expects 1 or more steps, got 0"):
        build(str(tmp_path), max_steps=0)


def test_a_stop_at_max_steps_on_an_epochs_last_step_evaluates_that_epoch_when_rerun(
    tmp_path,
) -> None:
    """Stopped by a signal at step 4 (max_steps, the end of epoch 0), the rerun said "already
    finished": epoch 0 was never evaluated, last.pt had epoch 0 and no metrics."""
    whole = build(str(tmp_path / "whole"), epochs=3, max_steps=4)
    assert whole.train() == "max_steps"
    ck = str(tmp_path / "stopped")
    first = build(ck, trainer_cls=SignalAtStep, epochs=3, max_steps=4, signal_check_every=1)
    first.signal_at = 4
    assert first.train() == "requeue"
    rerun = build(ck, epochs=3, max_steps=4)
    assert rerun.train() == "max_steps"
    assert rerun.global_step == 4  # evaluated epoch 0, trained no step of epoch 1
    expected = torch.load(tmp_path / "whole" / "last.pt", weights_only=True)
    got = torch.load(os.path.join(ck, "last.pt"), weights_only=True)
    assert (got["epoch"], got["metrics"]) == (expected["epoch"], expected["metrics"])
    assert got["metrics"] and got["epoch"] == 1
    assert all(torch.equal(got["model"][k], v) for k, v in expected["model"].items())


def test_hparams_of_functions_and_sets_have_the_same_fingerprint_in_every_process() -> None:
    """A function's repr names its address, a set's order follows the hash seed: every
    resume of such a run was refused as another run's."""
    hparams = {
        "activation": torch.relu,
        "loss": torch.nn.functional.cross_entropy,
        "tags": {"b", "a", "c"},
    }
    expected = {
        "activation": "torch._VariableFunctionsClass.relu",
        "loss": "torch.nn.functional.cross_entropy",
        "tags": ["a", "b", "c"],
    }
    assert ckpt.fingerprint(hparams) == expected
    code = (
        "import torch; from hpc_harness import checkpoint as c;"
        "print(c.fingerprint({'t': {'b', 'a', 'c', 'd', 'e'}, 'f': torch.relu}))"
    )
    seen = {
        subprocess.run(
            [PY, "-c", code],
            env={**clean_env(), "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")  # two hash seeds that iterate the set in different orders
    }
    relu = "torch._VariableFunctionsClass.relu"
    assert seen == {f"{{'f': '{relu}', 't': ['a', 'b', 'c', 'd', 'e']}}\n"}


def test_a_value_whose_text_names_an_address_is_refused_at_once() -> None:
    with pytest.raises(ValueError) as refused:
        ckpt.fingerprint({"scale": [object()]})
    assert re.fullmatch(
        r"<object object at 0x\w+> names a memory address, which differs in every process: "
        r"give the run's arguments by name or number",
        str(refused.value),
    )


def test_a_set_of_values_that_do_not_compare_is_ordered_by_their_text() -> None:
    """{10, 9, "a"} cannot be sorted (int < str); by repr it is one order in every process."""
    assert ckpt.fingerprint({"ids": {10, 9, "a"}}) == {"ids": ["a", 10, 9]}


def _rank0_fails(rank: int, world_size: int, ck: str, case: str) -> str:
    try:
        if case == "claim":
            pieces.load_checkpoint(ck, fingerprint={"lr": 0.1})
        else:
            state = {"global_step": 1, "lr": np.float64(0.1)}  # refused by the save's check
            pieces.save_checkpoint(ck, state if rank == 0 else None, 1)
    except Exception as exc:  # noqa: BLE001 - what each rank raised is the result
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
    return "returned"


@pytest.mark.parametrize("case", ["claim", "save"])
def test_an_error_of_rank_0_alone_is_raised_on_every_rank(tmp_path, case: str) -> None:
    """Rank 0's claim of the folder and its checkpoint write were outside what it sends the
    others: they waited in a collective until rank 0's process was gone (NCCL: until the
    watchdog's timeout) and then failed with a transport error."""
    ck = tmp_path / "ck"
    if case == "claim":
        ck.write_text("")  # a file where the folder should be
    errors = spawn_gloo(_rank0_fails, 2, str(ck), case)
    assert errors[0] != "returned" and errors == [errors[0]] * 2, errors


def test_a_finished_run_extended_by_epochs_and_max_steps_ends_as_the_longer_run(tmp_path) -> None:
    """epochs was part of the run's fingerprint: a finished run resumed with --epochs 2 was
    refused (Lightning lets max_epochs grow). Extended, it ends bitwise as the longer run;
    a checkpoint past the epochs asked for is a longer run's, refused in one line."""
    longer = build(str(tmp_path / "longer"), epochs=3, max_steps=10)
    assert longer.train() == "max_steps"
    ck = str(tmp_path / "ck")
    assert build(ck, epochs=1).train() == "finished"
    assert build(ck, epochs=2).train() == "finished"
    extended = build(ck, epochs=3, max_steps=10)
    assert extended.train() == "max_steps" and extended.global_step == 10
    expected = torch.load(tmp_path / "longer" / "last.pt", weights_only=True)["model"]
    got = torch.load(os.path.join(ck, "last.pt"), weights_only=True)["model"]
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    with pytest.raises(ckpt.RunMismatch, match="past epochs 1: it belongs to a longer run"):
        build(ck, epochs=1).train()


def test_a_checkpoint_one_step_into_the_epoch_after_the_last_is_refused(tmp_path) -> None:
    """4 steps an epoch: step 5 is epoch 1's first step, past a run of 1 epoch (its step 4,
    epoch 1's start, is that run's end)."""
    ck = str(tmp_path / "ck")
    assert build(ck, epochs=2, max_steps=5).train() == "max_steps"
    with pytest.raises(ckpt.RunMismatch) as refused:
        build(ck, epochs=1).train()
    assert str(refused.value) == ckpt.past_end_error(ck, 5, "epochs", 1)


class OwnRngShuffle(NumpyShuffle):
    """A sampler with a numpy Generator of its own (not the global RNG the harness saves)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.rng = np.random.default_rng(0)

    def __iter__(self):
        return iter(self.rng.permutation(self.n).tolist())


class StatefulShuffle(OwnRngShuffle):
    """The same with torchdata's protocol: its state saved and loaded through it."""

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]


@pytest.mark.parametrize("stop_at", [2, 4, 6])  # inside epoch 0, at its end, inside epoch 1
def test_a_sampler_with_state_dict_is_saved_and_restored_through_it(tmp_path, stop_at) -> None:
    """A sampler holding its own numpy Generator resumed silently wrong (samples read twice,
    others never; maxdiff 0.093 in the review)."""

    def make_loader() -> DataLoader:
        return DataLoader(INDEXED, batch_size=2, sampler=StatefulShuffle(8))

    whole, resumed = _same_order_after_a_resume(tmp_path, make_loader, stop_at)
    assert sorted(whole[8:]) == list(range(8)) and whole[:8] != whole[8:]
    assert resumed == whole


def test_a_sampler_with_random_state_no_checkpoint_saves_is_warned_of_once(
    tmp_path, capsys
) -> None:
    loader = DataLoader(INDEXED, batch_size=2, sampler=OwnRngShuffle(8))
    build(str(tmp_path), loader=loader, replace_sampler=False)
    saved = DataLoader(INDEXED, batch_size=2, sampler=StatefulShuffle(8))
    build(str(tmp_path / "saved"), loader=saved, replace_sampler=False)
    out = capsys.readouterr().out
    assert out.count("warning") == 1
    assert (
        "hpc_harness: warning: OwnRngShuffle.rng is a Generator no checkpoint saves: a resumed "
        "run will not draw what this one would; give it state_dict() and load_state_dict()\n"
    ) in out


class Draws(torch.utils.data.Dataset):
    """8 samples; the test gives it attributes."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(3), torch.tensor(0)


def test_which_random_state_of_a_dataset_is_warned_of(tmp_path, capsys) -> None:
    """Behind the harness's own sampler (not warned of), the dataset's attributes are read."""

    def warned(data: Any) -> list[str]:
        build(str(tmp_path), loader=DataLoader(data, batch_size=2, shuffle=True))
        return [line for line in capsys.readouterr().out.splitlines() if "no checkpoint" in line]

    def draws(**attributes: Any) -> Draws:
        data = Draws()
        vars(data).update(attributes)
        return data

    rest = "no checkpoint saves: a resumed run will not draw what this one would; give it "
    rest += "state_dict() and load_state_dict()"
    assert warned(draws(gen=torch.Generator())) == [
        f"hpc_harness: warning: Draws.gen is a Generator {rest}"
    ]
    assert warned(draws(rng=random.Random(0))) == [
        f"hpc_harness: warning: Draws.rng is a Random {rest}"
    ]
    assert warned(draws(generator=torch.Generator())) == []  # the name the harness saves
    assert warned([(torch.zeros(3), torch.tensor(0))] * 8) == []  # a list: no attributes


def test_only_an_object_that_saves_and_loads_its_state_is_checkpointed(tmp_path) -> None:
    class OnlyLoads(Draws):
        def load_state_dict(self, state: Any) -> None:
            raise AssertionError("never called: it cannot save a state")

    class OnlySaves(Draws):
        def state_dict(self) -> dict[str, Any]:
            return {}

    for data in (OnlyLoads(), OnlySaves()):
        loader = DataLoader(data, batch_size=2, shuffle=True)
        assert build(str(tmp_path), loader=loader)._stateful() == []


def test_a_fingerprint_of_an_older_harness_with_epochs_in_it_still_resumes(tmp_path) -> None:
    """A saved fingerprint that holds a key of trainer.RESUME_FREE (epochs, from a harness
    that left it in) resumes: the Trainer does not compare those keys."""
    ck = str(tmp_path / "ck")
    assert build(ck, epochs=2, max_steps=2).train() == "max_steps"
    (path,) = ckpt.list_checkpoints(ck)
    state = ckpt.load_file(path)
    state["fingerprint"]["epochs"] = 1  # as that harness wrote it
    ckpt.atomic_save(state, path)
    ckpt.write_run_file(ck, state["fingerprint"])
    resumed = build(ck, epochs=2)
    assert resumed.train() == "finished" and resumed.global_step == 8
    other = build(str(tmp_path / "other"), epochs=2, hparams={"lr": 0.1})
    error = ckpt.identity_error(ck, other.fingerprint, state["fingerprint"], other.resume_free)
    assert error.endswith("lr ('<unset>' -> 0.1) differ; " + ckpt.WAYS_OUT)


def test_the_callers_resume_free_keys_may_change_across_a_resume(tmp_path) -> None:
    """hparams keys named in TrainConfig.resume_free may change; any other stops the resume."""
    ck = str(tmp_path / "ck")
    free = {"resume_free": ("data_dir",)}
    assert build(ck, max_steps=2, hparams={"data_dir": "a"}, **free).train() == "max_steps"
    with pytest.raises(ckpt.RunMismatch, match=r"data_dir \('<unset>' -> 'b'\)"):
        build(ck, hparams={"data_dir": "b"}).train()
    assert build(ck, hparams={"data_dir": "b"}, **free).train() == "finished"
