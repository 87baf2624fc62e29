"""Strategies: how the model is replicated and how its state is saved and loaded.

    ddp   (default) one process per GPU (or per CPU task); DistributedDataParallel.
    dp    one process using every visible GPU through DataParallel. Multi-process or
          multi-node launches are refused. On CPU it is a plain single-process model.
    ddp2  one process per node using all of that node's GPUs through DataParallel, with
          gradients all-reduced across nodes after backward. On GPU more than one process per
          node is refused. On CPU there is nothing to split inside a process, so it degenerates
          to a gradient all-reduce across all processes: the same maths as ddp. Rank 0's
          buffers (BatchNorm statistics) are broadcast after each step (DDP: before each
          forward).
    fsdp  torch's FSDP2 (``fully_shard``) on each module of the wrap policy's classes, then on
          the root. The policy (``fsdp_wrap``) defaults to the classes found in an
          ``nn.ModuleList`` (a transformer's blocks); a module that shares a parameter with
          the rest of the model (GPT-2's ``lm_head.weight = wte.weight``) is left to the root,
          so tied weights stay one parameter. Works on CPU/gloo in torch 2.13.

Model and optimizer state go through ``torch.distributed.checkpoint.state_dict`` for every
strategy: keyed by parameter name, full (unsharded) tensors, so a checkpoint written under
one strategy and world size resumes under any other (ddp -> fsdp and back). At world size 2 a
gradient element is the sum of two numbers (commutative) halved (exact) under ddp's all-reduce
and fsdp's reduce-scatter alike, so a run that switches strategy at a resume stays bitwise
equal to an uninterrupted one (tests/python/test_strategy.py); with more ranks the two may sum
in different orders and a switch is then equal up to rounding.
On load rank 0 alone holds the state; ``broadcast_from_rank0`` hands every rank its part.
The optimizer must hold the model's parameters only (each is saved under its name). With
``sharded=True`` (``TrainConfig.sharded_checkpoint``) every rank keeps its own part instead,
for ``checkpoint.save_sharded``.
(Those helpers, broadcast_from_rank0 (torch 2.4) and dcp.save(checkpoint_id=) (2.3) are older
than MIN_TORCH: only ``fully_shard`` needs a check.)

With a world size of 1, ddp, ddp2 and fsdp all run the plain model.
"""

from __future__ import annotations

import dataclasses
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


def _copy_back(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def average_gradients(model: nn.Module, world_size: int) -> None:
    """Average the gradients over all processes with one flat all-reduce, in parameter order.

    The summation order is the same at every step, so a resumed run stays bitwise equal to an
    uninterrupted one at any world size. DDP does not promise that above 2 processes: after
    its first step it regroups the gradients by the order they were ready, so the first step
    after a resume sums them in another layout than the uninterrupted run did at that step.
    A parameter without a gradient on some ranks (a branch the data chooses) counts as zeros
    there; one without a gradient on every rank keeps None (momentum does not move it). The
    flags saying which rank has which ride in the same all-reduce.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params or world_size < 2:
        return
    missing = [i for i, p in enumerate(params) if p.grad is None]
    for i in missing:
        params[i].grad = torch.zeros_like(params[i])
    grads = [p.grad for p in params]
    # the flags are made on the gradients' device: a host-built tensor copied there each step
    # would make the host wait for the backward pass (a blocking copy to a GPU syncs)
    has = grads[0].new_ones(len(params))
    for i in missing:
        has[i] = 0
    flat = torch.cat([*(g.reshape(-1) for g in grads), has])
    dist.all_reduce(flat)
    flat.div_(world_size)
    _copy_back(flat, grads)
    if missing:  # the host reads the flags only then: no sync in a step that used everything
        for p, had_any in zip(params, flat[-len(params) :].tolist()):
            if not had_any:
                p.grad = None


def broadcast_buffers(model: nn.Module) -> None:
    """Rank 0's buffers (BatchNorm's running statistics) on every rank: one broadcast per
    dtype. ddp2 calls it after each step, as DDP broadcasts them before each forward, so the
    model that is evaluated and saved is the same on every rank."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for b in model.buffers():
        by_dtype.setdefault(b.dtype, []).append(b)
    for buffers in by_dtype.values():
        flat = torch.cat([b.reshape(-1) for b in buffers])
        dist.broadcast(flat, src=0)
        _copy_back(flat, buffers)


