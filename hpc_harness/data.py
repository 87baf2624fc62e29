"""Data: the sampler and sampler wrapping that make resume exact.

:class:`ResumableSampler` is a ``DistributedSampler`` whose order depends only on
``(seed, epoch)`` and which can start part-way into an epoch, so a resumed run sees exactly the
batches the interrupted run had not yet seen, without drawing from any global RNG.
:func:`prepare_dataloader` swaps it into a user's DataLoader (unless the user set their own
sampler or opted out).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

# The example's dataset lives in digits.py; importable from here too (older scripts).
from hpc_harness.digits import DigitsDataset, ensure_digits, write_digits  # noqa: F401

# --------------------------------------------------------------------------- samplers


class ResumableSampler(DistributedSampler):
    """DistributedSampler with an order fixed by ``(seed, epoch)`` and a start offset.

    ``set_epoch(e)`` then ``set_start(k)`` makes the next iteration skip this rank's first ``k``
    samples of epoch ``e``. The offset applies to one iteration only.
    """

    def __init__(
        self,
        dataset_len: int,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        self.n = dataset_len
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.start = 0
        if drop_last and dataset_len % num_replicas:
            self.num_samples = math.ceil((dataset_len - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(dataset_len / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_start(self, start: int) -> None:
        self.start = max(0, start)

    def indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        if self.drop_last:
            order = order[: self.total_size]
        elif self.total_size > len(order):
            pad = self.total_size - len(order)
            order += (order * math.ceil(pad / len(order)))[:pad]
        return order[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        mine = self.indices()[self.start :]
        self.start = 0
        return iter(mine)

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start)


def prepare_dataloader(
    loader: DataLoader,
    world_size: int = 1,
    rank: int = 0,
    seed: int = 0,
    replace_sampler: bool = True,
) -> tuple[DataLoader, ResumableSampler | None]:
    """Return a copy of ``loader`` sharded for this rank with a :class:`ResumableSampler`.

    The loader is left alone (and ``None`` returned as sampler) when ``replace_sampler`` is
    False, or when the user gave their own sampler or batch sampler: then resume skips
    already-seen batches by drawing and discarding them, and sharding is the user's job.
    Shuffling is kept if the original loader shuffled (``shuffle=True`` = RandomSampler).
    """
    sampler = loader.sampler
    user_batch_sampler = (
        loader.batch_sampler is not None and type(loader.batch_sampler).__name__ != "BatchSampler"
    )
    if (
        not replace_sampler
        or user_batch_sampler
        or not isinstance(sampler, (RandomSampler, SequentialSampler))
        or loader.batch_size is None
    ):
        if world_size > 1 and rank == 0:
            print(
                "hpc_harness: warning: DataLoader keeps its own sampler; make sure it shards "
                "the data across ranks",
                flush=True,
            )
        return loader, None
    new_sampler = ResumableSampler(
        len(loader.dataset),
        num_replicas=world_size,
        rank=rank,
        shuffle=isinstance(sampler, RandomSampler),
        seed=seed,
        drop_last=loader.drop_last,
    )
    generator = torch.Generator()
    generator.manual_seed(seed)
    kwargs: dict[str, Any] = dict(
        batch_size=loader.batch_size,
        sampler=new_sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        generator=generator,
    )
    if loader.num_workers > 0:
        kwargs["persistent_workers"] = loader.persistent_workers
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return DataLoader(loader.dataset, **kwargs), new_sampler
