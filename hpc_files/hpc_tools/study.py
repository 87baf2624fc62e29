"""Method bayes's search state: an Optuna study (TPE sampler, the sweep's ``metric.name``
and ``goal``) in a journal file, ``$SCRATCH/<project>/<exp>/optuna.journal`` (Optuna's
``JournalFileBackend``: appends under a symlink lock, safe on NFS).

Every Optuna trial is keyed by its round and index (user attributes ``round``, ``index``,
``trial``), so asking and telling are idempotent. Optuna is imported only when a study is
opened: the rest of hpc_tools runs without it.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from hpc_tools.errors import ToolError
from hpc_tools.sweep import sweep_argv


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ToolError(
            "method bayes needs Optuna: pip install 'optuna>=4' (or the project's "
            "extra: pip install -e '.[search]') into the python that expands trials",
            1,
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


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
                raise ToolError(
                    f"{path}: parameter {name!r}: probabilities are not supported by bayes"
                )
            for v in p["values"]:
                if isinstance(v, (list, dict)):
                    raise ToolError(
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
            raise ToolError(
                f"{path}: parameter {name!r}: distribution {dist} is not supported by "
                "method bayes (use values, int_uniform, uniform, q_uniform, log_uniform, "
                "log_uniform_values, inv_log_uniform or inv_log_uniform_values)"
            )
    return out


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


def tell_round(
    study: Any, round_: int, values: dict[int, float | None], pruned: frozenset[int] = frozenset()
) -> tuple[int, int, int]:
    """Tell round ``round_``'s trials not told yet: values[global trial] or None (FAIL); a
    trial in ``pruned`` (its folder's pruned file) as PRUNED where its program did not.

    Returns (told complete, told failed, pruned in the round); a second call tells nothing
    and counts the same pruned."""
    from optuna.trial import TrialState

    done = failed = pruned_count = 0
    for t in keyed(study, round_).values():
        trial = int(t.user_attrs["trial"])
        if t.state == TrialState.RUNNING and trial in pruned:
            study.tell(t.number, state=TrialState.PRUNED)
        elif t.state == TrialState.RUNNING:
            value = values.get(trial)
            if value is None or not math.isfinite(value):
                study.tell(t.number, state=TrialState.FAIL)
                failed += 1
            else:
                study.tell(t.number, value)
                done += 1
            continue
        elif t.state != TrialState.PRUNED:
            continue
        pruned_count += 1
    return done, failed, pruned_count


def rounds_manifest(
    spec: dict,
    per_round: int,
    seed: int,
    round_: int = 1,
    journal: str | None = None,
    study_name: str = "bayes",
) -> list[dict]:
    """Trials of rounds 1..round_ (asking round_'s if needed), as manifest records.

    Without a journal (--list-trials, --dry-run, checks before anything is written)
    round 1 is asked from a study in memory: the same seeded startup sampler gives the
    same values the journal study gives."""
    if journal is None and round_ != 1:
        raise ToolError("a round after the first needs the study's journal", 1)
    space = search_space(spec)
    study = open_study(journal, study_name, spec["goal"], sampler(seed, round_, per_round))
    ensure_round(study, space, round_, per_round)
    records = []
    for r in range(1, round_ + 1):
        got = keyed(study, r)
        if sorted(got) != list(range(per_round)):
            raise ToolError(f"the study has no complete round {r} ({len(got)} trials)", 1)
        for i in range(per_round):
            row = {name: got[i].params[name] for name in sorted(space)}
            argv = sweep_argv(spec, row)
            records.append(
                {
                    "argv": argv,
                    "params": row,
                    "source": f"bayes:round {r}",
                    "command": shlex.join(argv),
                }
            )
    return records
