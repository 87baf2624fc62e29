"""Turn a configs file, a wandb-format sweep file, a wandb sweep id and --seeds into one
trials manifest (manifest.py: trials.jsonl and commands.txt).

This is the definition behind every array job: job_submitter.sh runs it on the login node
(hpc_files/lib/trials.sh), and SLURM array task K runs trial K. Nothing here executes,
expands or evaluates user text. Usage (with hpc_files/ on PYTHONPATH)::

    python3 -m hpc_tools.trials --configs experiment_configurations.txt --list
    python3 -m hpc_tools.trials --sweep sweeper.yml --out-dir SUBMISSION_DIR
    python3 -m hpc_tools.trials --sweep sweeper.yml --trials 20 --sweep-seed 3 --seeds 2 --list
    python3 -m hpc_tools.trials --wandb-sweep ENTITY/PROJECT/ID --count 8 --list

Sources: configs.py (one experiment a line), sweep.py with sampling.py (grid, random) or
study.py (bayes: ``--trials N`` per round; ``--journal FILE --study NAME --round K`` lists
rounds 1..K and ``--out-dir`` then prints ``COUNT FIRST``), or K identical trials
``wandb agent --count 1 ID``. ``--list`` prints trials.jsonl and writes nothing;
``--out-dir DIR`` writes both files atomically and prints the number of trials. Errors:
one line ``PROG: error: MESSAGE`` on stderr, nothing written; exit 2 for bad options or
input, 1 for a failure to write or a missing PyYAML or Optuna.
"""

from __future__ import annotations

import os
import sys

from hpc_tools.configs import read_configs
from hpc_tools.errors import ToolError, quoted, report
from hpc_tools.files import write_atomic
from hpc_tools.manifest import (
    MAX_TRIALS,
    apply_seeds,
    check_programs,
    render,
    wandb_trials,
)

USAGE = """\
usage: {prog} [--configs FILE] [--sweep FILE] [--trials N] [--sweep-seed S] [--seeds N]
       {blank} [--prog NAME] (--list | --out-dir DIR)

Turn a configs file or a wandb sweep file (+ --seeds) into a trials manifest.

  --configs FILE    one experiment (a command line) per line; ignored with --sweep
  --configs-label TEXT
                    what messages call the configs file, instead of FILE:LINE
                    (the submitter's command after '--' comes in a temporary file)
  --sweep FILE      wandb sweep file (method grid, random or bayes)
  --wandb-sweep ID --count K
                    K trials 'wandb agent --count 1 ID' (a sweep on a wandb server)
  --trials N        random: number of trials (required); grid: keep the first N;
                    bayes: trials per round (required)
  --rounds R        bayes: number of rounds (default: 1)
  --round K --journal FILE --study NAME
                    bayes: list rounds 1..K of the study in the journal file
  --sweep-seed S    seed for method random (default: 0)
  --seeds N         run every trial N times with --seed=0..N-1 (default: no --seed added)
  --prog NAME       name used in error messages (default: trials.py)
  --list            print the manifest (JSON lines) to stdout, write nothing
  --out-dir DIR     write DIR/trials.jsonl and DIR/commands.txt, print the count
  -h, --help        show this help
"""

VALUE_OPTIONS = (
    "--configs",
    "--configs-label",
    "--sweep",
    "--wandb-sweep",
    "--count",
    "--trials",
    "--sweep-seed",
    "--seeds",
    "--rounds",
    "--round",
    "--journal",
    "--study",
    "--prog",
    "--out-dir",
)


