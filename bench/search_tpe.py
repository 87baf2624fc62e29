#!/usr/bin/env python3
"""Adaptive search offline vs random search, on a cheap synthetic objective (no cluster).

The Branin function (2-D, minimum 0.397887) stands in for a training run. Both sides
use the toolkit's own code paths for a sweep file with two uniform parameters:

* ``method: bayes``: hpc_tools/study.py as the controller drives it, in rounds of
  5: ``ensure_round`` asks 5 trials (round 1 is TPE's random startup), every trial is
  evaluated, ``tell_round`` tells the results, then the next round (a study in memory;
  the controller's is the same study in a journal file);
* ``method: random``: hpc_tools/sampling.py's seeded draws (``expand_sweep``).

Best value found after 30 trials, per seed; the table gives medians over 10 seeds (and
min-max) and how often TPE beat random on the same seed::

    PYTHONPATH=hpc_files .venv/bin/python bench/search_tpe.py [--smoke] [--out FRAGMENT.md]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from benchstats import write_section

from hpc_tools import sampling, sweep
from hpc_tools.study import ensure_round, open_study, sampler, search_space, tell_round

BRANIN_MIN = 0.397887
SPEC = {
    "method": "bayes",
    "program": "branin.py",
    "command": list(sweep.DEFAULT_COMMAND),
    "metric": "branin",
    "goal": "minimize",
    "params": [
        {"name": "x1", "dist": "uniform", "min": -5.0, "max": 10.0},
        {"name": "x2", "dist": "uniform", "min": 0.0, "max": 15.0},
    ],
}


def branin(x1: float, x2: float) -> float:
    b, c = 5.1 / (4 * math.pi**2), 5 / math.pi
    t = 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


def best_tpe(seed: int, n_trials: int, per_round: int) -> float:
    study = None
    best = math.inf
    space = search_space(SPEC)
    for round_ in range(1, n_trials // per_round + 1):
        smp = sampler(seed, round_, per_round)
        if study is None:
            study = open_study(None, "bench", SPEC["goal"], smp)
        study.sampler = smp  # the controller of each round opens the study with its own
        asked = ensure_round(study, space, round_, per_round)
        values = {}
        for t in asked:
            value = branin(t.params["x1"], t.params["x2"])
            values[int(t.user_attrs["trial"])] = value
            best = min(best, value)
        tell_round(study, round_, values)
    return best


def best_random(seed: int, n_trials: int) -> float:
    spec = dict(SPEC, method="random")
    rows = sampling.expand_sweep(spec, n_trials, seed, "bench")
    return min(branin(r["params"]["x1"], r["params"]["x2"]) for r in rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="2 seeds of 10 trials")
    p.add_argument("--out", help="write the Markdown section here")
    args = p.parse_args()
    seeds, n_trials, per_round = (2, 10, 5) if args.smoke else (10, 30, 5)
    start = time.perf_counter()
    tpe, rnd = [], []
    for seed in range(seeds):
        tpe.append(best_tpe(seed, n_trials, per_round))
        rnd.append(best_random(seed, n_trials))
        print(f"seed {seed}: tpe {tpe[-1]:.4f} random {rnd[-1]:.4f}", flush=True)
    elapsed = time.perf_counter() - start
    wins = sum(t < r for t, r in zip(tpe, rnd))
    med_t, med_r = statistics.median(tpe), statistics.median(rnd)
    import optuna

    lines = [
        "## 6. Adaptive search: method bayes (TPE in rounds) vs random search (no cluster)",
        "",
        f"Branin (minimum {BRANIN_MIN}), best value after {n_trials} trials, "
        f"{seeds} seeds; TPE asked and told in rounds of {per_round} through "
        "hpc_tools/study.py (round 1: its random startup), random search through "
        "hpc_tools/sampling.py's seeded draws. "
        f"Optuna {optuna.__version__}; {elapsed:.1f} s in all.",
        "",
        "| search | median best | min-max | regret (median - minimum) |",
        "| --- | --- | --- | --- |",
        f"| TPE, rounds of {per_round} | {med_t:.4f} | {min(tpe):.4f}-{max(tpe):.4f} "
        f"| {med_t - BRANIN_MIN:.4f} |",
        f"| random | {med_r:.4f} | {min(rnd):.4f}-{max(rnd):.4f} | {med_r - BRANIN_MIN:.4f} |",
        "",
        f"TPE found the lower value on {wins} of {seeds} seeds; median regret ratio "
        f"random/TPE: {(med_r - BRANIN_MIN) / max(med_t - BRANIN_MIN, 1e-12):.1f}x.",
        "",
    ]
    write_section("\n".join(lines), args.out)
    if not args.smoke and med_t >= med_r:
        print("search_tpe: TPE was not better than random search", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
