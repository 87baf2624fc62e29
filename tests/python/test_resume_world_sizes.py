"""Exact resume above two ranks: the Trainer (ddp, its default; fsdp at 4) and the pieces
recipe, signalled inside an epoch and at an epoch's end, resumed, end bitwise equal to an
uninterrupted run. One spawned gloo group per world size runs every case (8 ranks on 2 cores:
a tiny model, a few steps). Odd sizes pad the sampler; every epoch ends in a partial batch."""

from __future__ import annotations

import functools
import os
import signal

import pytest
import torch
from conftest import bitwise_equal, gloo_context, spawn_gloo
from test_pieces_recipe import TOTAL_STEPS, _run_recipe
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness.trainer import TrainConfig, Trainer

B = 2  # per rank; 9 samples a rank (the last padded), 5 steps an epoch, the 5th of 1 sample
STEPS_PER_EPOCH, EPOCHS = 5, 2
STOPS = (3, STEPS_PER_EPOCH)  # inside epoch 0, at its end


class SignalAtStep(Trainer):
    """Sends itself SIGUSR1 while computing the loss of global step ``signal_at`` (every rank
    does: SLURM signals every task)."""

    signal_at = 0

    def training_step(self, batch):
        if self.global_step + 1 == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)
        return super().training_step(batch)


def _model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights in every run
    return nn.Sequential(
        nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)
    )


def _train(rank: int, world_size: int, ck: str, strategy: str, signal_at: int = 0) -> str:
    n = 9 * world_size - 1
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g))
    cfg = TrainConfig(
        epochs=EPOCHS, ckpt_dir=ck, log_every=0, checkpoint_every_s=0, strategy=strategy, seed=3
    )
    cfg.signal_check_every = 1  # the flag is read at the step it was raised in
    trainer = SignalAtStep(
        _model(),
        lambda p: torch.optim.AdamW(p, lr=0.05),
        DataLoader(data, batch_size=B, shuffle=True),
        gloo_context(rank, world_size),
        cfg,
    )
    trainer.signal_at = signal_at
    assert trainer.steps_per_epoch == STEPS_PER_EPOCH
    return trainer.train()


def _max_diff(a: str, b: str) -> float:
    wa = torch.load(a, weights_only=False)["model"]
    wb = torch.load(b, weights_only=False)["model"]
    assert sorted(wa) == sorted(wb)
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


def _trainer_cases(rank: int, world_size: int, root: str, strategies: tuple[str, ...]) -> dict:
    """{(strategy, stop): max |resumed - uninterrupted|} over the final weights (rank 0)."""
    os.environ.pop("HPC_REQUEUE_MARKER", None)
    diffs = {}
    for strategy in strategies:
        ref = os.path.join(root, strategy, "ref")
        assert _train(rank, world_size, ref, strategy) == "finished"
        for stop in STOPS:
            ck = os.path.join(root, strategy, f"stop{stop}")
            assert _train(rank, world_size, ck, strategy, signal_at=stop) == "requeue"
            assert _train(rank, world_size, ck, strategy) == "finished"
            if rank == 0:
                diffs[strategy, stop] = _max_diff(f"{ref}/last.pt", f"{ck}/last.pt")
    return diffs


@pytest.mark.parametrize(
    ("world_size", "strategies"), [(3, ("ddp",)), (4, ("ddp", "fsdp")), (8, ("ddp",))]
)
def test_the_trainer_resumes_bitwise_above_two_ranks(tmp_path, world_size, strategies) -> None:
    """DDP regroups its gradient buckets after a process's first step (by the order the
    gradients became ready), and gloo's ring sums an element in an order set by its place in
    the bucket: the first step after a resume summed in another order than the uninterrupted
    run's same step (1.5e-08 away at 3 ranks)."""
    diffs = spawn_gloo(_trainer_cases, world_size, str(tmp_path), strategies)[0]
    assert diffs == {(s, stop): 0.0 for s in strategies for stop in STOPS}


