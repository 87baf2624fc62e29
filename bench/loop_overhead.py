"""Loop overhead: steps/s of the harness Trainer and of a plain loop built from hpc_harness.pieces,
each against a raw PyTorch DDP loop on the same model and data (issue 12: >= 0.98x).

Configurations (2 processes, gloo, CPU, OMP_NUM_THREADS=1, each launched with
``python -m torch.distributed.run --standalone --nproc-per-node=2``; workload from raw_ddp.py):

    raw      raw_ddp.py's loop: DistributedSampler + DDP + SGD, nothing else (the anchor)
    harness  hpc_harness.trainer.Trainer with TrainConfig defaults (progress lines, metrics.csv,
             the stop agreement, the final checkpoint)
    pieces   the user's own loop with hpc_harness.pieces, as its docstring shows: setup,
             ResumableSampler, load_checkpoint, StopAgreement.should_stop() every step,
             average_gradients, a final save_checkpoint

The three run side by side, interleaved (raw harness pieces, then pieces harness raw, ...)
after one discarded warm-up round; each rep's ratio is taken against the raw run beside it and
the median of those paired ratios is reported. Steps/s is the steady state: the first epoch is
excluded, the clock is the wall time at the end of every optimizer step on rank 0 (an optimizer
step hook, the same in the three workers). Beside it, rank 0's CPU time per step
(``time.process_time``) over the same steps: on a loaded machine the wall clock measures the
scheduler as much as the loop, the CPU time much less so.

    .venv/bin/python bench/loop_overhead.py [--reps 9] [--epochs 3] [--out section.md]
    .venv/bin/python bench/loop_overhead.py --smoke          # seconds: 1 rep, tiny data

``--worker raw|harness|pieces`` is what torch.distributed.run starts; not for people.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchstats import Series, md_table, paired_ratios

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
CONFIGS = ("raw", "harness", "pieces")
TARGET = 0.98
NAN = float("nan")


# --------------------------------------------------------------------------- workers


def clocked(make_optimizer, clock: list[float], cpu: list[float]):  # noqa: ANN001, ANN201
    """An optimizer factory whose optimizers record the wall and CPU time after every step."""

    def tick(*_: object) -> None:
        clock.append(time.time())
        cpu.append(time.process_time())

    def make(params):  # noqa: ANN001, ANN202
        opt = make_optimizer(params)
        opt.register_step_post_hook(tick)
        return opt

    return make


def worker_raw(args: argparse.Namespace) -> None:
    """raw_ddp.py's main() with the step clock of the other two workers."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from raw_ddp import BATCH, make_dataset, make_model, make_optimizer, write_result
    from torch import nn
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    clock: list[float] = []
    cpu: list[float] = []
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(make_model())
    data = make_dataset(args.samples)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    optimizer = clocked(make_optimizer, clock, cpu)(model.parameters())
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    if dist.get_rank() == 0:
        write_result(args.result, clock, len(loader), cpu=cpu)
    dist.destroy_process_group()


def worker_harness(args: argparse.Namespace) -> None:
    from raw_ddp import BATCH, make_dataset, make_model, make_optimizer, write_result
    from torch.utils.data import DataLoader

    from hpc_harness import dist as hdist
    from hpc_harness.trainer import TrainConfig, Trainer

    clock: list[float] = []
    cpu: list[float] = []
    ctx = hdist.setup(gpus=None, verbose=False)
    loader = DataLoader(make_dataset(args.samples), batch_size=BATCH, shuffle=True)
    cfg = TrainConfig(epochs=args.epochs, seed=0, ckpt_dir=args.ckpt_dir)
    trainer = Trainer(make_model(), clocked(make_optimizer, clock, cpu), loader, ctx, cfg)
    trainer.train()
    if ctx.is_main:
        write_result(args.result, clock, len(clock) // args.epochs, cpu=cpu)
    hdist.cleanup()


def worker_pieces(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F
    from raw_ddp import BATCH, make_dataset, make_model, make_optimizer, write_result
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
    while step < args.epochs * steps_per_epoch:
        epoch, start = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)
        sampler.set_start(start * BATCH)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            hp.average_gradients(model, ctx.world_size)
            opt.step()
            step += 1
            if stop.should_stop():
                path = hp.save_checkpoint(args.ckpt_dir, {"model": model.state_dict()}, step)
                hp.requeue_exit(step, epoch, path, stop)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "global_step": step}
    hp.save_checkpoint(args.ckpt_dir, state, step)
    if ctx.is_main:
        write_result(args.result, clock, steps_per_epoch, cpu=cpu)
    hp.cleanup()


# --------------------------------------------------------------------------- driver


