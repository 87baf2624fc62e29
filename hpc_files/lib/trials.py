#!/usr/bin/env python3
"""Turn a configs file, a wandb-format sweep file, a wandb sweep id and --seeds into one
trials manifest.

This is the definition behind every array job, and the only writer of trials.jsonl:
job_submitter.sh calls it on the login node (hpc_files/lib/trials.sh), and SLURM array
task K runs trial K. A command after ``--`` reaches it as a configs file of one line (the
words quoted). It runs with the system ``python3`` (3.9+) and the
standard library only; PyYAML is imported only for ``--sweep``. Nothing here executes,
expands or evaluates user text.

Usage::

    python3 hpc_files/lib/trials.py --configs experiment_configurations.txt --list
    python3 hpc_files/lib/trials.py --sweep sweeper.yml --out-dir SUBMISSION_DIR
    python3 hpc_files/lib/trials.py --sweep sweeper.yml --trials 20 --sweep-seed 3 --seeds 2 --list
    python3 hpc_files/lib/trials.py --wandb-sweep ENTITY/PROJECT/ID --count 8 --list

Sources (if --sweep is given, --configs is ignored; the submitter always passes
--configs when a configs file exists):

* ``--configs FILE``: one experiment per line. Blank lines and lines whose first
  non-blank character is ``#`` are skipped; an unquoted ``#`` that starts a word
  begins a comment, as in bash; a trailing ``\\`` joins the next line (the
  backslash and newline are removed, as in bash). Each line is a command, split
  with shell-word rules (``shlex``, posix) for the manifest's argv, never run:
  ``$VAR`` and ``$(...)`` stay literal text and the node expands them when it
  runs the line. Refused: unbalanced quotes, a ``\\`` on the last line, and
  unquoted ``; & | < > ( )`` outside ``$(...)`` (on the node they would end or
  redirect the command; quote them). ``--configs-label TEXT`` names the file in
  messages instead of ``FILE:LINE`` (the submitter passes a command given after
  ``--`` as a one-line temporary file, which the user never saw).
* ``--wandb-sweep ID --count K``: K identical trials ``wandb agent --count 1 ID`` (a
  sweep on a wandb server chooses each run's parameters); source ``wandb:ID``.
* ``--sweep FILE``: a wandb sweep file (``program``, ``method``, ``parameters``,
  optional ``command``; ``metric``, ``name``, ``project`` ... are accepted and
  ignored; ``early_terminate`` is checked by prune.py). ``program`` is required.

  - ``method: grid``: the product of every parameter's values, in the order wandb's
    own grid search (the ``sweeps`` package) hands them out: parameters sorted by
    name (Python string order), the LAST one varying fastest; values in the order
    listed; values alike (1 and 1.0) are one point, at the first one's place with the
    last one's value (the agent passes ``--b=1.0`` for ``[1, 1.0]``). ``value`` is one point,
    ``values`` a list, ``int_uniform`` every integer from min to max, ``q_uniform``
    min, min+q, ... below max. Any other distribution (or ``probabilities``) is
    refused, as in wandb. ``--trials N`` keeps the first N grid points.
  - ``method: random``: ``--trials N`` required; draws come from Python's
    Mersenne Twister seeded with ``--sweep-seed`` (default 0), only through
    ``random()``, so a file + seed gives the same trials on any Python version,
    and N trials are a prefix of N+1 trials. Per trial, parameters are drawn in
    name order.
  - ``method: bayes`` (needs ``metric:`` with ``name`` and ``goal``, and ``--trials N``
    per round): rounds of N trials asked from Optuna's TPE sampler by
    hpc_files/lib/bayes.py (which see); ``--rounds R`` (default 1) is recorded there.
    Without ``--journal`` this asks round 1 from a study in memory (seeded with
    ``--sweep-seed``: the same trials the journal study gets); with ``--journal FILE
    --study NAME --round K`` (the controller's next round) it asks round K in the
    journal's study if not asked yet and lists rounds 1..K (trial = global index).
    ``--out-dir`` then prints ``COUNT FIRST`` (FIRST: round K's first trial).

  Distributions (``distribution:``; without it, ``value`` -> constant, ``values``
  -> categorical, ``min``/``max`` -> int_uniform if both are integers, else
  uniform): constant (value), categorical (values, optional probabilities),
  int_uniform (min..max inclusive), uniform, q_uniform, log_uniform (min/max are
  natural-log exponents), q_log_uniform, log_uniform_values (min/max are values
  > 0), q_log_uniform_values, inv_log_uniform (1/X, ln X ~ U(min, max)),
  inv_log_uniform_values (1/X with X log-uniform on [1/max, 1/min]), normal (mu=0,
  sigma=1), q_normal, log_normal, q_log_normal. ``q`` defaults to 1 and
  ``round(x / q) * q`` is an int when q is an int.

  The command list is ``command:`` or ``${env} ${interpreter} ${program} ${args}``.
  An element that is exactly a macro expands as in ``wandb agent``: env ->
  ``/usr/bin/env``, interpreter -> ``python``, program, args (``--k=v``),
  args_no_equals (``--k v``), args_no_hyphens (``k=v``), args_no_boolean_flags
  (``--k`` for true, nothing for false), args_json (one JSON word),
  parameters in name order as in the agent,
  args_append_hydra (``+k=v``), args_override_hydra (``++k=v``). Values are
  formatted with Python ``str()`` like the agent does (``True``, ``0.001``).
  ``${args_json_file}`` and ``${envvar:NAME}`` are refused; any other element is
  literal text.

``--seeds N`` repeats every trial N times, trial-major (trial0 seed0, trial0 seed1,
..., trial1 seed0, ...), appending ``--seed=K`` (K = 0..N-1) to argv and ``seed: K``
to params; a trial that already passes --seed (or has a ``seed`` parameter) is an
error.

Output, one trial per line, trial K (0-based) on line K+1:

* ``trials.jsonl``: ``{"argv":[...],"params":{...},"source":"configs:LINE",
  "trial":K}`` with sorted keys and compact separators (byte-stable); source is
  ``configs:LINE`` (first line of the experiment, 1-based) or
  ``sweep:grid``/``sweep:random``. For configs lines, argv is the split BEFORE the
  node expands anything, and params is ``{}`` (plus seed).
* ``commands.txt``: one line of shell words that the node runs through
  ``eval "set -- $line"``: the configs line as written (comments and
  continuations removed, so ``$VAR`` expands on the node; globs and braces do not)
  or ``shlex.join(argv)`` for sweep trials (values stay literal), plus `` --seed=K``
  with --seeds.

``--list`` prints trials.jsonl and writes nothing; ``--out-dir DIR`` writes both
files atomically (temporary file + rename; DIR is created) and prints the number
of trials. Errors: one line ``PROG: error: MESSAGE`` on stderr, nothing written;
exit 2 for bad options or input, 1 for a failure to write or a missing PyYAML.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys

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
MAX_TRIALS = 1_000_000
DEFAULT_COMMAND = ["${env}", "${interpreter}", "${program}", "${args}"]
ARG_MACROS = (
    "args",
    "args_no_equals",
    "args_no_hyphens",
    "args_no_boolean_flags",
    "args_json",
    "args_append_hydra",
    "args_override_hydra",
)
DISTRIBUTIONS = (
    "constant",
    "categorical",
    "int_uniform",
    "uniform",
    "q_uniform",
    "log_uniform",
    "q_log_uniform",
    "log_uniform_values",
    "q_log_uniform_values",
    "inv_log_uniform",
    "inv_log_uniform_values",
    "normal",
    "q_normal",
    "log_normal",
    "q_log_normal",
)
UNQUOTED_OPERATORS = ";&|<>()"
# A leading word the node takes as the program's environment (launch.sh build_command).
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


class TrialsError(Exception):
    """A refusal: the message is one line; exit 2 (usage/input) or 1 (runtime)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _q(text: object) -> str:
    """Quote a user value for a one-line message."""
    s = str(text)
    if s.isprintable():
        return "'" + s + "'"
    return repr(s)


