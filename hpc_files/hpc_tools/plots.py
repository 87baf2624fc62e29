"""results.sh's PNGs (matplotlib, imported only to draw): ``--plot``, a metric's final
value against each parameter that varies, and ``--curves``, training curves."""

from __future__ import annotations

import math
import statistics
from typing import Any

from hpc_tools.collect import Trial
from hpc_tools.errors import ToolError
from hpc_tools.metrics import final_and_best
from hpc_tools.tables import param_text

IMAGE_TYPES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")  # what --plot and --curves write


def plot_points(
    trials: list[Trial], metric: str, goal: str
) -> tuple[list[str], list[tuple[Trial, float]]]:
    """(panels, points) of --plot: a panel per parameter that takes more than one value
    (else one panel, ``trial``), and (trial, final value of metric) for every finished
    trial that reported it: a running one's value is not final, a failed one's not a result."""
    names: list[str] = []
    for t in trials:
        names += [k for k in t.params if k not in names and k != "seed"]
    names = [k for k in names if len({param_text(t.params.get(k, "")) for t in trials}) > 1]
    points = []
    for t in trials:
        final, _ = final_and_best(t.metrics.get(metric, []), metric, goal)
        if final is not None and t.state == "finished":
            points.append((t, final))
    return names or ["trial"], points


def plot_results(trials: list[Trial], metric: str, goal: str, out: str) -> None:
    """One panel per varying parameter (plot_points): the metric's final value of every
    finished trial, with the mean per value."""
    names, points = plot_points(trials, metric, goal)
    fig, axes = panels(len(names), 3, 4.2)
    for ax, name in zip(axes.flat, names):
        xs = [t.index if name == "trial" else t.params.get(name) for t, _ in points]
        ys = [v for _, v in points]
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
        if not numeric:
            labels = sorted({str(x) for x in xs})
            xs = [labels.index(str(x)) for x in xs]
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=30, ha="right")
        ax.scatter(xs, ys, alpha=0.6)
        by_x: dict[Any, list[float]] = {}
        for x, y in zip(xs, ys):
            by_x.setdefault(x, []).append(y)
        mx = sorted(by_x)
        ax.plot(mx, [statistics.fmean(by_x[x]) for x in mx], color="C1", marker="_")
        if numeric and len(mx) >= 2 and min(mx) > 0 and max(mx) / min(mx) >= 100:
            ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel(f"{metric} ({goal})")
        ax.grid(alpha=0.3)
    save_panels(fig, axes, len(names), out, "--plot")


def panels(count: int, per_row: int, width: float) -> tuple[Any, Any]:
    """A figure of COUNT panels, PER_ROW a row, each WIDTH inches wide (Agg: no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(per_row, count)
    rows = math.ceil(count / cols)
    return plt.subplots(rows, cols, figsize=(width * cols, 3.2 * rows), squeeze=False)


def save_panels(fig: Any, axes: Any, used: int, out: str, option: str) -> None:
    """Blank the panels past USED and write the PNG OUT (exit 1 naming OPTION if it cannot)."""
    import matplotlib.pyplot as plt

    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=100)
    except OSError as exc:
        raise ToolError(f"{option}: cannot write {out!r}: {exc.strerror}", 1) from None
    finally:
        plt.close(fig)


def trial_label(t: Trial) -> str:
    params = ", ".join(f"{k}={param_text(v)}" for k, v in t.params.items())
    label = f"trial {t.index} ({params})" if params else f"trial {t.index}"
    return f"{label}, failed" if t.failed else label


def plot_curves(trials: list[Trial], names: list[str], out: str) -> dict[str, list[str]]:
    """One panel per metric in NAMES, its value against global step, one line per trial
    that logged it (a failed trial's dashed); a legend names the trials when there are
    several (in the first panel). Returns {metric: labels of its lines}, what was drawn."""
    fig, axes = panels(len(names), 2, 5)
    drawn: dict[str, list[str]] = {}
    legend_drawn = False
    for ax, name in zip(axes.flat, names):
        drawn[name] = []
        for t in trials:
            points = t.metrics.get(name)
            if not points:
                continue
            steps, values = zip(*points)
            label = trial_label(t)
            style = "--" if t.failed else "-"
            ax.plot(steps, values, style, marker="." if len(steps) < 50 else None, label=label)
            drawn[name].append(label)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(trials) > 1 and drawn[name] and not legend_drawn:  # once: same lines in each
            ax.legend(fontsize="x-small")
            legend_drawn = True
    save_panels(fig, axes, len(names), out, "--curves")
    return drawn
