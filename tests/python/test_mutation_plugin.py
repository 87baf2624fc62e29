"""tools/mutation_plugin.py, the pytest plugin of `make mutation`: the order it gives a
mutant's tests, and which processes it lets a test start."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

PLUGIN = Path(__file__).resolve().parents[2] / "tools" / "mutation_plugin.py"


def _plugin():
    spec = importlib.util.spec_from_file_location("mutation_plugin_under_test", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_mutants_tests_run_quickest_first_by_the_recorded_durations(tmp_path, monkeypatch):
    stats = {"duration_by_test": {"t.py::slow": 2.0, "t.py::quick": 0.01, "t.py::mid": 0.3}}
    (tmp_path / "mutmut-stats.json").write_text(json.dumps(stats))
    monkeypatch.chdir(tmp_path)  # mutmut runs the tests in mutants/, beside the file
    items = [
        SimpleNamespace(nodeid=n) for n in ("t.py::slow", "t.py::new", "t.py::mid", "t.py::quick")
    ]
    _plugin().pytest_collection_modifyitems(items)
    # a test without a recorded duration counts as instant
    assert [i.nodeid for i in items] == ["t.py::new", "t.py::quick", "t.py::mid", "t.py::slow"]


def test_without_statistics_the_order_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    items = [SimpleNamespace(nodeid=n) for n in ("b", "a")]
    _plugin().pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ["b", "a"]


def test_a_loaders_workers_start_and_any_other_process_is_a_skip() -> None:
    """A DataLoader's forked workers start in milliseconds and run the code under test: they
    start. Any other process (spawned workers or ranks, torchrun) skips the test that starts it."""
    import multiprocessing

    import pytest
    import torch
    from torch.utils.data import DataLoader

    plugin = _plugin()
    plugin.pytest_configure(None)
    try:
        loader = DataLoader(torch.arange(6), batch_size=2, num_workers=2)
        try:
            assert torch.cat(list(loader)).tolist() == [0, 1, 2, 3, 4, 5]
        except pytest.skip.Exception:  # a skip here would pass this test
            pytest.fail("the loader's workers were refused")
        with pytest.raises(pytest.skip.Exception, match="starts a process"):
            multiprocessing.get_context("spawn").Process(target=print).start()
        spawned = DataLoader(torch.arange(6), num_workers=1, multiprocessing_context="spawn")
        with pytest.raises(pytest.skip.Exception, match="starts a process"):
            next(iter(spawned))  # a fresh interpreter per worker: seconds
    finally:
        plugin.pytest_unconfigure(None)
