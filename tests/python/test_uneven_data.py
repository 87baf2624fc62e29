"""Data of another length on each rank (an IterableDataset the user shards): the ranks train
the same steps in an epoch, the fewest any rank has, and never wait for each other in
different collectives. gloo with a 20 s timeout, far below the default: a hang fails fast."""

from __future__ import annotations

import pytest
import torch
from conftest import gloo_context, spawn_gloo
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from hpc_harness.trainer import TrainConfig, Trainer


class Stream(IterableDataset):
    """``n`` samples, the same for a given ``n``; ``sized``: with a ``__len__``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.n)
        for _ in range(self.n):
            yield torch.randn(3, generator=g), torch.randint(0, 2, (), generator=g)


class SizedStream(Stream):
    def __len__(self) -> int:
        return self.n


class Counting(Trainer):
    steps = 0

    def _run_batch(self, batches):
        self.steps += 1
        return super()._run_batch(batches)


def _train(rank: int, world_size: int, ck: str, sized: bool) -> tuple[str, int, int]:
    n = 10 + 3 * rank  # 5, 7, 8 batches of 2 (the last of 1 on rank 1)
    data = (SizedStream if sized else Stream)(n)
    cfg = TrainConfig(epochs=2, max_steps=None if sized else 100, ckpt_dir=ck, log_every=1)
    cfg.checkpoint_every_s = 0
    torch.manual_seed(0)
    trainer = Counting(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1),
        DataLoader(data, batch_size=2),
        gloo_context(rank, world_size),
        cfg,
    )
    return trainer.train(), trainer.steps, trainer.global_step


def _both(rank: int, world_size: int, root: str) -> list[tuple[str, int, int]]:
    return [_train(rank, world_size, f"{root}/{sized}", sized) for sized in (True, False)]


def test_ranks_with_data_of_different_lengths_train_the_fewest_steps(tmp_path) -> None:
    """Before, the rank that ran out first went to the epoch's end (a stop check, an
    all-reduce of flags) while the others were in DDP's gradient all-reduce: gloo aborted
    ("Received data size doesn't match expected size") or waited, NCCL waited for its
    timeout. With a length, the ranks agree on the fewest steps at the start; without one,
    at every step (max_steps bounds the run)."""
    results = spawn_gloo(_both, 3, str(tmp_path), timeout_s=20)
    assert results == [[("finished", 10, 10)] * 2] * 3  # 2 epochs of 5 steps on every rank


def test_a_loader_without_a_length_trains_to_max_steps_or_asks_for_it(tmp_path) -> None:
    """It raised a raw TypeError (len() of the loader) even with max_steps set."""
    from conftest import cpu_context

    def build(max_steps):
        cfg = TrainConfig(epochs=3, max_steps=max_steps, ckpt_dir=str(tmp_path), log_every=0)
        loader = DataLoader(Stream(10), batch_size=2)  # 5 steps a pass
        sgd = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
        return Counting(nn.Linear(3, 2), sgd, loader, cpu_context(), cfg)

    trainer = build(12)
    assert trainer.total_steps == 12
    assert (trainer.train(), trainer.steps, trainer.epoch) == ("max_steps", 12, 2)
    with pytest.raises(ValueError) as refused:
        build(None)
    assert str(refused.value) == (
        "the training DataLoader has no length (an IterableDataset without __len__): set "
        "max_steps (an epoch is then one pass over it)"
    )


class LongerThanItsLength(Stream):
    """Yields ``n`` samples but says it has fewer: the epoch is the steps its length makes."""

    def __len__(self) -> int:
        return self.n - 4


def test_an_epoch_ends_at_its_agreed_steps_even_if_the_loader_has_more(tmp_path) -> None:
    """One process here: the agreed steps are the loader's own length; the loader of the rank
    with the fewest steps in a group is the same case (test above, spawned ranks)."""
    from conftest import cpu_context

    cfg = TrainConfig(epochs=2, ckpt_dir=str(tmp_path), log_every=0, checkpoint_every_s=0)
    loader = DataLoader(LongerThanItsLength(10), batch_size=2)  # 3 steps said, 5 yielded
    sgd = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    trainer = Counting(nn.Linear(3, 2), sgd, loader, cpu_context(), cfg)
    assert (trainer.train(), trainer.steps, trainer.global_step) == ("finished", 6, 6)


class OtherRankHas:
    """A group of two, faked in this process, whose other rank's next step has ``batches``."""

    class ReduceOp:
        MIN = "min"

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        assert op == "min"
        tensor.fill_(min(int(tensor), self.batches))


