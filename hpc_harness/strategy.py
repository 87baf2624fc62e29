"""Strategies: how the model is replicated and how its state is saved and loaded.

    ddp   (default) DistributedDataParallel, one process per GPU (or CPU task); above 2 ranks
          its gradients are summed in a fixed order (FixedOrderReduction): resume is exact.
    dp    one process over every visible GPU (DataParallel); several processes are refused.
    ddp2  one process per node over its GPUs (DataParallel), gradients all-reduced across
          processes after backward (average_gradients); on CPU the maths of ddp.
    fsdp  torch's FSDP2 (``fully_shard``) on each module of ``fsdp_wrap`` (default: the classes
          in an ``nn.ModuleList``), then on the root; tied weights stay in the root's group.

Model and optimizer state go through ``torch.distributed.checkpoint.state_dict``, keyed by
parameter name, full tensors: a checkpoint resumes under any strategy and world size. A resume
at the same world size and strategy is bitwise equal to an uninterrupted run (CPU). A switch
between fsdp and the others is bitwise only at world size 2 without ``grad_clip``: above 2 ranks
ddp's fixed order and fsdp's reduce-scatter sum in different orders, and with ``grad_clip`` the
norm is summed per parameter (ddp) or per shard (fsdp) and rounds differently (5.96e-08; with
BatchNorm 2.2e-04 after a few steps). Strategy.switch_warning says so at such a resume.
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
Optimizers = torch.optim.Optimizer | list[torch.optim.Optimizer]


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
    uninterrupted one at any world size (what FixedOrderReduction does for DDP).
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


class FixedOrderReduction:
    """A DDP communication hook that sums every gradient element in the same order at every
    step, so a resumed run stays bitwise equal to an uninterrupted one at any world size.

    DDP starts with one bucket of every parameter and, after a process's first step, regroups
    them by the order their gradients became ready; an all-reduce sums an element in an order
    set by its place in the buffer, so the first step after a resume summed in another layout
    than the uninterrupted run's same step. Here the parameters form fixed groups (in reverse
    order, DDP's guess of the backward's order, cut at ``group_bytes``), each all-reduced as
    one flat buffer as soon as DDP hands over the last of its gradients: whatever DDP's
    buckets, the layouts are the same, and communication still overlaps the backward pass.
    """

    def __init__(self, ddp: nn.Module, group_bytes: int = 25 * 2**20) -> None:
        """``ddp``: a DistributedDataParallel model; ``group_bytes``: DDP's own bucket size."""
        self.ddp, self.world_size = ddp, dist.get_world_size(ddp.process_group)
        params = [p for p in ddp.module.parameters() if p.requires_grad]
        self.groups: list[list[torch.Tensor]] = [[]]
        size = 0
        for p in reversed(params):
            if self.groups[-1] and size + p.numel() * p.element_size() > group_bytes:
                self.groups.append([])
                size = 0
            self.groups[-1].append(p)
            size += p.numel() * p.element_size()
        self.group_of = {id(p): i for i, group in enumerate(self.groups) for p in group}
        self._new_step()

    def _new_step(self) -> None:
        self.grads: list[dict[int, torch.Tensor]] = [{} for _ in self.groups]
        self.done = [torch.futures.Future() for _ in self.groups]
        self.launched = 0

    def register(self) -> None:
        self.ddp.register_comm_hook(None, self.hook)

    # no annotations on bucket and the result: DDP compares them with the types themselves,
    # and this module's postponed annotations are strings
    def hook(self, _state: object, bucket):
        buffer = bucket.buffer()
        buffer.div_(self.world_size)  # as DDP's own reduction: the mean, divided first
        mine = sorted({self.group_of[id(p)] for p in bucket.parameters()})
        for p, grad in zip(bucket.parameters(), bucket.gradients()):
            self.grads[self.group_of[id(p)]][id(p)] = grad
        waits = [self.done[i] for i in mine]
        for i in mine:
            if len(self.grads[i]) == len(self.groups[i]):
                self._reduce(i)
        if self.launched == len(self.groups):  # every group is under way: the next step's
            self._new_step()
        return torch.futures.collect_all(waits).then(lambda _: buffer)

    def _reduce(self, i: int) -> None:
        """All-reduce group ``i`` in its fixed layout, its gradients' views written back."""
        grads = [self.grads[i][id(p)] for p in self.groups[i]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        done = self.done[i]

        def write_back(fut: torch.futures.Future) -> None:
            _copy_back(fut.value()[0], grads)
            done.set_result(None)

        work = dist.all_reduce(flat, group=self.ddp.process_group, async_op=True)
        work.get_future().then(write_back)
        self.launched += 1


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
    """Wraps the model and owns the save/load of model and optimizer state.

    dp on CPU is the plain model; ddp2 on GPU refuses more than one process per node, and
    broadcasts rank 0's buffers after each step (DDP: before each forward). The optimizer must
    hold the model's parameters only (each is saved under its name). With ``sharded``
    (``TrainConfig.sharded_checkpoint``) every rank keeps its own part, for
    ``checkpoint.save_sharded``.
    """

    def __init__(
        self,
        name: str,
        ctx: Any,
        fsdp_wrap: tuple[type[nn.Module], ...] = (),
        ddp_kwargs: dict[str, Any] | None = None,
        fsdp_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.fsdp_wrap = fsdp_wrap
        # the user's options for DistributedDataParallel / fully_shard (the other's are unused)
        self.ddp_kwargs = _own_options("ddp_kwargs", ddp_kwargs, ("module", "device_ids"))
        self.fsdp_kwargs = _own_options("fsdp_kwargs", fsdp_kwargs, ("module", "mesh"))
        self.ctx = ctx
        self.world_size: int = ctx.world_size
        self.distributed = self.world_size > 1 and dist.is_available() and dist.is_initialized()
        check_strategy(name, self.world_size, ctx.local_world_size, ctx.device.type == "cuda")
        if name == "fsdp":  # the state_dict helpers, broadcast_from_rank0 (torch 2.4) and
            # dcp.save(checkpoint_id=) (2.3) are older than MIN_TORCH: only fully_shard is checked
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
            ddp = DDP(model, device_ids=ids, **self.ddp_kwargs)
            if self.world_size > 2:  # two ranks sum a+b, the same in any order
                FixedOrderReduction(ddp).register()
            return ddp
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
                fully_shard(module, mesh=mesh, **self.fsdp_kwargs)
            fully_shard(model, mesh=mesh, **self.fsdp_kwargs)
        return model

    def switch_warning(self, saved: str | None, grad_clip: float | None) -> str | None:
        """The line to print at a resume from a checkpoint of strategy ``saved`` when it will
        not end bitwise equal to an uninterrupted run (module docstring); None when it will."""
        if saved is None or (saved == "fsdp") == (self.name == "fsdp"):
            return None
        if self.world_size <= 2 and not grad_clip:
            return None
        why = "grad_clip's norm" if grad_clip else f"{self.world_size} ranks' gradient sums"
        return (
            f"hpc_harness: warning: resuming a {saved} checkpoint under {self.name}: "
            f"{why} round differently, the run ends close to, not bitwise equal to, an "
            f"uninterrupted {saved} run"
        )

    # -- state (collective: call on every rank) --------------------------------

    def state(
        self, model: nn.Module, optimizer: Optimizers, sharded: bool = False
    ) -> tuple[Any, Any]:
        """Model and optimizer state dicts keyed by parameter name: full tensors on rank 0's CPU
        (empty dicts on the other ranks), or with ``sharded`` every rank's own part (fsdp's
        DTensor shards) for ``checkpoint.save_sharded``. Several optimizers (a list) make one
        optimizer state: torch's state_dict helpers merge them and split them again at a load."""
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

    def load(self, model: nn.Module, optimizer: Optimizers, state: dict[str, Any]) -> None:
        """Load ``state["model"]`` and ``state["optimizer"]`` (as :meth:`state` returns them);
        when distributed only rank 0's are read and broadcast (the others may hold None). With
        ``state["sharded"]`` (a folder of ``checkpoint.save_sharded``) every rank reads its
        part, resharded by torch.distributed.checkpoint for this world size and strategy."""
        from torch.distributed.checkpoint import state_dict as dsd

        model = self._stateful(model)
        optimizers = optimizer if isinstance(optimizer, list) else [optimizer]
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
                optimizers[0].load_state_dict(whole[0])  # one optimizer's (older checkpoints)
                return
            if whole[0] is not None:
                optim, opts = whole[0], dsd.StateDictOptions()
        # not strict: a parameter without a gradient so far (a branch not taken yet) has none
        opts = dataclasses.replace(opts, strict=False)
        dsd.set_optimizer_state_dict(model, optimizer, optim, options=opts)
        for name, param in model.named_parameters():  # torch gave those a zero step's state
            if name not in with_state:
                for one in optimizers:
                    one.state.pop(param, None)

    def _stateful(self, model: nn.Module) -> nn.Module:
        """The model whose state is saved: fsdp's own, else the one inside DDP/DataParallel."""
        while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        return model


def _own_options(what: str, options: dict[str, Any] | None, sets: tuple[str, ...]) -> dict:
    """``options`` for DistributedDataParallel or fully_shard, refused if they name what the
    strategy itself sets (``sets``: the model, its device, its mesh)."""
    options = dict(options or {})
    if taken := sorted(set(options) & set(sets)):
        raise StrategyError(
            f"TrainConfig.{what}: {', '.join(taken)} is set by the strategy itself (the model, "
            f"this process's device or mesh); leave out {', '.join(sets)}"
        )
    return options


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
