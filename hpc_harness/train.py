"""Example: an MLP on scikit-learn's digits, trained with hpc_harness's Trainer.

Reaches >= 95% test accuracy on 360 held-out images in a few seconds on one CPU core.

Launch it any of these ways (the same file, no edits)::

    # laptop, one process
    python -m hpc_harness.train --epochs 15 --lr 3e-3

    # one node, 2 processes (CPU: gloo; GPUs: nccl, one per process)
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m hpc_harness.train

    # SLURM, one process per task (2 nodes x 4 GPUs), inside an sbatch allocation
    srun --ntasks-per-node=4 python -m hpc_harness.train --strategy ddp

    # SLURM, one torchrun per node
    srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc-per-node=4 \\
        --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT --rdzv-id=$SLURM_JOB_ID \\
        -m hpc_harness.train

Exit codes: 0 finished, 42 checkpointed at SIGUSR1/SIGTERM (requeue me; see signals.py),
anything else a failure. Re-running the same command resumes from the newest checkpoint in
``--ckpt-dir``. The defaults of ``--data-dir``, ``--ckpt-dir`` and ``--wandb`` come from the
job's environment (``--help`` shows them).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from hpc_harness.examples import faults


def default_data_dir(env: Mapping[str, str] | None = None) -> str:
    """``$SLURM_TMPDIR/datasets/digits`` if that exists (staged), else
    ``$scratch_dir/datasets/digits`` if scratch_dir is set, else ``./datasets/digits`` (written
    there if missing)."""
    env = os.environ if env is None else env
    if env.get("SLURM_TMPDIR"):
        staged = os.path.join(env["SLURM_TMPDIR"], "datasets", "digits")
        if os.path.exists(staged):
            return staged
    if env.get("scratch_dir"):
        return os.path.join(env["scratch_dir"], "datasets", "digits")
    return os.path.join(".", "datasets", "digits")


def default_ckpt_dir(env: Mapping[str, str] | None = None) -> str:
    """``$HPC_TRIAL_DIR/checkpoints`` (set per trial by the batch script, so array
    tasks never share a folder), else ``$scratch_dir/$exp_name/checkpoints``, else
    ``./checkpoints``."""
    env = os.environ if env is None else env
    if env.get("HPC_TRIAL_DIR"):
        return os.path.join(env["HPC_TRIAL_DIR"], "checkpoints")
    if env.get("scratch_dir") and env.get("exp_name"):
        return os.path.join(env["scratch_dir"], env["exp_name"], "checkpoints")
    return os.path.join(".", "checkpoints")


def positive(text: str) -> int:
    """A whole number of at least 1 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expects a whole number of 1 or more, got '{text}'")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hpc_harness.train",
        description="Train an MLP on the digits dataset with hpc_harness (exit 42 = requeue).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("model and optimisation")
    g.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    g.add_argument("--layers", type=int, default=2, help="hidden layers")
    g.add_argument("--hidden", type=int, default=128, help="units per hidden layer")
    g.add_argument("--batch-size", type=positive, default=32, help="per-process batch size")
    g.add_argument("--epochs", type=int, default=15)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-steps", type=positive, default=None, help="stop after this global step")
    g = p.add_argument_group("hardware")
    g.add_argument("--precision", choices=("32", "16-mixed", "bf16-mixed"), default="32")
    g.add_argument("--strategy", choices=("ddp", "dp", "ddp2", "fsdp"), default="ddp")
    g.add_argument(
        "--num-workers", type=int, default=0, help="DataLoader worker processes per rank"
    )
    g.add_argument(
        "--gpus",
        default=None,
        help="count (2), -1 for all, 0 for none; ignored when SLURM set CUDA_VISIBLE_DEVICES",
    )
    g = p.add_argument_group("files")
    g.add_argument("--data-dir", default=None, help=f"default: {default_data_dir()}")
    g.add_argument("--ckpt-dir", default=None, help=f"default: {default_ckpt_dir()}")
    g.add_argument("--run-dir", default=None, help="metrics.csv and wandb; default: --ckpt-dir")
    g.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0 = not by steps")
    g.add_argument(
        "--checkpoint-every-s",
        type=float,
        default=600.0,
        help="seconds of training; 0 = not by time (both 0: only at a signal and the end)",
    )
    g.add_argument("--keep-last", type=int, default=3, help="checkpoints kept")
    g.add_argument("--no-resume", action="store_true", help="ignore existing checkpoints")
    g.add_argument(
        "--fresh",
        action="store_true",
        help="start over: move the checkpoint folder of an earlier run aside to "
        "<ckpt-dir>.old-<time> (nothing is deleted); needed to reuse a folder with other arguments",
    )
    g = p.add_argument_group("logging")
    g.add_argument("--log-every", type=int, default=20, help="steps between progress lines")
    g.add_argument(
        "--wandb",
        choices=("auto", "online", "offline", "disabled"),
        default=None,
        help="default: $HPC_WANDB, else auto (online if an API key is configured, else off)",
    )
    g.add_argument(
        "--signal-check-every",
        type=int,
        default=0,
        help="steps between stop-flag checks (0: adaptive, about every --signal-check-seconds)",
    )
    g.add_argument(
        "--signal-check-seconds",
        type=float,
        default=0.5,
        help="adaptive: seconds between stop-flag checks (a signal is acted on within ~2x this)",
    )
    faults.add_flags(p)
    return p