# ---------------------------------------------------------------- command line


def parse_cli(argv: list[str]) -> dict:
    opts: dict = {"list": False, "help": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            if i < len(argv):
                raise TrialsError(f"unexpected argument {_q(argv[i])}")
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
                    raise TrialsError(f"{name} expects a value")
                value = argv[i]
                i += 1
            opts[name[2:].replace("-", "_")] = value
            continue
        if arg.startswith("-"):
            raise TrialsError(f"unknown option {_q(arg)} (see --help)")
        raise TrialsError(f"unexpected argument {_q(arg)}")
    if opts["help"]:
        return opts
    for key in ("trials", "seeds", "rounds", "round", "count"):
        if key in opts:
            opts[key] = _whole(f"--{key}", opts[key], 1)
    opts["sweep_seed"] = _whole("--sweep-seed", opts.get("sweep_seed", "0"), 0)
    for key in ("configs", "sweep", "out_dir"):
        if key in opts and not opts[key]:
            raise TrialsError(f"--{key.replace('_', '-')} expects a path, got ''")
    if opts["list"] == ("out_dir" in opts):
        raise TrialsError("give exactly one of --list or --out-dir DIR")
    if ("wandb_sweep" in opts) != ("count" in opts):
        raise TrialsError("--wandb-sweep ID and --count K go together")
    if "wandb_sweep" in opts and "seeds" in opts:
        raise TrialsError("--seeds does not apply to a wandb sweep (the sweep chooses the runs)")
    if "sweep" not in opts and "wandb_sweep" not in opts:
        if "configs" not in opts:
            raise TrialsError("give --configs FILE, --sweep FILE or --wandb-sweep ID")
        if "trials" in opts:
            raise TrialsError("--trials applies to --sweep only")
    if "rounds" in opts and "sweep" not in opts:
        raise TrialsError("--rounds applies to a --sweep file with method bayes only")
    if ("journal" in opts) != ("study" in opts):
        raise TrialsError("--journal and --study go together")
    if opts.get("round", 1) > 1 and "journal" not in opts:
        raise TrialsError("--round K > 1 needs --journal FILE --study NAME")
    return opts


def _whole(name: str, value: str, low: int) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) < low:
        raise TrialsError(f"{name} expects a whole number >= {low}, got {_q(value)}")
    return int(value)


