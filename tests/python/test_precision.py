"""32 / 16-mixed / bf16-mixed on CPU: autocast dtypes, GradScaler state in checkpoints."""

from __future__ import annotations

import pytest
import torch

from hpc_harness import precision
from hpc_harness.train import main


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
