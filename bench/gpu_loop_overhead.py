"""Loop overhead on one GPU: the harness Trainer and a pieces loop against a raw PyTorch loop,
epoch by epoch in one process, and the host synchronisations each loop makes per step.
The goal is >= 0.98x the raw loop's steps/s. Two workloads (why two: docs/performance.md):

    mlp     bench/raw_ddp.py's MLP 64-256-256-10, batch 64, SGD, fp32: the host is the bottleneck
    charlm  hpc_harness/examples/charlm.py's CharLM made larger, bf16 autocast, AdamW: the GPU is

Per workload, the loops' models start from the same weights, their loaders read the same data:

    raw        for x, y in loader: x.to(dev); loss; zero_grad; backward; step (nothing else)
    harness    hpc_harness.trainer.Trainer with TrainConfig defaults (precision as the workload)
    pieces     docs/harness.md's recipe ("Your own loop: the pieces"), cut to ResumableSampler,
               StopAgreement.should_stop() every step, average_gradients
    raw_again  the raw loop again, its own model and loader: the noise floor of the ratios

World size 1 (NCCL refuses two ranks on one device): no DDP, no all-reduce in the stop agreement.

    python bench/gpu_loop_overhead.py [--rounds 31] [--only mlp|charlm] [--out BENCHMARKS_GPU.md]
    python bench/gpu_loop_overhead.py --smoke      # seconds, also on a CPU: checks the script
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from benchstats import Series, md_table, paired_ratios
from raw_ddp import make_dataset, make_model
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from hpc_harness import pieces as hp
from hpc_harness.examples.charlm import CharLM, CharWindows, make_text
from hpc_harness.trainer import TrainConfig, Trainer

CONFIGS = ("raw", "harness", "pieces", "raw_again")
TARGET = 0.98
SEED = 0


@dataclass
class Workload:
    """What the three loops share: data, model, optimizer, loss and precision."""

    name: str
    describe: str
    data: Dataset
    batch: int
    make_model: Callable[[], nn.Module]
    make_optimizer: Callable[[Any], torch.optim.Optimizer]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    precision: str  # the Trainer's --precision; the raw and pieces loops autocast alike


def seq_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def workloads(smoke: bool) -> list[Workload]:
    mlp_samples = 2_000 if smoke else 20_000
    text = make_text(sentences=2_000 if smoke else 40_000)
    block, dim, layers = (32, 64, 2) if smoke else (128, 384, 6)
    windows = CharWindows(text, block)
    windows_used = Subset(windows, range(min(len(windows), 256 if smoke else 2_048)))
    vocab = len(windows.chars)

    def charlm() -> nn.Module:
        torch.manual_seed(SEED)
        return CharLM(vocab, block, dim=dim, heads=6 if dim % 6 == 0 else 4, layers=layers)

    return [
        Workload(
            "mlp",
            f"MLP 64-256-256-10, {mlp_samples} random samples, batch 64, SGD lr 0.01, fp32",
            make_dataset(mlp_samples),
            64,
            make_model,
            functools.partial(torch.optim.SGD, lr=0.01),
            F.cross_entropy,
            "32",
        ),
        Workload(
            "charlm",
            f"CharLM dim {dim}, {layers} layers, context {block}, tied embeddings, "
            f"{len(windows_used)} windows, batch 32, AdamW lr 3e-4, bf16 autocast",
            windows_used,
            32,
            charlm,
            functools.partial(torch.optim.AdamW, lr=3e-4),
            seq_loss,
            "bf16-mixed",
        ),
    ]


def autocast(device: torch.device, precision: str) -> Any:
    """What a user's own loop writes for the workload's precision."""
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()  # fp32: no autocast at all, as a raw loop writes it


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class EpochClock:
    """Per config: (steps/s, host CPU ms per step) of every timed epoch. ``timed`` waits for
    the GPU at both ends of the epoch, so all its GPU work is in the time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.rounds: dict[str, list[tuple[float, float]]] = {c: [] for c in CONFIGS}

    def timed(self, config: str, run: Callable[[], int]) -> None:
        sync(self.device)
        wall, cpu = time.perf_counter(), time.process_time()
        steps = run()
        sync(self.device)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        self.rounds[config].append((steps / wall, 1000 * cpu / steps))


