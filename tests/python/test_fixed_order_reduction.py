"""FixedOrderReduction (hpc_harness.strategy), in this process: its fixed groups (a fake group
of 2), and DDP's gradients through its hook (a gloo group of 1: the fake group's all-reduce never
completes its future). test_resume_world_sizes.py runs it on real ranks, which the mutation run
skips."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hpc_harness.strategy import FixedOrderReduction


@pytest.fixture
def fake_group():
    """A process group of 2 whose all-reduce returns this rank's own values (no second process):
    the mean of two equal contributions is this rank's gradient divided by 2."""
    import torch.distributed as dist

    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


def _shapes(reduction: FixedOrderReduction) -> list[list[tuple[int, ...]]]:
    return [[tuple(p.shape) for p in group] for group in reduction.groups]


def _three_layers() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))


def test_groups_are_the_parameters_in_reverse_cut_at_group_bytes(fake_group) -> None:
    model = _three_layers()  # reversed: bias 8 bytes, weight 16, bias 8, weight 16, ...
    reduction = FixedOrderReduction(SimpleNamespace(module=model, process_group=None), 24)
    assert reduction.world_size == 2
    assert _shapes(reduction) == [[(2,), (2, 2)]] * 3  # 24 bytes fit in 24
    assert reduction.group_of == {
        id(p): i for i, group in enumerate(reduction.groups) for p in group
    }
    model[0].weight.requires_grad_(False)  # frozen: in no group
    reduction = FixedOrderReduction(SimpleNamespace(module=model, process_group=None), 24)
    assert _shapes(reduction) == [[(2,), (2, 2)], [(2,), (2, 2)], [(2,)]]


def test_the_mean_is_over_the_ddp_models_own_group(fake_group) -> None:
    """DDP(process_group=...) through ddp_kwargs: its gradients are averaged over that group."""
    import torch.distributed as dist

    ddp = SimpleNamespace(module=_three_layers(), process_group=dist.new_group([0]))
    assert FixedOrderReduction(ddp).world_size == 1  # the default group has 2


def _big_then_two_floats(big_bytes: int) -> nn.Module:
    model = nn.Module()
    model.big = nn.Parameter(torch.zeros(big_bytes // 4))
    model.a, model.b = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
    return model


def test_the_default_group_is_ddps_bucket_of_25_mib(fake_group) -> None:
    def shapes(big_bytes: int) -> list[list[tuple[int, ...]]]:
        ddp = SimpleNamespace(module=_big_then_two_floats(big_bytes), process_group=None)
        return _shapes(FixedOrderReduction(ddp))

    mib25 = 25 * 2**20
    assert shapes(mib25 - 8) == [[(1,), (1,), ((mib25 - 8) // 4,)]]  # 25 MiB exactly: one
    assert shapes(mib25 - 4) == [[(1,), (1,)], [((mib25 - 4) // 4,)]]  # 4 bytes more: two


@pytest.fixture
def gloo_group_of_1():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_gradients_through_the_hook_are_the_plain_ones_at_every_step(
    gloo_group_of_1, monkeypatch
) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    reduced_in, all_reduce = [], dist.all_reduce

    def spy(tensor: torch.Tensor, group=None, async_op: bool = False):
        reduced_in.append(group)
        return all_reduce(tensor, group=group, async_op=async_op)

    monkeypatch.setattr(dist, "all_reduce", spy)

    plain = _three_layers()
    ddp = DDP(copy.deepcopy(plain), bucket_cap_mb=1e-5)  # a bucket a parameter, in any order
    reduction = FixedOrderReduction(ddp, 24)
    reduction.register()
    g = torch.Generator().manual_seed(1)
    for _ in range(3):  # the groups start over at each step
        x = torch.randn(4, 2, generator=g)
        plain.zero_grad()
        ddp.zero_grad()
        plain(x).square().mean().backward()
        ddp(x).square().mean().backward()
        for p, q in zip(plain.parameters(), ddp.parameters()):
            assert torch.equal(q.grad, p.grad)
        assert reduction.launched == 0 and reduction.grads == [{}, {}, {}]
    assert reduced_in == [ddp.process_group] * 9  # each group once a step, in the DDP's group


def test_ddp_gets_the_options_and_above_2_ranks_the_fixed_order(gloo_group_of_1) -> None:
    """Strategy.wrap under a group (of 1 here: the context says the world size)."""
    from hpc_harness.strategy import Strategy

    def wrapped(world_size: int) -> nn.Module:
        ctx = SimpleNamespace(
            world_size=world_size, local_world_size=1, device=torch.device("cpu"), devices=[]
        )
        options = {"find_unused_parameters": True}
        return Strategy("ddp", ctx, ddp_kwargs=options).wrap(_three_layers())

    three, two = wrapped(3), wrapped(2)
    assert three.find_unused_parameters and two.find_unused_parameters
    ((hook, _),) = three._comm_hooks
    assert isinstance(hook.__self__, FixedOrderReduction) and hook.__self__.ddp is three
    assert two._comm_hooks == []  # two ranks sum a + b alike in any order
