"""Optimizer helpers for the Trainer: named parameters, weight-decay groups, a warmup-cosine LR.

The Trainer calls its optimizer factory with a :class:`Params`: the model's parameters (so
``lambda params: torch.optim.AdamW(params, lr=1e-3)`` works as it always did) that also knows
their names, as your model names them under every strategy. nanoGPT's groups::

    make_optimizer = lambda params: torch.optim.AdamW(weight_decay_groups(params, 0.1), lr=6e-4)
    make_scheduler = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(20, 600))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn


class Params(list):
    """The model's parameters, in ``model.parameters()`` order, with ``named`` beside them:
    ``[(name, parameter), ...]``, the names of the model as written (no ``module.`` of DDP;
    fsdp's ``fully_shard`` keeps them, its parameters are DTensors of the full shape)."""

    def __init__(self, model: nn.Module) -> None:
        self.named: list[tuple[str, nn.Parameter]] = list(model.named_parameters())
        super().__init__(p for _, p in self.named)
        self.model = model


def weight_decay_groups(
    params: Params | Iterable[tuple[str, nn.Parameter]],
    weight_decay: float,
    decays: Callable[[str, nn.Parameter], bool] = lambda name, p: p.dim() >= 2,
) -> list[dict[str, Any]]:
    """Two parameter groups, nanoGPT's: ``weight_decay`` on the parameters ``decays`` picks
    (matrices and embeddings: two or more dimensions), none on the others (biases, norms).
    Frozen parameters are left out. Takes a :class:`Params` or ``named_parameters()``."""
    named = params.named if isinstance(params, Params) else list(params)
    trained = [(n, p) for n, p in named if p.requires_grad]
    return [
        {"params": [p for n, p in trained if decays(n, p)], "weight_decay": weight_decay},
        {"params": [p for n, p in trained if not decays(n, p)], "weight_decay": 0.0},
    ]


def warmup_cosine(warmup: int, total: int, min_ratio: float = 0.1) -> Callable[[int], float]:
    """nanoGPT's ``get_lr`` as a factor of the base LR for ``LambdaLR``: linear warmup over
    ``warmup`` steps, cosine decay to ``min_ratio`` at step ``total``, then flat. The Trainer
    steps the scheduler once per optimizer step and checkpoints it (its step count)."""
    if not 0 <= warmup < total:
        raise ValueError(f"warmup_cosine expects 0 <= warmup < total, got {warmup} and {total}")

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if step > total:
            return min_ratio
        cosine = 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (total - warmup)))
        return min_ratio + cosine * (1.0 - min_ratio)

    return factor  # a function: LambdaLR's state_dict then holds no copy of its settings
