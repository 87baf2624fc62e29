"""What a checkpoint carries of the precision (the GradScaler's scale) and what each precision
does to a forward pass, through the public Precision API."""

from __future__ import annotations

import pytest
import torch

from hpc_harness import precision

CPU = torch.device("cpu")


def _overflowing_steps(p: precision.Precision, n: int) -> None:
    """``n`` fp16 steps whose gradients overflow: each one skips the update, halves the scale."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(n):
        with p.autocast():
            loss = model(torch.ones(1, 2)).float().sum()
        p.scaler.scale(loss).backward()
        model.weight.grad.fill_(float("inf"))
        p.scaler.step(opt)
        p.scaler.update()
        opt.zero_grad()


def test_a_resumed_fp16_run_continues_with_the_saved_scale() -> None:
    before = precision.make_precision("16-mixed", CPU)
    fresh = before.scaler.get_scale()
    _overflowing_steps(before, 3)
    assert before.scaler.get_scale() == fresh / 8
    after = precision.make_precision("16-mixed", CPU)
    after.load_state_dict(before.state_dict())
    assert after.scaler.get_scale() == fresh / 8


@pytest.mark.parametrize("state", [None, {}])
def test_no_saved_scaler_state_keeps_the_fresh_scale(state) -> None:
    p = precision.make_precision("16-mixed", CPU)
    fresh = p.scaler.get_scale()
    p.load_state_dict(state)
    assert p.scaler.get_scale() == fresh


@pytest.mark.parametrize("name", ["32", "bf16-mixed"])
def test_without_a_scaler_there_is_no_state(name: str) -> None:
    p = precision.make_precision(name, CPU)
    assert p.name == name and p.device_type == "cpu"
    assert p.scaler is None and p.state_dict() is None
    p.load_state_dict({"scale": 4.0})  # a checkpoint from a 16-mixed run: nothing to restore


def test_full_precision_does_not_autocast() -> None:
    p = precision.make_precision("32", CPU)
    a = torch.ones(2, 2, dtype=torch.float32)
    with p.autocast():
        assert not torch.is_autocast_enabled("cpu")
        assert (a @ a).dtype == torch.float32


def test_mixed_precision_autocasts_on_the_given_device() -> None:
    for name, dtype in (("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)):
        p = precision.make_precision(name, CPU)
        assert p.dtype == dtype and p.device_type == "cpu"
        with p.autocast():
            assert torch.is_autocast_enabled("cpu")
            assert torch.get_autocast_dtype("cpu") == dtype
        assert not torch.is_autocast_enabled("cpu")


def test_the_fp16_probe_reports_what_works() -> None:
    assert precision._fp16_works("cpu") is True
    assert precision._fp16_works("no-such-device") is False


def test_unknown_precision_message_names_value_and_choices() -> None:
    with pytest.raises(ValueError) as err:
        precision.make_precision("fp8", CPU)
    assert str(err.value) == "--precision expects one of 32, 16-mixed, bf16-mixed, got 'fp8'"