def _reduced_grads(rank: int, world_size: int, bucket_mb: float, group_bytes: int) -> tuple:
    """Three steps' averaged gradients under DDP buckets of ``bucket_mb`` and
    FixedOrderReduction groups of ``group_bytes`` (the data the same for any layout), and the
    plain means over the ranks."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hpc_harness.strategy import FixedOrderReduction

    ddp = DDP(_model(), bucket_cap_mb=bucket_mb)
    FixedOrderReduction(ddp, group_bytes).register()
    g = torch.Generator().manual_seed(rank)
    grads, means = [], []
    for _ in range(3):
        ddp.zero_grad()
        x = torch.randn(4, 5, generator=g)
        ddp(x).square().mean().backward()
        grads += [p.grad.clone() for p in ddp.parameters()]
        ddp.zero_grad()
        with ddp.no_sync():
            ddp(x).square().mean().backward()
        for p in ddp.parameters():
            parts = [torch.empty_like(p.grad) for _ in range(world_size)]
            torch.distributed.all_gather(parts, p.grad)
            means.append(sum(parts) / world_size)
    return grads, means


def _layouts(rank: int, world_size: int) -> tuple[bool, float]:
    """Whether the gradients are bitwise the same under buckets of 25 MB and of 100 bytes,
    and their largest distance from the plain mean."""
    (big, means), (small, _) = (_reduced_grads(rank, world_size, mb, 300) for mb in (25, 1e-4))
    same = all(torch.equal(a, b) for a, b in zip(big, small))
    return same, max((a - m).abs().max().item() for a, m in zip(big, means))


def test_fixed_order_reduction_sums_alike_under_any_bucket_layout() -> None:
    """DDP's buckets (one of every parameter at the first step, then of 25 MB or of 100
    bytes) do not change a gradient's sum: groups of 300 bytes (one waits for later buckets,
    a bucket for later groups) average like DDP, bitwise the same under both layouts."""
    for same, off_mean in spawn_gloo(_layouts, 3):
        assert same and off_mean < 1e-6


def _recipe_cases(rank: int, world_size: int, root: str) -> dict[int, bool]:
    """The pieces recipe (AdamW, dropout, average_gradients) with 4 steps an epoch (the last
    sample of a rank padded) and 7 in all, stopped inside epoch 0 and at its end, resumed:
    {stop: its final weights bitwise the uninterrupted run's} on this rank, and the shapes of
    the floating tensors it pickled to other ranks."""
    samples, same = 9 * world_size - 1, {}
    # floating tensors pickled by broadcast_object_list (torch's broadcast_from_rank0 sends
    # the skeleton of the state so, with AdamW's step counts in it: scalars, left out)
    pickled: list[torch.Tensor] = []
    send = torch.distributed.broadcast_object_list

    def recorded(objects, *args, **kwargs):
        leaves = torch.utils._pytree.tree_leaves(objects)
        floats = (t for t in leaves if torch.is_tensor(t) and t.is_floating_point())
        pickled.extend(t for t in floats if t.dim())
        return send(objects, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.distributed, "broadcast_object_list", recorded)
        run = functools.partial(_run_recipe, mp, rank=rank, world_size=world_size)
        run = functools.partial(run, samples=samples, group=True)
        code, straight = run(os.path.join(root, "straight"), 0, [])
        assert code is None
        for stop in (2, 4):
            ck = os.path.join(root, f"stop{stop}")
            assert run(ck, stop, [])[0] == 42
            code, weights = run(ck, 0, [])
            assert code is None
            same[stop] = bitwise_equal(weights, straight)
    # the README's recipe loaded with the model and AdamW's moments pickled to every rank
    same["pickled"] = [tuple(t.shape) for t in pickled]
    return same


@pytest.mark.parametrize("world_size", [3, 4, 8])
def test_the_pieces_recipe_resumes_bitwise_above_two_ranks(tmp_path, world_size) -> None:
    assert TOTAL_STEPS == 7
    results = spawn_gloo(_recipe_cases, world_size, str(tmp_path))
    assert results == [{2: True, 4: True, "pickled": []}] * world_size
