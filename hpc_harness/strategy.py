"""Strategies: how the model is replicated and how its state is saved and loaded.

    ddp   (default) one process per GPU (or per CPU task); DistributedDataParallel.
    dp    one process using every visible GPU through DataParallel. Multi-process or
          multi-node launches are refused. On CPU it is a plain single-process model.
    ddp2  one process per node using all of that node's GPUs through DataParallel, with
          gradients all-reduced across nodes after backward. On GPU more than one process per
          node is refused. On CPU there is nothing to split inside a process, so it degenerates
          to a gradient all-reduce across all processes: the same maths as ddp.
    fsdp  torch's FSDP2 (``fully_shard``) on every child layer that has parameters and on the
          root. Works on CPU/gloo in torch 2.13 (the older FullyShardedDataParallel class does
          not: "FSDP needs a non-CPU accelerator device"). Checkpoints hold full (unsharded)
          state dicts, so they load under any strategy or world size.

With a world size of 1, ddp, ddp2 and fsdp all run the plain model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpc_harness import MIN_TORCH

STRATEGIES = ("ddp", "dp", "ddp2", "fsdp")


class StrategyError(RuntimeError):
    """The strategy cannot run in this launch (message says what would work)."""


def check_strategy(strategy: str, world_size: int, local_world_size: int, cuda: bool) -> None:
    """Refuse layouts a strategy cannot run, with a message naming what would work."""
    if strategy not in STRATEGIES:
        raise StrategyError(f"--strategy expects one of {', '.join(STRATEGIES)}, got '{strategy}'")
    if strategy == "dp" and world_size > 1:
        raise StrategyError(
            f"--strategy dp runs in ONE process (DataParallel over the node's GPUs) but this "
            f"launch has {world_size} processes; use --strategy ddp for several processes or "
            "nodes, or start dp with plain 'python' (one task)"
        )
    if strategy == "ddp2" and cuda and local_world_size > 1:
        raise StrategyError(
            f"--strategy ddp2 runs one process per node using all its GPUs but this node has "
            f"{local_world_size} processes; launch with srun --ntasks-per-node=1 (or torchrun "
            "--nproc-per-node=1), or use --strategy ddp"
        )


def average_gradients(model: nn.Module, world_size: int) -> None:
    """Average the gradients over all processes with one flat all-reduce, in parameter order.

    The summation order is the same at every step, so a resumed run stays bitwise equal to an
    uninterrupted one at any world size. DDP does not promise that above 2 processes: after
    its first step it regroups the gradients by the order they were ready, so the first step
    after a resume sums them in another layout than the uninterrupted run did at that step.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads or world_size < 2:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(world_size)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


class Strategy:
    """Wraps the model and owns the save/load of model and optimizer state."""

    def __init__(self, name: str, ctx: Any) -> None:
        self.name = name
        self.ctx = ctx
        self.world_size: int = ctx.world_size
        self.distributed = self.world_size > 1 and dist.is_available() and dist.is_initialized()
        check_strategy(name, self.world_size, ctx.info.local_world_size, ctx.device.type == "cuda")
        if name == "fsdp":
            try:
                from torch.distributed.fsdp import fully_shard  # noqa: F401
            except ImportError:
                raise StrategyError(
                    f"--strategy fsdp needs torch.distributed.fsdp.fully_shard (torch >= "
                    f"{MIN_TORCH}); this torch is {torch.__version__}: upgrade torch or use "
                    "--strategy ddp"
                ) from None
        self.needs_grad_sync = name == "ddp2" and self.distributed

    # -- model ----------------------------------------------------------------

    def wrap(self, model: nn.Module) -> nn.Module:
        model = model.to(self.ctx.device)
        if self.name in ("dp", "ddp2") and len(self.ctx.devices) > 1:
            model = nn.DataParallel(model, device_ids=self.ctx.devices)
        if not self.distributed:
            return model
        if self.name == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.ctx.device] if self.ctx.device.type == "cuda" else None
            return DDP(model, device_ids=ids)
        if self.name == "ddp2":
            for p in model.parameters():  # start identical on every node
                dist.broadcast(p.data, src=0)
            return model
        if self.name == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for module in model.modules():
                if module is not model and any(True for _ in module.parameters(recurse=False)):
                    fully_shard(module)
            fully_shard(model)
            return model
        return model

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        return model

    def sync_gradients(self, model: nn.Module) -> None:
        """ddp2 only: average gradients across processes (:func:`average_gradients`)."""
        average_gradients(model, self.world_size)

    # -- state (collective for fsdp: call on every rank) -------------------------

    def model_state(self, model: nn.Module) -> dict[str, Any]:
        if self.name == "fsdp" and self.distributed:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return get_model_state_dict(model, options=opts)
        return {k: v.detach().cpu() for k, v in self.unwrap(model).state_dict().items()}

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if self.name == "fsdp" and self.distributed:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_optimizer_state_dict,
            )

            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return get_optimizer_state_dict(model, optimizer, options=opts)
        return optimizer.state_dict()

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        if self.name == "fsdp" and self.distributed:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            opts = StateDictOptions(full_state_dict=True)
            set_model_state_dict(model, state["model"], options=opts)
            set_optimizer_state_dict(model, optimizer, state["optimizer"], options=opts)
            return
        self.unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
