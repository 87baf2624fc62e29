"""What the torchrun benchmarks share (harness_overhead.py and loop_overhead.py, whose raw
configuration is raw_ddp.py): their options, the interleaved order of their runs, one launch of
a configuration under torchrun and the load average (benchstats writes the Markdown section).

    import torchrun_bench as tb
    args = tb.driver_args(__doc__, CONFIGS, WORKERS, reps=5, epochs=5).parse_args()
    for rep, config in tb.interleaved(tb.run_plan(args), args.reps, not args.no_warmup):
        run = tb.launch(config, [WORKER_SCRIPT, ...], args, workdir)  # run.result: rank 0's
        tb.note_run(rep, config, "...")
    benchstats.write_section(render(...), args.out)

A driver runs each configuration as ``python -m torch.distributed.run --standalone
--nproc-per-node=2 WORKER --epochs E --samples S --result R`` in a fresh folder (the worker's
working directory: its checkpoints go there); rank 0 writes R (see raw_ddp.write_result).
Standard library only: the driver never imports torch, the workers do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
TORCHRUN_SHOWN = "torchrun --standalone --nproc-per-node=2"  # TORCHRUN as a table shows it
RAW_DDP = BENCH_DIR / "raw_ddp.py"
# --smoke: seconds, enough to run every configuration end to end and render the tables
SMOKE_REPS, SMOKE_EPOCHS, SMOKE_SAMPLES = 1, 2, 2000


def worker_args(description: str, epochs: int = 5) -> argparse.ArgumentParser:
    """The options every worker takes: the run's size and where rank 0 writes its result."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--samples", type=int, default=20_000)
    p.add_argument("--result", default=None, help="rank 0 writes its step clock here (JSON)")
    return p


def driver_args(
    doc: str,
    configs: Sequence[str],
    workers: Sequence[str],
    *,
    reps: int,
    epochs: int,
    smoke_configs: Sequence[str] | None = None,
) -> argparse.ArgumentParser:
    """worker_args plus the driver's options and the --worker switch that torchrun starts.

    ``doc`` is the benchmark's docstring (its first line describes it); ``smoke_configs`` what
    --smoke runs when --configs is not given (default: all of ``configs``).
    """
    smoke_configs = list(smoke_configs or configs)
    p = worker_args(doc.split("\n")[0], epochs)
    smoke = f"seconds: {SMOKE_REPS} rep, {SMOKE_EPOCHS} epochs of {SMOKE_SAMPLES} samples"
    if smoke_configs != list(configs):
        smoke += f", configs {','.join(smoke_configs)}"
    p.add_argument("--smoke", action="store_true", help=f"{smoke}, no warm-up")
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--configs", default=None, help=f"default: {','.join(configs)}")
    p.add_argument("--out", default=None, help="write the Markdown section here")
    # worker mode (started by torch.distributed.run; not for people)
    p.add_argument("--worker", choices=workers, default=None)
    p.add_argument("--ckpt-dir", default="checkpoints")
    p.set_defaults(all_configs=list(configs), smoke_configs=smoke_configs)
    return p


def run_plan(args: argparse.Namespace) -> list[str]:
    """The configurations to run (--configs, else driver_args' lists); --smoke also sets the
    smoke sizes in ``args``."""
    if args.smoke:
        args.reps, args.epochs, args.samples = SMOKE_REPS, SMOKE_EPOCHS, SMOKE_SAMPLES
        args.no_warmup = True
    if args.configs:
        return [c for c in args.configs.split(",") if c]
    return args.smoke_configs if args.smoke else args.all_configs


def run_meta(args: argparse.Namespace, load_before: str) -> dict[str, object]:
    """What every section says about the runs behind its numbers."""
    return {
        "samples": args.samples,
        "epochs": args.epochs,
        "reps": args.reps,
        "warmup": not args.no_warmup,
        "load_before": load_before,
        "load_after": loadavg(),
    }


def interleaved(configs: Sequence[str], reps: int, warmup: bool) -> Iterator[tuple[int, str]]:
    """(rep, config) in run order: rep -1 is the discarded warm-up round; configurations run
    A B C on even rounds and C B A on odd ones, so no configuration always follows the same one.
    """
    for rep in ([-1] if warmup else []) + list(range(reps)):
        yield from ((rep, c) for c in (configs if rep % 2 == 0 else configs[::-1]))


def note_run(rep: int, config: str, measures: str) -> None:
    """The progress line of one finished run, on stderr: ``harness_overhead: rep 0 raw: ...``."""
    label = "warm-up" if rep < 0 else f"rep {rep}"
    print(f"{Path(sys.argv[0]).stem}: {label} {config}: {measures}", file=sys.stderr, flush=True)


@dataclass
class Run:
    """One finished run: rank 0's result, when the launch began and how long it took."""

    result: dict
    launched: float  # time.time() just before torchrun started
    wall_s: float  # launch to exit of torchrun


def launch(config: str, worker: Sequence[str], args: argparse.Namespace, workdir: Path) -> Run:
    """``TORCHRUN WORKER --epochs --samples --result`` in a fresh folder under ``workdir``.

    The environment is the driver's with one thread per process, W&B off and no SLURM or
    requeue variables (a plain torchrun launch, even inside a SLURM job). A failed run raises
    RuntimeError after printing the tail of its log.
    """
    run_dir = Path(tempfile.mkdtemp(prefix=f"{config}.", dir=workdir))
    result = run_dir / "result.json"
    sizes = ["--epochs", str(args.epochs), "--samples", str(args.samples), "--result", str(result)]
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(BENCH_DIR), str(ROOT)]),
        HPC_WANDB="disabled",
        WANDB_MODE="disabled",
        PYTHONWARNINGS="ignore",
    )
    for var in [v for v in env if v.startswith(("SLURM_", "HPC_REQUEUE"))]:
        del env[var]
    log = run_dir / "log.txt"
    launched = time.time()
    with open(log, "w") as f:
        argv = [*TORCHRUN, *worker, *sizes]
        rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=run_dir)
    wall_s = time.time() - launched
    if rc.returncode != 0 or not result.exists():
        sys.stderr.write(log.read_text()[-4000:])
        raise RuntimeError(f"{config}: exit {rc.returncode}, see {log}")
    return Run(json.loads(result.read_text()), launched, wall_s)


def first_epoch_steps(result: dict) -> int:
    """How many steps the steady state leaves out: the first epoch (half the run when it has
    only one). The steady state is timed from the end of the last of them."""
    n, spe = len(result["steps"]), int(result["steps_per_epoch"])
    return spe if 0 < spe < n else n // 2


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"
