"""A small Trainer (pytorch/examples DDP-series style) that survives SLURM's wall time.

Optional: it is the pieces of :mod:`hpc_harness.pieces` with the loop written for you. To keep
your own loop, use those directly (hpc_harness/examples/charlm.py)::

    from hpc_harness import dist
    from hpc_harness.trainer import Trainer, TrainConfig
    from hpc_harness.signals import exit_code

    ctx = dist.setup(gpus=None)                       # ranks, backend, device, process group
    cfg = TrainConfig(epochs=10, ckpt_dir="ckpts", seed=0)  # checkpoint every 10 minutes
    trainer = Trainer(model, lambda params: torch.optim.AdamW(params, lr=1e-3),
                      DataLoader(train_set, 32, shuffle=True), ctx, cfg, eval_data=test_set)
    raise SystemExit(exit_code(trainer.train()))  # 0 finished, 42 checkpointed at a signal

It wraps the model for the strategy (strategy.py), shards the data by rank, checkpoints
atomically (by time, by steps, at a signal, at the end) and resumes the newest checkpoint: a
resumed run ends bitwise equal to an uninterrupted one (CPU, same world size). Hooks:
``training_step(batch)``, ``eval_step(batch)``, ``self.log(name, value)``; parameter groups and
schedulers: optim.py; a nanoGPT-shaped run: hpc_harness/examples/nanogpt.py.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map_only
from torch.utils.data import DataLoader, Dataset, IterableDataset

from hpc_harness import checkpoint as ckpt
from hpc_harness import pieces
from hpc_harness.data import prepare_dataloader
from hpc_harness.dist import group, say
from hpc_harness.metrics import MetricsLogger
from hpc_harness.optim import Params
from hpc_harness.precision import PrecisionError, make_precision
from hpc_harness.signals import REQUEUE_EXIT_CODE, StopAgreement
from hpc_harness.strategy import Strategy, average_gradients, broadcast_buffers


@dataclass
class TrainConfig:
    """Everything the loop needs besides model, optimizer and data."""

    epochs: int = 10
    max_steps: int | None = None  # stop (with a checkpoint) once global_step reaches this
    seed: int = 0
    accumulate: int = 1  # batches per optimizer step (gradient accumulation)
    monitor: str = "test_loss"  # the eval metric a ReduceLROnPlateau scheduler is stepped with
    # checkpoints
    ckpt_dir: str = "checkpoints"
    checkpoint_every: int = 0  # steps; 0 = not by step count
    checkpoint_every_s: float = 600.0  # seconds of training (rank 0's clock); 0 = not by time
    # (with both 0: only at a signal, max_steps and the end)
    keep_last: int = 3
    resume: bool = True
    fresh: bool = False  # move an earlier run's folder aside (pieces.start_fresh) and start over
    # distribution and precision
    strategy: str = "ddp"
    fsdp_wrap: tuple[type[nn.Module], ...] = ()  # module classes fsdp shards (strategy.py)
    # more options for DistributedDataParallel (find_unused_parameters, bucket_cap_mb, ...) and
    # fully_shard (reshard_after_forward, mp_policy, ...); those of the other strategy are unused
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)
    fsdp_kwargs: dict[str, Any] = field(default_factory=dict)
    precision: str = "32"
    replace_sampler: bool = True
    sharded_checkpoint: bool = False  # each rank writes its shard (checkpoint.save_sharded)
    grad_clip: float | None = None
    # logging
    run_dir: str | None = None  # metrics.csv, wandb; default: ckpt_dir
    log_every: int = 50
    wandb: str | None = "disabled"
    wandb_project: str | None = None
    hparams: dict[str, Any] = field(default_factory=dict)  # the run's arguments (fingerprint)
    # requeue protocol: how often the ranks agree on the stop flag (signals.StopAgreement)
    signal_check_every: int = 0  # steps between checks; 0 = adaptive (every signal_check_s)
    signal_check_s: float = 0.5  # adaptive: seconds between checks
    # the keys of hparams that may change across a resume (paths, logging flags); the fields
    # of RESUME_FREE may change too
    resume_free: tuple[str, ...] = ()


# The TrainConfig fields that may change across a resume without making it another run: the
# hardware, paths, where it stops (a finished run may be extended), logging, checkpoints.
RESUME_FREE = frozenset(
    "strategy fsdp_wrap ddp_kwargs fsdp_kwargs sharded_checkpoint precision ckpt_dir run_dir "
    "max_steps epochs log_every wandb wandb_project checkpoint_every checkpoint_every_s "
    "keep_last resume fresh signal_check_every signal_check_s resume_free".split()
)


Optimizers = torch.optim.Optimizer | list[torch.optim.Optimizer]


def _as_list(made: Any) -> list[Any]:
    """What a factory returned (one object, or a list or tuple of them) as a list."""
    return list(made) if isinstance(made, (list, tuple)) else [made]


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and python's random."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def duration(seconds: float) -> str:
    """``H:MM:SS``, with the days before it from one day on (a run's ETA may be days)."""
    days, rest = divmod(round(seconds), 86400)
    clock = f"{rest // 3600:02d}:{rest // 60 % 60:02d}:{rest % 60:02d}"
    return f"{days}d {clock}" if days else clock


class Trainer:
    """Training loop with exact resume and the requeue protocol.

    A ``ReduceLROnPlateau`` scheduler is stepped with ``TrainConfig.monitor`` at each epoch's
    end (checked on one evaluation batch before training); other schedulers every optimizer
    step. ``train()`` returns "finished", "max_steps", "pruned" or "requeue" (exit 42)."""

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: Callable[[Params], Optimizers],
        train_loader: DataLoader,
        ctx: Any,
        config: TrainConfig,
        make_scheduler: Callable[[Optimizers], Any] | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
        eval_data: Dataset | DataLoader | None = None,
    ) -> None:
        self.ctx, self.cfg, self.loss_fn, self.eval_data = ctx, config, loss_fn, eval_data
        self.rank, self.world_size, self.is_main = ctx.rank, ctx.world_size, ctx.is_main
        self.device = ctx.device
        if config.accumulate < 1:
            raise ValueError(f"accumulate expects 1 or more batches, got {config.accumulate}")
        if config.max_steps is not None and config.max_steps < 1:
            raise ValueError(f"max_steps expects 1 or more steps, got {config.max_steps}")
        self.strategy = Strategy(
            config.strategy, ctx, config.fsdp_wrap, config.ddp_kwargs, config.fsdp_kwargs
        )
        self.precision = make_precision(config.precision, self.device)
        if self.precision.dtype == torch.bfloat16 and self.strategy.data_parallel:
            raise PrecisionError(
                f"--precision bf16-mixed does not reach DataParallel's replicas (--strategy "
                f"{config.strategy} on {len(ctx.devices)} GPUs): torch runs each in a thread "
                "that autocasts to float16, without a scaler; use --strategy ddp, or "
                "--precision 16-mixed"
            )
        self.model = self.strategy.wrap(model)
        # the parameters, named as the user's model names them (optim.Params): groups are easy
        made = make_optimizer(Params(self.strategy._stateful(self.model)))
        # several optimizers (a list): each is stepped, all are saved as one state keyed by
        # parameter name; self.optimizer is the first (the logged lr is its first group's)
        self.optimizers = _as_list(made)
        self.optimizer = self.optimizers[0]
        self.schedulers = _as_list(make_scheduler(made)) if make_scheduler else []
        self.scheduler = self.schedulers[0] if self.schedulers else None
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
        self._plateau = any(isinstance(s, plateau) for s in self.schedulers)
        if self._plateau and eval_data is None:
            raise ValueError(
                f"ReduceLROnPlateau is stepped with {config.monitor} at each epoch end: "
                "pass eval_data"
            )
        # fp16's scaler, or a disabled one whose scale/step/update are the plain calls
        self.scaler = self.precision.scaler or torch.amp.GradScaler(enabled=False)
        self.train_loader, self.sampler = prepare_dataloader(
            train_loader, self.world_size, self.rank, config.seed, config.replace_sampler
        )
        batch_sampler = getattr(train_loader, "batch_sampler", None)
        self.batch_size = train_loader.batch_size or getattr(batch_sampler, "batch_size", 1)
        self.eval_loader = self._eval_loader(eval_data)
        # an IterableDataset the user shards may end sooner on one rank than on the others:
        # every step then asks whether every rank has a batch (a host sync per step, here only)
        self._agree_each_step = self.world_size > 1 and isinstance(
            train_loader.dataset, IterableDataset
        )
        self.steps_per_epoch = self._agreed_steps_per_epoch()
        if self.steps_per_epoch is None and config.max_steps is None:
            raise ValueError(
                "the training DataLoader has no length (an IterableDataset without __len__): "
                "set max_steps (an epoch is then one pass over it)"
            )
        if self.steps_per_epoch is None:
            self.total_steps = config.max_steps
        else:
            self.total_steps = min(
                config.epochs * self.steps_per_epoch, config.max_steps or math.inf
            )
        self._exhausted = False  # the epoch's batches ran out (the end of an unsized epoch)
        # SIGUSR1/SIGTERM set a flag; about every signal_check_s the ranks agree on it (and on
        # a timed checkpoint) through an all-reduce read at the next check: no host sync per step
        self.agreement = StopAgreement(
            ctx, config.signal_check_s, config.signal_check_every, config.checkpoint_every_s
        )
        self.epoch = self.step_in_epoch = self.global_step = 0
        self._pending_rng: dict[str, Any] | None = None
        self._epoch_start: dict[str, Any] | None = None  # _order_state() then (own sampler)
        self._workers_started = False  # the own loader's persistent workers
        self._logged: dict[str, list[Any]] = {}  # self.log() values since the last log line
        self._evaluating = False
        self.last_checkpoint: str | None = None
        self._saved_at: tuple[int, int] | None = None  # (step, epoch) of last_checkpoint
        self.metrics: dict[str, float] = {}
        self.logger: MetricsLogger | None = None
        self.resume_free = RESUME_FREE | set(config.resume_free)
        self.fingerprint = ckpt.fingerprint(self.run_config(), self.resume_free)
        self._warn_unsaved_state()

    def _agreed_steps_per_epoch(self) -> int | None:
        """Optimizer steps in an epoch, the same on every rank: the fewest any rank's loader
        has (data the user shards may differ in length; accelerate's even_batches), said in
        one line when they differ; None when a rank's loader has no length. Collective."""
        try:
            batches = len(self.train_loader)
        except TypeError:
            batches = -1
        mine = math.ceil(batches / self.cfg.accumulate) if batches >= 0 else -1
        if (torch_dist := group()) is None:
            return None if mine < 0 else mine
        both = torch.tensor([mine, -mine], dtype=torch.int64, device=self.device)
        torch_dist.all_reduce(both, op=torch_dist.ReduceOp.MIN)
        fewest, most = both[0].item(), -both[1].item()
        if fewest < 0:
            return None
        if fewest != most:
            self._print(
                f"hpc_harness: warning: the ranks' loaders have {fewest} to {most} steps an "
                f"epoch: every rank trains the first {fewest} (the fewest), the rest are left out"
            )
        return fewest

    def run_config(self) -> dict[str, Any]:
        """The run's arguments: TrainConfig's fields updated with ``hparams``. Its fingerprint
        (checkpoint.fingerprint: minus RESUME_FREE and ``resume_free``) is stored in every
        checkpoint and in ``run.json``; a resume with another one stops."""
        config = asdict(self.cfg)
        config.update(config.pop("hparams"))
        try:  # what a position in an epoch is counted in: others would skip other samples
            samples = len(self.train_loader.dataset)
        except TypeError:
            samples = None
        config.update(rank_batch_size=self.batch_size, train_samples=samples)
        return config

    def _print(self, *args: Any) -> None:
        if self.is_main:
            say(" ".join(str(a) for a in args))

    def _to_device(self, batch: Any) -> Any:
        if self.device.type == "cpu":
            return batch
        if type(batch) in (tuple, list) and all(isinstance(t, torch.Tensor) for t in batch):
            # (inputs, targets): pytree's walk would cost ~20 us a step, the moves ~1.3 us
            return type(batch)(t.to(self.device, non_blocking=True) for t in batch)
        return tree_map_only(torch.Tensor, lambda t: t.to(self.device, non_blocking=True), batch)

    # ------------------------------------------------------------------ steps

    def training_step(self, batch: Any) -> torch.Tensor:
        """The loss of one batch (override for batches that are not ``(inputs, targets)``);
        with ``accumulate=k`` it is divided by ``k`` and gradients are synchronised at the last
        micro-batch only (DDP ``no_sync``, FSDP ``set_requires_gradient_sync``)."""
        inputs, targets = batch
        return self.loss_fn(self.model(inputs), targets)

    def log(self, name: str, value: float | torch.Tensor) -> None:
        """Add ``value`` to the training metric ``name``: every ``log_every`` steps the mean of
        its values since the previous log line, over all ranks, is logged (one all-reduce for
        all metrics, no host sync per step). Every rank must log the same names equally often.
        Ignored during the evaluation (eval_step returns its metrics) and with log_every 0."""
        if self._evaluating or not self.cfg.log_every:
            return
        # kept until the log line sums them: an add per step is a kernel launch per step on a GPU
        value = value.detach() if isinstance(value, torch.Tensor) else value
        self._logged.setdefault(name, []).append(value)

    def _sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager[Any]:
        """Gradient synchronisation on (last micro-batch) or off (the others)."""
        if hasattr(self.model, "set_requires_gradient_sync"):  # FSDP2 (fully_shard)
            self.model.set_requires_gradient_sync(sync)
        if sync or not hasattr(self.model, "no_sync"):  # ddp2 syncs after backward, dp never
            return contextlib.nullcontext()
        return self.model.no_sync()  # DDP

    def _run_batch(self, batches: list[Any]) -> None:
        """One optimizer step over ``batches`` (``accumulate`` of them; the last may be fewer)."""
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        step_loss = None
        for i, batch in enumerate(batches):
            with self._sync_gradients(i == len(batches) - 1):
                with self.precision.autocast():
                    loss = self.training_step(self._to_device(batch))
                loss = loss / len(batches) if len(batches) > 1 else loss
                self.scaler.scale(loss).backward()
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        self.log("train_loss", step_loss)  # the step's loss: the mean of its micro-batches'
        if self.strategy.needs_grad_sync:  # ddp2
            average_gradients(self.model, self.world_size)
            broadcast_buffers(self.model)
        if self.cfg.grad_clip:
            for optimizer in self.optimizers:
                self.scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        for optimizer in self.optimizers:
            self.scaler.step(optimizer)
        self.scaler.update()
        for scheduler in self.schedulers:
            if not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                scheduler.step()

    def _run_epoch(self, epoch: int) -> str:
        """Run the rest of ``epoch``; returns "finished" (its batches are done), "requeue" or
        "max_steps"."""
        cfg = self.cfg
        if cfg.max_steps is not None and self.global_step >= cfg.max_steps:
            self._restore_pending_rng()  # the evaluation next draws from the checkpoint's RNG
            return "max_steps"  # resumed at max_steps on an epoch's end: evaluated next
        self.model.train()
        done = self.step_in_epoch * cfg.accumulate  # batches of this epoch already trained
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
            self.sampler.set_start(done * self.batch_size)
            # the workers' seeds (augmentations): the same at a resume, another on each rank
            self.train_loader.generator.manual_seed(self.sampler.worker_seed())
            if self._pending_rng is not None:  # before iter(): workers copy the dataset
                self._load_states(self._pending_rng)
            batches = iter(self.train_loader)  # workers born shielded (data.shield_workers)
        else:
            batches = self._user_sampler_batches(epoch, done)
        self._restore_pending_rng()  # after the iterator exists: it may draw randomness
        self._exhausted = False
        while chunk := self._next_chunk(batches):
            self._run_batch(chunk)
            self.step_in_epoch += 1
            self.global_step += 1
            step = self.global_step
            if cfg.log_every and step % cfg.log_every == 0:
                self._log_progress(epoch)
            if self.agreement.should_stop():
                return "requeue"
            if self.agreement.checkpoint_due or (
                cfg.checkpoint_every and step % cfg.checkpoint_every == 0
            ):
                self._save_checkpoint()
            if cfg.max_steps is not None and step >= cfg.max_steps:
                return "max_steps"
        self._exhausted = True
        return "finished"

    def _next_chunk(self, batches: Any) -> list[Any]:
        """The next step's batches; none once the epoch's agreed steps are done or (an
        IterableDataset, several ranks) once any rank has run out. Collective then."""
        if self.steps_per_epoch is not None and self.step_in_epoch >= self.steps_per_epoch:
            return []
        chunk = list(itertools.islice(batches, self.cfg.accumulate))
        if self._agree_each_step:
            have = torch.tensor(len(chunk), device=self.device)
            group().all_reduce(have, op=group().ReduceOp.MIN)
            if not have.item():
                return []
        return chunk

    def _epoch_done(self) -> bool:
        """The epoch's batches are all trained (an unsized one's: its iterator ran out)."""
        if self.steps_per_epoch is None:
            return self._exhausted
        return self.step_in_epoch >= self.steps_per_epoch

    def _restore_pending_rng(self) -> None:
        """The resumed checkpoint's RNG states, once, before the run draws from them."""
        if self._pending_rng is not None:
            ckpt.restore_rng(self._pending_rng)
            self._pending_rng = None

    def _user_sampler_batches(self, epoch: int, start: int) -> Any:
        """The rest of ``epoch`` from a DataLoader that keeps the user's own sampler.

        Its order (a RandomSampler's seed, the workers' seeds) is drawn from the RNGs (torch,
        numpy, python) and the loader's and samplers' own generators when the iteration
        starts. Their states at each epoch start are kept (and saved in the checkpoint), so a
        resume mid-epoch replays that draw and skips the ``start`` batches already trained: the
        resumed epoch is the same permutation. Skipping reads those batches (the default
        ResumableSampler does not). A checkpoint taken at the epoch's start (``max_steps`` at an
        epoch end) holds those states itself: they are restored before ``iter()``."""
        loader = self.train_loader
        for sampler in (loader.sampler, loader.batch_sampler):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        if self.steps_per_epoch is not None and start >= len(loader):
            return iter(())
        if loader.persistent_workers and not self._workers_started:
            # a persistent loader draws its later epochs' orders at its iterator's reset, the
            # first after its workers' base seed: an iterator made first, its draws undone,
            # makes every epoch's order (resumed or not) drawn at a reset
            before = self._order_state()
            iter(loader)
            self._set_order_state(before)
            self._workers_started = True
        if self._pending_rng is not None and start == 0:  # saved at this epoch's start
            self._set_order_state(self._pending_rng)
            self._pending_rng = None
        elif self._pending_rng is not None:  # the states of this epoch's start
            self._set_order_state(self._pending_rng["epoch_start"])
        self._epoch_start = self._order_state()
        batches = iter(loader)
        for _ in itertools.islice(batches, start):  # the order is drawn at the first batch
            pass
        return batches

    def _order_state(self) -> dict[str, Any]:
        """What the own loader's order is drawn from: ckpt.capture_rng(), ``generators`` and
        the ``state_dict()`` of a sampler or dataset that has one (torchdata's protocol)."""
        states = [obj.state_dict() for obj in self._stateful()]
        return {**ckpt.capture_rng(), "generators": self._generator_states(), "states": states}

    def _generator_states(self) -> list[torch.Tensor]:
        return [g.get_state() for g in self._generators()]

    def _set_order_state(self, state: dict[str, Any]) -> None:
        ckpt.restore_rng(state)
        for generator, saved in zip(self._generators(), state["generators"]):
            generator.set_state(saved)
        self._load_states(state)

    def _load_states(self, state: dict[str, Any]) -> None:
        for obj, saved in zip(self._stateful(), state.get("states") or ()):
            obj.load_state_dict(saved)

    def _stateful(self) -> list[Any]:
        """The loader's sampler, batch sampler and dataset that save their own state
        (``state_dict()`` and ``load_state_dict()``), each once; not the harness's sampler."""
        loader = self.train_loader
        owners = {id(o): o for o in (loader.sampler, loader.batch_sampler, loader.dataset)}
        return [
            o
            for o in owners.values()
            if o is not self.sampler
            and callable(getattr(o, "state_dict", None))
            and callable(getattr(o, "load_state_dict", None))
        ]

    def _warn_unsaved_state(self) -> None:
        """One line at the start for a sampler or dataset holding random state of its own that
        no checkpoint holds (a numpy Generator, a random.Random, a torch.Generator the harness
        does not know by the name ``generator``): a resume would draw another order."""
        import random

        import numpy as np

        kinds = (np.random.Generator, np.random.RandomState, random.Random, torch.Generator)
        loader, stateful = self.train_loader, self._stateful()
        for owner in {
            id(o): o for o in (loader.sampler, loader.batch_sampler, loader.dataset)
        }.values():
            if owner is self.sampler or any(owner is o for o in stateful):
                continue
            for name, value in vars(owner).items() if hasattr(owner, "__dict__") else ():
                if isinstance(value, kinds) and not (
                    name == "generator" and isinstance(value, torch.Generator)
                ):
                    self._print(
                        f"hpc_harness: warning: {type(owner).__name__}.{name} is a "
                        f"{type(value).__name__} no checkpoint saves: a resumed run will not "
                        "draw what this one would; give it state_dict() and load_state_dict()"
                    )
                    return

    def _generators(self) -> list[torch.Generator]:
        """The own generators of the loader, its sampler and batch sampler (a seeded shuffle)."""
        owners = (self.train_loader, self.train_loader.sampler, self.train_loader.batch_sampler)
        found = (getattr(owner, "generator", None) for owner in owners)
        return [g for g in found if isinstance(g, torch.Generator)]

    def _log_progress(self, epoch: int) -> None:
        """Log the mean of every self.log() metric since the last log line (or the resume;
        epoch boundaries do not reset it) over all ranks. ``train_loss`` is a step's loss (with
        ``accumulate``, the mean of its micro-batches'). Collective (one all-reduce, the only
        collective and host sync the logging adds): every rank calls it at the same steps."""
        now = time.perf_counter()
        names = sorted(self._logged)
        f32 = functools.partial(torch.as_tensor, dtype=torch.float32, device=self.device)
        total = torch.stack([torch.stack([f32(v) for v in self._logged[k]]).sum() for k in names])
        if (torch_dist := group()) is not None:
            torch_dist.all_reduce(total)
        # the only host sync, every log_every steps
        counts = {k: len(self._logged[k]) * self.world_size for k in names}
        values = {k: v / counts[k] for k, v in zip(names, total.tolist())}
        self._logged = {}
        rate = (self.global_step - self._log_step) / max(now - self._log_time, 1e-9)
        self._log_step, self._log_time = self.global_step, now
        samples = rate * self.batch_size * self.cfg.accumulate * self.world_size
        eta = (self.total_steps - self.global_step) / max(rate, 1e-9)
        lr = self.optimizer.param_groups[0]["lr"]
        self._print(
            f"hpc_harness: step {self.global_step}/{self.total_steps} epoch {epoch} "
            f"loss {values.get('train_loss', math.nan):.4f} lr {lr:.3g} samples/s {samples:.0f} "
            f"eta {duration(eta)}"
        )
        self.logger.log(self.global_step, epoch, {**values, "lr": lr, "samples_per_s": samples})

    # ------------------------------------------------------------------ evaluation

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """Metrics of one evaluation batch, as batch means (override for your own; every rank
        must return the same names). Default: ``test_loss`` by ``loss_fn`` and ``test_acc`` for
        class scores; a subclass that overrides ``training_step`` gets its loss alone."""
        if type(self).training_step is not Trainer.training_step:
            return {"test_loss": self.training_step(batch)}
        inputs, targets = batch
        out = self.model(inputs)
        metrics = {"test_loss": self.loss_fn(out.float(), targets)}
        if out.dim() == 2 and targets.dim() == 1 and not targets.dtype.is_floating_point:
            metrics["test_acc"] = (out.argmax(dim=1) == targets).double().mean()
        return metrics

    def _eval_loader(self, data: Dataset | DataLoader | None) -> DataLoader | None:
        """The evaluation's DataLoader: this rank's samples (every world_size-th from its rank,
        none padded: each counted once), in order. A DataLoader given keeps its batch size,
        workers and collate_fn; a Dataset gets the training loader's batch size and collate_fn,
        no workers. Its own generator, seeded at each evaluation: the workers' seeds are the
        same in a resumed run, and the global RNG (dropout's) is not drawn from."""
        if data is None:
            return None
        given = data if isinstance(data, DataLoader) else None
        dataset = given.dataset if given is not None else data
        if isinstance(dataset, IterableDataset) or (given is not None and not given.batch_size):
            raise ValueError(
                "eval_data expects a map-style Dataset, or a DataLoader of one with a "
                "batch_size: the Trainer shards it by rank with its own sampler"
            )
        source = given if given is not None else self.train_loader
        options = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn")
        more = ("multiprocessing_context", "prefetch_factor", "persistent_workers")
        kwargs = {k: getattr(source, k) for k in options}
        if given is not None and given.num_workers > 0:
            kwargs.update({k: getattr(given, k) for k in more})
        else:
            kwargs["num_workers"] = 0  # a Dataset is evaluated in this process
        loader = DataLoader(
            dataset,
            batch_size=given.batch_size if given is not None else self.batch_size,
            sampler=range(self.rank, len(dataset), self.world_size),
            generator=torch.Generator(),
            **kwargs,
        )
        return pieces.shield_workers(loader)

    def _eval_batch(self, batch: Any) -> dict[str, Any]:
        self._evaluating = True  # self.log() in a training_step that eval_step calls: ignored
        try:
            with self.precision.autocast():
                return self.eval_step(self._to_device(batch))
        finally:
            self._evaluating = False

    def _eval_samples(self, idx: list[int]) -> Any:
        """The evaluation batch of the samples ``idx``, collated as the eval loader does."""
        return self.eval_loader.collate_fn([self.eval_loader.dataset[i] for i in idx])

    @torch.no_grad()
    def _check_monitor(self) -> None:
        """Lightning's sanity check for the one name training relies on: the ``monitor`` of a
        ReduceLROnPlateau, from one evaluation batch before the first step, not after an epoch.
        It changes nothing in the run: the RNG states are seeded or restored after it."""
        self.model.eval()
        first = range(min(self.eval_loader.batch_size, len(self.eval_loader.dataset)))
        names = sorted(self._eval_batch(self._eval_samples(list(first))))
        self.model.train()
        if self.cfg.monitor not in names:
            raise ValueError(
                f"ReduceLROnPlateau is stepped with {self.cfg.monitor}, which eval_step does not "
                f"return (it returns {', '.join(names)}): set TrainConfig.monitor"
            )

    @torch.no_grad()
    def evaluate(self, stoppable: bool = False) -> dict[str, float] | None:
        """:meth:`eval_step`'s metrics averaged over ``eval_data``, sharded over ranks, every
        sample counted once (:meth:`_eval_loader`). Every rank runs the same number of forward
        passes (a rank short of samples repeats a batch and discards it): ddp and fsdp forwards
        are collective. ``stoppable``: the stop agreement is checked at every batch, and None
        returned once the ranks agreed to stop (an evaluation can last longer than the
        signal's lead)."""
        if self.eval_loader is None:
            return {}
        self.strategy.sync_buffers(self.model)  # one model on every rank
        self.model.eval()
        loader, size = self.eval_loader, self.eval_loader.batch_size
        n, mine = len(loader.dataset), len(loader.sampler)
        loader.generator.manual_seed(self.cfg.seed)  # the workers' seeds: the same each time
        batches, first = iter(loader), None
        sums: dict[str, torch.Tensor] = {}
        for b in range(0, math.ceil(n / self.world_size), size):  # the same on every rank
            if stoppable and self.agreement.should_stop():
                self.model.train()
                return None
            count = max(0, min(size, mine - b))  # this batch's samples (0: ran out)
            batch = next(batches) if count else first
            if batch is None:  # a rank without samples (fewer than ranks) runs sample 0
                batch = self._eval_samples([0])
            first = batch if first is None else first
            for k, v in self._eval_batch(batch).items():
                total = sums.setdefault(k, torch.zeros((), dtype=torch.float64, device=self.device))
                if count:  # a rank that has run out ran this forward for the others' sake
                    total += torch.as_tensor(v, device=self.device).double() * count
        names, zero = sorted(sums), torch.zeros((), dtype=torch.float64, device=self.device)
        totals = torch.stack([*(sums[k] for k in names), zero + mine])
        if (torch_dist := group()) is not None:
            torch_dist.all_reduce(totals)
        self.model.train()
        *values, samples = totals.tolist()
        return {k: v / max(samples, 1.0) for k, v in zip(names, values)}

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self) -> str:
        """Save (atomically) and prune; every rank calls it; returns the path. A state already
        saved (or resumed from: the same step and epoch) is not written again."""
        self.agreement.drain()
        if self._saved_at == (self.global_step, self.epoch):
            self.agreement.saved()
            return self.last_checkpoint
        sharded = self.cfg.sharded_checkpoint
        model, optim = self.strategy.state(self.model, self.optimizers, sharded)
        state = {
            "format_version": ckpt.FORMAT_VERSION,
            "model": model,
            "optimizer": optim,
            "scheduler": self._scheduler_state(),
            "scaler": self.precision.state_dict(),
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            "steps_per_epoch": self.steps_per_epoch,
            "world_size": self.world_size,
            "strategy": self.strategy.name,
            "precision": self.precision.name,
            "fingerprint": self.fingerprint,
            "metrics": dict(self.metrics),
        }
        extra = None
        if self._epoch_start is not None:  # the own loader's: see _user_sampler_batches
            extra = {"epoch_start": self._epoch_start, "generators": self._generator_states()}
        if stateful := self._stateful():  # as they are now: a resume at an epoch's start, or
            # (the harness's sampler) a dataset's state where the checkpoint is
            extra = {**(extra or {}), "states": [obj.state_dict() for obj in stateful]}
        path = pieces.save_checkpoint(
            self.cfg.ckpt_dir,
            state,
            self.global_step,
            self.cfg.keep_last,
            extra,
            self._write,
            sharded,
        )
        self.last_checkpoint, self._saved_at = path, (self.global_step, self.epoch)
        self.agreement.saved()
        return path

    def _scheduler_state(self) -> Any:
        """One scheduler's state_dict (the format of a single one), a list for several."""
        states = [s.state_dict() for s in self.schedulers]
        return states if len(states) > 1 else (states[0] if states else None)

    def _write(self, state: dict[str, Any], path: str) -> None:
        """Rank 0 writes a checkpoint (a subclass may hold or count the write)."""
        ckpt.atomic_save(state, path)

    def _resume(self) -> bool:
        """Load the newest usable checkpoint, the one rank 0 chose (collective). True if resumed."""
        state = pieces.load_checkpoint(
            self.cfg.ckpt_dir,
            False,
            self.fingerprint,
            rank0_only=("model", "optimizer"),
            resume_free=self.resume_free,
        )
        if state is None:
            return False
        self.strategy.load(self.model, self.optimizers, state)
        if warning := self.strategy.switch_warning(state.get("strategy"), self.cfg.grad_clip):
            self._print(warning)
        if self.schedulers and state.get("scheduler") is not None:
            saved = _as_list(state["scheduler"])
            if len(saved) != len(self.schedulers):
                raise ckpt.RunMismatch(
                    f"{state['path']} holds {len(saved)} schedulers' states, this run makes "
                    f"{len(self.schedulers)}: resume with the same make_scheduler"
                )
            for scheduler, saved_state in zip(self.schedulers, saved):
                scheduler.load_state_dict(saved_state)
        self.precision.load_state_dict(state.get("scaler"))
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
        self.global_step = int(state["global_step"])
        saved_world = int(state.get("world_size") or self.world_size)
        if saved_world != self.world_size and self.step_in_epoch > 0:
            if self.step_in_epoch >= (state.get("steps_per_epoch") or math.inf):  # it had ended
                self.step_in_epoch = self.steps_per_epoch
            else:
                self._rescale_position(saved_world)
        self.metrics = dict(state.get("metrics") or {})
        self._pending_rng = state["rng"]  # restored once the epoch's iterator exists
        if self._pending_rng is None:  # another world size (load_checkpoint warned)
            torch.manual_seed(self.cfg.seed + self.rank)
        self.last_checkpoint, self._saved_at = state["path"], (self.global_step, self.epoch)
        return True

    def _rescale_position(self, saved_world: int) -> None:
        """Mid-epoch under another world size: rank r reads every W-th sample of the epoch's
        order (the same at any W) from r, so the saved ranks have read its first ``read``
        samples; go on after as many of them as whole steps of this world cover."""
        per_step = self.cfg.accumulate * self.batch_size
        read = self.step_in_epoch * per_step * saved_world
        self.step_in_epoch = read // (per_step * self.world_size)
        covered = self.step_in_epoch * per_step * self.world_size
        self._print(
            f"hpc_harness: warning: world size {saved_world} -> {self.world_size} in epoch "
            f"{self.epoch}: {read} of its samples were read; going on after {covered} (step "
            f"{self.step_in_epoch} of {self.world_size} ranks), {read - covered} read again"
        )

    def _save_final(self) -> None:
        """``last.pt`` = {"model": plain state_dict, "global_step", "epoch", "metrics",
        "hparams"}, or with ``sharded_checkpoint`` the folder ``last.dcp``, every rank writing
        its part of the model (pieces.save_final); ``python -m
        torch.distributed.checkpoint.format_utils dcp_to_torch last.dcp model.pt`` makes a file
        of it. Collective."""
        sharded = self.cfg.sharded_checkpoint
        model = self.strategy.state(self.model, self.optimizers, sharded)[0]
        payload = {"model": model, "global_step": self.global_step, "epoch": self.epoch}
        payload.update(metrics=self.metrics, hparams=ckpt.plain(self.cfg.hparams))
        pieces.save_final(self.cfg.ckpt_dir, payload, sharded)

    # ------------------------------------------------------------------ the loop

    def train(self) -> str:
        """Train until done. Returns "finished", "max_steps", "pruned" or "requeue" (exit 42)."""
        cfg = self.cfg
        self.agreement.install()
        try:
            if self._plateau:  # before the folder is claimed: the fixed run may use it
                self._check_monitor()
            if cfg.fresh:
                pieces.start_fresh(cfg.ckpt_dir, cfg.run_dir)
            resumed = cfg.resume and self._resume()  # RunMismatch: stop before training
            if resumed and cfg.max_steps is not None and self.global_step > cfg.max_steps:
                raise ckpt.RunMismatch(
                    ckpt.past_end_error(cfg.ckpt_dir, self.global_step, "max_steps", cfg.max_steps)
                )
            if resumed and (self.epoch, self.step_in_epoch) > (cfg.epochs, 0):
                raise ckpt.RunMismatch(
                    ckpt.past_end_error(cfg.ckpt_dir, self.global_step, "epochs", cfg.epochs)
                )
            if not cfg.resume:  # else load_checkpoint claimed the folder
                pieces.on_rank0(lambda: ckpt.write_run_file(cfg.ckpt_dir, self.fingerprint))
            if resumed and self.epoch >= cfg.epochs:
                return self._finish_again("finished")
            if (
                resumed
                and cfg.max_steps is not None
                and self.global_step >= cfg.max_steps
                and not self._epoch_done()  # else its end is evaluated
            ):
                return self._finish_again("max_steps")
            self.logger = MetricsLogger(
                cfg.run_dir or cfg.ckpt_dir,
                self.is_main,
                cfg.wandb,
                cfg.hparams,
                cfg.wandb_project,
                new_run=not resumed,
            )
            if not resumed:
                seed_everything(cfg.seed + self.rank)  # per-rank streams (dropout etc.)
            t0 = time.perf_counter()
            self.agreement.saved()  # the timed interval counts training time
            self._log_step, self._log_time = self.global_step, time.perf_counter()
            status = "finished"
            while self.epoch < cfg.epochs and status == "finished":
                status = self._run_epoch(self.epoch)
                self.agreement.drain()
                if status == "finished" and self.agreement.stop_now():  # before evaluating
                    status = "requeue"
                if status == "requeue":
                    return self._requeue()
                if self._epoch_done() and not self._end_epoch():
                    return self._requeue()  # stopped in the evaluation: evaluated again after
                if self.step_in_epoch == 0 and pieces.should_stop_trial(self.metrics, self.epoch):
                    status = "pruned"  # the sweep's early_terminate (pieces): save, exit 0
            self._save_checkpoint()  # not again when nothing changed since the last one
            self._save_final()
            self._print(
                f"hpc_harness: {status} at global step {self.global_step} in "
                f"{time.perf_counter() - t0:.1f}s"
                + "".join(f" {k}={v:.4f}" for k, v in self.metrics.items())
            )
            return status
        except BaseException:  # W&B and metrics.csv: a failed run, not a finished one
            if self.logger is not None:
                self.logger.mark_failed(self.global_step, self.epoch)
            raise
        finally:  # the logger first: a SIGTERM while W&B uploads is still only a flag
            try:
                if self.logger is not None:
                    self.logger.close()
            finally:
                self.agreement.uninstall()

    def _end_epoch(self) -> bool:
        """Evaluate, log, step a ReduceLROnPlateau scheduler, and move to the next epoch; False
        (and nothing changed) when the ranks agreed to stop during the evaluation."""
        rng = ckpt.capture_rng()
        metrics = self.evaluate(stoppable=True)
        if metrics is None:  # saved with the RNG of the evaluation's start: run again after
            ckpt.restore_rng(rng)
            return False
        self.metrics = metrics
        if self.metrics:
            values = " ".join(f"{k} {v:.4f}" for k, v in self.metrics.items())
            self._print(f"hpc_harness: epoch {self.epoch} {values}")
            self.logger.log(self.global_step, self.epoch, self.metrics, last_at_step=True)
        for scheduler in self.schedulers:
            if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                scheduler.step(self.metrics[self.cfg.monitor])
        self.epoch += 1
        self.step_in_epoch = 0
        return True

    def _finish_again(self, status: str) -> str:
        """The resumed checkpoint is the end of the run: keep its results, train nothing.
        ``last.pt`` (``last.dcp``) is written again only if it is missing or of another step
        (the job died between its last checkpoint and it)."""
        cfg = self.cfg
        path = ckpt.final_path(cfg.ckpt_dir, cfg.sharded_checkpoint)
        step = pieces.on_rank0(lambda: ckpt.final_step(cfg.ckpt_dir, cfg.sharded_checkpoint))
        kept = f"{self.last_checkpoint} and {path} are kept as they are"
        if step != self.global_step:
            self._save_final()
            was = "missing" if step is None else f"of step {step}"
            kept = f"{self.last_checkpoint} is kept, {path} written again from it (it was {was})"
        self._print(
            f"hpc_harness: already finished ({status}) at global step {self.global_step}: {kept}"
        )
        return status

    def _requeue(self) -> str:
        """Signal path: save, rank 0 writes the marker, every rank returns once it exists (the
        caller exits 42)."""
        path = self._save_checkpoint()  # returns once every rank's part is written
        self.logger.mark_preempting(REQUEUE_EXIT_CODE)  # wandb: preempted, not finished
        pieces.announce_requeue(self.global_step, self.epoch, path, self.agreement)
        return "requeue"
