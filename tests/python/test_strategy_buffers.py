"""Buffers (BatchNorm's running statistics) across ranks: ``broadcast_buffers`` gives every rank
rank 0's, one broadcast per dtype; ``Strategy.sync_buffers`` does it for fsdp only (DDP
broadcasts them itself before each forward, ddp2 after each step).

The ranks are threads joined by torch's in-process threaded group (``conftest.threaded_ranks``):
real collectives, no process started."""

from __future__ import annotations

import torch
from conftest import gloo_context, threaded_ranks
from torch import nn

from hpc_harness.strategy import Strategy, broadcast_buffers

# above 2**24 an int64 is not a float32: buffers of both dtypes sent as one float tensor would
# come back rounded
BIG_COUNT = 2**24 + 1


def _model_of_rank(rank: int) -> nn.Module:
    """Two BatchNorms with rank-specific statistics, a Linear with rank-specific weights."""
    model = nn.Sequential(nn.BatchNorm1d(2), nn.Linear(2, 3), nn.BatchNorm1d(3))
    with torch.no_grad():
        for i, bn in enumerate((model[0], model[2])):
            bn.running_mean.copy_(torch.arange(bn.num_features) + 100.0 * rank + 10 * i)
            bn.running_var.copy_(torch.arange(bn.num_features) + 200.0 * rank + 10 * i + 1)
            bn.num_batches_tracked.fill_(BIG_COUNT + 2 * rank + i)
        model[1].weight.fill_(float(rank))
    return model


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b.clone() for n, b in model.named_buffers()}


def _broadcast(rank: int, world_size: int) -> tuple[dict, float]:
    model = _model_of_rank(rank)
    broadcast_buffers(model)
    return _buffers(model), model[1].weight.sum().item()


def test_every_rank_ends_with_rank_0s_buffers_of_every_dtype_and_keeps_its_weights() -> None:
    expected = _buffers(_model_of_rank(0))
    assert expected["0.num_batches_tracked"].dtype == torch.int64
    results = threaded_ranks(_broadcast, 3)
    for rank, (buffers, weight_sum) in enumerate(results):
        assert buffers.keys() == expected.keys()
        for name, value in expected.items():
            assert buffers[name].dtype == value.dtype, name
            assert torch.equal(buffers[name], value), (rank, name, buffers[name], value)
        assert weight_sum == 6.0 * rank  # parameters are not buffers: each rank keeps its own


def _synced(rank: int, world_size: int, strategy: str) -> dict:
    model = _model_of_rank(rank)
    Strategy(strategy, gloo_context(rank, world_size)).sync_buffers(model)
    return _buffers(model)


def test_fsdp_gives_every_rank_rank_0s_buffers() -> None:
    expected = _buffers(_model_of_rank(0))
    for buffers in threaded_ranks(_synced, 2, "fsdp"):
        assert all(torch.equal(buffers[n], v) for n, v in expected.items())


def test_ddp_and_ddp2_leave_the_buffers_to_their_own_broadcasts() -> None:
    """No collective of ours: DDP broadcasts them before each forward, ddp2 after each step."""
    for strategy in ("ddp", "ddp2"):
        results = threaded_ranks(_synced, 2, strategy)
        for rank, buffers in enumerate(results):
            own = _buffers(_model_of_rank(rank))
            assert all(torch.equal(buffers[n], v) for n, v in own.items()), (strategy, rank)


def test_fsdp_alone_has_no_group_to_sync_with() -> None:
    """World size 1, no process group: nothing to do, and nothing that needs a group."""
    model = _model_of_rank(1)
    Strategy("fsdp", gloo_context(0, 1)).sync_buffers(model)
    assert all(torch.equal(b, v) for b, v in zip(model.buffers(), _model_of_rank(1).buffers()))
