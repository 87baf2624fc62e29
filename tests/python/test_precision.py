"""32 / 16-mixed / bf16-mixed on CPU: autocast dtypes, GradScaler state in checkpoints."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness import dist as hdist
from hpc_harness import precision
from hpc_harness.train import main
from hpc_harness.trainer import TrainConfig, Trainer


@pytest.mark.parametrize(
    "name, dtype, scaler",
    [
        ("32", torch.float32, False),
        ("bf16-mixed", torch.bfloat16, False),
        ("16-mixed", torch.float16, True),
    ],
)
def test_autocast_dtype(name: str, dtype: torch.dtype, scaler: bool) -> None:
    p = precision.make_precision(name, torch.device("cpu"))
    layer = torch.nn.Linear(4, 3)
    with p.autocast():
        out = layer(torch.ones(2, 4))
    assert out.dtype == dtype
    assert (p.scaler is not None) == scaler


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="--precision expects one of 32, 16-mixed, bf16-mixed"):
        precision.make_precision("64", torch.device("cpu"))


def test_fp16_that_does_not_work_is_an_error_not_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "_fp16_works", lambda device_type: False)
    with pytest.raises(precision.PrecisionError, match="float16 autocast does not work on cpu"):
        precision.make_precision("16-mixed", torch.device("cpu"))


def test_a_torch_without_amp_grad_scaler_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path, digits_dir, capsys
) -> None:
    monkeypatch.delattr(torch.amp, "GradScaler")  # as on torch < 2.3
    with pytest.raises(
        precision.PrecisionError, match=r"needs torch.amp.GradScaler \(torch >= 2.6"
    ):
        precision.make_precision("16-mixed", torch.device("cpu"))
    args = ["--precision", "16-mixed", "--data-dir", digits_dir, "--ckpt-dir", str(tmp_path)]
    assert main([*args, "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torch.amp.GradScaler" in err[0], err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_fp16_probe_passes_on_cuda() -> None:
    # On CPU every tensor of the probe is on the CPU anyway; on a GPU the layer and its input
    # must both be moved to the device asked about, or the probe fails and 16-mixed is refused.
    assert precision._fp16_works("cuda")
    p = precision.make_precision("16-mixed", torch.device("cuda"))
    assert (p.device_type, p.dtype, p.scaler is not None) == ("cuda", torch.float16, True)


@pytest.mark.parametrize("name", ["16-mixed", "bf16-mixed"])
def test_mixed_precision_training_steps(name: str, tmp_path, digits_dir: str) -> None:
    ck = tmp_path / "ck"
    rc = main(
        [
            "--data-dir",
            digits_dir,
            "--ckpt-dir",
            str(ck),
            "--precision",
            name,
            "--epochs",
            "1",
            "--max-steps",
            "12",
            "--log-every",
            "0",
        ]
    )
    assert rc == 0
    state = torch.load(ck / "ckpt_step00000012.pt", weights_only=False)
    assert state["precision"] == name
    if name == "16-mixed":
        assert state["scaler"] is not None and state["scaler"]["scale"] > 0
    else:
        assert state["scaler"] is None
    weights = state["model"]
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in weights.values())


class InfLossTrainer(Trainer):
    """The loss of global steps 2, 3, 4 and 11 (1-based) is inf: the GradScaler skips those
    steps and halves its scale each time, so the scale differs from a fresh scaler's."""

    def training_step(self, batch):
        loss = super().training_step(batch)
        return loss * float("inf") if self.global_step + 1 in (2, 3, 4, 11) else loss


def _fp16_run(ck: str, max_steps: int | None = None) -> Trainer:
    data = TensorDataset(
        torch.randn(16, 3, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2
    )
    cfg = TrainConfig(
        epochs=2,
        ckpt_dir=ck,
        log_every=0,
        checkpoint_every_s=0,
        precision="16-mixed",
        max_steps=max_steps,
    )
    torch.manual_seed(0)
    trainer = InfLossTrainer(
        nn.Linear(3, 2),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        DataLoader(data, batch_size=2, shuffle=True),
        hdist.setup(verbose=False),
        cfg,
    )
    trainer.train()
    return trainer


def test_resume_restores_a_scale_the_scaler_changed(tmp_path) -> None:
    whole = _fp16_run(str(tmp_path / "a"))
    _fp16_run(str(tmp_path / "b"), max_steps=6)  # after the three halvings
    resumed = _fp16_run(str(tmp_path / "b"))
    assert whole.precision.scaler.get_scale() == 65536.0 / 2**4  # it did change
    assert resumed.precision.state_dict() == whole.precision.state_dict()
    assert all(
        torch.equal(a, b)
        for a, b in zip(whole.model.state_dict().values(), resumed.model.state_dict().values())
    )