class Strategy:
    """Wraps the model and owns the save/load of model and optimizer state."""

    def __init__(self, name: str, ctx: Any, fsdp_wrap: tuple[type[nn.Module], ...] = ()) -> None:
        self.name = name
        self.fsdp_wrap = fsdp_wrap
        self.ctx = ctx
        self.world_size: int = ctx.world_size
        self.distributed = self.world_size > 1 and dist.is_available() and dist.is_initialized()
        check_strategy(name, self.world_size, ctx.local_world_size, ctx.device.type == "cuda")
        if name == "fsdp":
            try:
                from torch.distributed.fsdp import fully_shard  # noqa: F401
            except ImportError:
                raise StrategyError(
                    f"--strategy fsdp needs torch.distributed.fsdp.fully_shard (torch >= "
                    f"{MIN_TORCH}); this torch is {torch.__version__}: upgrade torch or use "
                    "--strategy ddp"
                ) from None
        self.needs_grad_sync = name == "ddp2" and self.distributed  # average_gradients
        # one process over several GPUs: DataParallel, its replicas each run in a thread
        self.data_parallel = name in ("dp", "ddp2") and len(ctx.devices) > 1

    # -- model ----------------------------------------------------------------

    def wrap(self, model: nn.Module) -> nn.Module:
        model = model.to(self.ctx.device)
        if self.data_parallel:
            model = nn.DataParallel(model, device_ids=self.ctx.devices)
        if not self.distributed:
            return model
        if self.name == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.ctx.device] if self.ctx.device.type == "cuda" else None
            return DDP(model, device_ids=ids)
        if self.name == "ddp2":
            for t in [*model.parameters(), *model.buffers()]:  # start identical on every node
                dist.broadcast(t.data, src=0)
            return model
        if self.name == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            # on the run's device: fully_shard's default mesh is CUDA's wherever CUDA is
            # available, which moved a CPU run's model (--gpus 0, gloo) to cuda:0
            mesh = init_device_mesh(self.ctx.device.type, (self.world_size,))
            for module in reversed(shard_units(model, self.fsdp_wrap)):  # inner ones first
                fully_shard(module, mesh=mesh)
            fully_shard(model, mesh=mesh)
        return model

    # -- state (collective: call on every rank) --------------------------------

    def state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, sharded: bool = False
    ) -> tuple[Any, Any]:
        """Model and optimizer state dicts keyed by parameter name: full tensors on rank 0's CPU
        (empty dicts on the other ranks), or with ``sharded`` every rank's own part (fsdp's
        DTensor shards) for ``checkpoint.save_sharded``."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        self.sync_buffers(model)
        opts = StateDictOptions(full_state_dict=not sharded, cpu_offload=not sharded)
        return get_state_dict(self._stateful(model), optimizer, options=opts)

    def sync_buffers(self, model: nn.Module) -> None:
        """fsdp: rank 0's buffers on every rank, before the model is evaluated or saved. fully_shard
        leaves buffers to each rank, so BatchNorm's statistics drift apart: the ranks evaluated
        different models, and a resume gave them all rank 0's (DDP broadcasts them before each
        forward, ddp2 after each step). Collective."""
        if self.name == "fsdp" and self.distributed:
            broadcast_buffers(self._stateful(model))

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        """Load ``state["model"]`` and ``state["optimizer"]`` (as :meth:`state` returns them);
        when distributed only rank 0's are read and broadcast (the others may hold None). With
        ``state["sharded"]`` (a folder of ``checkpoint.save_sharded``) every rank reads its
        part, resharded by torch.distributed.checkpoint for this world size and strategy."""
        from torch.distributed.checkpoint import state_dict as dsd

        model = self._stateful(model)
        for module in model.modules():  # a forward without a backward (an evaluation before
            if hasattr(module, "reshard"):  # training) leaves FSDP2's root unsharded: a load
                module.reshard()  # into it fails ("mixed torch.Tensor and DTensor")
        # Two calls: set_state_dict treats a rank with an empty model dict as "optimizer only"
        # (torch 2.13), so ranks other than 0 would skip the model's broadcast.
        opts = dsd.StateDictOptions(full_state_dict=True, broadcast_from_rank0=self.distributed)
        msd, optim = state["model"] or {}, state["optimizer"] or {}
        if state.get("sharded"):
            import torch.distributed.checkpoint as dcp

            msd, optim = self.state(model, optimizer, sharded=True)
            saved = dcp.FileSystemReader(state["sharded"]).read_metadata().state_dict_metadata
            optim["state"] = {  # the load target has state for every parameter: not all saved
                name: entry
                for name, entry in optim["state"].items()
                if all(f"optimizer.state.{name}.{key}" in saved for key in entry)
            }
            dcp.load({"model": msd, "optimizer": optim}, checkpoint_id=state["sharded"])
            opts = dsd.StateDictOptions()
        dsd.set_model_state_dict(model, msd, options=opts)
        with_state = set(optim.get("state", {}))  # the parameters the checkpoint has state for
        if opts.full_state_dict:
            # Rank 0 sends these optimizer states whole: one without tensors (plain SGD; the
            # full-state way fails: "Expected device to be set", torch 2.13), and one keyed by
            # position (optimizer.state_dict(), checkpoints of earlier versions) to load as is.
            whole = [optim if _by_position(optim) or not _has_tensors(optim) else None]
            if self.distributed:
                whole.append(with_state)
                dist.broadcast_object_list(whole, src=0)
                with_state = whole.pop()
            if whole[0] is not None and _by_position(whole[0]):
                optimizer.load_state_dict(whole[0])
                return
            if whole[0] is not None:
                optim, opts = whole[0], dsd.StateDictOptions()
        # not strict: a parameter without a gradient so far (a branch not taken yet) has none
        opts = dataclasses.replace(opts, strict=False)
        dsd.set_optimizer_state_dict(model, optimizer, optim, options=opts)
        for name, param in model.named_parameters():  # torch gave those a zero step's state
            if name not in with_state:
                optimizer.state.pop(param, None)

    def _stateful(self, model: nn.Module) -> nn.Module:
        """The model whose state is saved: fsdp's own, else the one inside DDP/DataParallel."""
        while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        return model


def _by_position(optim_state: dict[str, Any]) -> bool:
    return any(isinstance(p, int) for g in optim_state.get("param_groups", ()) for p in g["params"])


def _has_tensors(optim_state: dict[str, Any]) -> bool:
    return any(
        torch.is_tensor(v) and v.dim() > 0
        for entry in optim_state.get("state", {}).values()
        for v in entry.values()
    )


def shard_units(model: nn.Module, classes: tuple[type[nn.Module], ...] = ()) -> list[nn.Module]:
    """The modules fsdp shards on their own (before the root), outer ones first: those of
    ``classes`` (default: the classes held in an ``nn.ModuleList``, a transformer's blocks),
    except a module sharing a parameter with the rest of the model (tied weights stay in the
    root's group, one parameter)."""
    if not classes:
        lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
        classes = tuple({type(child) for m in lists for child in m})
    names: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), set()).add(name)
    return [
        m
        for prefix, m in model.named_modules()
        if m is not model
        and isinstance(m, classes)
        and all(n.startswith(prefix + ".") for p in m.parameters() for n in names[id(p)])
    ]
