"""pytest plugin for the mutation run (tools/mutation.py): skip a test when it starts a process,
and record which test killed each mutant.

mutmut records which tests reach which function in its own process only, and runs a mutant
against those tests; a test that launches torchrun, a subprocess or spawned gloo ranks costs
seconds to a minute per mutant and kills nothing mutmut can attribute to it. Such a test is
skipped the moment it tries (``pytest.skip`` raises BaseException: no ``except Exception``
swallows it). Quick external commands the core itself calls (``scontrol show hostnames``) run
as usual, so the code around them is tested, and so do a DataLoader's worker processes started
by fork: they start in milliseconds, run the loader code the Trainer drives, and what they load
is checked in the test's process (a resumed epoch's order with persistent workers).
Loaded only by the mutation run (``-p mutation_plugin``), never by ``make test``.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import multiprocessing.process
import os
import shutil
import subprocess
from typing import Any

import pytest

_REASON = "starts a process: not a fast test for the mutation run"
# Commands that answer in milliseconds and that the core calls itself: allowed.
QUICK_COMMANDS = frozenset({"scontrol"})


def _start_unless_loader_worker(self: multiprocessing.process.BaseProcess) -> None:
    from torch.utils.data._utils.worker import _worker_loop  # noqa: PLC0415 (torch is heavy)

    # forked: a spawn or forkserver worker starts a fresh interpreter (seconds, not milliseconds)
    forked = (self._start_method or multiprocessing.get_start_method()) == "fork"
    if getattr(self, "_target", None) is not _worker_loop or not forked:
        pytest.skip(_REASON)
    _saved["start"](self)


def _popen_unless_quick(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
    argv0 = args if isinstance(args, (str, bytes, os.PathLike)) else next(iter(args), "")
    name = os.fsdecode(argv0)
    # a command that does not exist fails at once (FileNotFoundError): let it
    if (
        os.path.basename(name) not in QUICK_COMMANDS
        and shutil.which(name, path=(kwargs.get("env") or os.environ).get("PATH")) is not None
    ):
        pytest.skip(_REASON)
    _saved["popen"](self, args, *rest, **kwargs)


_saved: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Patched for the whole session (module- and session-scoped fixtures start processes too)."""
    # Every mutant's tests run in a fork of a process that has imported torch and collected
    # every test: frozen, those objects are never scanned by the collector again (nor copied
    # on write by a scan), a tenth of a Trainer test's CPU time.
    gc.freeze()
    _saved["popen"] = subprocess.Popen.__init__
    _saved["start"] = multiprocessing.process.BaseProcess.start
    subprocess.Popen.__init__ = _popen_unless_quick  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = _start_unless_loader_worker  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    if _saved:
        subprocess.Popen.__init__ = _saved.pop("popen")  # type: ignore[method-assign]
        multiprocessing.process.BaseProcess.start = _saved.pop("start")  # type: ignore[method-assign]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The quickest tests first, by the durations mutmut recorded: a mutant's run stops at its
    first failing test (-x), and mutmut hands the tests over in the order of a Python set,
    different in every process, so a mutant a 10 ms test kills could wait on seconds of
    training first. Read at every run: the statistics are written after the first runs."""
    try:  # mutmut runs the tests in <scratch copy>/mutants/, beside its statistics
        with open("mutmut-stats.json") as f:
            durations = json.load(f).get("duration_by_test", {})
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: durations.get(item.nodeid, 0.0))


# Where mutmut runs the tests (<scratch copy>/mutants/), fixed at import: a test may chdir.
KILLS_FILE = os.path.abspath("mutmut-kills.tsv")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Which test killed a mutant: one line per failing test, ``mutant<TAB>test<TAB>phase<TAB>
    last line of the error``, appended to ``mutmut-kills.tsv`` beside mutmut's statistics (two
    mutant runs append at once: one short write each). mutmut keeps only the exit code, and a
    kill that a test's own flakiness caused is otherwise impossible to tell from a real one."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if not report.failed or mutant in ("", "fail", "stats", "list_all_tests"):
        return
    error = (str(report.longrepr).strip().splitlines() or [""])[-1].replace("\t", " ")[:300]
    with open(KILLS_FILE, "a") as f:
        f.write(f"{mutant}\t{report.nodeid}\t{report.when}\t{error}\n")