@pytest.mark.parametrize(("other", "expected"), [(1, [0, 1]), (0, [])])
def test_an_unsized_step_is_trained_only_if_every_rank_has_a_batch(
    monkeypatch, other: int, expected: list[int]
) -> None:
    from hpc_harness import trainer as trainer_mod

    trainer = Trainer.__new__(Trainer)  # only what _next_chunk reads
    trainer.cfg, trainer.device = TrainConfig(accumulate=2), torch.device("cpu")
    trainer.steps_per_epoch, trainer.step_in_epoch, trainer._agree_each_step = None, 0, True
    monkeypatch.setattr(trainer_mod, "group", lambda: OtherRankHas(other))
    assert trainer._next_chunk(iter(range(5))) == expected


def test_an_empty_sized_loader_has_no_steps_and_an_unsized_one_no_count(tmp_path) -> None:
    """Length 0 is a length (an epoch of no steps); no length stays no length however many
    batches a step takes."""
    from conftest import cpu_context

    def build(data, **kw) -> Counting:
        cfg = TrainConfig(epochs=1, ckpt_dir=str(tmp_path), log_every=0, **kw)
        sgd = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
        return Counting(nn.Linear(3, 2), sgd, DataLoader(data, batch_size=2), cpu_context(), cfg)

    assert build(SizedStream(0)).steps_per_epoch == 0
    unsized = build(Stream(10), accumulate=2, max_steps=2)  # 5 batches: 3 steps a pass
    assert unsized.steps_per_epoch is None
    assert (unsized.train(), unsized.steps) == ("max_steps", 2)
    again = build(Stream(10), accumulate=2, max_steps=2)  # mid-epoch: nothing left to do
    assert (again.train(), again.steps, again.epoch) == ("max_steps", 0, 0)


def test_several_ranks_with_an_iterable_dataset_agree_at_every_step(tmp_path) -> None:
    """Built as rank 0 of 2 (no group needed to build it); a map-style dataset or one rank
    does not."""
    import dataclasses

    from conftest import cpu_context

    def agrees(data, world_size: int) -> bool:
        ctx = dataclasses.replace(cpu_context(), world_size=world_size)
        cfg = TrainConfig(ckpt_dir=str(tmp_path), log_every=0, max_steps=4)
        sgd = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
        loader = DataLoader(data, batch_size=2)
        return Trainer(nn.Linear(3, 2), sgd, loader, ctx, cfg)._agree_each_step

    assert agrees(SizedStream(10), 2) is True and agrees(SizedStream(10), 1) is False
    assert agrees(TensorDataset(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)), 2) is False


class OtherRankSteps:
    """A group of two, faked in this process, whose other rank's loader makes ``steps`` steps
    an epoch (-1: it has no length)."""

    class ReduceOp:
        MIN = "min"

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        assert op == "min"
        tensor.copy_(torch.minimum(tensor, torch.tensor([self.steps, -self.steps])))


@pytest.mark.parametrize(
    ("other", "steps", "said"), [(3, 3, "3 to 5"), (7, 5, "5 to 7"), (5, 5, ""), (0, 0, "0 to 5")]
)
def test_the_ranks_agree_on_the_fewest_steps_and_say_so(
    tmp_path, monkeypatch, capsys, other: int, steps: int, said: str
) -> None:
    from conftest import cpu_context

    from hpc_harness import trainer as trainer_mod

    monkeypatch.setattr(trainer_mod, "group", lambda: OtherRankSteps(other))
    cfg = TrainConfig(ckpt_dir=str(tmp_path), log_every=0)
    sgd = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    loader = DataLoader(SizedStream(10), batch_size=2)  # 5 steps here
    trainer = Trainer(nn.Linear(3, 2), sgd, loader, cpu_context(), cfg)
    assert trainer.steps_per_epoch == steps
    out = capsys.readouterr()
    warned = [line for line in (out.out + out.err).splitlines() if "steps an epoch" in line]
    assert warned == (
        [
            f"hpc_harness: warning: the ranks' loaders have {said} steps an epoch: every rank "
            f"trains the first {steps} (the fewest), the rest are left out"
        ]
        if said
        else []
    )
    monkeypatch.setattr(trainer_mod, "group", lambda: OtherRankSteps(-1))  # no length there
    cfg.max_steps = 4
    assert Trainer(nn.Linear(3, 2), sgd, loader, cpu_context(), cfg).steps_per_epoch is None
