"""Early termination offline: ``start`` records a sweep's pruner settings for its trials.

Run by the submitter once the submission folder is written::

    python3 -m hpc_tools.prune start --submission DIR --journal FILE --study NAME

It writes ``early_terminate.json`` there: the settings early_terminate.py derives from the
sweep's ``early_terminate:`` block, with the journal file and study that the trials share
(the experiment's ``optuna.journal``, as for method bayes). Each trial's program reports
its metric through hpc_harness/pruning.py, which opens that study with that pruner: no
server, no scheduler process. Nothing is written without the block.

Errors: one line ``prune.py: error: MESSAGE`` on stderr; exit 2 for bad input, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import sys

from hpc_tools.errors import ToolError, report
from hpc_tools.files import write_atomic
from hpc_tools.sweep import load_sweep

CONFIG = "early_terminate.json"  # in the submission folder; hpc_harness/pruning.py reads it


def cmd_start(argv: list[str]) -> int:
    opts = _options(argv, ("submission", "journal", "study"))
    sub = opts["submission"]
    spec = load_sweep(os.path.join(sub, "sweep.yml"))
    if spec["early_terminate"] is None:
        return 0
    config = {
        "journal": os.path.abspath(opts["journal"]),
        "study": opts["study"],
        "metric": spec["metric"],
        "goal": spec["goal"],
        **spec["early_terminate"],
    }
    write_atomic(os.path.join(sub, CONFIG), json.dumps(config, indent=1, sort_keys=True) + "\n")
    return 0


def _options(argv: list[str], names: tuple[str, ...]) -> dict[str, str]:
    opts: dict[str, str] = {}
    it = iter(argv)
    for arg in it:
        key, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if key not in names:
            raise ToolError(f"unknown option {arg!r}")
        opts[key] = value if eq else next(it, None) or ""
        if not opts[key]:
            raise ToolError(f"--{key} expects a value")
    missing = [n for n in names if n not in opts]
    if missing:
        raise ToolError(f"--{missing[0]} is required")
    return opts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv or argv[0] != "start":
            raise ToolError("usage: prune.py start --submission DIR --journal FILE --study NAME")
        return cmd_start(argv[1:])
    except ToolError as exc:
        return report("prune.py", exc)


if __name__ == "__main__":
    sys.exit(main())
