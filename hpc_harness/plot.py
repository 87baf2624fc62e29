"""Turn a run's metrics.csv into a PNG of training curves.

    hpc-plot RUN_DIR_OR_CSV [-o curves.png]
    python -m hpc_harness.plot checkpoints/metrics.csv -o curves.png

One panel per metric name (train_loss, test_acc, ...), value against global step. Rows
repeated after a requeue (logged after the last checkpoint, then again after resume) are
collapsed: the last row for each (name, step) wins. Uses matplotlib's Agg backend (no display).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from collections.abc import Sequence

from hpc_harness.metrics import CSV_NAME


def read_metrics(path: str) -> dict[str, list[tuple[int, float]]]:
    """{name: [(step, value), ...]} sorted by step, last row per (name, step) kept."""
    series: dict[str, dict[int, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                step, value = int(row["step"]), float(row["value"])
            except (KeyError, TypeError, ValueError):
                continue
            series.setdefault(row["name"], {})[step] = value
    return {name: sorted(points.items()) for name, points in series.items()}


def plot(csv_path: str, out_path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = read_metrics(csv_path)
    if not series:
        raise ValueError(f"no metrics rows in {csv_path}")
    names = sorted(series)
    cols = min(2, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        steps, values = zip(*series[name])
        ax.plot(steps, values, marker="." if len(steps) < 50 else None)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hpc-plot", description="Plot a hpc_harness metrics.csv")
    p.add_argument("path", help=f"a run folder (containing {CSV_NAME}) or the CSV itself")
    p.add_argument("-o", "--output", default=None, help="PNG path (default: next to the CSV)")
    args = p.parse_args(argv)
    csv_path = os.path.join(args.path, CSV_NAME) if os.path.isdir(args.path) else args.path
    if not os.path.isfile(csv_path):
        print(f"hpc-plot: error: no metrics file at '{csv_path}'", file=sys.stderr)
        return 2
    out = args.output or os.path.join(os.path.dirname(os.path.abspath(csv_path)), "curves.png")
    try:
        plot(csv_path, out)
    except ValueError as exc:
        print(f"hpc-plot: error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
