"""ResumableSampler keeps DistributedSampler's contract exactly (order, padding, drop_last,
length) and adds a start offset: a user swapping one for the other sees the same samples."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from hpc_harness.data import ResumableSampler


@pytest.mark.parametrize("n, replicas", [(10, 1), (10, 2), (10, 3), (7, 4), (2, 5)])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_same_samples_as_distributed_sampler(
    n: int, replicas: int, shuffle: bool, drop_last: bool
) -> None:
    data = list(range(n))
    for rank in range(replicas):
        for epoch in (0, 3):
            ours = ResumableSampler(n, replicas, rank, shuffle=shuffle, seed=4, drop_last=drop_last)
            theirs = DistributedSampler(
                data, replicas, rank, shuffle=shuffle, seed=4, drop_last=drop_last
            )
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs), (rank, epoch)
            assert len(ours) == len(theirs)


def test_padding_repeats_the_start_of_the_order() -> None:
    parts = [list(ResumableSampler(10, 3, r, shuffle=False)) for r in range(3)]
    assert parts == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    # more ranks than samples: the order repeats as often as needed
    assert [list(ResumableSampler(2, 5, r, shuffle=False)) for r in range(5)] == [
        [0],
        [1],
        [0],
        [1],
        [0],
    ]


def test_drop_last_drops_the_uneven_tail_only() -> None:
    parts = [list(ResumableSampler(10, 3, r, shuffle=False, drop_last=True)) for r in range(3)]
    assert parts == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    even = [list(ResumableSampler(10, 2, r, shuffle=False, drop_last=True)) for r in range(2)]
    assert even == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]


def test_start_counts_this_ranks_samples_and_is_clamped() -> None:
    s = ResumableSampler(12, 2, 1, shuffle=False)
    s.set_start(4)
    assert len(s) == 2 and list(s) == [9, 11]
    s.set_start(100)
    assert len(s) == 0 and list(s) == []
    s.set_start(-3)  # a negative offset means the start of the epoch
    assert len(s) == 6 and list(s) == [1, 3, 5, 7, 9, 11]


def test_shuffled_order_depends_on_seed_and_epoch_only() -> None:
    a = ResumableSampler(40, seed=1)
    b = ResumableSampler(40, seed=2)
    assert list(a) != list(b)
    epoch0 = list(a)
    a.set_epoch(1)
    assert list(a) != epoch0 and sorted(list(a)) == list(range(40))
    torch.manual_seed(0)
    first = list(ResumableSampler(40, seed=1))
    torch.manual_seed(1)
    assert list(ResumableSampler(40, seed=1)) == first  # no global RNG involved


def test_the_default_seed_is_distributed_samplers_0() -> None:
    assert list(ResumableSampler(30)) == list(ResumableSampler(30, seed=0))
    assert list(ResumableSampler(30)) == list(DistributedSampler(range(30), 1, 0))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_k_samples_on_every_rank_are_the_first_k_times_world_of_the_epochs_order(world) -> None:
    """What a resume under another world size relies on (Trainer._resume): the order does not
    depend on the world size and rank r reads every world-th sample of it from r."""
    order = ResumableSampler(50, 1, 0, seed=4)
    order.set_epoch(2)
    for k in range(1, 50 // world):
        read = set()
        for rank in range(world):
            sampler = ResumableSampler(50, world, rank, seed=4)
            sampler.set_epoch(2)
            read |= set(sampler.indices()[:k])
        assert read == set(order.indices()[: k * world])
