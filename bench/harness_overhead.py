"""Harness overhead: one DDP training run as a plain loop, via hpc_harness, via Lightning.

Configurations (same model, data, optimizer, batch; 2 processes, gloo, CPU, OMP_NUM_THREADS=1,
each started with ``python -m torch.distributed.run --standalone --nproc-per-node=2``):

    raw             bench/raw_ddp.py: DistributedSampler + DDP + SGD, nothing else (the anchor)
    harness         hpc_harness.trainer.Trainer with TrainConfig defaults (see worker_harness)
    harness_ckpt100 the same plus a checkpoint every 100 steps (keep 3)
    harness_quiet   no periodic work at all (no checkpoints, progress lines or signal checks)
    lightning       lightning.Trainer, DDP, progress bar, logger and checkpointing off

Interleaved after a discarded warm-up round; reported: steady-state steps/s, whole-process wall
time, launch to first step, per-step times (how to read them: docs/performance.md).

    .venv/bin/python bench/harness_overhead.py [--reps 5] [--epochs 5] [--out section.md]
    .venv/bin/python bench/harness_overhead.py --smoke        # seconds: 1 rep, tiny data,
                                                              # raw, harness and lightning

The ``--worker harness|lightning`` mode is what torch.distributed.run starts; not for people.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torchrun_bench as tb
from benchstats import Series, md_table, write_section

CONFIGS = ("raw", "harness", "harness_ckpt100", "harness_quiet", "lightning")
# --smoke runs each worker once: harness_ckpt100 and harness_quiet are the harness worker with
# other TrainConfig numbers (and in a smoke run's few steps no checkpoint falls due anyway),
# while every launch costs seconds of startup (torch imports), whatever the run's size.
SMOKE_CONFIGS = ("raw", "harness", "lightning")
NEVER = 10**9  # a step interval that never comes


# --------------------------------------------------------------------------- workers


def worker_harness(args: argparse.Namespace) -> None:
    from raw_ddp import BATCH, make_dataset, make_model, make_optimizer, write_result
    from torch.utils.data import DataLoader

    from hpc_harness import dist as hdist
    from hpc_harness.trainer import TrainConfig, Trainer

    class ClockedTrainer(Trainer):
        """Records the wall-clock time at the end of every optimizer step (rank 0 reads it)."""

        clock: list[float] = []

        def _run_batch(self, batch):  # noqa: ANN001, ANN202
            super()._run_batch(batch)
            self.clock.append(time.time())

    ctx = hdist.setup(gpus=None, verbose=False)
    model = make_model()
    loader = DataLoader(make_dataset(args.samples), batch_size=BATCH, shuffle=True)
    # TrainConfig defaults: progress lines and metrics.csv every 50 steps, a checkpoint every
    # 600 s of training (none in this short run), control flags (signal, timed checkpoint)
    # all-reduced asynchronously about every 0.5 s (adaptive), final checkpoint + last.pt
    defaults = TrainConfig()
    cfg = TrainConfig(
        epochs=args.epochs,
        seed=0,
        ckpt_dir=args.ckpt_dir,
        checkpoint_every=(
            defaults.checkpoint_every if args.checkpoint_every is None else args.checkpoint_every
        ),
        log_every=defaults.log_every if args.log_every is None else args.log_every,
        signal_check_every=(
            defaults.signal_check_every
            if args.signal_check_every is None
            else args.signal_check_every
        ),
    )
    trainer = ClockedTrainer(model, make_optimizer, loader, ctx, cfg)
    status = trainer.train()
    if ctx.is_main:
        write_result(args.result, trainer.clock, trainer.steps_per_epoch, status=status)
    hdist.cleanup()


def worker_lightning(args: argparse.Namespace) -> None:
    import lightning as L
    import torch.nn.functional as F
    from raw_ddp import BATCH, make_dataset, make_model, make_optimizer, write_result
    from torch.utils.data import DataLoader

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):  # noqa: ANN201
            return make_optimizer(self.parameters())

    class Clock(L.Callback):
        def __init__(self) -> None:
            self.t: list[float] = []

        def on_train_batch_end(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            self.t.append(time.time())

    clock = Clock()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=args.epochs,
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[clock],
        default_root_dir=args.ckpt_dir,
    )
    loader = DataLoader(make_dataset(args.samples), batch_size=BATCH, shuffle=True)
    trainer.fit(Module(), loader)
    if trainer.global_rank == 0:
        write_result(args.result, clock.t, trainer.num_training_batches)


# --------------------------------------------------------------------------- driver


def worker_argv(config: str) -> list[str]:
    """What torchrun starts for ``config`` (the run's sizes and result file come after)."""
    if config == "raw":
        return [str(tb.RAW_DDP)]
    me = [str(Path(__file__).resolve())]
    if config == "harness":
        return [*me, "--worker", "harness"]
    if config == "harness_ckpt100":
        return [*me, "--worker", "harness", "--checkpoint-every", "100"]
    if config == "harness_quiet":
        quiet = ["--checkpoint-every", "0", "--log-every", "0", "--signal-check-every", str(NEVER)]
        return [*me, "--worker", "harness", *quiet]
    if config == "lightning":
        return [*me, "--worker", "lightning"]
    raise ValueError(config)


def display_command(config: str) -> str:
    tail = {
        "raw": "bench/raw_ddp.py",
        "harness": "bench/harness_overhead.py --worker harness",
        "harness_ckpt100": "bench/harness_overhead.py --worker harness --checkpoint-every 100",
        "harness_quiet": "bench/harness_overhead.py --worker harness --checkpoint-every 0 "
        "--log-every 0 --signal-check-every 1000000000",
        "lightning": "bench/harness_overhead.py --worker lightning",
    }[config]
    return f"{tb.TORCHRUN_SHOWN} {tail}"


def run_once(config: str, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    """One whole training process; returns its measures. Steady state: the first epoch is
    excluded; the step times are rank 0's wall clock at the end of every step."""
    run = tb.launch(config, worker_argv(config), args, workdir)
    t0, wall = run.launched, run.wall_s
    steps = run.result["steps"]
    n = len(steps)
    spe = int(run.result["steps_per_epoch"])
    k = tb.first_epoch_steps(run.result)
    steady = steps[k - 1 :]
    diffs = [b - a for a, b in zip(steady, steady[1:])]
    diffs_sorted = sorted(diffs)
    # What ran between step g's optimizer update and step g+1's: classify each step time by
    # the global step g it follows (a fixed-interval harness: signal check when g % 10 == 0,
    # progress line when g % 50 == 0, checkpoint when g % 100 == 0; every loop: a new epoch
    # when g % spe).
    classes: dict[str, list[float]] = {k: [] for k in STEP_CLASSES}
    for j, d in enumerate(diffs):
        g = k + j  # global step (1-based) whose post-step work precedes this step time
        classes[step_class(g, spe)].append(d)
    cls = {f"cls_{name}_ms": statistics.fmean(v) * 1000 for name, v in classes.items() if v}
    return {
        **cls,
        "steps": n,
        "steady_steps": len(diffs),
        "steps_per_s": len(diffs) / (steady[-1] - steady[0]),
        "wall_s": wall,
        "first_step_s": steps[0] - t0,
        "step_median_ms": statistics.median(diffs) * 1000,
        "step_p99_ms": diffs_sorted[min(len(diffs) - 1, int(0.99 * len(diffs)))] * 1000,
        "step_max_ms": diffs_sorted[-1] * 1000,
        "step_mean_ms": statistics.fmean(diffs) * 1000,
        "after_last_step_s": t0 + wall - steps[-1],
    }


STEP_CLASSES = ("plain", "g10", "g50", "g100", "epoch")


def step_class(g: int, steps_per_epoch: int) -> str:
    """Which periodic work the harness does after global step ``g`` (see run_once)."""
    if steps_per_epoch and g % steps_per_epoch == 0:
        return "epoch"
    if g % 100 == 0:
        return "g100"
    if g % 50 == 0:
        return "g50"
    if g % 10 == 0:
        return "g10"
    return "plain"


def render(results: dict[str, list[dict[str, float]]], meta: dict[str, object]) -> str:
    def series(metric: str) -> list[Series]:
        return [Series(c, display_command(c), [r[metric] for r in results[c]]) for c in results]

    out = ["## 1. Harness overhead (DDP, 2 processes, gloo, CPU)\n\n"]
    out.append(
        f"MLP 64-256-256-10, {meta['samples']} random samples (seed 0), batch 64 per process, "
        f"SGD lr 0.01, {meta['epochs']} epochs = {meta['steps']} steps per process, "
        "`OMP_NUM_THREADS=1`, launched with `python -m torch.distributed.run --standalone "
        f"--nproc-per-node=2`. {meta['reps']} interleaved reps after "
        f"{'one discarded warm-up round' if meta['warmup'] else 'no warm-up (smoke)'}; "
        f"load before/after: {meta['load_before']} / {meta['load_after']}.\n\n"
    )
    out.append(
        "`harness` = `hpc_harness.trainer.Trainer` with `TrainConfig` defaults (progress line + "
        "metrics.csv every 50 steps, a checkpoint every 600 s of training (none in this short run) "
        "plus the final one, control flags all-reduced asynchronously about every 0.5 s, "
        "the interval in steps adapted to the step time: every ~100 steps here); "
        "`harness_ckpt100` = same plus a checkpoint every 100 steps; `harness_quiet` = no "
        "periodic work at "
        "all (no checkpoints, no progress lines, no signal checks: the bare loop); "
        "`lightning` = `lightning.Trainer` "
        "(`strategy='ddp'`) with progress bar, logger and checkpointing off.\n"
    )
    out.append("\n**Steady-state steps/s** (first epoch excluded; higher is better)\n\n")
    out.append(md_table(series("steps_per_s"), "raw", "steps/s", extra_anchors=["lightning"]))
    out.append("\n**Whole-process wall time** (launch to exit of torchrun)\n\n")
    out.append(md_table(series("wall_s"), "raw", "s"))
    out.append("\n**Launch to end of the first step**\n\n")
    out.append(md_table(series("first_step_s"), "raw", "s"))
    out.append("\n**Per-step time in the steady state** (medians over reps)\n\n")
    out.append("| config | median step | mean step | p99 step | max step | mean - median |\n")
    out.append("| --- | --- | --- | --- | --- | --- |\n")
    for c, rs in results.items():

        def med(metric: str, rs: list[dict[str, float]] = rs) -> float:
            return statistics.median(r[metric] for r in rs)

        out.append(
            f"| `{c}` | {med('step_median_ms'):.3f} ms | {med('step_mean_ms'):.3f} ms | "
            f"{med('step_p99_ms'):.2f} ms | {med('step_max_ms'):.2f} ms | "
            f"{med('step_mean_ms') - med('step_median_ms'):.3f} ms |\n"
        )
    out.append(
        "\n**Where the time goes**: mean step time by what ran after the previous step "
        "(global step g). A harness with `--signal-check-every 10` checks the stop flag (one "
        "all-reduce + `.item()`) after g % 10 == 0; with the default adaptive interval its checks "
        "fall at other steps, in 'plain'. It also writes a progress line + metrics.csv after "
        "g % 50 == 0, and also checkpoints after g % 100 == 0 (`harness_ckpt100` only); raw and "
        "Lightning do nothing there, so their columns show the noise floor. Excess = class "
        "mean - plain mean; the last "
        "column is the extra time per 100 steps vs raw implied by these means "
        "(90 plain + 8 g10 + 1 g50 + 1 g100 steps); 'periodic work' = 8 g10 + g50 + g100 "
        "excesses, and 'ratio if only that' = 100 plain / (100 plain + periodic): the "
        "steps/s ratio vs a loop with the same plain step, free of the process-to-process "
        "noise in the plain step itself (raw's row is the noise floor of this estimate).\n\n"
    )
    out.append(
        "| config | plain step | g%10 excess | g%50 excess | g%100 excess | epoch-start excess "
        "| per 100 steps vs raw | periodic work per 100 steps | ratio if only that |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )

    def cost100(rs: list[dict[str, float]]) -> float:
        def m(name: str) -> float:
            return statistics.median(r.get(f"cls_{name}_ms", float("nan")) for r in rs)

        return 90 * m("plain") + 8 * m("g10") + m("g50") + m("g100")

    raw100 = cost100(results["raw"]) if "raw" in results else float("nan")
    for c, rs in results.items():

        def cm(name: str, rs: list[dict[str, float]] = rs) -> float:
            return statistics.median(r.get(f"cls_{name}_ms", float("nan")) for r in rs)

        plain = cm("plain")
        periodic = 8 * (cm("g10") - plain) + (cm("g50") - plain) + (cm("g100") - plain)
        out.append(
            f"| `{c}` | {plain:.3f} ms | {cm('g10') - plain:+.3f} ms | {cm('g50') - plain:+.3f} ms "
            f"| {cm('g100') - plain:+.3f} ms | {cm('epoch') - plain:+.3f} ms "
            f"| {cost100(rs) - raw100:+.1f} ms | {periodic:+.1f} ms "
            f"| {100 * plain / (100 * plain + periodic):.3f}x |\n"
        )
    if meta["failures"]:
        out.append(
            f"\nFailed runs (retried, not counted): {len(meta['failures'])}: "
            + "; ".join(str(f) for f in meta["failures"])  # type: ignore[union-attr]
            + "\n"
        )
    return "".join(out)


def driver(args: argparse.Namespace) -> int:
    configs = tb.run_plan(args)
    results: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    load_before = tb.loadavg()
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-overhead.") as tmp:
        for rep, c in tb.interleaved(configs, args.reps, not args.no_warmup):
            for _attempt in range(3):
                try:
                    r = run_once(c, args, Path(tmp))
                    break
                except RuntimeError as exc:
                    failures.append(f"{c} ({exc})")
                    print(f"harness_overhead: {exc}; retrying", file=sys.stderr, flush=True)
            else:
                raise RuntimeError(f"{c} failed 3 times in a row")
            tb.note_run(
                rep,
                c,
                f"{r['steps_per_s']:.1f} steps/s, wall {r['wall_s']:.2f} s, "
                f"first step {r['first_step_s']:.2f} s",
            )
            if rep >= 0:
                results[c].append(r)
    steps = {int(r["steps"]) for rs in results.values() for r in rs}
    if len(steps) != 1:
        raise RuntimeError(f"configurations ran different step counts: {sorted(steps)}")
    meta = {**tb.run_meta(args, load_before), "steps": steps.pop(), "failures": failures}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    write_section(render(results, meta), args.out)
    return 0


def main() -> int:
    p = tb.driver_args(
        __doc__, CONFIGS, ("harness", "lightning"), reps=5, epochs=5, smoke_configs=SMOKE_CONFIGS
    )
    p.add_argument("--json", default=None, help="write every measure here")
    # the harness worker's TrainConfig (default: TrainConfig's)
    p.add_argument("--checkpoint-every", type=int, default=None)
    p.add_argument("--log-every", type=int, default=None)
    p.add_argument("--signal-check-every", type=int, default=None)
    args = p.parse_args()
    if args.worker == "harness":
        worker_harness(args)
        return 0
    if args.worker == "lightning":
        worker_lightning(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
