"""Mutation testing of the training core with mutmut; writes docs/reports/MUTATION.md.

    make mutation                        # = the line below, after installing mutmut
    .venv/bin/python tools/mutation.py   # fresh run of every core file, then the report
    .venv/bin/python tools/mutation.py --only 'hpc_harness.pieces*'   # re-test some, in place
    .venv/bin/python tools/mutation.py --report   # only rewrite MUTATION.md from .mutation/
    .venv/bin/python tools/mutation.py --retest-survivors   # minutes: see below

The core is the file list of tools/count_core_lines.py (one owner). The run happens in a
scratch copy, ``.mutation/`` (git-ignored; see prepare), so the project's files are never
touched. Fast tests only; a test that starts a process is skipped (see mutmut_settings). The
failing test of every killed mutant goes to ``.mutation/mutants/mutmut-kills.tsv``.

Survivors that cannot change behaviour are listed in ``tests/mutation/equivalent.txt`` (its
format: load_equivalents). ``--retest-survivors`` is for new tests on an unchanged core when
``.mutation/`` is gone (every fresh clone): it re-tests only the survivors MUTATION.md lists,
keeps that report's other verdicts, and stops if the core changed since (carry_verdicts).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
EQUIVALENT = ROOT / "tests" / "mutation" / "equivalent.txt"
REPORT = ROOT / "docs" / "reports" / "MUTATION.md"
PLUGIN = Path(__file__).resolve().parent / "mutation_plugin.py"
TARGET = 0.85

sys.path.insert(0, str(Path(__file__).resolve().parent))
from count_core_lines import CORE, code_lines  # noqa: E402

# mutmut's exit-code table (mutmut/stats.py), folded into the report's columns.
KILLED = {1, 3}  # a test failed or pytest errored; a negative code not in TIMEOUT (a signal
# ended the test process: a crash, or SIGUSR1 with the mutant's handler gone) also kills
TIMEOUT = {36, -24, 24, 152, 255}
SURVIVED = {0}
NO_TESTS = {5, 33}


def mutmut_settings(also_copy: list[str]) -> str:
    """The [tool.mutmut] table of the scratch copy's pyproject.toml.

    Fast tests only: ``tests/python`` without the ``slow`` and ``cluster`` markers, and a test
    that starts a process (``subprocess``, ``multiprocessing``: torchrun, spawned gloo ranks) is
    skipped the moment it tries (``mutation_plugin.py``). mutmut only sees which tests reach which
    function in its own process, so those tests would cost minutes and kill almost nothing.
    mutmut keeps only each mutant's exit code; the plugin also appends the failing test of every
    killed mutant to ``mutants/mutmut-kills.tsv`` (mutant, test, phase, last line of the error),
    so a kill can be traced to the test that made it."""
    also = ", ".join(f'"{name}"' for name in also_copy)
    only = ", ".join(f'"hpc_harness/{name}"' for name in CORE)
    paths = ", ".join(f'"{path}"' for path in pytest_pythonpath())
    return f"""[tool.mutmut]
source_paths = ["hpc_harness"]
only_mutate = [{only}]
also_copy = [{also}]
pytest_add_cli_args_test_selection = ["tests/python", "-m", "not slow and not cluster"]
# no:unraisableexception: it ends each mutant's run with full collections of the forked heap
# (torch, every collected test): half the CPU time of a mutant a fast test kills; it only turns
# an exception in a finalizer into a warning, which fails no test here
pytest_add_cli_args = [
  "-p", "mutation_plugin", "-p", "no:cacheprovider", "-p", "no:unraisableexception", "-q", "-x"
]
process_isolation = "forkserver"
timeout_multiplier = 5.0
timeout_constant = 10.0  # s: the wall limit also covers a forked pytest start-up, >11 s under load

[tool.pytest.ini_options]
pythonpath = [{paths}]
markers = ["cluster: needs the local SLURM cluster", "slow: takes more than a few seconds"]
# a test that a mutant makes hang fails at 30 s (the slowest fast test takes 3): mutmut's own
# limit, 10x the CPU time of all the tests of the mutant's function, is minutes in the Trainer
timeout = 30
"""


def pytest_pythonpath() -> list[str]:
    """The project's pytest ``pythonpath`` (pyproject.toml): the tests import the login-node
    package ``hpc_tools`` from ``hpc_files/``, and the scratch copy's pyproject.toml replaces the
    project's. Read as one line of JSON-compatible strings: tomllib is Python 3.11's."""
    found = re.search(r"^pythonpath = (\[.*\])$", (ROOT / "pyproject.toml").read_text(), re.M)
    return json.loads(found.group(1)) if found else []


def project_files() -> list[str]:
    """The project's files (tracked or new, not ignored): what the tests may read."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


