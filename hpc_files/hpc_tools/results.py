"""Read submissions back: status.sh's live table (status.py), results.sh's results table
and the trials ``--retry-failed`` reruns.

Runs on the login node, called by the thin entry points ``hpc_files/status.sh`` and
``hpc_files/results.sh`` (and job_submitter.sh for ``failed``)::

    python3 -m hpc_tools.results status|results|failed --project NAME [ARG...]

with the arguments (and ``-h``) of the USAGE texts. ``--curves`` draws training curves
(plots.py); with ``--run`` they are one run's outside SLURM (a laptop run), no submission
or ``$SCRATCH`` needed. Standard library only (matplotlib for the PNGs).

Errors: one line ``PROG: error: MESSAGE`` on stderr; exit 2 for bad input (unknown
experiment, unknown metric, --watch without a terminal, a --run path without metrics), 1
for a failure to write.
"""

from __future__ import annotations

import csv
import os
import re
import sys
from collections.abc import Sequence

from hpc_tools import status
from hpc_tools.cli import Parser, project_folder
from hpc_tools.collect import Trial, collect
from hpc_tools.errors import ToolError, report
from hpc_tools.metrics import find_metrics_csv, lower_is_better, read_metrics
from hpc_tools.plots import IMAGE_TYPES, plot_curves, plot_results
from hpc_tools.submissions import find_submission, read_text
from hpc_tools.sweep import DEFAULT_GOAL
from hpc_tools.tables import render_table, results_table

# results.sh's help, beside the parser it describes ({project}: as status.USAGE's).
USAGE = """\
usage: results.sh EXP|JOBID [--sort METRIC[:max|min]] [--no-group] [--metrics A,B]
                  [--csv FILE] [--plot FILE.png] [--curves FILE.png] [--project NAME]
       results.sh --run RUN_DIR|CSV --curves FILE.png [--metrics A,B]

One row per configuration of the newest submission of experiment EXP (or the
submission whose job id is JOBID) under $SCRATCH/{project}/: its trials, its
parameters, n, state, and for every metric its final and best value (mean ± std
over the seeds of the configuration; failed trials are listed but left out of
the mean unless all failed; a configuration whose every trial failed sorts
last). Metrics come from each trial's metrics.csv; for a wandb sweep array
(-w), from each task's run (<exp>/runs/<run id>/), its parameters from the
run's run.json.

  -s, --sort METRIC[:max|min]  sort by METRIC's final value (default: the sweep
                     file's metric: name and goal when it was logged, else
                     the first of --metrics, else the first logged metric;
                     max unless the name says loss/error)
  --no-group         one row per trial (seeds not grouped)
  -m, --metrics A,B  show only these metrics (default: every logged metric)
  --csv FILE         also write the table as CSV (mean and std in own columns)
  --plot FILE.png    draw the sort metric of the finished trials against each
                     parameter that varies (matplotlib)
  --curves FILE.png  draw the training curves: one panel per metric (those of
                     --metrics), value against global step, one line per trial
  --run RUN_DIR|CSV  instead of EXP: one run outside SLURM (a laptop run), its
                     folder (metrics.csv in it or one folder below, e.g.
                     checkpoints/) or its metrics.csv; takes --curves and
                     --metrics only, needs no $SCRATCH
  --project NAME     the project folder under $SCRATCH (default: {project},
                     the folder holding hpc_files/)
  -h, --help         show this help
"""