def parse_cli(argv: list[str]) -> dict:
    opts: dict = {"list": False, "help": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            if i < len(argv):
                raise ToolError(f"unexpected argument {quoted(argv[i])}")
            break
        if arg in ("-h", "--help"):
            opts["help"] = True
            continue
        if arg == "--list":
            opts["list"] = True
            continue
        name, eq, value = arg.partition("=")
        if name in VALUE_OPTIONS:
            if not eq:
                if i >= len(argv):
                    raise ToolError(f"{name} expects a value")
                value = argv[i]
                i += 1
            opts[name[2:].replace("-", "_")] = value
            continue
        if arg.startswith("-"):
            raise ToolError(f"unknown option {quoted(arg)} (see --help)")
        raise ToolError(f"unexpected argument {quoted(arg)}")
    if opts["help"]:
        return opts
    for key in ("trials", "seeds", "rounds", "round", "count"):
        if key in opts:
            opts[key] = _whole(f"--{key}", opts[key], 1)
    opts["sweep_seed"] = _whole("--sweep-seed", opts.get("sweep_seed", "0"), 0)
    for key in ("configs", "sweep", "out_dir"):
        if key in opts and not opts[key]:
            raise ToolError(f"--{key.replace('_', '-')} expects a path, got ''")
    if opts["list"] == ("out_dir" in opts):
        raise ToolError("give exactly one of --list or --out-dir DIR")
    if ("wandb_sweep" in opts) != ("count" in opts):
        raise ToolError("--wandb-sweep ID and --count K go together")
    if "wandb_sweep" in opts and "seeds" in opts:
        raise ToolError("--seeds does not apply to a wandb sweep (the sweep chooses the runs)")
    if "sweep" not in opts and "wandb_sweep" not in opts:
        if "configs" not in opts:
            raise ToolError("give --configs FILE, --sweep FILE or --wandb-sweep ID")
        if "trials" in opts:
            raise ToolError("--trials applies to --sweep only")
    if "rounds" in opts and "sweep" not in opts:
        raise ToolError("--rounds applies to a --sweep file with method bayes only")
    if ("journal" in opts) != ("study" in opts):
        raise ToolError("--journal and --study go together")
    if opts.get("round", 1) > 1 and "journal" not in opts:
        raise ToolError("--round K > 1 needs --journal FILE --study NAME")
    return opts


def _whole(name: str, value: str, low: int) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) < low:
        raise ToolError(f"{name} expects a whole number >= {low}, got {quoted(value)}")
    return int(value)


def build(opts: dict) -> list[dict]:
    if "wandb_sweep" in opts:
        if opts["count"] > MAX_TRIALS:
            raise ToolError(f"{opts['count']} trials, more than {MAX_TRIALS}")
        return wandb_trials(opts["wandb_sweep"], opts["count"])
    if "sweep" in opts:
        # Imported here: a configs file or a command, most submissions, need none of the sweep
        # modules, and trials.py's start is the longest step of a submission.
        from hpc_tools.sampling import expand_sweep
        from hpc_tools.study import rounds_manifest
        from hpc_tools.sweep import load_sweep

        path = opts["sweep"]
        spec = load_sweep(path)
        if spec["method"] != "bayes" and "rounds" in opts:
            raise ToolError(f"{path}: --rounds applies to method bayes only, not {spec['method']}")
        if spec["method"] == "bayes":
            if "trials" not in opts:
                raise ToolError(f"{path}: method bayes needs --trials N (trials per round)")
            if opts.get("seeds"):
                raise ToolError(f"{path}: --seeds does not apply to method bayes")
            if opts.get("round", 1) > opts.get("rounds", 1):
                raise ToolError(f"--round {opts['round']} is past --rounds {opts.get('rounds', 1)}")
            trials = rounds_manifest(
                spec,
                opts["trials"],
                opts["sweep_seed"],
                opts.get("round", 1),
                opts.get("journal"),
                opts.get("study", "bayes"),
            )
            check_programs(trials, path)
            opts["first"] = (opts.get("round", 1) - 1) * opts["trials"]
            return trials
        trials = expand_sweep(spec, opts.get("trials"), opts["sweep_seed"], path)
    else:
        path = opts["configs"]
        trials = read_configs(path, opts.get("configs_label"))
    check_programs(trials, path, opts.get("configs_label"))
    trials = apply_seeds(trials, opts.get("seeds"), path, opts.get("configs_label"))
    if len(trials) > MAX_TRIALS:
        raise ToolError(f"{len(trials)} trials, more than {MAX_TRIALS}")
    return trials


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = "trials.py"
    for i, arg in enumerate(argv):  # --prog first, so every error carries it
        if arg == "--prog" and i + 1 < len(argv):
            prog = argv[i + 1]
        elif arg.startswith("--prog="):
            prog = arg[len("--prog=") :]
    try:
        opts = parse_cli(argv)
        if opts["help"]:
            sys.stdout.write(USAGE.format(prog=prog, blank=" " * len(prog)))
            return 0
        trials = build(opts)
        jsonl, commands = render(trials)
        if opts["list"]:
            sys.stdout.write(jsonl)
            return 0
        out_dir = opts["out_dir"]
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as exc:
            raise ToolError(
                f"--out-dir: cannot create {quoted(out_dir)}: {exc.strerror}", 1
            ) from None
        write_atomic(os.path.join(out_dir, "trials.jsonl"), jsonl)
        write_atomic(os.path.join(out_dir, "commands.txt"), commands)
        first = f" {opts['first']}" if "first" in opts else ""
        sys.stdout.write(f"{jsonl.count(chr(10))}{first}\n")
        return 0
    except ToolError as exc:
        return report(prog, exc)


if __name__ == "__main__":
    sys.exit(main())