def prepare(workdir: Path) -> None:
    """A fresh scratch copy: the project's files, the plugin, and a pyproject.toml holding only
    the mutmut settings."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    tops = set()
    for rel in project_files():
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, workdir / rel)
        tops.add(rel.split("/")[0])
    shutil.copy2(PLUGIN, workdir / "mutation_plugin.py")
    tops.add("mutation_plugin.py")
    also = sorted(tops - {"hpc_harness", "pyproject.toml"})
    (workdir / "pyproject.toml").write_text(mutmut_settings(also))


def run_mutmut(workdir: Path, children: int, names: list[str]) -> tuple[float, float]:
    """``mutmut run`` in the scratch copy; returns its wall time and the CPU time (user + sys)
    of it and every process under it, in seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(workdir)}
    if importlib.util.find_spec("mutmut") is None:
        sys.exit("mutation.py: error: mutmut is not installed (tools/install_deps.sh mutation)")
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = subprocess.call(
        # python -m, not the mutmut script: a venv built elsewhere (a worktree) and moved keeps
        # that place in its scripts' first line, and the script then fails to start
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *names],
        cwd=workdir,
        env=env,
    )
    elapsed = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if code != 0:
        sys.exit(f"mutation.py: error: mutmut run exited {code} after {elapsed:.0f} s")
    return elapsed, cpu


# --------------------------------------------------------------------------- --retest-survivors


def split_row(line: str) -> list[str]:
    """The cells of a Markdown table row (``\\|`` inside a cell is not a separator)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]


def previous_report(path: Path) -> tuple[dict[str, int], dict[str, str]]:
    """What a report records: the mutants of each file, and each survivor's mutated-line cell."""
    counts: dict[str, int] = {}
    survivors: dict[str, str] = {}
    for line in path.read_text().splitlines():
        cells = split_row(line) if line.startswith("| hpc_harness") else []
        if len(cells) == 9:  # the per-file table
            counts[cells[0]] = int(cells[1])
        elif len(cells) == 4:  # the survivors table: "name (status)", before, after, reason
            survivors[cells[0].split(" ")[0]] = cells[2]
    return counts, survivors


def carry_verdicts(
    workdir: Path, report: str, counts: dict[str, int], survivors: dict[str, str]
) -> None:
    """After the ``survivors`` of ``report`` (:func:`previous_report`) were re-tested in
    ``workdir``: every mutant that was not re-tested keeps the report's verdict, killed (a
    timeout is counted as killed). Exits first, changing nothing, if the mutants are not the ones
    the report was made of (the core changed since its run): the same number in each file and the
    same mutated line for every survivor it lists."""
    changed = "the core changed since that run; run make mutation"
    metas = {}
    for name in CORE:
        path = f"hpc_harness/{name}"
        meta_path = workdir / "mutants" / "hpc_harness" / f"{name}.meta"
        meta = json.loads(meta_path.read_text())
        codes = meta["exit_code_by_key"]
        if len(codes) != counts.get(path):
            sys.exit(
                f"mutation.py: error: {path} has {len(codes)} mutants, {report} counted "
                f"{counts.get(path)}: {changed}"
            )
        for key in codes.keys() & survivors.keys():
            if md_code(changed_line(workdir, key, path)[1]) != survivors[key]:
                sys.exit(f"mutation.py: error: {key} is not the one {report} lists: {changed}")
        meta["exit_code_by_key"] = {k: v if k in survivors else 1 for k, v in codes.items()}
        metas[meta_path] = meta
    for meta_path, meta in metas.items():  # 1: killed (or timed out) in the report's run
        meta_path.write_text(json.dumps(meta, indent=4))


# --------------------------------------------------------------------------- report


@dataclass
class Mutant:
    name: str  # hpc_harness.pieces.x_save_checkpoint__mutmut_3
    status: str  # killed, timeout, survived, no tests, other
    before: str = ""  # the original line, stripped
    after: str = ""  # the mutated line, stripped
    reason: str = ""  # why it cannot change behaviour (from equivalent.txt)

    @property
    def function(self) -> str:
        return re.sub(r"__mutmut_\d+$", "", self.name)


