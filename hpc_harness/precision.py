"""Mixed precision with torch.autocast: ``32`` | ``16-mixed`` | ``bf16-mixed``.

- ``32``: no autocast, no scaler.
- ``bf16-mixed``: autocast to bfloat16 (CUDA and CPU); no scaler needed.
- ``16-mixed``: autocast to float16 plus ``torch.amp.GradScaler``. On CPU, torch 2.13 supports
  float16 autocast and a CPU GradScaler (checked at start-up by a one-layer probe); if the probe
  fails (or the torch has no ``torch.amp.GradScaler``), :class:`PrecisionError` says so in one
  line before training: never a silent switch to another precision.

The scaler's state is part of the checkpoint, so a resumed run continues with the same scale.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from hpc_harness import MIN_TORCH

PRECISIONS = ("32", "16-mixed", "bf16-mixed")


class PrecisionError(ValueError):
    """The precision cannot run with this torch on this device (message says what would)."""


@dataclass
class Precision:
    """How forward passes run and how the loss is backpropagated."""

    name: str
    device_type: str
    dtype: Any = None  # torch.dtype or None for full precision
    scaler: Any = None  # torch.amp.GradScaler or None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        import torch

        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def state_dict(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


def _fp16_works(device_type: str) -> bool:
    import torch

    try:
        layer = torch.nn.Linear(4, 2).to(device_type)
        with torch.autocast(device_type=device_type, dtype=torch.float16):
            out = layer(torch.ones(2, 4, device=device_type))
        scaler = torch.amp.GradScaler(device_type)
        scaler.scale(out.float().sum()).backward()
        return out.dtype == torch.float16
    except Exception:
        return False


def make_precision(name: str, device: Any) -> Precision:
    """Build the autocast/scaler pair for ``name`` on ``device`` (a torch.device)."""
    import torch

    if name not in PRECISIONS:
        raise ValueError(f"--precision expects one of {', '.join(PRECISIONS)}, got '{name}'")
    dev = device.type
    if name == "32":
        return Precision(name, dev)
    if name == "bf16-mixed":
        return Precision(name, dev, dtype=torch.bfloat16)
    if not hasattr(torch.amp, "GradScaler"):
        raise PrecisionError(
            f"--precision 16-mixed needs torch.amp.GradScaler (torch >= {MIN_TORCH}); this torch "
            f"is {torch.__version__}: upgrade torch or use --precision bf16-mixed"
        )
    if not _fp16_works(dev):
        raise PrecisionError(
            f"--precision 16-mixed: float16 autocast does not work on {dev} with torch "
            f"{torch.__version__}; use --precision bf16-mixed or 32"
        )
    return Precision(name, dev, dtype=torch.float16, scaler=torch.amp.GradScaler(dev))
