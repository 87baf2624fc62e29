#!/usr/bin/env python3
"""Early termination offline (a sweep's early_terminate) on synthetic learning curves.

No cluster, no GPU: a trial is a seeded learning curve whose shape depends on its learning
rate (too low: slow; too high: fast then a low plateau), with per-epoch noise. Per seed, the
same trials (random search's draws from hpc_tools/sampling.py over a log-uniform lr) run three ways:

* early termination: ``early_terminate: {type: hyperband, min_iter: 1, eta: 3}`` parsed by
  hpc_tools/early_terminate.py, each trial reporting every epoch to an Optuna study through
  hpc_harness/pruning.py's pruner and ``prune_now`` (what a trial on a node runs), CONCURRENT
  trials advancing together (an array job's tasks);
* every trial to the end (no early termination);
* plain random search given the epochs early termination spent (its first trials, whole).

Paired seeds; the table gives medians (min-max) of epochs spent and of the best final metric::

    PYTHONPATH=hpc_files .venv/bin/python bench/early_terminate.py [--smoke] [--out FRAGMENT.md]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchstats import write_section  # noqa: E402

from hpc_harness import pruning  # noqa: E402
from hpc_tools import early_terminate, sampling, sweep  # noqa: E402

BLOCK = {"type": "hyperband", "min_iter": 3, "eta": 3}
NOISE = 0.004  # per-epoch noise (sd) of val_acc
# Two families: every lr learns at one pace (curves do not cross: early rank = final rank,
# but for the noise), and a higher lr learning sooner (fast starters plateau lower: crossing).
FAMILIES = (("curves that do not cross", 0.0), ("crossing curves", 0.35))
SPEC = {
    "method": "random",
    "program": "curve.py",
    "command": list(sweep.DEFAULT_COMMAND),
    "metric": "val_acc",
    "goal": "maximize",
    "params": [{"name": "lr", "dist": "log_uniform_values", "min": 1.0e-5, "max": 1.0}],
}


def curve(lr: float, epochs: int, speed: float, rng: random.Random) -> list[float]:
    """val_acc after epochs 1..epochs: the plateau is best at lr=10^-2.5; ``speed`` > 0 makes
    a higher lr approach its (lower) plateau sooner, so curves cross."""
    x = math.log10(lr) + 2.5
    plateau = max(0.2, 0.95 - 0.06 * x * x)
    tau = 4.0 * 10 ** (-speed * x)  # epochs to approach the plateau
    return [
        plateau - (plateau - 0.1) * math.exp(-t / tau) + rng.gauss(0, NOISE)
        for t in range(1, epochs + 1)
    ]


def with_pruning(curves: list[list[float]], concurrent: int) -> tuple[int, float, int]:
    """(epochs spent, best final value of a finished trial, its index)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = early_terminate.parse("bench", BLOCK, SPEC["metric"])
    study = optuna.create_study(direction=SPEC["goal"], pruner=pruning.pruner(cfg))
    spent, best, best_i = 0, -math.inf, -1
    for first in range(0, len(curves), concurrent):
        live = {i: study.ask() for i in range(first, min(first + concurrent, len(curves)))}
        for step in range(1, len(curves[0]) + 1):
            for i, trial in list(live.items()):
                spent += 1
                value = curves[i][step - 1]
                if pruning.prune_now(trial, value, step, cfg):
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    del live[i]
        for i, trial in live.items():
            study.tell(trial, curves[i][-1])
            if curves[i][-1] > best:
                best, best_i = curves[i][-1], i
    return spent, best, best_i


