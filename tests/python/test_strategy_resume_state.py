"""What a sixth review found in the strategies' state: a parameter without optimizer state (not
used yet) made every checkpoint unloadable; a sharded save took a replicated buffer from any
rank; fsdp never made the ranks' buffers (BatchNorm's statistics) agree. Each test failed
before."""

from __future__ import annotations

import pytest
import torch
from conftest import gloo_context, spawn_gloo
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness import dist as hdist
from hpc_harness.strategy import Strategy
from hpc_harness.trainer import TrainConfig, Trainer


class WithAnUnusedHead(nn.Module):
    """``aux`` has had no gradient yet (a branch not taken so far, a head unfrozen later):
    the optimizer has no state for it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 3)
        self.aux = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.bn = nn.Linear(6, 6), nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.fc(x)))


class WithBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def _data(inputs: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(32, inputs, generator=torch.Generator().manual_seed(1))
    return x, torch.randint(0, 3, (32,), generator=torch.Generator().manual_seed(2))


def _trainer(
    ctx, ck: str, make_model, max_steps: int | None = None, plateau: bool = False, **cfg
) -> Trainer:
    torch.manual_seed(0)  # the same initial weights in every run
    model = make_model()
    x, y = _data(model_inputs(model))
    config = TrainConfig(
        epochs=2, ckpt_dir=ck, log_every=0, checkpoint_every_s=0, max_steps=max_steps, **cfg
    )
    return Trainer(
        model,
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True),
        ctx,
        config,
        make_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau if plateau else None,
        eval_data=TensorDataset(x[:8], y[:8]),
    )


def model_inputs(model: nn.Module) -> int:
    return 4 if isinstance(model, WithAnUnusedHead) else 6


def _resumed_equals_uninterrupted(ctx, tmp: str, make_model, **cfg) -> dict[str, bool]:
    """Trains 2 epochs whole and in two pieces (stopped at step 3); per state tensor of this
    rank's model, and per parameter whether the optimizer holds state for it, whether the two
    runs ended equal (a parameter without state must not gain a zero step's state: the next
    checkpoint would hold what the uninterrupted run's does not)."""
    whole = _trainer(ctx, f"{tmp}/whole", make_model, **cfg)
    assert whole.train() == "finished"
    cut = f"{tmp}/cut"
    assert _trainer(ctx, cut, make_model, max_steps=3, **cfg).train() == "max_steps"
    resumed = _trainer(ctx, cut, make_model, **cfg)
    assert resumed.train() == "finished" and resumed.global_step == whole.global_step
    a = whole.strategy._stateful(whole.model).state_dict()
    b = resumed.strategy._stateful(resumed.model).state_dict()
    same = {k: torch.equal(_full(a[k]), _full(b[k])) for k in a}
    for (name, p), q in zip(whole.model.named_parameters(), resumed.model.parameters()):
        same[f"optimizer state of {name}"] = (p in whole.optimizer.state) == (
            q in resumed.optimizer.state
        )
    return same


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def test_a_parameter_without_optimizer_state_resumes(tmp_path) -> None:
    """torch refused the load ("Missing optimizer state for parameter 'aux.weight'"), at every
    requeue: the run could never go on."""
    ctx = hdist.setup(verbose=False)
    same = _resumed_equals_uninterrupted(ctx, str(tmp_path), WithAnUnusedHead)
    assert same and all(same.values()), same


def test_a_parameter_without_optimizer_state_resumes_from_a_sharded_checkpoint(tmp_path) -> None:
    """The load target gave every parameter optimizer state, which dcp.load then demanded
    from the checkpoint ("Missing key ... optimizer.state.aux.weight.momentum_buffer")."""
    ctx = hdist.setup(verbose=False)
    same = _resumed_equals_uninterrupted(
        ctx, str(tmp_path), WithAnUnusedHead, sharded_checkpoint=True
    )
    assert same and all(same.values()), same


def _two_ranks(
    rank: int, world_size: int, tmp: str, strategy: str, sharded: bool, plateau: bool = False
) -> dict:
    ctx = gloo_context(rank, world_size)
    same = _resumed_equals_uninterrupted(
        ctx, tmp, WithBatchNorm, strategy=strategy, sharded_checkpoint=sharded, plateau=plateau
    )
    trainer = _trainer(ctx, f"{tmp}/ranks", WithBatchNorm, strategy=strategy)
    trainer.train()
    model = trainer.strategy._stateful(trainer.model)
    buffers = {k: v.tolist() for k, v in model.named_buffers()}  # plain: a tensor would be
    # shared through a file the rank then removes
    return {"same": same, "buffers": buffers, "metrics": dict(trainer.metrics)}


def _test_loss_of_the_saved_model(folder: str) -> float:
    """The final model (last.pt) evaluated in one process: what the ranks should have logged."""
    model = WithBatchNorm()
    model.load_state_dict(torch.load(f"{folder}/last.pt", weights_only=True)["model"])
    x, y = _data(6)
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(model.eval()(x[:8]), y[:8]).item()


def test_ddp_with_batchnorm_resumes_bitwise_from_a_sharded_checkpoint(tmp_path) -> None:
    """dcp.save's default plan spreads a replicated tensor's writes over the ranks: the
    checkpoint held rank 1's BatchNorm statistics, which the resumed rank 0 then broadcast."""
    ranks = spawn_gloo(_two_ranks, 2, str(tmp_path), "ddp", True)
    same = ranks[0]["same"]
    assert all(same.values()), [k for k, v in same.items() if not v]


def test_fsdp_ranks_evaluate_and_save_one_model_and_resume_bitwise(tmp_path) -> None:
    """fsdp kept each rank's BatchNorm statistics: the ranks evaluated different models (the
    logged test loss averaged them), and a resume gave every rank rank 0's."""
    ranks = spawn_gloo(_two_ranks, 2, str(tmp_path), "fsdp", False)
    assert ranks[0]["buffers"] == ranks[1]["buffers"]
    same = ranks[0]["same"]
    assert all(same.values()), [k for k, v in same.items() if not v]
    expected = _test_loss_of_the_saved_model(f"{tmp_path}/ranks")
    assert ranks[0]["metrics"]["test_loss"] == pytest.approx(expected, rel=1e-6)


def test_fsdp_with_a_plateau_scheduler_resumes(tmp_path) -> None:
    """The monitor's check (one evaluation batch before training) left FSDP2's root module
    unsharded (a forward without a backward): the resume's load then failed at every requeue
    ("got mixed torch.Tensor and DTensor")."""
    ranks = spawn_gloo(_two_ranks, 2, str(tmp_path), "fsdp", False, True)
    same = ranks[0]["same"]
    assert all(same.values()), [k for k, v in same.items() if not v]


def test_every_module_that_can_reshard_is_resharded_before_a_load() -> None:
    """The test above in this one process (mutation testing runs none): Strategy.load first
    calls reshard() (FSDP2's) on each module that has it."""
    calls: list[nn.Module] = []

    class Resharded(nn.Linear):
        def reshard(self) -> None:
            calls.append(self)

    model = nn.Sequential(Resharded(2, 2), nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    Strategy("ddp", hdist.setup(verbose=False)).load(model, optimizer, state)
    assert calls == [model[0]]