def _read(path: str, what: str, label: str | None = None) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise TrialsError(f"{what}: cannot read {_q(path)}: {exc.strerror}") from None
    try:
        # utf-8-sig: a byte-order mark (Windows editors) is not part of the first line.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TrialsError(f"{label or path}: not UTF-8 text (byte {exc.start})") from None
    if "\0" in text:
        raise TrialsError(f"{label or path}: contains a NUL byte")
    return text


# ---------------------------------------------------------------- configs file


def _place(path: str, line: int | str, label: str | None) -> str:
    """Where a configs line is, for a message: FILE:LINE, or the label (--configs-label)
    that names the whole source."""
    return label or f"{path}:{line}"


def read_configs(path: str, label: str | None = None) -> list[dict]:
    """One trial per experiment line of a configs file (see the module docstring)."""
    content = _read(path, "--configs", label)
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in content.split("\n")]
    trials = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        first = i + 1
        text, i = _scan_experiment(lines, i, path, label)
        if not text:
            continue
        try:
            argv = shlex.split(text, posix=True)
        except ValueError as exc:
            raise TrialsError(f"{_place(path, first, label)}: {exc}") from None
        if not argv:
            continue
        trials.append({"argv": argv, "params": {}, "source": f"configs:{first}", "command": text})
    if not trials:
        raise TrialsError(f"{label or path}: no experiments (every line is blank or a comment)")
    return trials


