"""A wandb sweep file, read and checked: ``program``, ``method`` (grid, random or bayes),
``parameters``, optional ``command`` and ``metric``; ``early_terminate`` is checked by
early_terminate.py; ``name``, ``project`` ... are accepted and ignored.

``load_sweep`` returns a normalised spec that sampling.py (grid, random) and study.py
(bayes) turn into trials; ``sweep_argv`` builds a trial's argv from its parameter values,
as ``wandb agent`` does. PyYAML is imported only here, when a sweep file is read.
"""

from __future__ import annotations

import json
import math

from hpc_tools import early_terminate
from hpc_tools.errors import ToolError, quoted
from hpc_tools.files import read_source
from hpc_tools.manifest import MAX_TRIALS

# A metric without goal: is minimized, as in W&B (results.sh sorts by it the same way).
DEFAULT_GOAL = "minimize"

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


def load_sweep(path: str) -> dict:
    """Read and validate a wandb sweep file; return a normalised spec: method, program,
    params (_parameter's, sorted by name), command (words), metric, goal, early_terminate.

    The command list is ``command:`` or DEFAULT_COMMAND; its macros are sweep_argv's.
    ``${args_json_file}`` and ``${envvar:NAME}`` are refused; any other element is literal
    text."""
    text = read_source(path, "--sweep")
    try:
        import yaml
    except ImportError:
        raise ToolError(
            "--sweep needs PyYAML: pip install pyyaml, or run this with the project's python", 1
        ) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ToolError(f"{path}{where}: invalid YAML: {problem}") from None
    if not isinstance(doc, dict):
        raise ToolError(
            f"{path}: a sweep file must be a mapping (program:, method:, "
            "parameters:), got " + type(doc).__name__
        )
    method = doc.get("method")
    if method not in ("grid", "random", "bayes"):
        raise ToolError(f"{path}: method must be grid, random or bayes, got {quoted(method)}")
    metric = doc.get("metric")
    metric_name = goal = None
    if method == "bayes" and metric is None:
        raise ToolError(
            f"{path}: method bayes needs metric: with name: (a metric the program "
            "logs to metrics.csv) and goal: minimize or maximize"
        )
    if metric is not None:  # results.sh ranks by it too
        if (
            not isinstance(metric, dict)
            or not isinstance(metric.get("name"), str)
            or not metric["name"]
        ):
            raise ToolError(
                f"{path}: metric must be a mapping with name: (and goal: minimize or maximize)"
            )
        metric_name = metric["name"]
        goal = metric.get("goal", DEFAULT_GOAL)
        if goal not in ("minimize", "maximize"):
            raise ToolError(f"{path}: metric goal must be minimize or maximize, got {quoted(goal)}")
    program = doc.get("program")
    if not isinstance(program, str) or not program:
        raise ToolError(f"{path}: program missing (the script wandb would run, e.g. train.py)")
    _check_text(path, "program", program)
    params = doc.get("parameters")
    if not isinstance(params, dict) or not params:
        raise ToolError(f"{path}: no parameters (parameters: must be a non-empty mapping)")
    for name in params:
        if not isinstance(name, str):
            raise ToolError(f"{path}: parameter names must be strings, got {quoted(name)}")
    specs = [_parameter(path, name, params[name], method) for name in sorted(params)]
    command = doc.get("command", DEFAULT_COMMAND)
    if not isinstance(command, list) or not command:
        raise ToolError(f"{path}: command must be a non-empty list")
    words = []
    for word in command:
        if word is None or isinstance(word, (bool, list, dict)):
            raise ToolError(f"{path}: command items must be strings or numbers, got {quoted(word)}")
        word = str(word)
        _check_text(path, "command", word)
        if "${envvar:" in word:
            raise ToolError(
                f"{path}: {quoted(word)}: ${{envvar:...}} is not supported; put "
                "the line in a configs file, where $VAR expands on the node"
            )
        if word.startswith("${") and word.endswith("}"):
            macro = word[2:-1]
            if macro == "args_json_file":
                raise ToolError(f"{path}: ${{args_json_file}} is not supported; use ${{args_json}}")
            if macro not in ("env", "interpreter", "program") + ARG_MACROS:
                raise ToolError(f"{path}: unknown macro {quoted(word)} in command")
        words.append(word)
    return {
        "method": method,
        "program": program,
        "params": specs,
        "command": words,
        "metric": metric_name,
        "goal": goal,
        # The pruner's settings, or None without the block.
        "early_terminate": early_terminate.parse(path, doc.get("early_terminate"), metric_name),
    }


def _check_text(path: str, what: str, text: str) -> None:
    if "\n" in text or "\r" in text or "\0" in text:
        raise ToolError(f"{path}: {what} contains a newline or NUL: {quoted(text)}")