def family(speed: float, seeds: int, n_trials: int, epochs: int, concurrent: int) -> list[tuple]:
    """Per seed: (epochs with early termination, its best final, epochs without, best final,
    same best trial?, random search's trials in the same epochs, its best final)."""
    rows = []
    for seed in range(seeds):
        draws = sampling.expand_sweep(SPEC, n_trials, seed, "bench")
        lrs = [d["params"]["lr"] for d in draws]
        curves = [
            curve(lr, epochs, speed, random.Random(seed * 100_003 + i)) for i, lr in enumerate(lrs)
        ]
        spent, best, best_i = with_pruning(curves, concurrent)
        finals = [c[-1] for c in curves]
        same = finals.index(max(finals)) == best_i
        budget = max(1, spent // epochs)  # whole trials random search affords in those epochs
        rows.append(
            (spent, best, n_trials * epochs, max(finals), same, budget, max(finals[:budget]))
        )
        print(f"speed {speed} seed {seed}: {rows[-1]}", flush=True)
    return rows


def med(rows: list[tuple], k: int, f: str = "{:.4f}") -> str:
    vals = [r[k] for r in rows]
    return f"{f.format(statistics.median(vals))} ({f.format(min(vals))}-{f.format(max(vals))})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="2 seeds of 9 trials, 9 epochs")
    p.add_argument("--out", help="write the Markdown section here")
    args = p.parse_args()
    seeds, n_trials, epochs, concurrent = (2, 9, 9, 3) if args.smoke else (10, 81, 27, 9)
    start = time.perf_counter()
    results = [
        (name, family(speed, seeds, n_trials, epochs, concurrent)) for name, speed in FAMILIES
    ]
    elapsed = time.perf_counter() - start
    cfg = early_terminate.parse("bench", BLOCK, SPEC["metric"])
    steps = [cfg["min_resource"] * cfg["reduction_factor"] ** k for k in range(epochs)]
    rungs = ", ".join(str(s) for s in steps if s < epochs)
    import optuna

    lines = [
        "## 8. Early termination offline: early_terminate (hyperband) vs none vs random search",
        "",
        f"Synthetic learning curves (val_acc, maximize; plateau set by a log-uniform lr, best "
        f"at 10^-2.5; noise sd {NOISE} per epoch), {n_trials} trials x {epochs} epochs per "
        f"seed, {seeds} paired seeds (the same trials and curves on every side). Early "
        f"termination: `early_terminate: {json.dumps(BLOCK)}` through "
        "hpc_tools/early_terminate.py and "
        f"hpc_harness/pruning.py (Optuna's SuccessiveHalvingPruner: rungs at epochs {rungs}), "
        f"{concurrent} trials at a time, as array tasks. Random search: the first trials of the "
        f"same draws, whole, in as many epochs as early termination spent. Optuna "
        f"{optuna.__version__}; {elapsed:.1f} s in all.",
        "",
        "| curves | search | epochs spent | best final val_acc | same best trial |",
        "| --- | --- | --- | --- | --- |",
    ]
    ok = True
    for name, rows in results:
        ratios = [r[2] / r[0] for r in rows]
        same = sum(r[4] for r in rows)
        lines += [
            f"| {name} | early termination | {med(rows, 0, '{:.0f}')} | {med(rows, 1)} "
            f"| {same} of {seeds} seeds |",
            f"| | no early termination | {med(rows, 2, '{:.0f}')} | {med(rows, 3)} | |",
            f"| | random search, same epochs | {med(rows, 5, '{:.0f}')} trials x {epochs} "
            f"| {med(rows, 6)} | |",
            f"| | epochs without / with | {statistics.median(ratios):.1f}x "
            f"({min(ratios):.1f}-{max(ratios):.1f}x) | | |",
        ]
        if name == FAMILIES[0][0]:
            ok = statistics.median(ratios) >= 2 and same > seeds // 2
    lines += [
        "",
        'Medians (min-max) over the seeds. "Same best trial": the trial that ends highest when '
        "every trial runs to its end was kept to its end. Where a higher lr learns sooner and "
        "plateaus lower (crossing curves), the first rungs prune the slow best trials: raise "
        "min_iter there.",
        "",
    ]
    write_section("\n".join(lines), args.out)
    if not args.smoke and not ok:
        print("early_terminate: under 2x fewer epochs, or the best trial lost", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
