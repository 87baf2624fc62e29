"""average_gradients (hpc_harness.pieces): one flat all-reduce, divided by the world size, copied
back parameter by parameter; parameters without a gradient are left alone."""

from __future__ import annotations

import pytest
import torch
from conftest import spawn_gloo

from hpc_harness.pieces import average_gradients


def _model_with_grads() -> tuple[torch.nn.Module, dict[str, torch.Tensor | None]]:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    for i, p in enumerate(model.parameters()):
        p.grad = torch.arange(p.numel(), dtype=torch.float32).view_as(p) + 10 * i
    model[1].bias.grad = None  # e.g. an unused parameter
    return model, {
        n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()
    }


def test_alone_the_gradients_are_untouched() -> None:
    model, before = _model_with_grads()
    average_gradients(model, 1)
    for name, p in model.named_parameters():
        assert (p.grad is None) == (before[name] is None)
        if p.grad is not None:
            assert torch.equal(p.grad, before[name])


@pytest.fixture
def fake_group():
    """A process group of 2 whose all-reduce returns this rank's own values (no second process):
    the average of two equal contributions is then the sum of one divided by 2."""
    import torch.distributed as dist

    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


def test_with_a_group_every_gradient_is_divided_by_the_world_size(fake_group) -> None:
    model, before = _model_with_grads()
    average_gradients(model, 2)
    for name, p in model.named_parameters():
        if before[name] is None:
            assert p.grad is None
        else:
            assert torch.equal(p.grad, before[name] / 2), name


def _heads_used_by_one_rank_each(rank: int, world_size: int) -> dict[str, list | None]:
    """Rank 0 trains head ``a`` only, rank 1 head ``b`` only (a branch the data chooses);
    ``c`` is used by no rank. The heads have the same shape: a flat buffer built from each
    rank's own gradients would add rank 0's ``a`` to rank 1's ``b`` without an error."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({k: torch.nn.Linear(2, 1, bias=False) for k in "abc"})
    x = torch.full((1, 2), 1.0 if rank == 0 else 10.0)
    model["a" if rank == 0 else "b"](x).sum().backward()
    average_gradients(model, world_size)
    return {k: None if m.weight.grad is None else m.weight.grad.tolist() for k, m in model.items()}


def test_a_gradient_that_only_some_ranks_have_is_averaged_with_zeros_from_the_others() -> None:
    # rank 0's gradient of a is x = [1, 1], rank 1's of b is [10, 10]; the other rank's is 0
    expected = {"a": [[0.5, 0.5]], "b": [[5.0, 5.0]], "c": None}
    assert spawn_gloo(_heads_used_by_one_rank_each, 2) == [expected, expected]


def test_a_step_that_used_every_parameter_builds_nothing_on_the_host(
    fake_group, monkeypatch
) -> None:
    """The has-gradient flags are made where the gradients are. Built on the host, they were
    copied to the GPU at every step, and torch waits for a blocking copy to finish: the host
    then waited for the backward pass each step before it could queue the all-reduce. No GPU
    here, so the test forbids building a tensor from Python values (what that copy starts
    from) during the call."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    for p in model.parameters():
        p.grad = torch.ones_like(p)

    def built_on_the_host(*args, **kwargs):
        raise AssertionError("a tensor built from Python values in average_gradients")

    monkeypatch.setattr(torch, "tensor", built_on_the_host)
    average_gradients(model, 2)
    assert all(torch.equal(p.grad, torch.full_like(p, 0.5)) for p in model.parameters())


def test_a_model_of_one_parameter_is_averaged(fake_group) -> None:
    """The flags of which rank has which gradient are made beside the first gradient."""
    model = torch.nn.Linear(3, 1, bias=False)
    model.weight.grad = torch.tensor([[2.0, 4.0, 6.0]])
    average_gradients(model, 2)
    assert model.weight.grad.tolist() == [[1.0, 2.0, 3.0]]