# The flags that may change across a resume without making it another run; the Trainer
# adds its own settings of the same kind (trainer.RESUME_FREE: where it stops, checkpoints,
# logging, strategy, precision).
RESUME_FREE = ("gpus", "num_workers", "data_dir", "no_resume", "signal_check_seconds")


def make_model(layers: int, hidden: int, n_in: int = 64, n_out: int = 10):  # -> nn.Module
    from torch import nn

    mods: list[nn.Module] = []
    width = n_in
    for _ in range(layers):
        mods += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    mods.append(nn.Linear(width, n_out))
    return nn.Sequential(*mods)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.signal_check_every < 0:
        parser.error(
            f"--signal-check-every expects 0 (adaptive) or more, got {args.signal_check_every}"
        )
    if not args.signal_check_seconds > 0:
        parser.error(f"--signal-check-seconds must be more than 0, got {args.signal_check_seconds}")
    if args.num_workers < 0:
        workers = args.num_workers
        parser.error(
            f"--num-workers expects 0 (load in the training process) or more, got {workers}"
        )
    import torch
    from torch.utils.data import DataLoader

    from hpc_harness import dist
    from hpc_harness.checkpoint import RunMismatch, UnsafeCheckpoint
    from hpc_harness.digits import DigitsDataset, ensure_digits
    from hpc_harness.precision import PrecisionError
    from hpc_harness.signals import exit_code
    from hpc_harness.strategy import StrategyError
    from hpc_harness.trainer import TrainConfig

    try:
        ctx = dist.setup(gpus=args.gpus)
    except (dist.LaunchError, ValueError) as exc:
        print(f"hpc_harness: error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        data_dir = args.data_dir or default_data_dir()
        ckpt_dir = args.ckpt_dir or default_ckpt_dir()
        ensure_digits(data_dir, local_rank=ctx.local_rank)
        dist.barrier()
        train_set, test_set = DigitsDataset(data_dir, "train"), DigitsDataset(data_dir, "test")
        if ctx.is_main:
            print(
                f"hpc_harness: data {data_dir} ({len(train_set)} train, {len(test_set)} test), "
                f"checkpoints {ckpt_dir}",
                flush=True,
            )
        torch.manual_seed(args.seed)  # same initial weights on every rank
        model = make_model(args.layers, args.hidden)
        loader = DataLoader(
            train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers
        )
        cfg = TrainConfig(
            epochs=args.epochs,
            max_steps=args.max_steps,
            seed=args.seed,
            ckpt_dir=ckpt_dir,
            checkpoint_every=args.checkpoint_every,
            checkpoint_every_s=args.checkpoint_every_s,
            keep_last=args.keep_last,
            resume=not args.no_resume,
            fresh=args.fresh,
            strategy=args.strategy,
            precision=args.precision,
            run_dir=args.run_dir,
            log_every=args.log_every,
            wandb=args.wandb,
            hparams={k: v for k, v in vars(args).items() if k not in faults.FLAGS},
            signal_check_every=args.signal_check_every,
            signal_check_s=args.signal_check_seconds,
            resume_free=RESUME_FREE,
        )
        steps_total = args.epochs * -(-len(train_set) // (args.batch_size * ctx.world_size))
        try:
            trainer = faults.trainer(
                faults.Faults.from_args(args),
                model,
                lambda params: torch.optim.AdamW(params, lr=args.lr),
                loader,
                ctx,
                cfg,
                make_scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(
                    opt, T_max=max(steps_total, 1)
                ),
                eval_data=test_set,
            )
        except (StrategyError, PrecisionError) as exc:
            print(f"hpc_harness: error: {exc}", file=sys.stderr, flush=True)
            return 2
        try:
            status = trainer.train()
        except (RunMismatch, UnsafeCheckpoint) as exc:
            if ctx.is_main:
                print(f"hpc_harness: error: {exc}", file=sys.stderr, flush=True)
            return 2
        if ctx.is_main and status != "requeue" and trainer.metrics:
            dist.say(f"hpc_harness: final test accuracy {trainer.metrics['test_acc']:.4f}")
        return exit_code(status)
    finally:
        dist.cleanup()


if __name__ == "__main__":
    sys.exit(main())
