"""Medians, ranges and paired ratios for the benchmarks, as Markdown tables.

A ratio is computed per rep (``B_i / A_i``) and reported as the median and range of those
paired ratios (why: paired_ratios).

Library use (Python benchmarks)::

    from benchstats import Series, md_table
    print(md_table([Series("raw", "cmd", [1.0, 1.1])], anchor="raw", unit="s"))

Command line (shell benchmarks), samples as ``config<TAB>rep<TAB>value`` lines (seconds);
``commands.tsv`` holds ``config<TAB>command`` lines, shown in the table's command column::

    python bench/benchstats.py table samples.tsv --anchor bare --unit s \\
        [--commands commands.tsv] [--order a,b,c]
    python bench/benchstats.py diff samples.tsv --anchor ours \\
        [--commands commands.tsv] [--order b,c]

Standard library only, so any python3 can run it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Series:
    """One configuration's samples, in rep order (rep i ran beside rep i of the others)."""

    name: str
    command: str
    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")


def fmt(value: float, unit: str) -> str:
    """A value with its unit, scaled to stay readable (s -> ms below 1 s)."""
    if value != value:  # NaN
        return "n/a"
    if unit == "s" and abs(value) < 1.0:
        return f"{value * 1000:.1f} ms"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "x":
        return f"{value:.3f}x"
    if abs(value) >= 100:
        return f"{value:.0f} {unit}".rstrip()
    return f"{value:.2f} {unit}".rstrip()


def paired_ratios(series: Series, anchor: Series) -> list[float]:
    """``series_i / anchor_i`` for every rep both have.

    Every benchmark runs its configurations interleaved (A B C, C B A, A B C, ...) after a
    discarded warm-up, so rep ``i`` of A and rep ``i`` of B ran next to each other under the same
    load: their ratio, not a ratio of medians taken at different times, is what is reported."""
    return [a / b for a, b in zip(series.values, anchor.values) if b]


def ratio_cell(series: Series, anchor: Series) -> str:
    ratios = paired_ratios(series, anchor)
    if not ratios:
        return "n/a"
    if series is anchor:
        return "1 (anchor)"
    med = statistics.median(ratios)
    return f"**{med:.3f}x** ({min(ratios):.3f}-{max(ratios):.3f})"


def md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(
    series: Sequence[Series],
    anchor: str | None = None,
    unit: str = "s",
    value_name: str = "median",
    extra_anchors: Sequence[str] = (),
) -> str:
    """A Markdown table: config, command, n, median, min-max, ratio vs anchor(s)."""
    by_name = {s.name: s for s in series}
    anchors = [a for a in ([anchor] if anchor else []) + list(extra_anchors) if a in by_name]
    head = ["config", "command", "n", value_name, "min-max"] + [f"ratio vs {a}" for a in anchors]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in series:
        if s.values:
            rng = f"{fmt(min(s.values), unit)} - {fmt(max(s.values), unit)}"
        else:
            rng = "n/a"
        row = [
            f"`{s.name}`",
            f"`{md_escape(s.command)}`" if s.command else "",
            str(len(s.values)),
            f"**{fmt(s.median, unit)}**",
            rng,
        ]
        row += [ratio_cell(s, by_name[a]) for a in anchors]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def diff_table(series: Sequence[Series], anchor: Series) -> str:
    """Paired differences ``series_i - anchor_i`` in ms: median, min-max, reps slower."""
    lines = [
        "| config | command | n | median difference | min-max | reps slower than the anchor |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in series:
        diffs = [(a - b) * 1000 for a, b in zip(s.values, anchor.values)]
        if not diffs:
            continue
        slower = sum(d > 0 for d in diffs)
        med = statistics.median(diffs)
        lines.append(
            f"| `{s.name}` | `{md_escape(s.command)}` | {len(diffs)} | **{med:+.1f} ms** "
            f"| {min(diffs):+.1f} - {max(diffs):+.1f} ms | {slower}/{len(diffs)} |"
        )
    return "\n".join(lines) + "\n"


def write_section(text: str, out: str | None) -> None:
    """A benchmark's Markdown section, to ``out`` (if given) and stdout."""
    if out:
        Path(out).write_text(text, encoding="utf-8")
    print(text)


def read_samples(path: str, order: Sequence[str] = ()) -> list[Series]:
    """``config<TAB>rep<TAB>value`` lines -> one Series per config (rep order kept)."""
    found: dict[str, dict[int, float]] = {}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3 or not parts[0] or parts[0].startswith("#"):
                continue
            found.setdefault(parts[0], {})[int(parts[1])] = float(parts[2])
    names = [n for n in order if n in found] + [n for n in found if n not in order]
    return [Series(n, "", [found[n][r] for r in sorted(found[n])]) for n in names]


def read_commands(path: str | None) -> dict[str, str]:
    if not path:
        return {}
    out = {}
    with open(path) as f:
        for line in f:
            name, _, command = line.rstrip("\n").partition("\t")
            if name:
                out[name] = command
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Markdown table of interleaved benchmark samples.")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="median, min-max and paired ratios per config")
    t.add_argument("samples")
    t.add_argument("--anchor", default=None)
    t.add_argument("--also-vs", default="", help="comma-separated extra anchors")
    t.add_argument("--unit", default="s")
    t.add_argument("--commands", default=None)
    t.add_argument("--order", default="", help="comma-separated config order")
    t.add_argument("--value-name", default="median")
    d = sub.add_parser("diff", help="paired differences to the anchor, in ms")
    d.add_argument("samples")
    d.add_argument("--anchor", required=True)
    d.add_argument("--commands", default=None)
    d.add_argument("--order", default="", help="comma-separated configs (default: all but anchor)")
    m = sub.add_parser("median", help="print the median of one config's samples")
    m.add_argument("samples")
    m.add_argument("config")
    args = p.parse_args(argv)
    order = [o for o in getattr(args, "order", "").split(",") if o]
    series = read_samples(args.samples, order)
    if args.cmd == "median":
        match = [s for s in series if s.name == args.config]
        if not match or not match[0].values:
            print("nan")
            return 1
        print(f"{match[0].median:.6f}")
        return 0
    commands = read_commands(args.commands)
    for s in series:
        s.command = commands.get(s.name, "")
    if args.cmd == "diff":
        by_name = {s.name: s for s in series}
        if args.anchor not in by_name:
            print(f"benchstats.py: no samples of {args.anchor}", file=sys.stderr)
            return 1
        shown = [s for s in series if s.name != args.anchor and (not order or s.name in order)]
        sys.stdout.write(diff_table(shown, by_name[args.anchor]))
        return 0
    extra = [a for a in args.also_vs.split(",") if a]
    sys.stdout.write(md_table(series, args.anchor, args.unit, args.value_name, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