def count_syncs(device: torch.device, run: Callable[[], int]) -> tuple[int, int]:
    """(host synchronisations, steps) of one epoch of ``run``, from CUDA's sync debug mode:
    ``"warn"`` warns at every operation that makes the host wait for the GPU."""
    if device.type != "cuda":
        return -1, run()
    sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            steps = run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught), steps


def backward(work: Workload, device: torch.device, model: nn.Module, opt: Any, batch: Any) -> None:
    """What the raw and pieces loops both write before the optimizer step: the batch moved to
    the device, forward and loss (autocast as the workload's precision), gradients cleared,
    backward."""
    x, y = (t.to(device, non_blocking=True) for t in batch)
    with autocast(device, work.precision):
        loss = work.loss_fn(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()


def raw_loop(work: Workload, device: torch.device) -> Callable[[], int]:
    """One epoch of the raw loop (its own model, optimizer and loader) per call."""
    model = work.make_model().to(device)
    opt = work.make_optimizer(model.parameters())
    loader = DataLoader(work.data, work.batch, shuffle=True, generator=torch.Generator())

    def epoch() -> int:
        steps = 0
        for batch in loader:
            backward(work, device, model, opt, batch)
            opt.step()
            steps += 1
        return steps

    return epoch


def measure(work: Workload, ctx: Any, rounds: int, ckpt_dir: str) -> dict[str, Any]:
    """The Trainer's ``train()`` runs ``rounds`` epochs after a warm-up one; after each, one raw,
    one pieces and one raw_again epoch run (the order reversed every other round), so a round's
    epochs run seconds apart in the same process. One more epoch of each loop then counts its
    host synchronisations (count_syncs)."""
    device = ctx.device
    clock = EpochClock(device)

    raw_epoch, raw_again_epoch = raw_loop(work, device), raw_loop(work, device)

    model = work.make_model().to(device)
    opt = work.make_optimizer(model.parameters())
    sampler = hp.ResumableSampler(len(work.data), ctx.world_size, ctx.rank, seed=SEED)
    loader = DataLoader(work.data, work.batch, sampler=sampler, generator=torch.Generator())
    stop = hp.StopAgreement(ctx)
    pieces_epochs = itertools.count()

    def pieces_epoch() -> int:
        sampler.set_epoch(next(pieces_epochs))
        sampler.set_start(0)
        steps = 0
        for batch in loader:
            backward(work, device, model, opt, batch)
            hp.average_gradients(model, ctx.world_size)
            opt.step()
            steps += 1
            if stop.should_stop():
                raise SystemExit("gpu_loop_overhead: a stop signal during the benchmark")
        return steps

    class Interleaved(Trainer):
        def _run_epoch(self, epoch: int) -> str:
            status = ""

            def run() -> int:
                nonlocal status
                before = self.global_step
                status = super(Interleaved, self)._run_epoch(epoch)
                return self.global_step - before

            if epoch < rounds + 1:
                clock.timed("harness", run)
            else:  # the last epoch: its host synchronisations counted
                syncs["harness"] = count_syncs(device, run)
            return status

        def _end_epoch(self) -> bool:
            epoch = self.epoch
            ended = super()._end_epoch()
            if epoch < rounds + 1:
                others = [
                    ("raw", raw_epoch),
                    ("pieces", pieces_epoch),
                    ("raw_again", raw_again_epoch),
                ]
                for config, run in others if epoch % 2 else others[::-1]:
                    clock.timed(config, run)
            return ended

    syncs: dict[str, tuple[int, int]] = {}
    cfg = TrainConfig(epochs=rounds + 2, seed=SEED, ckpt_dir=ckpt_dir, precision=work.precision)
    shuffled = DataLoader(work.data, work.batch, shuffle=True)
    trainer = Interleaved(
        work.make_model(), work.make_optimizer, shuffled, ctx, cfg, loss_fn=work.loss_fn
    )
    if trainer.train() != "finished":  # a stop signal (the caller's timeout) before the end
        raise SystemExit(f"gpu_loop_overhead: {work.name} stopped before its last round")
    syncs["raw"] = count_syncs(device, raw_epoch)
    syncs["pieces"] = count_syncs(device, pieces_epoch)
    # the first round is the warm-up (allocator, cuDNN/cuBLAS heuristics, autotuning)
    return {"rounds": {c: r[1:] for c, r in clock.rounds.items()}, "syncs": syncs}


def render(work: Workload, result: dict[str, Any]) -> str:
    per_round = result["rounds"]
    n = len(per_round["raw"])
    wall = [Series(c, c, [r[0] for r in per_round[c]]) for c in CONFIGS]
    cpu = [Series(c, c, [r[1] for r in per_round[c]]) for c in CONFIGS]
    out = [f"### {work.name}: {work.describe}\n\n"]
    out.append("Steps/s per epoch (higher is better):\n\n")
    out.append(md_table(wall, "raw", "steps/s"))
    out.append("\nHost CPU time per step (lower is better):\n\n")
    out.append(md_table(cpu, "raw", "ms"))
    out.append("\n")
    for name in ("harness", "pieces"):
        ratio = statistics.median(paired_ratios(wall[CONFIGS.index(name)], wall[0]))
        out.append(
            f"- `{name}`: {ratio:.3f}x raw in steps/s (paired median over {n} rounds; "
            f"target {TARGET}x): {'meets' if ratio >= TARGET else 'below'}\n"
        )
    floor = sorted(paired_ratios(wall[CONFIGS.index("raw_again")], wall[0]))
    low, high = floor[len(floor) // 4], floor[(3 * len(floor)) // 4]
    out.append(
        f"- noise floor: the raw loop against itself (`raw_again`) {statistics.median(floor):.3f}x"
        f", its middle half of rounds {low:.3f}-{high:.3f}x\n"
    )
    counted = ", ".join(
        f"{c} {result['syncs'][c][0]} in {result['syncs'][c][1]} steps"
        if result["syncs"][c][0] >= 0
        else f"{c} not counted (no CUDA)"
        for c in ("raw", "harness", "pieces")
    )
    out.append(f"- host synchronisations in one epoch (CUDA sync debug mode): {counted}\n\n")
    return "".join(out)


def header(device: torch.device, rounds: int) -> str:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none (CPU)"
    return (
        "# Loop overhead on one GPU\n\n"
        f"Generated by `python bench/gpu_loop_overhead.py --rounds {rounds}` "
        f"on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; do not edit by hand. "
        "Section 7 of BENCHMARKS.md measures the same loops on 2 CPU processes (gloo); this "
        "file is the GPU side, measured where a GPU was lent (the bench's docstring says how).\n\n"
        f"| | |\n| --- | --- |\n| device | {gpu} |\n| torch | {torch.__version__} |\n"
        f"| python | {platform.python_version()} |\n\n"
        f"Each epoch timed with `torch.cuda.synchronize()` at both ends; {rounds} rounds after a "
        "discarded warm-up one, the three loops' epochs of a round seconds apart in one "
        "process; ratio = median of the per-round ratios against the raw epoch.\n\n"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=31, help="timed rounds per workload")
    p.add_argument("--only", choices=("mlp", "charlm"), help="one workload")
    p.add_argument("--out", help="write the report here too (Markdown)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 1 round")
    args = p.parse_args()
    rounds = 1 if args.smoke else args.rounds
    ctx = hp.setup(verbose=False)
    text = [header(ctx.device, rounds)]
    for work in workloads(args.smoke):
        if args.only and work.name != args.only:
            continue
        with tempfile.TemporaryDirectory(prefix="bench-gpu.") as tmp:
            result = measure(work, ctx, rounds, tmp)
        text.append(render(work, result))
        print(text[-1], flush=True)
        if args.out:  # after each workload: a run stopped in the next keeps what it measured
            Path(args.out).write_text("".join(text))
    hp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