def _scan_experiment(lines: list[str], i: int, path: str, label: str | None) -> tuple[str, int]:
    """Read one experiment starting at lines[i]; return its text and the next index.

    Tracks quotes the way bash does so that comments, continuations and unbalanced
    quotes are found; the text keeps every quote and backslash as written.
    """
    out: list[str] = []
    quote = ""
    quote_at = (0, 0)
    depth = 0  # nesting of $( ... )
    line = lines[i]
    pos = 0
    while True:
        if pos >= len(line):
            if quote:
                raise TrialsError(
                    f"{_place(path, quote_at[0], label)}: unbalanced {quote} quote "
                    f"(opened at column {quote_at[1]})"
                )
            break
        c = line[pos]
        if quote == "'":
            out.append(c)
            quote = "" if c == "'" else quote
            pos += 1
            continue
        if c == "\\":
            if pos == len(line) - 1:
                if quote:
                    raise TrialsError(
                        f"{_place(path, quote_at[0], label)}: unbalanced {quote} quote "
                        f"(opened at column {quote_at[1]})"
                    )
                if i + 1 >= len(lines):
                    raise TrialsError(
                        f"{_place(path, i + 1, label)}: '\\' continues a line but the file ends"
                    )
                i += 1
                line = lines[i]
                pos = 0
                continue
            out.append(line[pos : pos + 2])
            pos += 2
            continue
        if quote == '"':
            out.append(c)
            quote = "" if c == '"' else quote
            pos += 1
            continue
        if c in "'\"":
            quote = c
            quote_at = (i + 1, pos + 1)
        elif c == "#" and (not out or out[-1] in " \t"):
            break  # a comment runs to the end of the physical line
        elif c == "$" and line[pos + 1 : pos + 2] == "(":
            depth += 1
            out.append("$(")
            pos += 2
            continue
        elif c == "(" and depth:
            depth += 1
        elif c == ")" and depth:
            depth -= 1
        elif c in UNQUOTED_OPERATORS and not depth:
            raise TrialsError(
                f"{_place(path, i + 1, label)}: unquoted {_q(c)} at column {pos + 1} would end "
                "or redirect the command on the node; quote it"
            )
        out.append(c)
        pos += 1
    if depth:
        raise TrialsError(f"{_place(path, i + 1, label)}: unbalanced '$(': missing ')'")
    return "".join(out).strip(), i + 1


# ---------------------------------------------------------------- sweep file


def load_sweep(path: str) -> dict:
    """Read and validate a wandb sweep file; return a normalised spec."""
    text = _read(path, "--sweep")
    try:
        import yaml
    except ImportError:
        raise TrialsError(
            "--sweep needs PyYAML: pip install pyyaml, or run this with the project's python", 1
        ) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TrialsError(f"{path}{where}: invalid YAML: {problem}") from None
    if not isinstance(doc, dict):
        raise TrialsError(
            f"{path}: a sweep file must be a mapping (program:, method:, "
            "parameters:), got " + type(doc).__name__
        )
    method = doc.get("method")
    if method not in ("grid", "random", "bayes"):
        raise TrialsError(f"{path}: method must be grid, random or bayes, got {_q(method)}")
    metric = doc.get("metric")
    metric_name = goal = None
    if method == "bayes" and metric is None:
        raise TrialsError(
            f"{path}: method bayes needs metric: with name: (a metric the program "
            "logs to metrics.csv) and goal: minimize or maximize"
        )
    if metric is not None:  # results.sh ranks by it too: W&B's default goal, minimize
        if (
            not isinstance(metric, dict)
            or not isinstance(metric.get("name"), str)
            or not metric["name"]
        ):
            raise TrialsError(
                f"{path}: metric must be a mapping with name: (and goal: minimize or maximize)"
            )
        metric_name = metric["name"]
        goal = metric.get("goal", "minimize")
        if goal not in ("minimize", "maximize"):
            raise TrialsError(f"{path}: metric goal must be minimize or maximize, got {_q(goal)}")
    program = doc.get("program")
    if not isinstance(program, str) or not program:
        raise TrialsError(f"{path}: program missing (the script wandb would run, e.g. train.py)")
    _check_text(path, "program", program)
    params = doc.get("parameters")
    if not isinstance(params, dict) or not params:
        raise TrialsError(f"{path}: no parameters (parameters: must be a non-empty mapping)")
    for name in params:
        if not isinstance(name, str):
            raise TrialsError(f"{path}: parameter names must be strings, got {_q(name)}")
    specs = [_parameter(path, name, params[name], method) for name in sorted(params)]
    command = doc.get("command", DEFAULT_COMMAND)
    if not isinstance(command, list) or not command:
        raise TrialsError(f"{path}: command must be a non-empty list")
    words = []
    for word in command:
        if word is None or isinstance(word, (bool, list, dict)):
            raise TrialsError(f"{path}: command items must be strings or numbers, got {_q(word)}")
        word = str(word)
        _check_text(path, "command", word)
        if "${envvar:" in word:
            raise TrialsError(
                f"{path}: {_q(word)}: ${{envvar:...}} is not supported; put "
                "the line in a configs file, where $VAR expands on the node"
            )
        if word.startswith("${") and word.endswith("}"):
            macro = word[2:-1]
            if macro == "args_json_file":
                raise TrialsError(
                    f"{path}: ${{args_json_file}} is not supported; use ${{args_json}}"
                )
            if macro not in ("env", "interpreter", "program") + ARG_MACROS:
                raise TrialsError(f"{path}: unknown macro {_q(word)} in command")
        words.append(word)
    return {
        "method": method,
        "program": program,
        "params": specs,
        "command": words,
        "metric": metric_name,
        "goal": goal,
        "early_terminate": _early_terminate(path, doc.get("early_terminate"), metric_name),
    }