def cmd_results(argv: Sequence[str], prog: str) -> int:
    project = target = csv_out = plot_out = curves_out = run_path = None
    sort_text: str | None = None
    metrics_filter: list[str] | None = None
    group = True
    table_options: list[str] = []  # given options that only an experiment's table takes
    p = Parser(argv)
    for name, inline in p:
        if name == "--project":
            project = p.value(name, inline)
        elif name in ("-s", "--sort"):
            sort_text = p.value(name, inline)
            if not sort_text:
                raise ToolError("--sort expects METRIC or METRIC:max|min, got ''")
            table_options.append(name)
        elif name == "--no-group":
            group = False
            table_options.append(name)
        elif name in ("-m", "--metrics"):
            metrics_filter = [m for m in p.value(name, inline).split(",") if m]
        elif name == "--csv":
            csv_out = p.value(name, inline)
            table_options.append(name)
        elif name == "--plot":
            plot_out = p.value(name, inline)
            table_options.append(name)
        elif name == "--curves":
            curves_out = p.value(name, inline)
        elif name == "--run":
            run_path = p.value(name, inline)
        else:
            target = p.target(name, inline, target)
    for opt, path in (("--csv", csv_out), ("--plot", plot_out), ("--curves", curves_out)):
        if path == "":
            raise ToolError(f"{opt} expects a file name, got ''")
        if opt != "--csv" and path and os.path.splitext(path)[1].lower() not in IMAGE_TYPES:
            raise ToolError(f"{opt} expects a .png, .pdf, .svg or .jpg file, got {path!r}")
    if run_path is not None:
        if run_path == "":
            raise ToolError("--run expects a run folder or its metrics.csv, got ''")
        if target is not None:
            raise ToolError(f"give EXP ({target!r}) or --run, not both")
        if table_options:
            raise ToolError(f"{table_options[0]} is for an experiment's table, not --run")
        return cmd_run_curves(run_path, curves_out, metrics_filter)
    if target is None:
        raise ToolError("give the experiment (or job id) to show: results.sh EXP")
    project, project_dir = project_folder(project)
    sub = find_submission(project_dir, target)
    trials = collect(sub, project)
    logged: list[str] = []
    for t in trials:
        logged += [m for m in t.metrics if m not in logged]
    sort: tuple[str, str] | None = None
    if sort_text is not None:
        name, goal = parse_sort(sort_text)
        if name not in logged:
            raise ToolError(
                f"--sort: no trial logged {name!r} (logged: {', '.join(logged) or 'nothing'})"
            )
        sort = (name, goal or ("min" if lower_is_better(name) else "max"))
    else:
        name, goal = sweep_metric(os.path.join(sub.path, "sweep.yml"))
        if name and name in logged:
            sort = (name, goal or "max")
        else:
            if name:
                sys.stderr.write(
                    f"{prog}: note: the sweep's metric {name!r} was not logged; "
                    "sorting by the first metric\n"
                )
            first = next((m for m in metrics_filter or [] if m in logged), None)
            first = first or (logged[0] if logged else None)
            if first:
                sort = (first, "min" if lower_is_better(first) else "max")
    shown_metrics = chosen_metrics(logged, metrics_filter)
    if metrics_filter is not None and sort and sort[0] not in shown_metrics:
        shown_metrics = [sort[0]] + shown_metrics
    for opt, path in (("--plot", plot_out), ("--curves", curves_out)):
        if path and not logged:
            raise ToolError(f"{opt}: no trial logged a metric yet")
    header, rows, csv_rows = results_table(trials, sort, group, shown_metrics)
    where = f"sorted by {sort[0]} ({sort[1]})" if sort else "no metrics logged yet"
    sys.stdout.write(f"{sub.exp}  {sub.path}\n{len(trials)} trial(s); {where}\n")
    sys.stdout.write(render_table(header, rows))
    if csv_out:
        try:
            with open(csv_out, "w", newline="", encoding="utf-8") as fh:
                csv.writer(fh, lineterminator="\n").writerows(csv_rows)
        except OSError as exc:
            raise ToolError(f"--csv: cannot write {csv_out!r}: {exc.strerror}", 1) from None
        sys.stdout.write(f"wrote {csv_out}\n")
    if plot_out and sort:
        plot_results(trials, sort[0], sort[1], plot_out)
        sys.stdout.write(f"wrote {plot_out}\n")
    if curves_out:
        plot_curves(trials, shown_metrics, curves_out)
        sys.stdout.write(f"wrote {curves_out}\n")
    return 0


def parse_sort(text: str) -> tuple[str, str | None]:
    name, colon, goal = text.rpartition(":")
    if not colon or goal not in ("max", "min"):
        return text, None
    if not name:
        raise ToolError(f"--sort expects METRIC or METRIC:max|min, got {text!r}")
    return name, goal


