"""A small Trainer (pytorch/examples DDP-series style) that survives SLURM's wall time.

Optional: it is the pieces of :mod:`hpc_harness.pieces` (setup, ResumableSampler, the
checkpoint files, StopAgreement, the requeue announcement) with the loop written for you. To
keep your own loop, use those directly (hpc_harness/examples/charlm.py).

Plug in your own model and data::

    from hpc_harness import dist
    from hpc_harness.trainer import Trainer, TrainConfig
    from hpc_harness.signals import exit_code

    ctx = dist.setup(gpus=None)                       # ranks, backend, device, process group
    cfg = TrainConfig(epochs=10, ckpt_dir="ckpts", seed=0)  # checkpoint every 10 minutes
    trainer = Trainer(model, lambda params: torch.optim.AdamW(params, lr=1e-3),
                      DataLoader(train_set, batch_size=32, shuffle=True), ctx, cfg,
                      eval_data=test_set)
    raise SystemExit(exit_code(trainer.train()))  # 0 finished, 42 checkpointed at a signal

What it does for you:
- wraps the model for the strategy (ddp, dp, ddp2, fsdp; see strategy.py) and swaps a
  :class:`~hpc_harness.data.ResumableSampler` into the DataLoader (sharded by rank, order
  fixed by (seed, epoch)), calling ``set_epoch`` every epoch;
- autocast + GradScaler for ``16-mixed`` / ``bf16-mixed`` (precision.py);
- checkpoints every ``checkpoint_every_s`` seconds of training (default 600, decided by rank
  0's clock) and/or every ``checkpoint_every`` steps, at a signal, at ``max_steps`` and at the
  end, atomically, keeping the last ``keep_last``; resumes from the newest one that loads, as
  chosen by rank 0 for every rank (checkpoint.load_latest_shared). A resumed
  run ends bitwise equal to an uninterrupted one (CPU, same world size): model, optimizer,
  scheduler, scaler, epoch and position in it, and every rank's RNG states are restored (with
  ``replace_sampler=False`` too: the epoch's order is replayed and the trained batches skipped);
- run identity: every checkpoint and ``<ckpt_dir>/run.json`` hold the run's fingerprint
  (``run_config()`` minus checkpoint.RESUME_FREE_KEYS); resuming with another raises
  checkpoint.RunMismatch before training; ``fresh`` moves the old folder aside; a run resumed
  at its end says "already finished" and keeps ``last.pt``;
- SIGUSR1/SIGTERM set a flag; about every ``signal_check_s`` seconds (or every
  ``signal_check_every`` steps when that is set) the ranks agree on it (and on whether a timed
  checkpoint is due) and then save, write the requeue marker, and return ``"requeue"`` (exit
  code 42);
- rank-0 progress lines and metrics.csv (+ wandb), final ``last.pt`` with the plain state_dict.

The logged ``train_loss`` is the mean of the per-step losses since the previous log line
(epoch boundaries do not reset it), averaged over all ranks: every ``log_every`` steps one
all-reduce of the summed loss, the only collective the logging adds.

Per step it does no host synchronisation: the loss is read (``.item()``) only every
``log_every`` steps, and the control flags (stop, timed checkpoint due) are all-reduced
asynchronously at each check: the reduction started at one check is read at the next, so
training never waits for it and every rank acts at the same step. Checks are spaced by time,
not by a step count, so a 5 ms step and a 10 s step both react to the wall-time signal within
about ``2 * signal_check_s`` seconds plus one step: each rank proposes the step count that
takes ``signal_check_s`` at its measured pace, the proposals ride in the same all-reduce (the
smallest wins), and every rank reads the same interval at the same step. A fixed
``signal_check_every`` (steps) turns that off.
Override ``_compute_loss`` for batches that are not ``(inputs, targets)``. A
``ReduceLROnPlateau`` scheduler is stepped with ``test_loss`` at each epoch end (the others
every step).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

from hpc_harness import checkpoint as ckpt
from hpc_harness import dist as hdist
from hpc_harness.data import prepare_dataloader
from hpc_harness.metrics import MetricsLogger
from hpc_harness.precision import make_precision
from hpc_harness.signals import REQUEUE_EXIT_CODE, StopAgreement, announce_requeue
from hpc_harness.strategy import Strategy


@dataclass
class TrainConfig:
    """Everything the loop needs besides model, optimizer and data."""

    epochs: int = 10
    max_steps: int | None = None  # stop (with a checkpoint) once global_step reaches this
    seed: int = 0
    # checkpoints
    ckpt_dir: str = "checkpoints"
    checkpoint_every: int = 0  # steps; 0 = not by step count
    checkpoint_every_s: float = 600.0  # seconds of training (rank 0's clock); 0 = not by time
    # (with both 0: only at a signal, max_steps and the end)
    keep_last: int = 3
    resume: bool = True
    fresh: bool = False  # move an earlier run's folder aside (checkpoint.move_aside) and start over
    # distribution and precision
    strategy: str = "ddp"
    fsdp_wrap: tuple[type[nn.Module], ...] = ()  # module classes fsdp shards (strategy.py)
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


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and python's random."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """Training loop with exact resume and the requeue protocol (see module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: Callable[[Any], torch.optim.Optimizer],
        train_loader: DataLoader,
        ctx: Any,
        config: TrainConfig,
        make_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
        eval_data: Dataset | None = None,
    ) -> None:
        self.ctx = ctx
        self.cfg = config
        self.rank = ctx.rank
        self.world_size = ctx.world_size
        self.is_main = ctx.is_main
        self.device = ctx.device
        self.loss_fn = loss_fn
        self.eval_data = eval_data
        self.strategy = Strategy(config.strategy, ctx, config.fsdp_wrap)
        self.model = self.strategy.wrap(model)
        self.optimizer = make_optimizer(self.model.parameters())
        self.scheduler = make_scheduler(self.optimizer) if make_scheduler else None
        # ReduceLROnPlateau is stepped with a metric at each epoch end, the others every step
        self._plateau = isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        if self._plateau and eval_data is None:
            raise ValueError(
                "ReduceLROnPlateau is stepped with test_loss at each epoch end: pass eval_data"
            )
        self.precision = make_precision(config.precision, self.device, log=self._print)
        self.train_loader, self.sampler = prepare_dataloader(
            train_loader, self.world_size, self.rank, config.seed, config.replace_sampler
        )
        self.batch_size = train_loader.batch_size or 1
        self.collate_fn = train_loader.collate_fn or default_collate  # evaluate() uses it too
        self.steps_per_epoch = len(self.train_loader)
        self.total_steps = config.epochs * self.steps_per_epoch
        if config.max_steps is not None:
            self.total_steps = min(self.total_steps, config.max_steps)
        self.run_dir = config.run_dir or config.ckpt_dir
        self.agreement = StopAgreement(
            ctx, config.signal_check_s, config.signal_check_every, config.checkpoint_every_s
        )
        self.stop = self.agreement.flag
        # position
        self.epoch = 0
        self.step_in_epoch = 0
        self.global_step = 0
        self._pending_rng: dict[str, Any] | None = None
        self._epoch_rng: torch.Tensor | None = None  # torch RNG at this epoch's start (own sampler)
        # preallocated per-step buffers
        self._loss_sum = torch.zeros((), device=self.device)  # losses since the last log line
        self._log_step = 0  # global step of the last log line (or of the start/resume)
        self._log_time = time.perf_counter()
        self._non_blocking = self.device.type == "cuda"
        self.last_checkpoint: str | None = None
        self.metrics: dict[str, float] = {}
        self.logger: MetricsLogger | None = None
        self.fingerprint = ckpt.fingerprint(self.run_config())

    def run_config(self) -> dict[str, Any]:
        """The run's arguments: TrainConfig's fields updated with ``hparams``. Its fingerprint
        (checkpoint.fingerprint: minus the keys that may change across a resume) is stored in
        every checkpoint and in ``run.json``; a resume with another one stops."""
        config = asdict(self.cfg)
        config.update(config.pop("hparams"))
        return config

    # ------------------------------------------------------------------ helpers

    def _print(self, *args: Any) -> None:
        if self.is_main:
            hdist.say(" ".join(str(a) for a in args))

    def _to_device(self, batch: Any) -> Any:
        if self.device.type == "cpu":
            return batch
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=self._non_blocking)
        if isinstance(batch, (list, tuple)):
            return type(batch)(self._to_device(b) for b in batch)
        if isinstance(batch, dict):
            return {k: self._to_device(v) for k, v in batch.items()}
        return batch

    # ------------------------------------------------------------------ steps

    def _compute_loss(self, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return self.loss_fn(self.model(inputs), targets)

    def _run_batch(self, batch: Any) -> None:
        batch = self._to_device(batch)
        with self.precision.autocast():
            loss = self._compute_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        scaler = self.precision.scaler
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if self.strategy.needs_grad_sync:
            self.strategy.sync_gradients(self.model)
        if self.cfg.grad_clip:
            if scaler is not None:
                scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        if scaler is not None:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None and not self._plateau:
            self.scheduler.step()
        self._loss_sum.add_(loss.detach())

    def _run_epoch(self, epoch: int) -> str:
        """Run the rest of ``epoch``; returns "continue", "requeue" or "max_steps"."""
        cfg = self.cfg
        self.model.train()
        start = self.step_in_epoch
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
            self.sampler.set_start(start * self.batch_size)
            self.train_loader.generator.manual_seed(cfg.seed * 1_000_003 + epoch)
            batches = iter(self.train_loader)
        else:
            batches = self._user_sampler_batches(epoch, start)
        if self._pending_rng is not None:  # after the iterator exists: it may draw randomness
            ckpt.restore_rng(self._pending_rng)
            self._pending_rng = None
        for batch in batches:
            self._run_batch(batch)
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
        return "continue"

    def _user_sampler_batches(self, epoch: int, start: int) -> Any:
        """The rest of ``epoch`` from a DataLoader that keeps the user's own sampler.

        Its order (a RandomSampler's seed, the workers' seeds) is drawn from torch's global
        RNG when the iteration starts. The RNG state at each epoch start is kept (and saved in
        the checkpoint), so a resume mid-epoch replays that draw and skips the ``start``
        batches already trained: the resumed epoch is the same permutation. Skipping reads
        those batches (the default ResumableSampler does not)."""
        sampler = getattr(self.train_loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        if start >= self.steps_per_epoch:
            return iter(())
        if start > 0 and self._pending_rng is not None:
            epoch_rng = self._pending_rng.get("epoch_start_torch")
            if epoch_rng is not None:
                torch.set_rng_state(epoch_rng)
            else:
                self._print(
                    "hpc_harness: warning: the checkpoint has no epoch-start RNG state (older "
                    "hpc_harness): the rest of this epoch is not the same order"
                )
        self._epoch_rng = torch.get_rng_state()
        batches = iter(self.train_loader)
        for _ in itertools.islice(batches, start):  # the order is drawn at the first batch
            pass
        return batches

    def _log_progress(self, epoch: int) -> None:
        """Log the mean loss over the steps since the last log line and over all ranks.
        Collective (one all-reduce): every rank calls it at the same steps."""
        now = time.perf_counter()
        n = self.global_step - self._log_step
        total = self._loss_sum
        if self.world_size > 1 and dist.is_initialized():
            total = total.clone()
            dist.all_reduce(total)
        # the only host sync, every log_every steps
        loss = total.item() / (max(n, 1) * self.world_size)
        self._loss_sum.zero_()
        rate = n / max(now - self._log_time, 1e-9)
        self._log_step, self._log_time = self.global_step, now
        samples = rate * self.batch_size * self.world_size
        eta = (self.total_steps - self.global_step) / max(rate, 1e-9)
        lr = self.optimizer.param_groups[0]["lr"]
        self._print(
            f"hpc_harness: step {self.global_step}/{self.total_steps} epoch {epoch} "
            f"loss {loss:.4f} lr {lr:.3g} samples/s {samples:.0f} "
            f"eta {time.strftime('%H:%M:%S', time.gmtime(eta))}"
        )
        self.logger.log(
            self.global_step, epoch, {"train_loss": loss, "lr": lr, "samples_per_s": samples}
        )

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """``test_loss`` (and ``test_acc`` for class scores) on ``eval_data``, sharded over ranks,
        every sample counted once. Batches are built with the training DataLoader's
        ``collate_fn`` and scored with ``loss_fn`` (a batch mean, PyTorch's default reduction);
        a subclass that overrides ``_compute_loss`` gets its own loss and no accuracy. Every
        rank runs the same number of forward passes (a rank short of samples repeats a batch
        and discards it): ddp and fsdp forwards are collective."""
        if self.eval_data is None:
            return {}
        self.model.eval()
        custom = type(self)._compute_loss is not Trainer._compute_loss
        n = len(self.eval_data)
        mine = list(range(self.rank, n, self.world_size))
        per_rank = -(-n // self.world_size)  # the most samples a rank has
        batches = -(-per_rank // self.batch_size)  # the same on every rank
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, correct, count
        scored_acc = False
        for b in range(batches):
            idx = mine[b * self.batch_size : (b + 1) * self.batch_size]
            counted = len(idx)
            if not idx:  # this rank has run out: a forward for the others' sake, discarded
                idx = mine[: self.batch_size] or [0]
            batch = self._to_device(self.collate_fn([self.eval_data[i] for i in idx]))
            with self.precision.autocast():
                if custom:
                    loss, out, targets = self._compute_loss(batch), None, None
                else:
                    inputs, targets = batch
                    out = self.model(inputs)
                    loss = self.loss_fn(out.float(), targets)
            if not counted:
                continue
            sums[0] += loss.double() * counted
            sums[2] += counted
            if out is not None and out.dim() == 2 and targets.dim() == 1:
                if not targets.dtype.is_floating_point:
                    sums[1] += (out.argmax(dim=1) == targets).sum().double()
                    scored_acc = True
        if self.world_size > 1 and dist.is_initialized():
            dist.all_reduce(sums)
        self.model.train()
        total = max(sums[2].item(), 1.0)
        metrics = {"test_loss": sums[0].item() / total}
        if scored_acc:
            metrics["test_acc"] = sums[1].item() / total
        return metrics

    # ------------------------------------------------------------------ checkpoints

    def _gather_rng(self) -> list[dict[str, Any]]:
        mine = ckpt.capture_rng()
        if self._epoch_rng is not None:
            mine["epoch_start_torch"] = self._epoch_rng
        if self.world_size > 1 and dist.is_initialized():
            out: list[Any] = [None] * self.world_size
            dist.all_gather_object(out, mine)
            return out
        return [mine]

    def _state(self) -> dict[str, Any] | None:
        """Checkpoint dict on rank 0 (None elsewhere). Collective: call on every rank."""
        rng = self._gather_rng()
        sharded = self.cfg.sharded_checkpoint
        model, optim = self.strategy.state(self.model, self.optimizer, sharded)
        if not (self.is_main or sharded):
            return None
        return {
            "format_version": ckpt.FORMAT_VERSION,
            "model": model,
            "optimizer": optim,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.precision.state_dict(),
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step,
            "sampler": {
                "epoch": self.epoch,
                "start_batch": self.step_in_epoch,
                "seed": self.cfg.seed,
                "batch_size": self.batch_size,
            },
            "rng": rng,
            "world_size": self.world_size,
            "strategy": self.strategy.name,
            "precision": self.precision.name,
            "config": ckpt.plain(asdict(self.cfg)),
            "fingerprint": self.fingerprint,
            "metrics": dict(self.metrics),
        }

    def _save_checkpoint(self) -> str:
        """Save (atomically) and prune; every rank calls it; returns the path."""
        path = ckpt.checkpoint_path(
            self.cfg.ckpt_dir, self.global_step, self.cfg.sharded_checkpoint
        )
        self.agreement.drain()
        state = self._state()
        if self.cfg.sharded_checkpoint:
            ckpt.save_sharded(state, path)
        elif self.is_main:
            self._write(state, path)
        if self.is_main:
            ckpt.prune(self.cfg.ckpt_dir, self.cfg.keep_last)
        if self.world_size > 1 and dist.is_initialized():
            dist.barrier()
        self.last_checkpoint = path
        self.agreement.saved()
        return path

    def _write(self, state: dict[str, Any], path: str) -> None:
        """Rank 0 writes a checkpoint (a test subclass pauses here, see testing.py)."""
        ckpt.atomic_save(state, path)

    def _resume(self) -> bool:
        """Load the newest usable checkpoint, the one rank 0 chose (collective). True if resumed."""
        state, path = ckpt.load_latest_shared(
            self.cfg.ckpt_dir, self._print, rank0_only=("model", "optimizer")
        )
        saved = state.get("fingerprint") if state is not None else None
        error = None
        if self.is_main:
            if state is not None and saved is None:
                self._print(
                    f"hpc_harness: warning: {path} has no run fingerprint (an older hpc_harness "
                    "wrote it): resuming without checking that it belongs to this run"
                )
            error = ckpt.identity_error(self.cfg.ckpt_dir, self.fingerprint, saved)
        error = self._from_rank0(error)
        if error:
            raise ckpt.RunMismatch(error)
        if state is None:
            return False
        self.strategy.load(self.model, self.optimizer, state)
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.precision.load_state_dict(state.get("scaler"))
        self.epoch = int(state["epoch"])
        self.step_in_epoch = int(state["step_in_epoch"])
        self.global_step = int(state["global_step"])
        self.metrics = dict(state.get("metrics") or {})
        rng = state.get("rng") or []
        if len(rng) == self.world_size:
            self._pending_rng = rng[self.rank]
        else:
            self._print(
                f"hpc_harness: warning: checkpoint has RNG states for {len(rng)} ranks, world size "
                f"is {self.world_size}: reseeding (the run will not match an uninterrupted one)"
            )
            torch.manual_seed(self.cfg.seed + self.rank)
        self.last_checkpoint = path
        self._print(
            f"hpc_harness: resumed from {path} (global step {self.global_step}, epoch "
            f"{self.epoch}, step in epoch {self.step_in_epoch})"
        )
        return True

    def _from_rank0(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (collective when distributed)."""
        if self.world_size > 1 and dist.is_initialized():
            box = [obj]
            dist.broadcast_object_list(box, src=0)
            return box[0]
        return obj

    def _start_fresh(self) -> None:
        """``fresh``: rank 0 moves the folder of an earlier run aside (collective)."""
        if self.is_main:
            aside = ckpt.move_aside(self.cfg.ckpt_dir, os.environ.get("SLURM_JOB_ID"))
            if aside:
                self._print(f"hpc_harness: starting fresh; the earlier run's files are in {aside}")
        hdist.barrier()

    def _record_identity(self) -> None:
        """Rank 0 writes ``run.json`` unless it already holds this run's fingerprint."""
        if self.is_main:
            run = ckpt.read_run_file(self.cfg.ckpt_dir)
            if run is None or run["fingerprint"] != self.fingerprint:
                ckpt.write_run_file(self.cfg.ckpt_dir, self.fingerprint)

    def _already_finished(self) -> bool:
        cfg = self.cfg
        return self.epoch >= cfg.epochs or (
            cfg.max_steps is not None and self.global_step >= cfg.max_steps
        )

    def _finish_again(self) -> str:
        """The resumed checkpoint is the end of the run: keep its results, train nothing.
        ``last.pt`` is written only if it is missing (the job died before writing it)."""
        path = os.path.join(self.cfg.ckpt_dir, "last.pt")
        if self._from_rank0(not os.path.exists(path)):
            self._save_final()
        status = "finished" if self.epoch >= self.cfg.epochs else "max_steps"
        self._print(
            f"hpc_harness: already finished ({status}) at global step {self.global_step}: "
            f"{self.last_checkpoint} and {path} are kept as they are"
        )
        return status

    def _save_final(self) -> str | None:
        """Rank 0 writes ``<ckpt_dir>/last.pt`` = {"model": plain state_dict, ...}."""
        model = self.strategy.state(self.model, self.optimizer)[0]
        path = os.path.join(self.cfg.ckpt_dir, "last.pt")
        if self.is_main:
            payload = {
                "model": model,
                "global_step": self.global_step,
                "epoch": self.epoch,
                "metrics": self.metrics,
                "hparams": self.cfg.hparams,
            }
            ckpt.atomic_save(payload, path)
        return path

    # ------------------------------------------------------------------ the loop

    def train(self) -> str:
        """Train until done. Returns "finished", "max_steps" or "requeue" (exit 42)."""
        cfg = self.cfg
        self.agreement.install()
        try:
            if cfg.fresh:
                self._start_fresh()
            resumed = cfg.resume and self._resume()  # RunMismatch: stop before training
            self._record_identity()
            if resumed and self._already_finished():
                return self._finish_again()
            self.logger = MetricsLogger(
                self.run_dir,
                enabled=self.is_main,
                wandb_mode=cfg.wandb,
                config=cfg.hparams,
                project=cfg.wandb_project,
            )
            if not resumed:
                seed_everything(cfg.seed + self.rank)  # per-rank streams (dropout etc.)
            status = "finished"
            t0 = time.perf_counter()
            self.agreement.saved()  # the timed interval counts training time
            start_step = self.global_step
            self._log_step, self._log_time = self.global_step, time.perf_counter()
            while self.epoch < cfg.epochs:
                status = self._run_epoch(self.epoch)
                self.agreement.drain()
                if status == "requeue":
                    return self._requeue()
                if self.step_in_epoch >= self.steps_per_epoch:
                    self.metrics = self.evaluate()
                    if self.metrics:
                        self._print(
                            f"hpc_harness: epoch {self.epoch} "
                            + " ".join(f"{k} {v:.4f}" for k, v in self.metrics.items())
                        )
                        self.logger.log(self.global_step, self.epoch, self.metrics)
                    if self._plateau:
                        self.scheduler.step(self.metrics["test_loss"])
                    self.epoch += 1
                    self.step_in_epoch = 0
                if status == "max_steps":
                    break
                status = "finished"
            if self.global_step != start_step or self.last_checkpoint is None:
                self._save_checkpoint()
            self._save_final()
            elapsed = time.perf_counter() - t0
            self._print(
                f"hpc_harness: {status} at global step {self.global_step} in {elapsed:.1f}s"
                + "".join(f" {k}={v:.4f}" for k, v in self.metrics.items())
            )
            return status
        finally:
            self.agreement.uninstall()
            if self.logger is not None:
                self.logger.close()

    def _requeue(self) -> str:
        """Signal path: save, barrier, rank 0 writes the marker; caller exits 42."""
        path = self._save_checkpoint()  # ends with a barrier: every rank's part is done
        self.logger.mark_preempting(REQUEUE_EXIT_CODE)  # wandb: preempted, not finished
        if self.is_main:
            announce_requeue(self.global_step, self.epoch, path, self.stop.name)
        return "requeue"
