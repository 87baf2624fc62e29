"""A sweep's ``early_terminate:`` block (wandb's hyperband) checked and mapped to the
arguments of Optuna's ``SuccessiveHalvingPruner``.

The sweep file's reader (sweep.py) calls ``parse``; ``prune.py start`` records the result
in the submission folder, where each trial's hpc_harness/pruning.py reads it. No Optuna is
needed here: this runs on the login node.
"""

from __future__ import annotations

import math

from hpc_tools.errors import ToolError

KEYS = ("type", "min_iter", "max_iter", "s", "eta", "strict")


def _whole(path: str, key: str, value: object, low: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
    ):
        raise ToolError(f"{path}: early_terminate {key} must be a whole number, got {value!r}")
    if value < low:
        raise ToolError(f"{path}: early_terminate {key} must be at least {low}, got {value!r}")
    return int(value)


def parse(path: str, block: object, metric: str | None) -> dict | None:
    """The sweep's ``early_terminate`` block -> the pruner's settings, or None without one.

    wandb's hyperband (the ``sweeps`` package, hyperband_stopping.py) is one bracket of
    successive halving: bands (rungs) at min_iter, min_iter*eta, min_iter*eta^2 ...; or, from
    max_iter, int(max_iter/eta^i) for i = s..1 (none past max_iter/eta); at each band a run
    goes on only if it is in the top 1/eta of the values every run logged there. That is
    Optuna's SuccessiveHalvingPruner with min_resource = the first band, reduction_factor =
    eta and min_early_stopping_rate = 0; the max_iter form also sets ``last_rung`` (the last
    band: no trial is stopped after it, as wandb checks no band past it; Optuna's rungs are
    min_resource*eta^k, so a band that int() rounded down comes a little later here).
    Optuna's HyperbandPruner would run several brackets of it, each starting at another rung:
    not what wandb does. A step is what the program reports (the Trainer: epochs done, from
    1), so min_iter: 2 stops a trial after its second epoch at the earliest.
    """
    if block is None:
        return None
    if not isinstance(block, dict):
        raise ToolError(f"{path}: early_terminate must be a mapping (type: hyperband, ...)")
    if block.get("type") != "hyperband":
        raise ToolError(
            f"{path}: early_terminate type must be hyperband, got {block.get('type')!r}"
        )
    unknown = sorted(str(k) for k in block if k not in KEYS)
    if unknown:
        raise ToolError(
            f"{path}: early_terminate: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})"
        )
    if metric is None:
        raise ToolError(
            f"{path}: early_terminate needs metric: with name: (the metric each trial "
            "reports) and goal: minimize or maximize"
        )
    eta = _whole(path, "eta", block.get("eta", 3), 2)  # Optuna's reduction_factor is an int
    if "min_iter" in block:
        if "max_iter" in block or "s" in block:
            raise ToolError(f"{path}: early_terminate takes min_iter, or max_iter and s, not both")
        first = _whole(path, "min_iter", block["min_iter"], 1)
        last = None
    elif "max_iter" in block and "s" in block:
        max_iter = _whole(path, "max_iter", block["max_iter"], 1)
        s = _whole(path, "s", block["s"], 1)
        bands = [int(max_iter / eta**i) for i in range(1, s + 1) if max_iter / eta**i >= 1]
        if not bands:
            raise ToolError(
                f"{path}: early_terminate: max_iter {max_iter} / eta {eta} is below 1: no band "
                "to stop trials at (raise max_iter, or lower eta)"
            )
        first, last = min(bands), max(bands)
    else:
        raise ToolError(f"{path}: early_terminate hyperband needs min_iter, or max_iter and s")
    if block.get("strict", True) not in (True, False):  # read by neither wandb's code nor this
        raise ToolError(f"{path}: early_terminate strict must be true or false")
    return {"min_resource": first, "reduction_factor": eta, "last_rung": last}
