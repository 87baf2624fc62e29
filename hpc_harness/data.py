"""Data: the example dataset on disk, and sampler wrapping that makes resume exact.

The example dataset is scikit-learn's handwritten digits (1797 8x8 images, shipped inside
sklearn, no download), written out as many small files so that staging to node-local disk is
exercised the way real datasets exercise it::

    <data_dir>/index.csv          file,label,split   (one line per sample; 80/20 train/test)
    <data_dir>/images/00000.npy   one uint8 8x8 array per sample

The writer (local rank 0 of each node, since ``$SLURM_TMPDIR`` is node-local) builds it in a
temporary sibling folder and renames it into place; everyone else polls for ``index.csv``.

:class:`ResumableSampler` is a ``DistributedSampler`` whose order depends only on
``(seed, epoch)`` and which can start part-way into an epoch, so a resumed run sees exactly the
batches the interrupted run had not yet seen, without drawing from any global RNG.
:func:`prepare_dataloader` swaps it into a user's DataLoader (unless the user set their own
sampler or opted out).
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

INDEX_NAME = "index.csv"
TEST_FRACTION = 0.2


# --------------------------------------------------------------------------- the digits files


def write_digits(data_dir: str) -> None:
    """Write the digits dataset under ``data_dir`` atomically (temp folder + rename)."""
    from sklearn.datasets import load_digits

    if os.path.exists(os.path.join(data_dir, INDEX_NAME)):
        return
    parent = os.path.dirname(os.path.abspath(data_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(
        parent,
        f".{os.path.basename(os.path.abspath(data_dir))}.tmp.{socket.gethostname()}.{os.getpid()}",
    )
    digits = load_digits()
    images = digits.images.astype(np.uint8)
    labels = digits.target.astype(int)
    order = np.random.RandomState(0).permutation(len(labels))  # fixed split, not the run seed
    n_test = int(round(len(labels) * TEST_FRACTION))
    split = np.empty(len(labels), dtype=object)
    split[order[:n_test]] = "test"
    split[order[n_test:]] = "train"
    os.makedirs(os.path.join(tmp, "images"))
    lines = ["file,label,split"]
    for i, (img, lab) in enumerate(zip(images, labels)):
        name = f"images/{i:05d}.npy"
        np.save(os.path.join(tmp, name), img)
        lines.append(f"{name},{lab},{split[i]}")
    with open(os.path.join(tmp, INDEX_NAME), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        os.rename(tmp, data_dir)
    except OSError:  # someone else (another node on a shared disk) won the race
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.exists(os.path.join(data_dir, INDEX_NAME)):
            raise


def ensure_digits(data_dir: str, local_rank: int = 0, timeout_s: float = 600.0) -> None:
    """Local rank 0 writes the dataset if missing; the other ranks wait for ``index.csv``."""
    index = os.path.join(data_dir, INDEX_NAME)
    if local_rank == 0:
        write_digits(data_dir)
        return
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(index):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f}s for {index} to be written by local rank 0")
        time.sleep(0.2)


class DigitsDataset(Dataset):
    """One split of the digits files, read once into memory (float32 in [0, 1], flattened)."""

    def __init__(self, data_dir: str, split: str = "train") -> None:
        with open(os.path.join(data_dir, INDEX_NAME)) as f:
            rows = [line.strip().split(",") for line in f.readlines()[1:] if line.strip()]
        rows = [r for r in rows if r[2] == split]
        if not rows:
            raise ValueError(f"no '{split}' samples in {data_dir}/{INDEX_NAME}")
        arrays = [np.load(os.path.join(data_dir, r[0])) for r in rows]
        self.x = torch.from_numpy(np.stack(arrays).reshape(len(rows), -1).astype(np.float32) / 16)
        self.y = torch.tensor([int(r[1]) for r in rows], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]

    def __getitems__(self, idx: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # One gather per batch instead of one per sample; default_collate stacks them back.
        t = torch.as_tensor(idx)
        return list(zip(self.x[t], self.y[t]))


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
