"""The trials manifest: a submission's trials.jsonl and commands.txt, trial K on line K+1.

* ``trials.jsonl``: ``{"argv":[...],"params":{...},"source":"configs:LINE","trial":K}``
  with sorted keys and compact separators (byte-stable); source is ``configs:LINE`` (the
  experiment's first line, 1-based), ``sweep:grid``, ``sweep:random``, ``bayes:round R``
  or ``wandb:ID``. For configs lines, argv is the split BEFORE the node expands anything,
  and params is ``{}`` (plus seed).
* ``commands.txt``: one line of shell words that the node runs through
  ``eval "set -- $line"``: the configs line as written (comments and continuations
  removed, so ``$VAR`` expands on the node; globs and braces do not) or
  ``shlex.join(argv)`` for sweep trials (values stay literal), plus `` --seed=K`` with
  --seeds.
"""

from __future__ import annotations

import json
import os
import re
import shlex

from hpc_tools.configs import place
from hpc_tools.errors import ToolError, quoted

MAX_TRIALS = 1_000_000

# A leading word the node takes as the program's environment (launch.sh build_command).
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _where(trial: dict, path: str, label: str | None = None) -> str:
    """Where a trial comes from, for a message: FILE:LINE (or the label) for a configs
    line, the file for a sweep."""
    source = trial["source"]
    if source.startswith("configs:"):
        return place(path, source[len("configs:") :], label)
    return path


def check_programs(trials: list[dict], path: str, label: str | None = None) -> None:
    """Refuse a trial with no program to run, which would fail on the node ('exec: : not
    found'): the node takes leading NAME=value words as the program's environment and runs
    the next word."""
    for trial in trials:
        argv = trial["argv"]
        n = 0
        while n < len(argv) and ASSIGNMENT.match(argv[n]):
            n += 1
        if n == len(argv):
            what = (
                f"only environment assignments ({quoted(' '.join(argv))})" if argv else "no words"
            )
            raise ToolError(f"{_where(trial, path, label)}: {what}, no program to run")
        if not argv[n]:
            raise ToolError(f"{_where(trial, path, label)}: the program to run is an empty word")


def apply_seeds(
    trials: list[dict], n_seeds: int | None, path: str, label: str | None = None
) -> list[dict]:
    """``--seeds N``: every trial N times, trial-major (trial0 seed0, trial0 seed1, ...),
    with ``--seed=K`` appended to argv and ``seed: K`` added to params; a trial that already
    passes --seed (or has a ``seed`` parameter) is refused."""
    if n_seeds is None:
        return trials
    out = []
    for trial in trials:
        if "seed" in trial["params"] or any(
            a == "--seed" or a.startswith("--seed=") for a in trial["argv"]
        ):
            raise ToolError(
                f"{_where(trial, path, label)}: the trial already sets --seed; "
                "drop it or drop --seeds"
            )
        for k in range(n_seeds):
            out.append(
                {
                    "argv": trial["argv"] + [f"--seed={k}"],
                    "params": {**trial["params"], "seed": k},
                    "source": trial["source"],
                    "command": f"{trial['command']} --seed={k}",
                }
            )
    return out


def render(trials: list[dict]) -> tuple[str, str]:
    """Return (trials.jsonl, commands.txt) text; byte-stable for the same trials."""
    jsonl = []
    commands = []
    for k, trial in enumerate(trials):
        record = {
            "trial": k,
            "argv": trial["argv"],
            "params": trial["params"],
            "source": trial["source"],
        }
        jsonl.append(json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False))
        commands.append(trial["command"])
    return "".join(x + "\n" for x in jsonl), "".join(x + "\n" for x in commands)


def manifest_of(folder: str) -> str:
    """A submission folder's trials.jsonl text ("" when it cannot be read)."""
    try:
        with open(os.path.join(folder, "trials.jsonl"), encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def wandb_trials(sweep_id: str, count: int) -> list[dict]:
    """COUNT identical trials that each ask the wandb server for one run of SWEEP_ID."""
    argv = ["wandb", "agent", "--count", "1", sweep_id]
    trial = {"argv": argv, "params": {}, "source": f"wandb:{sweep_id}", "command": shlex.join(argv)}
    return [trial] * count
