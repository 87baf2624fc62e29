"""One optimizer step of the Trainer, in-process: which micro-batch synchronises gradients
(DDP's no_sync, FSDP2's set_requires_gradient_sync), gradients set to None between steps,
batches moved to the device, self.log's running sums, and the default eval_step."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import cpu_context
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness.trainer import TrainConfig, Trainer


def make_trainer(model: nn.Module, n: int = 8, trainer_cls=Trainer, **cfg_kw) -> Trainer:
    """``n`` samples in order, batch 2; the model as given (no process group: not wrapped)."""
    g = torch.Generator().manual_seed(4)
    data = TensorDataset(torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g))
    cfg = TrainConfig(
        **{"epochs": 1, "log_every": 0, "checkpoint_every_s": 0, "resume": False, **cfg_kw}
    )
    return trainer_cls(
        model,
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        DataLoader(data, batch_size=2),
        cpu_context(),
        cfg,
    )


class DdpLike(nn.Linear):
    """Records how many micro-batches ran before each ``no_sync()`` was entered."""

    def __init__(self) -> None:
        super().__init__(3, 2)
        self.forwards, self.no_sync_at = 0, []

    def forward(self, x):
        self.forwards += 1
        return super().forward(x)

    @contextlib.contextmanager
    def no_sync(self):
        self.no_sync_at.append(self.forwards)
        yield


class FsdpLike(nn.Linear):
    """Records every ``set_requires_gradient_sync`` call (FSDP2's switch)."""

    def __init__(self) -> None:
        super().__init__(3, 2)
        self.sync_calls = []

    def set_requires_gradient_sync(self, sync: bool) -> None:
        self.sync_calls.append(sync)


def test_gradients_are_synchronised_only_at_each_steps_last_micro_batch(tmp_path) -> None:
    # 14 samples, batch 2, accumulate 3: steps of 3, 3 and 1 micro-batches
    ddp = DdpLike()
    assert make_trainer(ddp, 14, ckpt_dir=str(tmp_path / "a"), accumulate=3).train() == "finished"
    assert ddp.no_sync_at == [0, 1, 3, 4]  # not around micro-batches 2, 5 and 6
    fsdp = FsdpLike()
    assert make_trainer(fsdp, 14, ckpt_dir=str(tmp_path / "b"), accumulate=3).train() == "finished"
    assert fsdp.sync_calls == [False, False, True, False, False, True, True]


class OnlyFirstStepUsesExtra(nn.Module):
    """``extra`` takes part in the loss of the first step only (a conditional branch)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.extra = nn.Linear(3, 2), nn.Parameter(torch.ones(2))
        self.use_extra = True

    def forward(self, x):
        out = self.linear(x)
        return out * self.extra if self.use_extra else out


class BranchTrainer(Trainer):
    extra_before_step_2: torch.Tensor

    def training_step(self, batch):
        self.model.use_extra = self.global_step == 0
        if self.global_step == 1:
            self.extra_before_step_2 = self.model.extra.detach().clone()
        return super().training_step(batch)


def test_a_parameter_without_a_gradient_in_a_step_is_not_moved_by_momentum(tmp_path) -> None:
    # zero_grad(set_to_none=True): its grad is None, so SGD skips it (a zero grad would not)
    trainer = make_trainer(OnlyFirstStepUsesExtra(), 4, BranchTrainer, ckpt_dir=str(tmp_path))
    assert trainer.train() == "finished" and trainer.global_step == 2
    assert not torch.equal(trainer.extra_before_step_2, torch.ones(2))  # step 1 moved it
    assert torch.equal(trainer.model.extra.detach(), trainer.extra_before_step_2)


def test_batches_are_moved_to_the_device_except_on_the_cpu(tmp_path) -> None:
    trainer = make_trainer(nn.Linear(3, 2), ckpt_dir=str(tmp_path))
    batch = {"x": torch.ones(2), "pair": (torch.zeros(1), 3), "name": "a"}
    assert trainer._to_device(batch) is batch  # CPU: used as it is
    trainer.device = torch.device("meta")  # stands for an accelerator
    moved = trainer._to_device(batch)
    assert moved["x"].device.type == moved["pair"][0].device.type == "meta"
    assert (moved["pair"][1], moved["name"]) == (3, "a")
    assert batch["x"].device.type == "cpu"


def test_a_tuple_or_list_of_tensors_is_moved_without_pytrees_walk(tmp_path, monkeypatch) -> None:
    """The common batch, (inputs, targets): pytree's walk costs about 20 us a step on the host
    (1.3 us for the two .to() calls), more than the rest of the Trainer's step adds, and on a GPU
    it is paid every step (the CPU skips the move). Other batches still take the walk."""
    from hpc_harness import trainer as trainer_mod

    trainer = make_trainer(nn.Linear(3, 2), ckpt_dir=str(tmp_path))
    trainer.device = torch.device("meta")  # stands for an accelerator
    walked = []
    real = trainer_mod.tree_map_only
    monkeypatch.setattr(
        trainer_mod, "tree_map_only", lambda *a: walked.append(type(a[2])) or real(*a)
    )
    for batch in ((torch.ones(2), torch.zeros(2)), [torch.ones(2), torch.zeros(2)]):
        moved = trainer._to_device(batch)
        assert type(moved) is type(batch) and len(moved) == 2
        assert all(t.device.type == "meta" for t in moved)
    assert walked == []
    moved = trainer._to_device({"x": torch.ones(2)})
    assert walked == [dict] and moved["x"].device.type == "meta"
    moved = trainer._to_device((torch.ones(2), 3))  # not only tensors: the walk
    assert walked == [dict, tuple] and moved[0].device.type == "meta" and moved[1] == 3


def test_logged_values_are_kept_without_autograd_history_and_summed_at_the_log_line(
    tmp_path,
) -> None:
    trainer = make_trainer(nn.Linear(3, 2), ckpt_dir=str(tmp_path), log_every=2)
    w = torch.ones(2, requires_grad=True)
    trainer.log("loss", (w * 2).sum())
    trainer.log("loss", 1.5)
    kept = trainer._logged["loss"]
    assert not kept[0].requires_grad and kept[1] == 1.5  # no graph alive until the log line
    trainer.device = torch.device("meta")  # no host sync per step: the values stay where made
    trainer.log("on_device", torch.ones((), device="meta"))
    assert trainer._logged["on_device"][0].device.type == "meta"


def test_log_does_no_tensor_work_per_step_and_nothing_without_log_lines(tmp_path) -> None:
    """An add per step was a kernel launch per step on a GPU (about 5 us of host time there,
    more than the rest of the Trainer's bookkeeping); the log line sums the kept values."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ran: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ran.append(str(func))
            return func(*args, **(kwargs or {}))

    trainer = make_trainer(nn.Linear(3, 2), ckpt_dir=str(tmp_path), log_every=2)
    loss = torch.tensor(0.5)
    with Ops() as ops:
        for _ in range(3):
            trainer.log("loss", loss)
    launched = [op for op in ops.ran if op != "aten.detach.default"]  # a view: no kernel
    assert launched == [] and len(trainer._logged["loss"]) == 3
    quiet = make_trainer(nn.Linear(3, 2), ckpt_dir=str(tmp_path / "q"), log_every=0)
    quiet.log("loss", loss)  # never logged: nothing kept, so nothing grows
    assert quiet._logged == {}


class DictBatchTrainer(Trainer):
    """A user loss for batches that are not (inputs, targets): eval_step uses it alone."""

    def training_step(self, batch):
        return (self.model(batch[0]) - 1.0).pow(2).mean() + 100.0


def test_eval_step_with_a_user_loss_returns_it_as_test_loss(tmp_path) -> None:
    trainer = make_trainer(nn.Linear(3, 2), trainer_cls=DictBatchTrainer, ckpt_dir=str(tmp_path))
    x = torch.randn(4, 3)
    with torch.no_grad():
        expected = (trainer.model(x) - 1.0).pow(2).mean() + 100.0
        metrics = trainer.eval_step((x, None))
    assert list(metrics) == ["test_loss"]
    assert metrics["test_loss"].item() == pytest.approx(expected.item())


class PerPosition(nn.Module):
    """Class scores per position: (batch, classes, length), as cross_entropy takes them."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x):  # (batch, length, 3) -> (batch, 2, length)
        return self.linear(x).transpose(1, 2)


def test_eval_step_gives_accuracy_for_one_class_per_sample_only(tmp_path) -> None:
    trainer = make_trainer(nn.Linear(3, 2), ckpt_dir=str(tmp_path))
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        metrics = trainer.eval_step((x, y))
        expected = (trainer.model(x).argmax(dim=1) == y).double().mean()
    assert sorted(metrics) == ["test_acc", "test_loss"] and metrics["test_acc"] == expected
    trainer.model = PerPosition()
    with torch.no_grad():
        metrics = trainer.eval_step((torch.randn(4, 5, 3), torch.randint(0, 2, (4, 5))))
    assert sorted(metrics) == ["test_loss"]  # integer targets, but not one class per sample


@pytest.mark.parametrize("precision", ["32", "16-mixed"])
def test_grad_clip_bounds_the_norm_of_each_steps_gradient(tmp_path, precision: str) -> None:
    # 16-mixed: the GradScaler's scale is taken out of the gradients before they are clipped
    model = nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = make_trainer(model, 2, ckpt_dir=str(tmp_path), grad_clip=0.01, precision=precision)
    if precision != "32" and trainer.precision.scaler is None:
        pytest.skip("float16 autocast does not run on this CPU (precision.py's probe)")
    assert trainer.train() == "finished" and trainer.global_step == 1
    # SGD's first step (its momentum buffer starts as the gradient): lr x the clipped gradient
    moved = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])
    assert moved.norm().item() == pytest.approx(0.1 * 0.01, rel=1e-4)


def test_ddp2_averages_gradients_once_per_step_after_its_last_micro_batch(
    tmp_path, monkeypatch
) -> None:
    from hpc_harness import trainer as trainer_mod

    model = DdpLike()
    trainer = make_trainer(model, 8, ckpt_dir=str(tmp_path), accumulate=2)
    trainer.strategy.needs_grad_sync, trainer.world_size = True, 2  # ddp2 on two nodes
    calls = []
    monkeypatch.setattr(
        trainer_mod, "average_gradients", lambda m, ws: calls.append((m, ws, model.forwards))
    )
    assert trainer.train() == "finished"
    assert calls == [(model, 2, 2), (model, 2, 4)]  # after micro-batches 2 and 4


class CountingLoss(Trainer):
    """The k-th micro-batch's loss is k (1, 2, 3, ...), tied to the model for a backward."""

    def training_step(self, batch):
        self.k = getattr(self, "k", 0) + 1
        return self.model(batch[0]).sum() * 0.0 + self.k


def test_the_logged_loss_is_the_mean_of_the_steps_losses_with_accumulation(tmp_path) -> None:
    # 5 micro-batches, 2 per step: steps of losses (1, 2), (3, 4) and (5) weigh 1.5, 3.5, 5;
    # the mean over micro-batches (3.0) gave the last, partial step less weight than the others
    trainer = make_trainer(
        nn.Linear(3, 2), 10, CountingLoss, ckpt_dir=str(tmp_path), accumulate=2, log_every=3
    )
    assert trainer.train() == "finished" and trainer.global_step == 3
    with open(tmp_path / "metrics.csv") as f:
        rows = [line.split(",") for line in f.read().splitlines()]
    header, loss = rows[0], [r for r in rows if "train_loss" in r]
    assert len(loss) == 1
    assert float(loss[0][header.index("value")]) == pytest.approx(10 / 3, rel=1e-5)