@dataclass
class FileResult:
    path: str
    mutants: list[Mutant] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(m.status == status for m in self.mutants)


def status_of(code: int | None) -> str:
    if code in TIMEOUT:
        return "timeout"
    if code in KILLED or (code is not None and code < 0):
        return "killed"
    if code in SURVIVED:
        return "survived"
    if code in NO_TESTS:
        return "no tests"
    return "not checked" if code is None else f"other ({code})"


def load_equivalents(path: Path) -> dict[tuple[str, str], str]:
    """(function, mutated line) -> reason, from ``tests/mutation/equivalent.txt``.

    One a line: ``<function>`` TAB ``<mutated line>`` TAB ``<reason>``, where ``<function>`` is
    the mutant name without its number (``hpc_harness.pieces.x_save_checkpoint``) and ``<mutated
    line>`` the changed source line, stripped (so an entry outlives renumbering but not a change
    of that line)."""
    out: dict[tuple[str, str], str] = {}
    if not path.exists():
        return out
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            sys.exit(f"mutation.py: error: {path}:{n}: expected 3 tab-separated fields")
        out[(parts[0].strip(), parts[1].strip())] = parts[2].strip()
    return out


def changed_line(workdir: Path, name: str, path: str) -> tuple[str, str]:
    """The first line the mutant changes, before and after (the diff ``mutmut show`` prints)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant  # noqa: PLC0415

    here = Path.cwd()
    os.chdir(workdir)  # mutmut reads its settings and mutants/ from the current directory
    try:
        diff = get_diff_for_mutant(name, path=path)
    finally:
        os.chdir(here)
    before = after = ""
    for line in diff.splitlines():
        if line.startswith("-") and not line.startswith("---") and not before:
            before = line[1:].strip()
        elif line.startswith("+") and not line.startswith("+++") and not after:
            after = line[1:].strip()
    return before, after


def collect(workdir: Path, equivalents: dict[tuple[str, str], str]) -> list[FileResult]:
    results = []
    for name in CORE:
        meta = workdir / "mutants" / "hpc_harness" / f"{name}.meta"
        if not meta.exists():
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        fr = FileResult(f"hpc_harness/{name}")
        for key in sorted(codes, key=natural):
            m = Mutant(key, status_of(codes[key]))
            if m.status not in ("killed", "timeout", "not checked"):
                m.before, m.after = changed_line(workdir, key, fr.path)
                m.reason = equivalents.get((m.function, m.after), "")
            fr.mutants.append(m)
        results.append(fr)
    return results


def kill_ratio(counts: dict[str, int]) -> float:
    """Killed or timed out over the checked, non-equivalent mutants (NaN when none)."""
    tested = counts["all"] - counts["not checked"] - counts["equiv"]
    return (counts["killed"] + counts["timeout"]) / tested if tested > 0 else float("nan")


def pct(ratio: float) -> str:
    return "n/a" if ratio != ratio else f"{ratio:.1%}"


def natural(key: str) -> tuple[str, int]:
    head, _, num = key.rpartition("__mutmut_")
    return head, int(num) if num.isdigit() else 0


def md_code(text: str) -> str:
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def core_size() -> int:
    """Lines of code in the core (count_core_lines.code_lines), the number the report states."""
    return sum(code_lines((ROOT / "hpc_harness" / name).read_text()) for name in CORE)


def write_report(
    results: list[FileResult], timing: tuple[float, float] | None, out: Path, note: str = ""
) -> float:
    """MUTATION.md; returns the kill ratio: killed + timeout over the checked mutants that are
    not listed as equivalent."""
    rows = []
    keys = ("all", "killed", "timeout", "survived", "no tests", "not checked", "equiv")
    tot = dict.fromkeys(keys, 0)
    for fr in results:
        counts = {
            "all": len(fr.mutants),
            "equiv": sum(bool(m.reason) for m in fr.mutants),
            **{k: fr.count(k) for k in keys[1:6]},
        }
        for key in keys:
            tot[key] += counts[key]
        rows.append(f"| {fr.path} | " + " | ".join(str(counts[k]) for k in keys) + " | ")
        rows[-1] += f"{pct(kill_ratio(counts))} |"
    ratio = kill_ratio(tot)
    checked = tot["all"] - tot["not checked"]
    raw = (tot["killed"] + tot["timeout"]) / checked if checked else 1.0
    import mutmut  # noqa: PLC0415 (only the report needs its version)

    lines = [
        "# Mutation testing of the training core",
        "",
        "Generated by `tools/mutation.py` (`make mutation`) on "
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; do not edit by hand.",
        "",
        f"- command: `make mutation` (= `tools/install_deps.sh mutation && "
        f"{Path(sys.executable).name} tools/mutation.py`), mutmut {mutmut.__version__}, "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs",
        "- mutated: the files `tools/count_core_lines.py` counts; tests: `tests/python` without "
        "the `slow` and `cluster` markers, a test that starts a process skipped "
        "(`tools/mutation_plugin.py`)",
        f"- core size: {core_size()} lines of code in {len(CORE)} files "
        "(`tools/count_core_lines.py`: non-blank, non-comment, non-docstring)",
        "- full run: "
        + (
            f"{timing[0] / 60:.1f} min wall, {timing[1] / 60:.1f} min CPU (all processes; "
            f"1-min load at the end {os.getloadavg()[0]:.1f})"
            if timing is not None
            else "not timed by this invocation (report only, or a partial re-run)"
        ),
        *([f"- {note}"] if note else []),
        f"- **kill ratio: {pct(ratio)}** (killed or timed out, over the checked mutants not "
        f"listed as equivalent; target {TARGET:.0%}); {raw:.1%} of all {checked} checked "
        f"mutants; {tot['not checked']} of {tot['all']} not checked",
        "",
        "| file | mutants | killed | timeout | survived | no tests | not checked | equivalent "
        "| kill ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "| total | " + " | ".join(str(tot[k]) for k in keys) + f" | {pct(ratio)} |",
        "",
        "`no tests`: no fast test reaches that function in the test process (it runs only in",
        "a spawned rank or a subprocess, or not at all). Equivalent mutants are listed in",
        "`tests/mutation/equivalent.txt` with the reason they cannot change behaviour.",
        "",
        "## Survivors",
        "",
        "| mutant | original | mutated | equivalent because |",
        "| --- | --- | --- | --- |",
    ]
    for fr in results:
        for m in fr.mutants:
            if m.status in ("killed", "timeout", "not checked"):
                continue
            label = f"{m.name} ({m.status})"
            lines.append(
                f"| {label} | {md_code(m.before)} | {md_code(m.after)} | "
                f"{m.reason or 'not equivalent: needs a test'} |"
            )
    out.write_text("\n".join(lines) + "\n")
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="reuse .mutation/ (incremental)")
    parser.add_argument("--report", action="store_true", help="only rewrite the report")
    parser.add_argument(
        "--only",
        nargs="*",
        default=[],
        help="mutant names or globs to (re-)test, e.g. 'hpc_harness.pieces*' (implies --keep)",
    )
    parser.add_argument(
        "--retest-survivors",
        action="store_true",
        help="fresh copy: re-test the survivors MUTATION.md lists, keep its other verdicts",
    )
    parser.add_argument("--children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--out", type=Path, default=REPORT)
    parser.add_argument("--note", default="", help="one line for the report (e.g. the load)")
    args = parser.parse_args()
    timing = None
    if args.retest_survivors:
        counts, survivors = previous_report(REPORT)
        prepare(WORK)
        run_mutmut(WORK, args.children, sorted(survivors))
        carry_verdicts(WORK, REPORT.name, counts, survivors)
    elif not args.report:
        if not (args.keep or args.only) or not WORK.exists():
            prepare(WORK)
        else:  # refresh the sources and tests; mutmut re-tests what changed
            for rel in project_files():
                if rel != "pyproject.toml":
                    (WORK / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / rel, WORK / rel)
            shutil.copy2(PLUGIN, WORK / "mutation_plugin.py")
            settings = (WORK / "pyproject.toml").read_text()
            also = re.search(r"^also_copy = \[(.*)\]$", settings, re.M)
            names = [a.strip().strip('"') for a in also.group(1).split(",")] if also else []
            (WORK / "pyproject.toml").write_text(mutmut_settings(names))
        timing = run_mutmut(WORK, args.children, args.only)
        if args.only or args.keep:
            timing = None  # not a full run
    results = collect(WORK, load_equivalents(EQUIVALENT))
    ratio = write_report(results, timing, args.out, args.note)
    print(f"mutation.py: kill ratio {pct(ratio)}; wrote {args.out}")
    unexplained = [
        m.name for fr in results for m in fr.mutants if m.status == "survived" and not m.reason
    ]
    print(f"mutation.py: {len(unexplained)} survivors without a test or a reason")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
