"""Loop overhead: steps/s of the harness Trainer and of a plain loop built from hpc_harness.pieces,
each against a raw PyTorch DDP loop on the same model and data (the goal is >= 0.98x raw).

2 processes, gloo, CPU, OMP_NUM_THREADS=1, each launched with
``python -m torch.distributed.run --standalone --nproc-per-node=2``; workload from raw_ddp.py:

    raw      raw_ddp.py: DistributedSampler + DDP + SGD, nothing else (the anchor)
    harness  hpc_harness.trainer.Trainer with TrainConfig defaults
    pieces   docs/harness.md's recipe ("Your own loop: the pieces"): ResumableSampler,
             load_checkpoint, StopAgreement.should_stop() every step, average_gradients, a save

First the three as separate launches, interleaved: steady-state steps/s and CPU time per step.
Then epoch by epoch in ONE launch (``--worker interleaved``). Reading them: docs/performance.md.

    .venv/bin/python bench/loop_overhead.py [--reps 9] [--epochs 12] [--rounds 31] [--out F]
    .venv/bin/python bench/loop_overhead.py --smoke          # seconds: 1 rep, tiny data

``--worker harness|pieces|interleaved`` is what torch.distributed.run starts; not for people.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torchrun_bench as tb
from benchstats import Series, md_table, paired_ratios, write_section

CONFIGS = ("raw", "harness", "pieces")
TARGET = 0.98
NAN = float("nan")


# --------------------------------------------------------------------------- workers


def worker_harness(args: argparse.Namespace) -> None:
    from raw_ddp import BATCH, clocked, make_dataset, make_model, make_optimizer, write_result
    from torch.utils.data import DataLoader

    from hpc_harness import dist as hdist
    from hpc_harness.trainer import TrainConfig, Trainer

    clock: list[float] = []
    cpu: list[float] = []
    ctx = hdist.setup(gpus=None, verbose=False)
    loader = DataLoader(make_dataset(args.samples), batch_size=BATCH, shuffle=True)
    # TrainConfig defaults: progress lines, metrics.csv, the stop agreement, the final checkpoint
    cfg = TrainConfig(epochs=args.epochs, seed=0, ckpt_dir=args.ckpt_dir)
    trainer = Trainer(make_model(), clocked(make_optimizer, clock, cpu), loader, ctx, cfg)
    trainer.train()
    if ctx.is_main:
        write_result(args.result, clock, len(clock) // args.epochs, cpu=cpu)
    hdist.cleanup()


def pieces_step(world_size: int):  # noqa: ANN201
    """The user's step of the pieces loop (docs/harness.md, "Your own loop: the pieces"): forward,
    loss, backward, ``average_gradients``, optimizer step. Both pieces workers call it."""
    import torch.nn.functional as F

    from hpc_harness import pieces as hp

    def step(model, opt, x, y) -> None:  # noqa: ANN001
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        hp.average_gradients(model, world_size)
        opt.step()

    return step


def worker_pieces(args: argparse.Namespace) -> None:
    """docs/harness.md's recipe: setup, ResumableSampler, load_checkpoint,
    StopAgreement.should_stop() every step, average_gradients, a final save_checkpoint."""
    import torch
    from raw_ddp import BATCH, clocked, make_dataset, make_model, make_optimizer, write_result
    from torch.utils.data import DataLoader

    from hpc_harness import pieces as hp

    clock: list[float] = []
    cpu: list[float] = []
    ctx = hp.setup(verbose=False)
    data = make_dataset(args.samples)
    model = make_model()
    opt = clocked(make_optimizer, clock, cpu)(model.parameters())
    sampler = hp.ResumableSampler(len(data), ctx.world_size, ctx.rank, seed=0)
    loader = DataLoader(data, BATCH, sampler=sampler, generator=torch.Generator())
    state = hp.load_checkpoint(args.ckpt_dir)
    step = state["global_step"] if state else 0
    steps_per_epoch = len(loader)
    stop = hp.StopAgreement(ctx).install()
    train_step = pieces_step(ctx.world_size)
    while step < args.epochs * steps_per_epoch:
        epoch, start = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)
        sampler.set_start(start * BATCH)
        for x, y in loader:
            train_step(model, opt, x, y)
            step += 1
            if stop.should_stop():
                path = hp.save_checkpoint(args.ckpt_dir, {"model": model.state_dict()}, step)
                hp.requeue_exit(step, epoch, path, stop)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "global_step": step}
    hp.save_checkpoint(args.ckpt_dir, state, step)
    if ctx.is_main:
        write_result(args.result, clock, steps_per_epoch, cpu=cpu)
    hp.cleanup()


def worker_interleaved(args: argparse.Namespace) -> None:
    """The three loops in the same two processes, one epoch of each in turn: ``args.epochs``
    rounds, the first a discarded warm-up. The Trainer runs its own ``train()``; the raw and
    pieces epochs run between two of its epochs (from its ``_end_epoch``, in alternating
    order), so a round's three epochs are seconds apart on the same processes and cores: the
    paired ratios do not carry the differences between launches minutes apart (CPU placement,
    neighbours) that the separate runs do. Each epoch is timed from its first optimizer step to
    its last."""
    import torch
    from raw_ddp import (
        BATCH,
        SEED,
        clocked,
        make_dataset,
        make_model,
        make_optimizer,
        train_epoch,
    )
    from torch import nn
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from hpc_harness import pieces as hp
    from hpc_harness.trainer import TrainConfig, Trainer

    clocks = {c: ([], []) for c in CONFIGS}  # wall, CPU at the end of every optimizer step
    ctx = hp.setup(verbose=False)
    data = make_dataset(args.samples)

    raw_model = nn.parallel.DistributedDataParallel(make_model())
    raw_sampler = DistributedSampler(data, shuffle=True, seed=SEED)
    raw_loader = DataLoader(data, batch_size=BATCH, sampler=raw_sampler)
    raw_opt = clocked(make_optimizer, *clocks["raw"])(raw_model.parameters())
    raw_epoch = functools.partial(train_epoch, raw_model, raw_loader, raw_opt)  # raw_ddp.py's

    model = make_model()
    opt = clocked(make_optimizer, *clocks["pieces"])(model.parameters())
    sampler = hp.ResumableSampler(len(data), ctx.world_size, ctx.rank, seed=0)
    loader = DataLoader(data, BATCH, sampler=sampler, generator=torch.Generator())
    stop = hp.StopAgreement(ctx)
    train_step = pieces_step(ctx.world_size)

    def pieces_epoch(epoch: int) -> None:
        sampler.set_epoch(epoch)
        sampler.set_start(0)
        for x, y in loader:
            train_step(model, opt, x, y)
            if stop.should_stop():
                raise SystemExit("loop_overhead: a stop signal during the benchmark")

    class Interleaved(Trainer):
        def _end_epoch(self) -> None:
            epoch = self.epoch
            super()._end_epoch()
            for run in (raw_epoch, pieces_epoch) if epoch % 2 else (pieces_epoch, raw_epoch):
                run(epoch)

    cfg = TrainConfig(epochs=args.epochs, seed=0, ckpt_dir=args.ckpt_dir)
    shuffled = DataLoader(data, batch_size=BATCH, shuffle=True)
    trainer = Interleaved(
        make_model(), clocked(make_optimizer, *clocks["harness"]), shuffled, ctx, cfg
    )
    stop.install()  # the Trainer's own agreement takes the signals while it trains
    trainer.train()
    stop.uninstall()
    if ctx.is_main:
        per_epoch = {c: epoch_rates(*clocks[c], args.epochs) for c in CONFIGS}
        Path(args.result).write_text(json.dumps(per_epoch))
    hp.cleanup()


def epoch_rates(wall: list[float], cpu: list[float], epochs: int) -> list[tuple[float, float]]:
    """(steps/s, CPU ms per step) of each epoch, from its first optimizer step to its last."""
    n = len(wall) // epochs
    out = []
    for e in range(epochs):
        w, c = wall[e * n : (e + 1) * n], cpu[e * n : (e + 1) * n]
        out.append(((n - 1) / (w[-1] - w[0]), 1000 * (c[-1] - c[0]) / (n - 1)))
    return out


# --------------------------------------------------------------------------- driver


def worker_argv(config: str) -> list[str]:
    """What torchrun starts for ``config`` (the run's sizes and result file come after)."""
    if config == "raw":
        return [str(tb.RAW_DDP)]
    return [str(Path(__file__).resolve()), "--worker", config]


def display_command(config: str) -> str:
    if config == "raw":
        return f"{tb.TORCHRUN_SHOWN} bench/raw_ddp.py"
    return f"{tb.TORCHRUN_SHOWN} bench/loop_overhead.py --worker {config}"


def run_once(config: str, args: argparse.Namespace, workdir: Path) -> tuple[float, float]:
    """One whole training run; returns its steady-state steps/s and CPU ms per step (rank 0).

    The first epoch is excluded. The clock is the wall time and ``time.process_time`` at the end
    of every optimizer step on rank 0 (an optimizer step hook, raw_ddp.clocked, the same in the
    three workers)."""
    result = tb.launch(config, worker_argv(config), args, workdir).result
    k = tb.first_epoch_steps(result)
    steady = result["steps"][k - 1 :]
    cpu = result["cpu"][k - 1 :]
    return (len(steady) - 1) / (steady[-1] - steady[0]), 1000 * (cpu[-1] - cpu[0]) / (len(cpu) - 1)


def run_interleaved(args: argparse.Namespace, workdir: Path) -> dict[str, list[list[float]]]:
    """One launch of the interleaved worker: per config, (steps/s, CPU ms per step) of each
    round after the warm-up."""
    sized = copy.copy(args)
    sized.epochs = args.rounds + 1
    worker = [str(Path(__file__).resolve()), "--worker", "interleaved"]
    result = tb.launch("interleaved", worker, sized, workdir).result
    return {c: rounds[1:] for c, rounds in result.items()}


def render_interleaved(per_round: dict[str, list[list[float]]]) -> str:
    """Section 7's second part: the loops epoch by epoch in the same two processes."""
    rounds = len(per_round["raw"])
    out = [
        f"\n**Epoch by epoch in the same two processes** (`--worker interleaved`: the Trainer's "
        f"`train()` runs {rounds} epochs after a warm-up one, and after each of them one raw and "
        "one pieces epoch run, in alternating order; a round's three epochs run seconds apart "
        "on the same processes and cores. Per epoch, first to last optimizer step; ratio = "
        "median of the per-round ratios)\n\n"
    ]
    wall = [Series(c, c, [r[0] for r in per_round[c]]) for c in CONFIGS]
    cpu = [Series(c, c, [r[1] for r in per_round[c]]) for c in CONFIGS]
    out.append(md_table(wall, "raw", "steps/s"))
    out.append("\n")
    out.append(md_table(cpu, "raw", "ms"))
    out.append("\n")
    for name in ("harness", "pieces"):
        ratio = statistics.median(paired_ratios(wall[CONFIGS.index(name)], wall[0]))
        speed = statistics.median(paired_ratios(cpu[0], cpu[CONFIGS.index(name)]))
        out.append(
            f"- `{name}`, epoch by epoch: {ratio:.3f}x raw in steps/s, {speed:.3f}x raw in CPU "
            f"time per step (paired medians over {rounds} rounds; target {TARGET}x): "
            f"{'meets' if min(ratio, speed) >= TARGET else 'below'}\n"
        )
    return "".join(out)


def render(series: list[Series], cpu: list[Series], meta: dict[str, object]) -> str:
    by_name = {s.name: s for s in series}
    out = ["## 7. Loop overhead: harness and pieces loop vs a raw PyTorch loop\n\n"]
    out.append(
        f"Same workload as section 1 (MLP 64-256-256-10, {meta['samples']} random samples, batch "
        f"64 per process, SGD, 2 processes, gloo, CPU, `OMP_NUM_THREADS=1`), {meta['epochs']} "
        f"epochs; {meta['reps']} interleaved reps after "
        f"{'one discarded warm-up round' if meta['warmup'] else 'no warm-up (smoke)'}; load "
        f"before/after: {meta['load_before']} / {meta['load_after']}. `harness` = `Trainer` "
        "with `TrainConfig` defaults; `pieces` = the recipe of `docs/harness.md` "
        "(`ResumableSampler`, `StopAgreement.should_stop()` every step, `average_gradients`, "
        "`load_checkpoint` at the start and `save_checkpoint` at the end). Ratio = median of the "
        f"per-rep ratios against the raw run beside it; target >= {TARGET}x.\n\n"
    )
    out.append("**Steady-state steps/s** (first epoch excluded; higher is better)\n\n")
    out.append(md_table(series, "raw", "steps/s"))
    out.append(
        "\n**CPU time per steady-state step** (rank 0, `time.process_time`; lower is better)\n\n"
    )
    out.append(md_table(cpu, "raw", "ms"))
    out.append("\n")
    cpu_by_name = {s.name: s for s in cpu}
    for name in ("harness", "pieces"):
        if name in by_name and "raw" in by_name:
            wall = statistics.median(paired_ratios(by_name[name], by_name["raw"]) or [NAN])
            # speed from CPU time: raw's CPU per step over this config's, paired per rep
            speed = statistics.median(paired_ratios(cpu_by_name["raw"], cpu_by_name[name]) or [NAN])
            out.append(
                f"- `{name}`: {wall:.3f}x raw in steps/s, {speed:.3f}x raw in CPU time per step "
                f"(paired medians; target {TARGET}x): "
                f"{'meets' if min(wall, speed) >= TARGET else 'below'}\n"
            )
    return "".join(out)


def driver(args: argparse.Namespace) -> int:
    configs = tb.run_plan(args)
    values: dict[str, list[float]] = {c: [] for c in configs}
    cpu_ms: dict[str, list[float]] = {c: [] for c in configs}
    load_before = tb.loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-loop.") as tmp:
        for rep, c in tb.interleaved(configs, args.reps, not args.no_warmup):
            r, ms = run_once(c, args, Path(tmp))
            tb.note_run(rep, c, f"{r:.1f} steps/s, {ms:.3f} ms CPU/step")
            if rep >= 0:
                values[c].append(r)
                cpu_ms[c].append(ms)
        per_round = run_interleaved(args, Path(tmp)) if set(configs) == set(CONFIGS) else None
    text = render(
        [Series(c, display_command(c), values[c]) for c in configs],
        [Series(c, display_command(c), cpu_ms[c]) for c in configs],
        tb.run_meta(args, load_before),
    )
    if per_round is not None:
        text += render_interleaved(per_round)
    write_section(text, args.out)
    return 0


def main() -> int:
    parser = tb.driver_args(
        __doc__, CONFIGS, ("harness", "pieces", "interleaved"), reps=9, epochs=12
    )
    parser.add_argument("--rounds", type=int, default=31, help="interleaved rounds (default 31)")
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1
    if args.worker == "interleaved":
        worker_interleaved(args)
    elif args.worker == "harness":
        worker_harness(args)
    elif args.worker == "pieces":
        worker_pieces(args)
    else:
        return driver(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
