#!/usr/bin/env python3
"""Adaptive search offline: ``method: bayes`` as rounds of array jobs driven by Optuna.

A login-node (or small CPU job) tool; nothing here runs in the training job. The
search state is an Optuna study (TPE sampler, the sweep's ``metric.name``/``goal``) in
a journal file beside the experiment's submissions, ``$SCRATCH/<project>/<exp>/
optuna.journal`` (Optuna's ``JournalFileBackend``: appends under a symlink lock, safe
on NFS). Every Optuna trial is keyed by its round and index (user attributes
``round``, ``index``, ``trial``), so asking and telling are idempotent::

    job_submitter.sh --sweep bayes.yml --rounds 3 --trials 4 -e EXP ...
      round 1: trials.py asks 4 trials (the sampler's random startup), one array job
               (tasks 0-3) and a controller job (afterany:<round 1>):
    bayes.py controller --submission ROUND_1_FOLDER
      reads each finished trial's metrics.csv (hpc_files/lib/results.py), tells Optuna
      (a failed task or a missing metric is told as FAIL), then re-runs the submitter
      with the round-1 argv and HPC_BAYES_ROUND=2: trials.py asks 4 more (TPE), a new
      submission folder (tasks 4-7, its trials.jsonl/commands.txt list rounds 1-2) and
      its controller; the last round's controller only records results (bayes_best.json).

Round K's submission folder holds the manifest of rounds 1..K (trial = global index,
so ``trials/K`` folders never collide) and ``bayes.json`` (study, journal, round, the
submitter's argv and folder). Re-running a controller tells only trials not yet told
and submits the next round only once: ``next_round`` in its folder is created (pending)
before the submitter runs and holds the round's folder after.

Usage::

    bayes.py start --submission DIR --journal FILE --study NAME --round K --rounds R
                   --trials N [--sweep-seed S] --cwd DIR -- SUBMITTER ARG...
    bayes.py controller --submission DIR [--project NAME]

Errors: one line ``bayes.py: error: MESSAGE`` on stderr; exit 2 for bad input, 1 otherwise.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import trials as trials_mod  # noqa: E402  (hpc_files/lib/trials.py: sweep files, argv)

GOALS = ("minimize", "maximize")
# stop.sh's record in the experiment folder (STOP_RECORD in lib/experiment.sh): no next round.
STOP_RECORD = "stopped"


class BayesError(Exception):
    """A refusal: one line; exit 2 (input) or 1 (runtime)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise BayesError(
            "method bayes needs Optuna: pip install 'optuna>=4' (or the project's "
            "extra: pip install -e '.[search]') into the python that expands trials",
            1,
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


# ---------------------------------------------------------------- search space


def search_space(spec: dict, path: str = "sweep") -> dict[str, Any]:
    """A normalised sweep spec (trials.load_sweep) -> {name: Optuna distribution}.

    values -> categorical; value -> a one-choice categorical; int_uniform -> int;
    uniform -> float; q_uniform -> float (or int) with step q; log_uniform_values and
    inv_log_uniform_values -> log float on [min, max] (1/X of a log-uniform X is
    log-uniform); log_uniform / inv_log_uniform (natural-log exponents) -> log float
    on [e^min, e^max] / [e^-max, e^-min]. Normal, q_log and weighted categorical
    distributions have no Optuna counterpart and are refused.
    """
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, Any] = {}
    for p in spec["params"]:
        name, dist = p["name"], p["dist"]
        if dist in ("constant", "categorical"):
            if "probabilities" in p:
                raise BayesError(
                    f"{path}: parameter {name!r}: probabilities are not supported by bayes"
                )
            for v in p["values"]:
                if isinstance(v, (list, dict)):
                    raise BayesError(
                        f"{path}: parameter {name!r}: bayes takes values that are numbers, "
                        f"strings, booleans or null, got {v!r}"
                    )
            out[name] = CategoricalDistribution(p["values"])
        elif dist == "int_uniform":
            out[name] = IntDistribution(int(p["min"]), int(p["max"]))
        elif dist == "uniform":
            out[name] = FloatDistribution(float(p["min"]), float(p["max"]))
        elif dist == "q_uniform":
            q, low, high = p["q"], p["min"], p["max"]
            if all(isinstance(x, int) for x in (q, low, high)):
                out[name] = IntDistribution(low, low + (high - low) // q * q, step=q)
            else:
                top = low + math.floor((high - low) / q + 1e-9) * q
                out[name] = FloatDistribution(float(low), float(top), step=float(q))
        elif dist in ("log_uniform_values", "inv_log_uniform_values"):
            out[name] = FloatDistribution(float(p["min"]), float(p["max"]), log=True)
        elif dist == "log_uniform":
            out[name] = FloatDistribution(math.exp(p["min"]), math.exp(p["max"]), log=True)
        elif dist == "inv_log_uniform":
            out[name] = FloatDistribution(math.exp(-p["max"]), math.exp(-p["min"]), log=True)
        else:
            raise BayesError(
                f"{path}: parameter {name!r}: distribution {dist} is not supported by "
                "method bayes (use values, int_uniform, uniform, q_uniform, log_uniform, "
                "log_uniform_values, inv_log_uniform or inv_log_uniform_values)"
            )
    return out


# ---------------------------------------------------------------- the study


def sampler(seed: int, round_: int, per_round: int) -> Any:
    """TPE: the first round (per_round trials) samples at random (its startup); a seed
    per round, so a round is reproducible and rounds differ."""
    optuna = _optuna()
    return optuna.samplers.TPESampler(
        seed=seed * 100_003 + round_,
        n_startup_trials=per_round,
        constant_liar=True,
    )


def open_study(journal: str | None, name: str, goal: str, smp: Any) -> Any:
    """The study in the journal file (created on first use); in memory when journal is None."""
    optuna = _optuna()
    storage = None
    if journal is not None:
        from optuna.storages import JournalStorage

        try:
            from optuna.storages.journal import JournalFileBackend as Backend
        except ImportError:  # optuna < 4.0 names it JournalFileStorage
            from optuna.storages import JournalFileStorage as Backend  # type: ignore
        storage = JournalStorage(Backend(journal))
    return optuna.create_study(
        study_name=name, storage=storage, direction=goal, sampler=smp, load_if_exists=True
    )


def keyed(study: Any, round_: int) -> dict[int, Any]:
    """Round ``round_``'s trials by index."""
    out = {}
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("round") == round_:
            out[int(t.user_attrs["index"])] = t
    return out


def ensure_round(study: Any, space: dict, round_: int, per_round: int) -> list[Any]:
    """Ask the trials of round ``round_`` that are not asked yet; return the round's trials."""
    have = keyed(study, round_)
    for index in range(per_round):
        if index in have:
            continue
        t = study.ask(space)
        t.set_user_attr("round", round_)
        t.set_user_attr("index", index)
        t.set_user_attr("trial", (round_ - 1) * per_round + index)
    have = keyed(study, round_)
    return [have[i] for i in range(per_round)]


def tell_round(study: Any, round_: int, values: dict[int, float | None]) -> tuple[int, int]:
    """Tell round ``round_``'s trials not told yet: values[global trial] or None (FAIL).

    Returns (told complete, told failed); a second call tells nothing."""
    from optuna.trial import TrialState

    done = failed = 0
    for t in keyed(study, round_).values():
        if t.state != TrialState.RUNNING:
            continue
        value = values.get(int(t.user_attrs["trial"]))
        if value is None or not math.isfinite(value):
            study.tell(t.number, state=TrialState.FAIL)
            failed += 1
        else:
            study.tell(t.number, value)
            done += 1
    return done, failed


def manifest(
    spec: dict,
    per_round: int,
    seed: int,
    round_: int = 1,
    journal: str | None = None,
    study_name: str = "bayes",
) -> list[dict]:
    """Trials of rounds 1..round_ (asking round_'s if needed), as trials.py's records.

    Without a journal (--list-trials, --dry-run, checks before anything is written)
    round 1 is asked from a study in memory: the same seeded startup sampler gives the
    same values the journal study gives."""
    if journal is None and round_ != 1:
        raise BayesError("a round after the first needs the study's journal", 1)
    space = search_space(spec)
    study = open_study(journal, study_name, spec["goal"], sampler(seed, round_, per_round))
    ensure_round(study, space, round_, per_round)
    records = []
    for r in range(1, round_ + 1):
        got = keyed(study, r)
        if sorted(got) != list(range(per_round)):
            raise BayesError(f"the study has no complete round {r} ({len(got)} trials)", 1)
        for i in range(per_round):
            row = {name: got[i].params[name] for name in sorted(space)}
            argv = trials_mod._sweep_argv(spec, row)
            records.append(
                {
                    "argv": argv,
                    "params": row,
                    "source": f"bayes:round {r}",
                    "command": shlex.join(argv),
                }
            )
    return records


# ---------------------------------------------------------------- controller


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise BayesError(f"cannot read {path}: {exc}", 1) from None


def _write_json(path: str, data: dict) -> None:
    trials_mod.write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def round_values(submission: str, project: str, metric: str, first: int, count: int):
    """{global trial: final value of metric, or None for a failed or metric-less trial},
    read by results.py (the same reader as results.sh)."""
    import results

    sub = results.load_submission(submission)
    out: dict[int, float | None] = {}
    for trial in results.collect(sub, project):
        if not first <= trial.index < first + count:
            continue
        points = trial.metrics.get(metric) or []
        final = points[-1][1] if points else None
        out[trial.index] = None if trial.failed or final is None else final
    return out


def cmd_start(argv: list[str]) -> int:
    """In the submitter, once the round's folder exists: the study in the journal holds
    this round's trials (asked now unless they were), and they are the folder's manifest."""
    opts, rest = _options(
        argv, ("submission", "journal", "study", "round", "rounds", "trials", "sweep-seed", "cwd")
    )
    sub = opts["submission"]
    spec = trials_mod.load_sweep(os.path.join(sub, "sweep.yml"))
    round_, rounds, per_round = int(opts["round"]), int(opts["rounds"]), int(opts["trials"])
    seed = int(opts.get("sweep-seed", "0"))
    records = manifest(spec, per_round, seed, round_, opts["journal"], opts["study"])
    jsonl, commands = trials_mod.render(records)
    for name, text in (("trials.jsonl", jsonl), ("commands.txt", commands)):
        with open(os.path.join(sub, name), encoding="utf-8") as fh:
            if fh.read() != text:
                raise BayesError(
                    f"{sub}/{name} differs from the study's round {round_}; not submitted", 1
                )
    _write_json(
        os.path.join(sub, "bayes.json"),
        {
            "study": opts["study"],
            "journal": opts["journal"],
            "round": round_,
            "rounds": rounds,
            "trials_per_round": per_round,
            "sweep_seed": seed,
            "metric": spec["metric"],
            "goal": spec["goal"],
            "cwd": opts["cwd"],
            "argv": rest,
        },
    )
    return 0


def cmd_controller(argv: list[str]) -> int:
    opts, _ = _options(argv, ("submission", "project"))
    sub = os.path.abspath(opts["submission"])
    info = _read_json(os.path.join(sub, "bayes.json"))
    round_, per_round = info["round"], info["trials_per_round"]
    project = opts.get("project") or os.path.basename(os.path.dirname(os.path.dirname(sub)))
    first = (round_ - 1) * per_round
    spec_path = os.path.join(sub, "sweep.yml")
    spec = trials_mod.load_sweep(spec_path)
    study = open_study(
        info["journal"],
        info["study"],
        info["goal"],
        sampler(info["sweep_seed"], round_ + 1, per_round),
    )
    values = round_values(sub, project, info["metric"], first, per_round)
    done, failed = tell_round(study, round_, values)
    print(f"bayes: round {round_}/{info['rounds']}: told {done} complete, {failed} failed")
    stopped = os.path.join(os.path.dirname(sub), STOP_RECORD)
    if round_ >= info["rounds"] or os.path.exists(stopped):
        if round_ < info["rounds"]:
            print(f"bayes: {stopped} exists (stop.sh); round {round_ + 1} is not submitted")
        return record_best(sub, study, spec)
    marker = os.path.join(sub, "next_round")
    if not _claim(marker):
        return _already_submitted(marker, sub, info["study"], round_ + 1)
    env = dict(os.environ)
    env.update(
        HPC_BAYES_ROUND=str(round_ + 1),
        HPC_BAYES_STUDY=info["study"],
        HPC_BAYES_JOURNAL=info["journal"],
    )
    try:
        proc = subprocess.run(
            submitter_argv(info["argv"]),
            cwd=info["cwd"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:  # it did not start: nothing was queued
        os.unlink(marker)
        raise BayesError(f"cannot run the submitter for round {round_ + 1}: {exc}", 1) from None
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    folder = _queued_round(sub, info["study"], round_ + 1)
    if not folder:
        os.unlink(marker)  # nothing was queued: the next controller tries again
        raise BayesError(f"submitting round {round_ + 1} failed (exit {proc.returncode})", 1)
    trials_mod.write_atomic(marker, folder + "\n")
    if proc.returncode != 0:  # e.g. sbatch refused the round's own controller job
        raise BayesError(
            f"round {round_ + 1} was queued ({folder}), then its submitter failed "
            f"(exit {proc.returncode}; its message is above)",
            1,
        )
    return 0


PENDING = "pending: "


def _claim(marker: str) -> bool:
    """Create ``next_round`` before submitting, or find it there: a controller stopped
    between the submitter's sbatch and recording its folder leaves it pending, so no later
    controller (nor one running beside it) submits the round a second time."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f"{PENDING}controller pid {os.getpid()} on {os.uname().nodename}\n")
    return True


def _already_submitted(marker: str, sub: str, study: str, round_: int) -> int:
    with open(marker, encoding="utf-8") as fh:
        text = fh.read().strip()
    if not text.startswith(PENDING):
        print(f"bayes: round {round_} was already submitted: {text}")
        return 0
    folder = _queued_round(sub, study, round_)
    if not folder:
        raise BayesError(
            f"round {round_} is being submitted by another controller, or was by one that "
            f"stopped before recording it ({text[len(PENDING) :]}); no submission of it with a "
            f"job id is in {os.path.dirname(sub)} yet: once that controller has ended and "
            f"squeue shows no round {round_}, remove {marker} to submit it",
            1,
        )
    trials_mod.write_atomic(marker, folder + "\n")
    print(f"bayes: round {round_} was already submitted: {folder}")
    return 0


def _queued_round(sub: str, study: str, round_: int) -> str:
    """The folder of the study's round that sbatch accepted, in sub's experiment, or ''."""
    import results

    return results.study_rounds(os.path.dirname(sub), study).get(round_, "")


def submitter_argv(argv: list[str]) -> list[str]:
    """Round 1's submitter argv for the next round, less --wait (a controller job does
    not wait for the round it submits); words after '--' are the program's, kept."""
    if "--" in argv:
        cut = argv.index("--")
        return [a for a in argv[:cut] if a != "--wait"] + argv[cut:]
    return [a for a in argv if a != "--wait"]


def record_best(sub: str, study: Any, spec: dict) -> int:
    from optuna.trial import TrialState

    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    data: dict[str, Any] = {
        "metric": spec["metric"],
        "goal": spec["goal"],
        "trials": len(study.get_trials(deepcopy=False)),
        "complete": len(complete),
    }
    if complete:
        best = study.best_trial
        data.update(
            best_value=best.value, best_params=best.params, best_trial=best.user_attrs.get("trial")
        )
        print(
            f"bayes: best {spec['metric']} {best.value} (trial {data['best_trial']}): {best.params}"
        )
    _write_json(os.path.join(sub, "bayes_best.json"), data)
    return 0


def _options(argv: list[str], names: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return opts, argv[i + 1 :]
        key = arg[2:].partition("=")[0] if arg.startswith("--") else ""
        if key not in names:
            raise BayesError(f"unknown option {arg!r}")
        if "=" in arg:
            opts[key] = arg.partition("=")[2]
        elif i + 1 < len(argv):
            i += 1
            opts[key] = argv[i]
        else:
            raise BayesError(f"{arg} expects a value")
        i += 1
    return opts, []


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv or argv[0] not in ("start", "controller"):
            raise BayesError("usage: bayes.py start|controller ... (see the module docstring)")
        if argv[0] == "start":
            return cmd_start(argv[1:])
        return cmd_controller(argv[1:])
    except (BayesError, trials_mod.TrialsError) as exc:
        sys.stderr.write(f"bayes.py: error: {' '.join(str(exc).splitlines())}\n")
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
