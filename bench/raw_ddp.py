"""The anchor of the harness- and loop-overhead benchmarks: a plain hand-written DDP loop.

Nothing but DistributedSampler + DDP + SGD: no logging, no checkpoints, no signal checks.
It also defines the workload every configuration of ``bench/harness_overhead.py`` and
``bench/loop_overhead.py`` shares (the model, the data and the per-step clock), so the loops
differ only in the loop; both run this file as their ``raw`` configuration.

    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc-per-node=2 \\
        bench/raw_ddp.py --epochs 5 --samples 20000 --result /tmp/raw.json

Rank 0 writes ``--result``: JSON with the wall-clock time (``time.time()``) at the end of every
optimizer step (``steps``), rank 0's CPU time (``time.process_time()``) at the same moments
(``cpu``), when the process started (``t_start``) and how many steps make an epoch
(``steps_per_epoch``); the driver turns these into steady-state steps/s and CPU time per step.
"""

from __future__ import annotations

import json
import os
import time

T_START = time.time()  # as early as possible: process start, for launch-to-first-step

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402
from torchrun_bench import worker_args  # noqa: E402

from hpc_harness.dist import cleanup  # noqa: E402

BATCH = 64
LR = 0.01
SEED = 0


def make_model() -> nn.Module:
    """MLP 64 -> 256 -> 256 -> 10, identical initial weights on every rank (seeded)."""
    torch.manual_seed(SEED)
    return nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


def make_dataset(samples: int) -> TensorDataset:
    """``samples`` random 64-feature vectors with labels 0-9 from a fixed seed."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(samples, 64, generator=g)
    y = torch.randint(0, 10, (samples,), generator=g)
    return TensorDataset(x, y)


def make_optimizer(params) -> torch.optim.Optimizer:  # noqa: ANN001
    return torch.optim.SGD(params, lr=LR)


def clocked(make_optimizer, clock: list[float], cpu: list[float]):  # noqa: ANN001, ANN201
    """An optimizer factory whose optimizers record the wall and CPU time after every step."""

    def tick(*_: object) -> None:
        clock.append(time.time())
        cpu.append(time.process_time())

    def make(params):  # noqa: ANN001, ANN202
        opt = make_optimizer(params)
        opt.register_step_post_hook(tick)
        return opt

    return make


def write_result(path: str | None, steps: list[float], steps_per_epoch: int, **extra) -> None:
    if not path:
        return
    payload = {"t_start": T_START, "steps": steps, "steps_per_epoch": steps_per_epoch, **extra}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def train_epoch(model: nn.Module, loader: DataLoader, optimizer, epoch: int) -> None:  # noqa: ANN001
    """One epoch of the anchor loop (its DistributedSampler set to ``epoch``): forward, loss,
    backward, step; nothing else."""
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def main() -> None:
    args = worker_args("Plain DDP loop (the anchor).").parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.parallel.DistributedDataParallel(make_model())
    data = make_dataset(args.samples)
    sampler = DistributedSampler(data, shuffle=True, seed=SEED)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    clock: list[float] = []
    cpu: list[float] = []
    optimizer = clocked(make_optimizer, clock, cpu)(model.parameters())
    for epoch in range(args.epochs):
        train_epoch(model, loader, optimizer, epoch)
    if rank == 0:
        write_result(args.result, clock, len(loader), cpu=cpu)
    # not destroy_process_group() alone: cleanup() first lets gloo's threads free the last
    # all-reduce, or the process may abort at exit after a finished run (dist.GIL_YIELD_S)
    cleanup()


if __name__ == "__main__":
    main()
