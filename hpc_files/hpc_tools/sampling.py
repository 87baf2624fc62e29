"""Methods grid and random: a sweep spec (sweep.load_sweep) expanded into trials."""

from __future__ import annotations

import itertools
import math
import random
import shlex

from hpc_tools.errors import ToolError
from hpc_tools.manifest import MAX_TRIALS
from hpc_tools.sweep import sweep_argv


def _draw(p: dict, rng) -> object:
    """One value of parameter p, using only rng.random() (stable across Pythons)."""
    dist = p["dist"]
    if dist == "constant":
        return p["values"][0]
    u = rng.random()
    if dist == "categorical":
        values = p["values"]
        probs = p.get("probabilities")
        if probs is None:
            return values[min(int(u * len(values)), len(values) - 1)]
        acc = 0.0
        for value, prob in zip(values, probs):
            acc += prob
            if u < acc:
                return value
        return values[-1]
    if dist == "int_uniform":
        span = p["max"] - p["min"] + 1
        return p["min"] + min(int(u * span), span - 1)
    if dist.endswith("normal"):
        u2 = rng.random()
        x = p["mu"] + p["sigma"] * math.sqrt(-2.0 * math.log(1.0 - u)) * math.cos(2 * math.pi * u2)
        if "log" in dist:
            x = math.exp(x)
    else:
        low, high = p["min"], p["max"]
        if dist.endswith("_values"):
            if dist.startswith("inv_"):
                low, high = 1.0 / high, 1.0 / low
            low, high = math.log(low), math.log(high)
        x = low + (high - low) * u
        if "log_uniform" in dist:
            x = math.exp(x)
            if dist.startswith("inv_"):
                x = 1.0 / x
    if dist.startswith("q_"):
        q = p["q"]
        if isinstance(q, int):
            return int(round(x / q)) * q
        return round(x / q) * q
    return x


def expand_sweep(spec: dict, n_trials: int | None, seed: int, path: str) -> list[dict]:
    """The trials of method grid or random (``source`` ``sweep:grid``/``sweep:random``).

    grid: the product of every parameter's values, in the order wandb's own grid search
    (the ``sweeps`` package) hands them out: parameters sorted by name, the LAST one
    varying fastest, values in the order listed; ``n_trials`` keeps the first N points.
    random: ``n_trials`` required; draws come from Python's Mersenne Twister seeded with
    ``seed``, only through ``random()``, so a file + seed gives the same trials on any
    Python version, and N trials are a prefix of N+1 trials; per trial, parameters are
    drawn in name order.
    """
    params = spec["params"]
    names = [p["name"] for p in params]
    if spec["method"] == "grid":
        size = 1
        for p in params:
            size *= len(p["values"])
        if size == 0:
            raise ToolError(f"{path}: the grid is empty")
        if size > MAX_TRIALS and (n_trials is None or n_trials > MAX_TRIALS):
            raise ToolError(f"{path}: the grid has {size} points, more than {MAX_TRIALS}")
        points = itertools.islice(
            itertools.product(*(p["values"] for p in params)),
            n_trials if n_trials is not None else size,
        )
        rows = [dict(zip(names, point)) for point in points]
    else:
        if n_trials is None:
            raise ToolError("method random needs --trials N")
        rng = random.Random(seed)
        rows = [{p["name"]: _draw(p, rng) for p in params} for _ in range(n_trials)]
    source = "sweep:" + spec["method"]
    trials = []
    for row in rows:
        argv = sweep_argv(spec, row)
        trials.append({"argv": argv, "params": row, "source": source, "command": shlex.join(argv)})
    return trials