def _json_value(path: str, name: str, value: object) -> object:
    """Refuse values a manifest cannot hold: non-JSON types, NaN/inf, newlines, NUL."""
    if value is None or isinstance(value, (bool, int, str)):
        if isinstance(value, str):
            _check_text(path, f"a value of {name!r}", value)
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ToolError(f"{path}: parameter {name!r}: {value} is not allowed")
        return value
    if isinstance(value, list):
        return [_json_value(path, name, v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_value(path, name, v) for k, v in value.items()}
    raise ToolError(f"{path}: parameter {name!r}: {quoted(value)} is not a JSON value")


def _number(path: str, name: str, spec: dict, key: str, default: object = None) -> float:
    value = spec.get(key, default)
    if value is None:
        raise ToolError(f"{path}: parameter {name!r} ({spec.get('distribution')}) needs {key}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolError(f"{path}: parameter {name!r}: {key} must be a number, got {quoted(value)}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ToolError(f"{path}: parameter {name!r}: {key} must be finite")
    return value


def _parameter(path: str, name: object, spec: object, method: str) -> dict:
    """One parameter: {name, dist, and values or min/max/q/mu/sigma/probabilities}.

    Without ``distribution:``, ``value`` -> constant, ``values`` -> categorical,
    ``min``/``max`` -> int_uniform if both are integers, else uniform. Distributions:
    constant (value), categorical (values, optional probabilities), int_uniform (min..max
    inclusive), uniform, q_uniform, log_uniform (min/max are natural-log exponents),
    q_log_uniform, log_uniform_values (min/max are values > 0), q_log_uniform_values,
    inv_log_uniform (1/X, ln X ~ U(min, max)), inv_log_uniform_values (1/X with X
    log-uniform on [1/max, 1/min]), normal (mu=0, sigma=1), q_normal, log_normal,
    q_log_normal; ``q`` defaults to 1. In a grid, only value, values, int_uniform (every
    integer from min to max) and q_uniform (min, min+q, ... below max) are allowed, and
    values alike (1 and 1.0) are one point, at the first one's place with the last one's
    value (the agent passes ``--b=1.0`` for ``[1, 1.0]``), as in wandb.
    """
    if not isinstance(name, str) or not name or "=" in name:
        raise ToolError(
            f"{path}: parameter names must be non-empty strings without '=', got {quoted(name)}"
        )
    _check_text(path, "a parameter name", name)
    if not isinstance(spec, dict):
        raise ToolError(
            f"{path}: parameter {name!r} must be a mapping (value:, values:, or "
            f"distribution: with min/max), got {quoted(spec)}"
        )
    if "parameters" in spec:
        raise ToolError(f"{path}: parameter {name!r}: nested parameters are not supported")
    dist = spec.get("distribution")
    if dist is None:
        if "value" in spec and "values" in spec:
            raise ToolError(f"{path}: parameter {name!r}: give value or values, not both")
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
            raise ToolError(
                f"{path}: parameter {name!r} needs value, values, or distribution with min/max"
            )
    if dist not in DISTRIBUTIONS:
        raise ToolError(
            f"{path}: parameter {name!r}: unknown distribution {quoted(dist)} "
            f"(supported: {', '.join(DISTRIBUTIONS)})"
        )
    out: dict = {"name": name, "dist": dist}
    if dist == "constant":
        if "value" not in spec:
            raise ToolError(f"{path}: parameter {name!r} (constant) needs value")
        out["values"] = [_json_value(path, name, spec["value"])]
    elif dist == "categorical":
        values = spec.get("values")
        if not isinstance(values, list):
            raise ToolError(f"{path}: parameter {name!r}: values must be a list")
        if not values:
            raise ToolError(f"{path}: parameter {name!r}: values is empty")
        out["values"] = [_json_value(path, name, v) for v in values]
        probs = spec.get("probabilities")
        if probs is not None:
            if method == "grid":
                raise ToolError(
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
                raise ToolError(
                    f"{path}: parameter {name!r}: probabilities must be one "
                    "number >= 0 per value, summing to 1"
                )
            out["probabilities"] = probs
    else:
        if dist.endswith("normal"):
            out["mu"] = _number(path, name, spec, "mu", 0)
            out["sigma"] = _number(path, name, spec, "sigma", 1)
            if out["sigma"] <= 0:
                raise ToolError(f"{path}: parameter {name!r}: sigma must be > 0")
        else:
            low = out["min"] = _number(path, name, spec, "min")
            high = out["max"] = _number(path, name, spec, "max")
            if low > high:
                raise ToolError(f"{path}: parameter {name!r}: min {low} > max {high}")
            if dist == "int_uniform" and not (isinstance(low, int) and isinstance(high, int)):
                raise ToolError(
                    f"{path}: parameter {name!r} (int_uniform): min and max must be integers"
                )
            if dist.endswith("_values") and low <= 0:
                raise ToolError(f"{path}: parameter {name!r} ({dist}): min must be > 0")
        if dist.startswith("q_"):
            out["q"] = _number(path, name, spec, "q", 1)
            if out["q"] <= 0:
                raise ToolError(f"{path}: parameter {name!r}: q must be > 0")
        if method == "grid":
            if dist not in ("int_uniform", "q_uniform"):
                raise ToolError(
                    f"{path}: parameter {name!r}: distribution {dist} cannot be "
                    "used in a grid (use value, values, int_uniform or q_uniform)"
                )
            step = 1 if dist == "int_uniform" else out["q"]
            count = high - low + 1 if dist == "int_uniform" else math.ceil((high - low) / step)
            if count > MAX_TRIALS:
                raise ToolError(f"{path}: parameter {name!r}: {dist} range too large for a grid")
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
            raise ToolError(f"{path}: parameter {name!r}: no grid values")
    return out


def sweep_argv(spec: dict, row: dict) -> list[str]:
    """The argv wandb agent would build for these parameter values (``row``, in name order).

    A command element that is exactly a macro expands as in ``wandb agent``: env ->
    ``/usr/bin/env``, interpreter -> ``python``, program, args (``--k=v``), args_no_equals
    (``--k v``), args_no_hyphens (``k=v``), args_no_boolean_flags (``--k`` for true, nothing
    for false), args_json (one JSON word), args_append_hydra (``+k=v``),
    args_override_hydra (``++k=v``). Values are formatted with ``str()`` as the agent does
    (``True``, ``0.001``)."""
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
