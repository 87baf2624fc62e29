"""results.sh's table: one row per configuration (or trial), the final and best value of
every metric (mean ± std over a configuration's seeds), sorted by one metric."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

from hpc_tools.collect import Trial
from hpc_tools.logs import with_restarts
from hpc_tools.metrics import final_and_best


def render_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header] + rows]
    return "\n".join(lines) + "\n"


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"


def param_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


@dataclass
class Row:
    trials: list[Trial]
    values: dict[str, tuple[list[float], list[float]]]  # metric -> (finals, bests)

    def mean(self, metric: str, which: int = 0) -> float | None:
        vals = self.values.get(metric, ([], []))[which]
        return statistics.fmean(vals) if vals else None


def build_rows(trials: list[Trial], metric_names: list[str], group: bool, goals: dict) -> list[Row]:
    buckets: dict[tuple, list[Trial]] = {}
    for t in trials:
        key = t.config if group else (t.index,)
        buckets.setdefault(key, []).append(t)
    rows = []
    for members in buckets.values():
        counted = [t for t in members if not t.failed] or members
        values = {}
        for name in metric_names:
            finals, bests = [], []
            for t in counted:
                final, best = final_and_best(t.metrics.get(name, []), name, goals.get(name))
                if final is not None:
                    finals.append(final)
                    bests.append(best)
            values[name] = (finals, bests)
        rows.append(Row(members, values))
    return rows


def state_summary(members: list[Trial]) -> str:
    if len(members) == 1:
        return with_restarts(members[0].state, members[0].restarts)
    counts: dict[str, int] = {}
    for t in members:
        counts[t.state] = counts.get(t.state, 0) + 1
    text = ", ".join(s if n == len(members) else f"{n} {s}" for s, n in counts.items())
    requeues = sum(t.restarts for t in members)
    return f"{text}, requeued {requeues}x" if requeues else text


def cell(vals: list[float], grouped: bool) -> str:
    if not vals:
        return "-"
    if not grouped:
        return fmt(vals[0])
    if len(vals) == 1:
        return fmt(vals[0])
    return f"{fmt(statistics.fmean(vals))} ± {fmt(statistics.stdev(vals))}"


def results_table(
    trials: list[Trial],
    sort: tuple[str, str] | None,
    group: bool,
    metric_names: list[str],
) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """(header, rows as shown, rows for the CSV) sorted by the sort metric's final value
    (mean over a row's trials that did not fail); rows whose every trial failed go last."""
    goals = {sort[0]: sort[1]} if sort else {}
    rows = build_rows(trials, metric_names, group, goals)
    if sort:
        sign = -1 if sort[1] == "max" else 1

        def key(row: Row) -> tuple:
            mean = row.mean(sort[0])
            all_failed = all(t.failed for t in row.trials)
            value = sign * mean if mean is not None else 0
            return (all_failed, mean is None, value, row.trials[0].index)

        rows.sort(key=key)
    param_names: list[str] = []
    for t in trials:
        param_names += [k for k in t.params if k not in param_names and not (group and k == "seed")]
    grouped = group and any(len(r.trials) > 1 for r in rows)
    # A parameter and a metric of one name (--lr and a logged lr) get prefixed columns.
    clash = set(param_names) & set(metric_names)
    shown_params = [f"param.{k}" if k in clash else k for k in param_names]
    header = ["trial" + ("s" if grouped else "")] + shown_params + (["n"] if grouped else [])
    header.append("state")
    csv_header = list(header)
    for name in metric_names:
        label = f"metric.{name}" if name in clash else name
        header += [label, f"best {label}"]
        csv_header += [label, f"{label}_std", f"best {label}", f"best {label}_std"]
    shown, plain = [], []
    for row in rows:
        first = row.trials[0]
        ids = ",".join(str(t.index) for t in row.trials)
        params = [param_text(first.params.get(k, "")) for k in param_names]
        head = [ids] + params
        if grouped:
            n = len(row.values[sort[0]][0]) if sort and sort[0] in row.values else len(row.trials)
            head.append(str(n))
        head.append(state_summary(row.trials))
        line, cline = list(head), list(head)
        for name in metric_names:
            finals, bests = row.values[name]
            line += [cell(finals, grouped), cell(bests, grouped)]
            for vals in (finals, bests):
                cline.append(repr(statistics.fmean(vals)) if vals else "")
                cline.append(repr(statistics.stdev(vals)) if len(vals) > 1 else "")
        shown.append(line)
        plain.append(cline)
    return header, shown, [csv_header] + plain
