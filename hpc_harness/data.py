"""Data: the sampler and sampler wrapping that make resume exact.

:class:`ResumableSampler` is torch's ``DistributedSampler`` (order fixed by ``(seed, epoch)``,
no global RNG) that can start part-way into an epoch, so a resumed run sees exactly the batches
the interrupted run had not yet seen. :func:`prepare_dataloader` swaps it into a user's
DataLoader (unless the user set their own sampler or opted out).
"""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Iterator
from multiprocessing import resource_tracker

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

# The example's dataset lives in digits.py; importable from here too (tools/demo.sh, tests).
from hpc_harness.digits import DigitsDataset, ensure_digits, write_digits  # noqa: F401
from hpc_harness.signals import shielded_worker_init, signals_blocked


class ResumableSampler(DistributedSampler):
    """DistributedSampler over ``range(dataset_len)`` with a start offset.

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
        super().__init__(range(dataset_len), num_replicas, rank, shuffle, seed, drop_last)
        self.start = 0

    def set_start(self, start: int) -> None:
        self.start = max(0, start)

    def worker_seed(self) -> int:
        """The seed for the DataLoader's own generator at the start of this rank's current
        epoch (``loader.generator.manual_seed(sampler.worker_seed())`` after ``set_epoch``): the
        iterator draws its workers' base seed from that generator, so their randomness
        (augmentations) is another on each rank and in each epoch, and a resumed process draws
        in its epoch what an uninterrupted one drew (the generator itself is not saved)."""
        return ((self.seed * 1_000_003 + self.epoch) * 1_000_033 + self.rank) % 2**64

    def indices(self) -> list[int]:
        """This rank's samples of the current epoch, in order (no offset)."""
        return list(super().__iter__())

    def __iter__(self) -> Iterator[int]:
        mine, self.start = self.indices()[self.start :], 0
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
    False, or when the user gave their own sampler or batch sampler, or a RandomSampler that
    is not a permutation (``replacement``, ``num_samples``): then resume replays the
    epoch's order and skips the batches already trained, and sharding is the user's job.
    Shuffling is kept if the original loader shuffled (``shuffle=True`` = RandomSampler).
    """
    sampler = loader.sampler
    if (
        not replace_sampler
        or loader.batch_size is None  # the user's batch_sampler (DataLoader sets None then)
        or not isinstance(sampler, (RandomSampler, SequentialSampler))
        or getattr(sampler, "replacement", False)  # not a permutation of the data
        or len(sampler) != len(loader.dataset)
    ):
        if world_size > 1 and rank == 0:
            print(
                "hpc_harness: warning: DataLoader keeps its own sampler; make sure it shards "
                "the data across ranks",
                flush=True,
            )
        return shield_workers(loader), None
    shuffle = isinstance(sampler, RandomSampler)
    new = ResumableSampler(len(loader.dataset), world_size, rank, shuffle, seed, loader.drop_last)
    # the user's settings are kept; the sampler and the generator are the harness's
    names = ("batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout")
    names += ("worker_init_fn", "pin_memory_device", "in_order")
    if loader.num_workers > 0:  # DataLoader refuses these without workers
        names += ("persistent_workers", "prefetch_factor", "multiprocessing_context")
    kwargs = {k: getattr(loader, k) for k in names}
    generator = torch.Generator().manual_seed(seed)
    return shield_workers(
        DataLoader(loader.dataset, sampler=new, generator=generator, **kwargs)
    ), new


def shield_workers(loader: DataLoader) -> DataLoader:
    """``loader`` with workers that outlive the signals SLURM sends every process of a step;
    returns it (shielded again, it is left as it is). Its iterators start their workers with
    the signals blocked, whatever the start method, so a plain ``for batch in loader`` is safe
    from a worker's birth on (a spawned one takes seconds to start), and
    signals.shielded_worker_init, wrapped around its ``worker_init_fn``, keeps them blocked
    there."""
    if loader.num_workers > 0:
        init = loader.worker_init_fn
        if getattr(init, "func", None) is not shielded_worker_init:
            loader.worker_init_fn = functools.partial(shielded_worker_init, init)
        if not getattr(loader, "born_shielded", False):
            loader.__class__ = _born_shielded(type(loader))  # the user's subclass is kept
    return loader


@functools.cache
def _born_shielded(loader_class: type[DataLoader]) -> type[DataLoader]:
    """``loader_class`` whose iterators start their workers with the stop signals blocked:
    DataLoader starts them (persistent ones once; a forkserver at its first use) in
    ``_get_iterator``, so they inherit this mask. A signal that comes meanwhile reaches this
    process on leaving."""

    class Shielded(loader_class):
        born_shielded = True

        def _get_iterator(self) -> Iterator:
            context = self.multiprocessing_context or multiprocessing.get_context()
            if context.get_start_method() != "fork":
                # Python's resource tracker, started at a process's first spawn or forkserver,
                # unblocks SIGTERM in the thread that starts it: started here, before the block
                resource_tracker.ensure_running()
            with signals_blocked():
                return super()._get_iterator()

    Shielded.__name__ = Shielded.__qualname__ = f"Shielded{loader_class.__name__}"
    return Shielded
