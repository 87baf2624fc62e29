"""ResumableSampler and the automatic sampler wrapping of a user's DataLoader."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from hpc_harness.data import ResumableSampler, prepare_dataloader


def _dataset(n: int = 10) -> TensorDataset:
    return TensorDataset(torch.arange(n).float().unsqueeze(1), torch.arange(n))


def test_ranks_partition_the_data() -> None:
    parts = [ResumableSampler(10, num_replicas=3, rank=r, seed=1).indices() for r in range(3)]
    assert all(len(p) == 4 for p in parts)  # padded to equal length
    assert set().union(*parts) == set(range(10))
    assert isinstance(ResumableSampler(10), DistributedSampler)


def test_order_is_fixed_by_seed_and_epoch() -> None:
    a, b = ResumableSampler(50, seed=3), ResumableSampler(50, seed=3)
    a.set_epoch(2)
    b.set_epoch(2)
    assert a.indices() == b.indices()
    b.set_epoch(3)
    assert a.indices() != b.indices()
    assert sorted(a.indices()) == list(range(50))


def test_start_offset_skips_consumed_samples_once() -> None:
    s = ResumableSampler(20, seed=0)
    s.set_epoch(1)
    full = list(s)
    s.set_start(7)
    assert len(s) == 13
    assert list(s) == full[7:]
    assert list(s) == full  # the offset applied to one iteration only


def test_sampler_does_not_touch_global_rng() -> None:
    torch.manual_seed(0)
    before = torch.get_rng_state()
    list(ResumableSampler(100, seed=5))
    assert torch.equal(before, torch.get_rng_state())


def test_prepare_wraps_a_shuffling_loader_per_rank() -> None:
    loader = DataLoader(_dataset(10), batch_size=2, shuffle=True)
    seen = []
    for rank in range(2):
        wrapped, sampler = prepare_dataloader(loader, world_size=2, rank=rank, seed=0)
        assert isinstance(sampler, ResumableSampler) and sampler.shuffle
        assert wrapped.batch_size == 2 and len(wrapped) == 3
        seen.append([int(i) for _, y in wrapped for i in y])
    assert set(seen[0]).isdisjoint(seen[1])
    assert set(seen[0]) | set(seen[1]) == set(range(10))


def test_prepare_keeps_sequential_order_unshuffled() -> None:
    wrapped, sampler = prepare_dataloader(DataLoader(_dataset(6), batch_size=3), 1, 0)
    assert sampler is not None and not sampler.shuffle
    assert [int(i) for _, y in wrapped for i in y] == list(range(6))


def test_prepare_leaves_a_user_sampler_alone(capsys) -> None:
    ds = _dataset(8)
    user = DistributedSampler(ds, num_replicas=2, rank=0)
    loader = DataLoader(ds, batch_size=2, sampler=user)
    same, sampler = prepare_dataloader(loader, world_size=2, rank=0)
    assert same is loader and sampler is None
    assert "keeps its own sampler" in capsys.readouterr().out
    same, sampler = prepare_dataloader(
        DataLoader(ds, batch_size=2, shuffle=True), 2, 0, replace_sampler=False
    )
    assert sampler is None


def test_the_workers_seed_is_one_a_torch_generator_takes_for_any_run_seed() -> None:
    # a run's --seed may be any 64-bit number; torch.Generator.manual_seed takes [0, 2**64)
    for seed in (0, 7, 2**62 + 1, 2**63 + 12345, 2**64 - 1):
        for epoch, rank in ((0, 0), (3, 1), (1000, 7)):
            sampler = ResumableSampler(64, 8, rank, seed=seed)
            sampler.set_epoch(epoch)
            assert 0 <= sampler.worker_seed() < 2**64
            torch.Generator().manual_seed(sampler.worker_seed())