def chosen_metrics(logged: list[str], metrics_filter: list[str] | None) -> list[str]:
    """--metrics A,B (each one logged by some trial), else every logged metric."""
    if metrics_filter is None:
        return logged
    unknown = [m for m in metrics_filter if m not in logged]
    if unknown:
        raise ToolError(
            f"--metrics: no trial logged {unknown[0]!r} (logged: {', '.join(logged) or '-'})"
        )
    return metrics_filter


def sweep_metric(path: str) -> tuple[str | None, str | None]:
    """(metric name, 'max'|'min') from a wandb sweep file's ``metric:``."""
    text = read_text(path)
    if text is None:
        return None, None
    try:
        import yaml

        spec = yaml.safe_load(text)
        metric = spec.get("metric") if isinstance(spec, dict) else None
    except ImportError:
        block = re.search(r"^metric:\s*\n((?:[ \t]+.*\n?)+)", text, re.MULTILINE)
        metric = {}
        for key in ("name", "goal"):
            m = re.search(
                rf"^\s+{key}:\s*['\"]?([^'\"\s#]+)", block.group(1) if block else "", re.M
            )
            if m:
                metric[key] = m.group(1)
    except Exception:  # a broken sweep file only loses the default sort
        return None, None
    if not isinstance(metric, dict) or not metric.get("name"):
        return None, None
    goal = str(metric.get("goal", DEFAULT_GOAL))
    return str(metric["name"]), ("min" if goal.startswith("min") else "max")


def cmd_run_curves(run_path: str, curves_out: str | None, metrics_filter: list[str] | None) -> int:
    """--run: one run's curves, outside SLURM (no submission, no SCRATCH)."""
    if curves_out is None:
        raise ToolError("--run draws one run's curves: give --curves FILE.png too")
    csv_path = run_metrics_csv(run_path)
    run = Trial(0, {}, (), "", False, 0, read_metrics(csv_path))
    if not run.metrics:
        raise ToolError(f"--run: no metrics rows in {csv_path!r}")
    names = chosen_metrics(list(run.metrics), metrics_filter) or list(run.metrics)
    plot_curves([run], names, curves_out)
    sys.stdout.write(f"wrote {curves_out}\n")
    return 0


def run_metrics_csv(path: str) -> str:
    """--run's metrics file: PATH itself, or metrics.csv in the run folder PATH or one below
    (the harness writes ``checkpoints/metrics.csv``)."""
    found = path if os.path.isfile(path) else find_metrics_csv(path, array=False)
    if not found:
        raise ToolError(f"--run: no metrics.csv at {path!r} or one folder below")
    return found


def cmd_failed(argv: Sequence[str]) -> int:
    """``failed --project NAME EXP``, for job_submitter.sh --retry-failed: the newest
    submission of EXP on the first line, then the trials to rerun, one a line: those that
    ended failed (a failed exit, cancelled, timed out), not those that finished, were pruned
    or are still queued or running."""
    project = target = None
    p = Parser(argv)
    for name, inline in p:
        if name == "--project":
            project = p.value(name, inline)
        else:
            target = p.target(name, inline, target)
    project, project_dir = project_folder(project)
    if target is None or re.fullmatch(r"\d+(_\d+)?", target):
        raise ToolError("--retry-failed expects an experiment name")
    sub = find_submission(project_dir, target)
    failed = [t.index for t in collect(sub, project) if t.failed and "pruned" not in t.state]
    sys.stdout.write("".join(f"{line}\n" for line in [sub.path, *failed]))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else ""
    prog = os.environ.get("HPC_PROG", f"{command}.sh")
    before_end = args[: args.index("--")] if "--" in args else args
    usage = {"status": status.USAGE, "results": USAGE}
    if command in usage and ("-h" in before_end or "--help" in before_end):
        project = args[1] if args[:1] == ["--project"] and len(args) > 1 else "<project>"
        sys.stdout.write(usage[command].format(project=project))
        return 0
    try:
        if command == "status":
            return status.cmd_status(args, prog)
        if command == "results":
            return cmd_results(args, prog)
        if command == "failed":
            return cmd_failed(args)
        raise ToolError(f"expected 'status', 'results' or 'failed', got {command!r}")
    except ToolError as exc:
        return report(prog, exc)
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
