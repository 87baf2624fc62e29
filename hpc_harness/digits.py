"""The example's dataset: scikit-learn's handwritten digits as many small files on disk.

1797 8x8 images, shipped inside sklearn (no download), written out as many small files so that
staging to node-local disk is exercised the way real datasets exercise it::

    <data_dir>/index.csv          file,label,split   (one line per sample; 80/20 train/test)
    <data_dir>/images/00000.npy   one uint8 8x8 array per sample

The writer (local rank 0 of each node, since ``$SLURM_TMPDIR`` is node-local) builds it in a
temporary sibling folder and renames it into place; everyone else polls for ``index.csv``.
"""

from __future__ import annotations

import os
import shutil
import socket
import time

import numpy as np
import torch
from torch.utils.data import Dataset

INDEX_NAME = "index.csv"
TEST_FRACTION = 0.2


def write_digits(data_dir: str) -> None:
    """Write the digits dataset under ``data_dir`` atomically (temp folder + rename)."""
    if os.path.exists(os.path.join(data_dir, INDEX_NAME)):
        return
    # Imported only here: sklearn costs a process about a second.
    from sklearn.datasets import load_digits

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