def launch_argv(config: str, args: argparse.Namespace, result: Path, ckpt: Path) -> list[str]:
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    sizes = ["--epochs", str(args.epochs), "--samples", str(args.samples), "--result", str(result)]
    me = [str(Path(__file__).resolve()), "--worker", config, "--ckpt-dir", str(ckpt)]
    return [*run, *me, *sizes]


def display_command(config: str) -> str:
    return f"torchrun --standalone --nproc-per-node=2 bench/loop_overhead.py --worker {config}"


def run_once(config: str, args: argparse.Namespace, workdir: Path) -> tuple[float, float]:
    """One whole training run; returns its steady-state steps/s and CPU ms per step (rank 0)."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{config}.", dir=workdir))
    result = run_dir / "result.json"
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(BENCH_DIR), str(ROOT)]),
        HPC_WANDB="disabled",
        WANDB_MODE="disabled",
        PYTHONWARNINGS="ignore",
    )
    for var in [v for v in env if v.startswith(("SLURM_", "HPC_REQUEUE"))]:
        del env[var]  # a plain torchrun launch, even inside a SLURM job
    log = run_dir / "log.txt"
    with open(log, "w") as f:
        argv = launch_argv(config, args, result, run_dir / "ckpt")
        rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=run_dir)
    if rc.returncode != 0 or not result.exists():
        sys.stderr.write(log.read_text()[-4000:])
        raise RuntimeError(f"{config}: exit {rc.returncode}, see {log}")
    data = json.loads(result.read_text())
    steps, spe = data["steps"], int(data["steps_per_epoch"])
    k = spe if 0 < spe < len(steps) else len(steps) // 2  # first epoch excluded
    steady = steps[k - 1 :]
    cpu = data["cpu"][k - 1 :]
    return (len(steady) - 1) / (steady[-1] - steady[0]), 1000 * (cpu[-1] - cpu[0]) / (len(cpu) - 1)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def render(series: list[Series], cpu: list[Series], meta: dict[str, object]) -> str:
    by_name = {s.name: s for s in series}
    out = ["## 7. Loop overhead: harness and pieces loop vs a raw PyTorch loop\n\n"]
    out.append(
        f"Same workload as section 1 (MLP 64-256-256-10, {meta['samples']} random samples, batch "
        f"64 per process, SGD, 2 processes, gloo, CPU, `OMP_NUM_THREADS=1`), {meta['epochs']} "
        f"epochs; {meta['reps']} interleaved reps after "
        f"{'one discarded warm-up round' if meta['warmup'] else 'no warm-up (smoke)'}; load "
        f"before/after: {meta['load_before']} / {meta['load_after']}. `harness` = `Trainer` "
        "with `TrainConfig` defaults; `pieces` = the loop of `hpc_harness/pieces.py`'s docstring "
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
    warmup = not args.no_warmup
    if args.smoke:
        args.reps, args.epochs, args.samples, warmup = 1, 2, 2000, False
    configs = [c for c in args.configs.split(",") if c]
    values: dict[str, list[float]] = {c: [] for c in configs}
    cpu_ms: dict[str, list[float]] = {c: [] for c in configs}
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-loop.") as tmp:
        rounds = ([-1] if warmup else []) + list(range(args.reps))
        for rep in rounds:
            for c in configs if rep % 2 == 0 else configs[::-1]:
                r, ms = run_once(c, args, Path(tmp))
                label = "warm-up" if rep < 0 else f"rep {rep}"
                print(
                    f"loop_overhead: {label} {c}: {r:.1f} steps/s, {ms:.3f} ms CPU/step",
                    file=sys.stderr,
                    flush=True,
                )
                if rep >= 0:
                    values[c].append(r)
                    cpu_ms[c].append(ms)
    meta = {
        "samples": args.samples,
        "epochs": args.epochs,
        "reps": args.reps,
        "warmup": warmup,
        "load_before": load_before,
        "load_after": loadavg(),
    }
    text = render(
        [Series(c, display_command(c), values[c]) for c in configs],
        [Series(c, display_command(c), cpu_ms[c]) for c in configs],
        meta,
    )
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="1 rep, 2 epochs of 2000 samples")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=20_000)
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--out", default=None, help="write the Markdown section here")
    p.add_argument("--worker", choices=CONFIGS, default=None)
    p.add_argument("--result", default=None)
    p.add_argument("--ckpt-dir", default="checkpoints")
    args = p.parse_args()
    if args.worker == "raw":
        worker_raw(args)
    elif args.worker == "harness":
        worker_harness(args)
    elif args.worker == "pieces":
        worker_pieces(args)
    else:
        return driver(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
