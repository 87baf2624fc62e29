"""Loop overhead in instructions: what the harness Trainer and a pieces loop execute per step
beyond a raw loop, counted by valgrind's callgrind, so the count does not move with the
machine's load. The goal is >= 0.98x the raw loop's steps/s.

Each loop runs in one process (world size 1, CPU, ``OMP_NUM_THREADS=1``) on bench/raw_ddp.py's
workload, for N and for 2N optimizer steps under ``valgrind --tool=callgrind``; instructions per
step = (instructions(2N) - instructions(N)) / N, ratio = raw's instructions per step over the
loop's. How to read the counts: docs/performance.md.

    raw      for x, y in loader: loss; zero_grad; backward; step
    harness  hpc_harness.trainer.Trainer, TrainConfig defaults but max_steps
    pieces   docs/harness.md's recipe ("Your own loop: the pieces"), cut to ResumableSampler,
             StopAgreement.should_stop() every step, average_gradients, a final save

Six runs of about 3 minutes each, as many at once as there are CPUs.

    .venv/bin/python bench/loop_instructions.py [--steps 150] [--out F]
    .venv/bin/python bench/loop_instructions.py --smoke      # N = 5: checks that it runs
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchstats import write_section

CONFIGS = ("raw", "harness", "pieces")
TARGET = 0.98
SAMPLES = 40_000  # 625 steps an epoch: 2N steps stay in the first epoch
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


# --------------------------------------------------------------------------- workers


def run_loop(config: str, steps: int, ckpt_dir: str) -> None:
    import torch
    import torch.nn.functional as F
    from loop_overhead import pieces_step
    from raw_ddp import BATCH, SEED, make_dataset, make_model, make_optimizer
    from torch.utils.data import DataLoader

    from hpc_harness import pieces as hp

    torch.set_num_threads(1)
    data = make_dataset(SAMPLES)
    if config == "raw":
        model, done = make_model(), 0
        opt = make_optimizer(model.parameters())
        loader = DataLoader(data, BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break
        return
    ctx = hp.setup(gpus=0, verbose=False)
    if config == "harness":
        from hpc_harness.trainer import TrainConfig, Trainer

        cfg = TrainConfig(epochs=1, max_steps=steps, seed=SEED, ckpt_dir=ckpt_dir)
        loader = DataLoader(data, BATCH, shuffle=True)
        Trainer(make_model(), make_optimizer, loader, ctx, cfg).train()
        return
    # pieces: docs/harness.md's recipe, cut to what runs every step and the final save. Under
    # valgrind the stop agreement's checks (spaced by time) come about every 6 steps.
    model, step = make_model(), 0
    opt = make_optimizer(model.parameters())
    sampler = hp.ResumableSampler(len(data), ctx.world_size, ctx.rank, seed=SEED)
    loader = DataLoader(data, BATCH, sampler=sampler, generator=torch.Generator())
    stop = hp.StopAgreement(ctx).install()
    train_step = pieces_step(ctx.world_size)  # loop_overhead.py's pieces loop step
    sampler.set_epoch(0)
    for x, y in loader:
        train_step(model, opt, x, y)
        step += 1
        if stop.should_stop():
            raise SystemExit("loop_instructions: a stop signal during the benchmark")
        if step == steps:
            break
    hp.save_checkpoint(ckpt_dir, {"model": model.state_dict(), "global_step": step}, step)


# --------------------------------------------------------------------------- driver


def instructions(config: str, steps: int, workdir: Path) -> int:
    """Instructions callgrind counts in one whole run of ``config`` for ``steps`` steps: about
    3 minutes, most of it importing torch under valgrind."""
    ckpt = tempfile.mkdtemp(prefix=f"{config}-{steps}.", dir=workdir)
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={ckpt}/callgrind.out",
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        config,
        "--steps",
        str(steps),
        "--ckpt-dir",
        ckpt,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    started = time.monotonic()
    r = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    found = COLLECTED.findall(r.stderr)
    if r.returncode != 0 or not found:
        sys.exit(f"loop_instructions: {config} ({steps} steps) failed:\n{r.stderr[-3000:]}")
    elapsed = time.monotonic() - started
    print(f"loop_instructions: {config} {steps} steps: {int(found[-1]):,} ({elapsed:.0f} s)")
    return int(found[-1])


def render(per_step: dict[str, float], steps: int) -> str:
    out = ["## Loop overhead in instructions (callgrind)\n\n"]
    out.append(
        f"`python bench/loop_instructions.py --steps {steps}`: each loop for {steps} and "
        f"{2 * steps} steps in one process (world size 1, CPU, one thread) under valgrind's "
        "callgrind; instructions per step = the difference over the extra steps (start-up, "
        "imports, warm-up and the final save cancel). Deterministic, unlike section 7's clock. "
        "Ratio = raw's instructions per step over the loop's.\n\n"
    )
    out.append("| config | instructions per step | more than raw | ratio vs raw |\n")
    out.append("| --- | ---: | ---: | --- |\n")
    raw = per_step["raw"]
    for c in CONFIGS:
        extra = per_step[c] - raw
        out.append(
            f"| `{c}` | {per_step[c]:,.0f} | {extra:+,.0f} ({100 * extra / raw:+.2f}%) | "
            f"**{raw / per_step[c]:.4f}x** |\n"
        )
    out.append("\n")
    for c in ("harness", "pieces"):
        ratio = raw / per_step[c]
        verdict = "meets" if ratio >= TARGET else "below"
        out.append(f"- `{c}`: {ratio:.4f}x raw in instructions per step (target {TARGET}x): ")
        out.append(f"{verdict}\n")
    return "".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=150, help="N: runs of N and 2N steps")
    p.add_argument("--out", default=None, help="write the Markdown section here")
    p.add_argument("--smoke", action="store_true", help="N = 5: checks that it runs")
    p.add_argument("--worker", choices=CONFIGS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--ckpt-dir", default="checkpoints", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        run_loop(args.worker, args.steps, args.ckpt_dir)
        return 0
    steps = 5 if args.smoke else args.steps
    runs = [(c, n) for c in CONFIGS for n in (steps, 2 * steps)]
    with tempfile.TemporaryDirectory(prefix="bench-instructions.") as tmp:
        # each run is one single-threaded valgrind process: as many at once as there are CPUs
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            counted = dict(zip(runs, pool.map(lambda r: instructions(*r, Path(tmp)), runs)))
    # one step's instructions: start-up, imports, the first steps' warm-up and the final
    # checkpoint are in both runs and cancel out
    counts = {c: (counted[c, 2 * steps] - counted[c, steps]) / steps for c in CONFIGS}
    write_section(render(counts, steps), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