def _early_terminate(path: str, block: object, metric: str | None) -> dict | None:
    """The pruner's settings from ``early_terminate:`` (prune.py beside this file owns them)."""
    if block is None:
        return None
    lib = os.path.dirname(os.path.abspath(__file__))
    if lib not in sys.path:
        sys.path.insert(0, lib)
    import prune

    try:
        return prune.parse(path, block, metric)
    except prune.PruneError as exc:
        raise TrialsError(str(exc), exc.code) from None


def _check_text(path: str, what: str, text: str) -> None:
    if "\n" in text or "\r" in text or "\0" in text:
        raise TrialsError(f"{path}: {what} contains a newline or NUL: {_q(text)}")


def _json_value(path: str, name: str, value: object) -> object:
    """Refuse values a manifest cannot hold: non-JSON types, NaN/inf, newlines, NUL."""
    if value is None or isinstance(value, (bool, int, str)):
        if isinstance(value, str):
            _check_text(path, f"a value of {name!r}", value)
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise TrialsError(f"{path}: parameter {name!r}: {value} is not allowed")
        return value
    if isinstance(value, list):
        return [_json_value(path, name, v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_value(path, name, v) for k, v in value.items()}
    raise TrialsError(f"{path}: parameter {name!r}: {_q(value)} is not a JSON value")


def _number(path: str, name: str, spec: dict, key: str, default: object = None) -> float:
    value = spec.get(key, default)
    if value is None:
        raise TrialsError(f"{path}: parameter {name!r} ({spec.get('distribution')}) needs {key}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TrialsError(f"{path}: parameter {name!r}: {key} must be a number, got {_q(value)}")
    if value != value or value in (float("inf"), float("-inf")):
        raise TrialsError(f"{path}: parameter {name!r}: {key} must be finite")
    return value


def _parameter(path: str, name: object, spec: object, method: str) -> dict:
    if not isinstance(name, str) or not name or "=" in name:
        raise TrialsError(
            f"{path}: parameter names must be non-empty strings without '=', got {_q(name)}"
        )
    _check_text(path, "a parameter name", name)
    if not isinstance(spec, dict):
        raise TrialsError(
            f"{path}: parameter {name!r} must be a mapping (value:, values:, or "
            f"distribution: with min/max), got {_q(spec)}"
        )
    if "parameters" in spec:
        raise TrialsError(f"{path}: parameter {name!r}: nested parameters are not supported")
    dist = spec.get("distribution")
    if dist is None:
        if "value" in spec and "values" in spec:
            raise TrialsError(f"{path}: parameter {name!r}: give value or values, not both")
        if "value" in spec:
            dist = "constant"
        elif "values" in spec:
            dist = "categorical"
        elif "min" in spec and "max" in spec:
            ints = all(
                isinstance(spec[k], int) and not isinstance(spec[k], bool) for k in ("min", "max")
            )
            dist = "int_uniform" if ints else "uniform"
        else:
            raise TrialsError(
                f"{path}: parameter {name!r} needs value, values, or distribution with min/max"
            )
    if dist not in DISTRIBUTIONS:
        raise TrialsError(
            f"{path}: parameter {name!r}: unknown distribution {_q(dist)} "
            f"(supported: {', '.join(DISTRIBUTIONS)})"
        )
    out: dict = {"name": name, "dist": dist}
    if dist == "constant":
        if "value" not in spec:
            raise TrialsError(f"{path}: parameter {name!r} (constant) needs value")
        out["values"] = [_json_value(path, name, spec["value"])]
    elif dist == "categorical":
        values = spec.get("values")
        if not isinstance(values, list):
            raise TrialsError(f"{path}: parameter {name!r}: values must be a list")
        if not values:
            raise TrialsError(f"{path}: parameter {name!r}: values is empty")
        out["values"] = [_json_value(path, name, v) for v in values]
        probs = spec.get("probabilities")
        if probs is not None:
            if method == "grid":
                raise TrialsError(
                    f"{path}: parameter {name!r}: probabilities are not allowed in a grid"
                )
            if (
                not isinstance(probs, list)
                or len(probs) != len(values)
                or any(
                    isinstance(p, bool) or not isinstance(p, (int, float)) or p < 0 for p in probs
                )
                or abs(sum(probs) - 1) > 1e-6
            ):
                raise TrialsError(
                    f"{path}: parameter {name!r}: probabilities must be one "
                    "number >= 0 per value, summing to 1"
                )
            out["probabilities"] = probs
    else:
        if dist.endswith("normal"):
            out["mu"] = _number(path, name, spec, "mu", 0)
            out["sigma"] = _number(path, name, spec, "sigma", 1)
            if out["sigma"] <= 0:
                raise TrialsError(f"{path}: parameter {name!r}: sigma must be > 0")
        else:
            low = out["min"] = _number(path, name, spec, "min")
            high = out["max"] = _number(path, name, spec, "max")
            if low > high:
                raise TrialsError(f"{path}: parameter {name!r}: min {low} > max {high}")
            if dist == "int_uniform" and not (isinstance(low, int) and isinstance(high, int)):
                raise TrialsError(
                    f"{path}: parameter {name!r} (int_uniform): min and max must be integers"
                )
            if dist.endswith("_values") and low <= 0:
                raise TrialsError(f"{path}: parameter {name!r} ({dist}): min must be > 0")
        if dist.startswith("q_"):
            out["q"] = _number(path, name, spec, "q", 1)
            if out["q"] <= 0:
                raise TrialsError(f"{path}: parameter {name!r}: q must be > 0")
        if method == "grid":
            if dist not in ("int_uniform", "q_uniform"):
                raise TrialsError(
                    f"{path}: parameter {name!r}: distribution {dist} cannot be "
                    "used in a grid (use value, values, int_uniform or q_uniform)"
                )
            step = 1 if dist == "int_uniform" else out["q"]
            count = high - low + 1 if dist == "int_uniform" else math.ceil((high - low) / step)
            if count > MAX_TRIALS:
                raise TrialsError(f"{path}: parameter {name!r}: {dist} range too large for a grid")
            out["values"] = [low + i * step for i in range(count)]
    if method == "grid":  # as wandb's grid: values alike (1, 1.0) are one point, at the
        place: dict[str, int] = {}  # first one's place, with the last one's value
        unique = []
        for value in out["values"]:
            key = json.dumps(
                int(value) if isinstance(value, float) and value.is_integer() else value,
                sort_keys=True,
            )
            if key in place:
                unique[place[key]] = value
            else:
                place[key] = len(unique)
                unique.append(value)
        out["values"] = unique
        if not unique:
            raise TrialsError(f"{path}: parameter {name!r}: no grid values")
    return out


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
    params = spec["params"]
    names = [p["name"] for p in params]
    if spec["method"] == "grid":
        size = 1
        for p in params:
            size *= len(p["values"])
        if size == 0:
            raise TrialsError(f"{path}: the grid is empty")
        if size > MAX_TRIALS and (n_trials is None or n_trials > MAX_TRIALS):
            raise TrialsError(f"{path}: the grid has {size} points, more than {MAX_TRIALS}")
        import itertools

        points = itertools.islice(
            itertools.product(*(p["values"] for p in params)),
            n_trials if n_trials is not None else size,
        )
        rows = [dict(zip(names, point)) for point in points]
    else:
        if n_trials is None:
            raise TrialsError("method random needs --trials N")
        import random

        rng = random.Random(seed)
        rows = [{p["name"]: _draw(p, rng) for p in params} for _ in range(n_trials)]
    source = "sweep:" + spec["method"]
    trials = []
    for row in rows:
        argv = _sweep_argv(spec, row)
        trials.append({"argv": argv, "params": row, "source": source, "command": shlex.join(argv)})
    return trials


def _sweep_argv(spec: dict, row: dict) -> list[str]:
    """The argv wandb agent would build for these parameter values."""
    flags: dict[str, list[str]] = {m: [] for m in ARG_MACROS}
    for name, value in row.items():
        text = str(value)
        flags["args"].append(f"--{name}={text}")
        flags["args_no_equals"] += [f"--{name}", text]
        flags["args_no_hyphens"].append(f"{name}={text}")
        flags["args_append_hydra"].append(f"+{name}={text}")
        flags["args_override_hydra"].append(f"++{name}={text}")
        if not isinstance(value, bool):
            flags["args_no_boolean_flags"].append(f"--{name}={text}")
        elif value:
            flags["args_no_boolean_flags"].append(f"--{name}")
    flags["args_json"] = [json.dumps(row)]
    flags["env"] = ["/usr/bin/env"]
    flags["interpreter"] = ["python"]
    flags["program"] = [spec["program"]]
    argv = []
    for word in spec["command"]:
        if word.startswith("${") and word.endswith("}"):
            argv += flags[word[2:-1]]
        else:
            argv.append(word)
    return argv


# ---------------------------------------------------------------- seeds and output


def _where(trial: dict, path: str, label: str | None = None) -> str:
    """Where a trial comes from, for a message: FILE:LINE (or the label) for a configs
    line, the file for a sweep."""
    source = trial["source"]
    if source.startswith("configs:"):
        return _place(path, source[len("configs:") :], label)
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
            what = f"only environment assignments ({_q(' '.join(argv))})" if argv else "no words"
            raise TrialsError(f"{_where(trial, path, label)}: {what}, no program to run")
        if not argv[n]:
            raise TrialsError(f"{_where(trial, path, label)}: the program to run is an empty word")


def apply_seeds(
    trials: list[dict], n_seeds: int | None, path: str, label: str | None = None
) -> list[dict]:
    if n_seeds is None:
        return trials
    out = []
    for trial in trials:
        if "seed" in trial["params"] or any(
            a == "--seed" or a.startswith("--seed=") for a in trial["argv"]
        ):
            raise TrialsError(
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


def write_atomic(path: str, text: str) -> None:
    """``text`` into ``path`` through a temporary file beside it and a rename: a reader sees
    the old file or the new one, never half (the submitter and bayes.py's files)."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise TrialsError(f"cannot write {_q(path)}: {exc.strerror}", 1) from None


def _bayes_module():
    """bayes.py beside this file (Optuna is imported there, only for method bayes)."""
    lib = os.path.dirname(os.path.abspath(__file__))
    if lib not in sys.path:
        sys.path.insert(0, lib)
    import bayes

    return bayes


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


def build(opts: dict) -> list[dict]:
    if "wandb_sweep" in opts:
        if opts["count"] > MAX_TRIALS:
            raise TrialsError(f"{opts['count']} trials, more than {MAX_TRIALS}")
        return wandb_trials(opts["wandb_sweep"], opts["count"])
    if "sweep" in opts:
        path = opts["sweep"]
        spec = load_sweep(path)
        if spec["method"] != "bayes" and "rounds" in opts:
            raise TrialsError(
                f"{path}: --rounds applies to method bayes only, not {spec['method']}"
            )
        if spec["method"] == "bayes":
            if "trials" not in opts:
                raise TrialsError(f"{path}: method bayes needs --trials N (trials per round)")
            if opts.get("seeds"):
                raise TrialsError(f"{path}: --seeds does not apply to method bayes")
            if opts.get("round", 1) > opts.get("rounds", 1):
                raise TrialsError(
                    f"--round {opts['round']} is past --rounds {opts.get('rounds', 1)}"
                )
            bayes = _bayes_module()
            try:
                trials = bayes.manifest(
                    spec,
                    opts["trials"],
                    opts["sweep_seed"],
                    opts.get("round", 1),
                    opts.get("journal"),
                    opts.get("study", "bayes"),
                )
            except bayes.BayesError as exc:
                raise TrialsError(str(exc), exc.code) from None
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
        raise TrialsError(f"{len(trials)} trials, more than {MAX_TRIALS}")
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
            raise TrialsError(
                f"--out-dir: cannot create {_q(out_dir)}: {exc.strerror}", 1
            ) from None
        write_atomic(os.path.join(out_dir, "trials.jsonl"), jsonl)
        write_atomic(os.path.join(out_dir, "commands.txt"), commands)
        first = f" {opts['first']}" if "first" in opts else ""
        sys.stdout.write(f"{jsonl.count(chr(10))}{first}\n")
        return 0
    except TrialsError as exc:
        message = " ".join(str(exc).splitlines())
        sys.stderr.write(f"{prog}: error: {message}\n")
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
