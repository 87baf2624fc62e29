#!/usr/bin/env python3
"""Early termination offline: a sweep's ``early_terminate:`` block as an Optuna pruner.

The login-node half. ``parse`` checks the block wandb reads (``type: hyperband`` with
``min_iter`` and ``eta``, or ``max_iter``, ``s`` and ``eta``) and maps it to the arguments of
Optuna's ``SuccessiveHalvingPruner``; ``start`` (run by the submitter once the submission
folder is written) records them in ``early_terminate.json`` there, with the journal file and
study that the trials share (the experiment's ``optuna.journal``, as for method bayes). Each
trial's program reports its metric through hpc_harness/pruning.py, which opens that study
with that pruner: no server, no scheduler process. Nothing is written without the block::

    prune.py start --submission DIR --journal FILE --study NAME

Errors: one line ``prune.py: error: MESSAGE`` on stderr; exit 2 for bad input, 1 otherwise.
"""

from __future__ import annotations

import json
import math
import os
import sys

CONFIG = "early_terminate.json"  # in the submission folder; hpc_harness/pruning.py reads it
KEYS = ("type", "min_iter", "max_iter", "s", "eta", "strict")


class PruneError(Exception):
    """A refusal: one line; exit 2 (input) or 1 (runtime)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _whole(path: str, key: str, value: object, low: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
    ):
        raise PruneError(f"{path}: early_terminate {key} must be a whole number, got {value!r}")
    if value < low:
        raise PruneError(f"{path}: early_terminate {key} must be at least {low}, got {value!r}")
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
        raise PruneError(f"{path}: early_terminate must be a mapping (type: hyperband, ...)")
    if block.get("type") != "hyperband":
        raise PruneError(
            f"{path}: early_terminate type must be hyperband, got {block.get('type')!r}"
        )
    unknown = sorted(str(k) for k in block if k not in KEYS)
    if unknown:
        raise PruneError(
            f"{path}: early_terminate: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})"
        )
    if metric is None:
        raise PruneError(
            f"{path}: early_terminate needs metric: with name: (the metric each trial "
            "reports) and goal: minimize or maximize"
        )
    eta = _whole(path, "eta", block.get("eta", 3), 2)  # Optuna's reduction_factor is an int
    if "min_iter" in block:
        if "max_iter" in block or "s" in block:
            raise PruneError(f"{path}: early_terminate takes min_iter, or max_iter and s, not both")
        first = _whole(path, "min_iter", block["min_iter"], 1)
        last = None
    elif "max_iter" in block and "s" in block:
        max_iter = _whole(path, "max_iter", block["max_iter"], 1)
        s = _whole(path, "s", block["s"], 1)
        bands = [int(max_iter / eta**i) for i in range(1, s + 1) if max_iter / eta**i >= 1]
        if not bands:
            raise PruneError(
                f"{path}: early_terminate: max_iter {max_iter} / eta {eta} is below 1: no band "
                "to stop trials at (raise max_iter, or lower eta)"
            )
        first, last = min(bands), max(bands)
    else:
        raise PruneError(f"{path}: early_terminate hyperband needs min_iter, or max_iter and s")
    if block.get("strict", True) not in (True, False):  # read by neither wandb's code nor this
        raise PruneError(f"{path}: early_terminate strict must be true or false")
    return {"min_resource": first, "reduction_factor": eta, "last_rung": last}


def cmd_start(argv: list[str]) -> int:
    opts = _options(argv, ("submission", "journal", "study"))
    sub = opts["submission"]
    lib = os.path.dirname(os.path.abspath(__file__))
    if lib not in sys.path:
        sys.path.insert(0, lib)
    import trials

    try:
        spec = trials.load_sweep(os.path.join(sub, "sweep.yml"))
    except trials.TrialsError as exc:
        raise PruneError(str(exc), exc.code) from None
    if spec["early_terminate"] is None:
        return 0
    config = {
        "journal": os.path.abspath(opts["journal"]),
        "study": opts["study"],
        "metric": spec["metric"],
        "goal": spec["goal"],
        **spec["early_terminate"],
    }
    trials.write_atomic(
        os.path.join(sub, CONFIG), json.dumps(config, indent=1, sort_keys=True) + "\n"
    )
    return 0


def _options(argv: list[str], names: tuple[str, ...]) -> dict[str, str]:
    opts: dict[str, str] = {}
    it = iter(argv)
    for arg in it:
        key, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if key not in names:
            raise PruneError(f"unknown option {arg!r}")
        opts[key] = value if eq else next(it, None) or ""
        if not opts[key]:
            raise PruneError(f"--{key} expects a value")
    missing = [n for n in names if n not in opts]
    if missing:
        raise PruneError(f"--{missing[0]} is required")
    return opts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv or argv[0] != "start":
            raise PruneError("usage: prune.py start --submission DIR --journal FILE --study NAME")
        return cmd_start(argv[1:])
    except PruneError as exc:
        sys.stderr.write(f"prune.py: error: {' '.join(str(exc).splitlines())}\n")
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
