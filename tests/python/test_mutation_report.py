"""tools/mutation.py's reading of its own report, which --retest-survivors relies on: the
mutants per file, and each survivor with its mutated line as the report shows it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"

REPORT = """# Mutation testing of the training core

| file | mutants | killed | timeout | survived | no tests | not checked | equivalent | kill ratio |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
| hpc_harness/dist.py | 489 | 445 | 0 | 44 | 0 | 0 | 0 | 91.0% |
| hpc_harness/trainer.py | 646 | 578 | 8 | 60 | 0 | 0 | 8 | 91.8% |
| total | 1135 | 1023 | 8 | 104 | 0 | 0 | 8 | 91.5% |

## Survivors

| mutant | original | mutated | equivalent because |
| --- | --- | --- | --- |
| hpc_harness.dist.x_setup__mutmut_8 (survived) | `a = b` | `a = c` | not equivalent: needs a test |
| hpc_harness.trainer.xǁTǁf__mutmut_76 (survived) | `x: str \\| None` | `x: str \\| int` | a \\| |
"""


def _mutation_tool():
    sys.path.insert(0, str(TOOLS))  # mutation.py imports count_core_lines beside it
    try:
        spec = importlib.util.spec_from_file_location("mutation_under_test", TOOLS / "mutation.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(TOOLS))
    return module


def test_the_report_gives_the_mutants_per_file_and_every_survivors_mutated_line(tmp_path):
    report = tmp_path / "MUTATION.md"
    report.write_text(REPORT)
    counts, survivors = _mutation_tool().previous_report(report)
    assert counts == {"hpc_harness/dist.py": 489, "hpc_harness/trainer.py": 646}
    assert survivors == {
        "hpc_harness.dist.x_setup__mutmut_8": "`a = c`",
        "hpc_harness.trainer.xǁTǁf__mutmut_76": "`x: str \\| int`",
    }


def test_a_survivors_cell_is_what_the_report_writes_for_its_mutated_line():
    tool = _mutation_tool()
    # the comparison --retest-survivors makes: md_code of the fresh mutant's line
    assert tool.md_code('x: str | None = ""') == '`x: str \\| None = ""`'
    assert tool.split_row("| a `b \\| c` | d |") == ["a `b \\| c`", "d"]


def test_verdicts_are_not_carried_when_a_file_has_other_mutants_than_the_report(tmp_path):
    """--retest-survivors stops, leaving every meta file as it was, when a core file has a
    mutant count the report does not record (the core changed since that run)."""
    tool = _mutation_tool()
    folder = tmp_path / "mutants" / "hpc_harness"
    folder.mkdir(parents=True)
    counts = {}
    for i, name in enumerate(tool.CORE):
        meta = {"exit_code_by_key": {f"m{i}__mutmut_1": None, f"m{i}__mutmut_2": None}}
        (folder / f"{name}.meta").write_text(json.dumps(meta))
        counts[f"hpc_harness/{name}"] = 2
    counts[f"hpc_harness/{tool.CORE[-1]}"] = 3
    before = {p.name: p.read_text() for p in folder.iterdir()}
    with pytest.raises(SystemExit) as stop:
        tool.carry_verdicts(tmp_path, "MUTATION.md", counts, {})
    assert str(stop.value) == (
        f"mutation.py: error: hpc_harness/{tool.CORE[-1]} has 2 mutants, MUTATION.md counted 3: "
        "the core changed since that run; run make mutation"
    )
    assert {p.name: p.read_text() for p in folder.iterdir()} == before


def test_every_mutant_not_retested_is_carried_as_killed(tmp_path):
    tool = _mutation_tool()
    folder = tmp_path / "mutants" / "hpc_harness"
    folder.mkdir(parents=True)
    for i, name in enumerate(tool.CORE):
        meta = {"exit_code_by_key": {f"m{i}__mutmut_1": None}, "durations_by_key": {}}
        (folder / f"{name}.meta").write_text(json.dumps(meta))
    counts = {f"hpc_harness/{name}": 1 for name in tool.CORE}
    tool.carry_verdicts(tmp_path, "MUTATION.md", counts, {})
    meta = json.loads((folder / f"{tool.CORE[0]}.meta").read_text())
    assert meta == {"exit_code_by_key": {"m0__mutmut_1": 1}, "durations_by_key": {}}


class _Report:
    """What mutation_plugin.pytest_runtest_logreport reads of a pytest TestReport."""

    def __init__(self, failed: bool, longrepr: str = "E   assert 1 == 2\nt.py:3: AssertionError"):
        self.failed, self.longrepr = failed, longrepr
        self.nodeid, self.when = "tests/python/test_x.py::test_y", "call"


def test_the_plugin_records_which_test_killed_which_mutant(tmp_path, monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location("plugin_under_test", TOOLS / "mutation_plugin.py")
    plugin = importlib.util.module_from_spec(spec)
    monkeypatch.chdir(tmp_path)
    spec.loader.exec_module(plugin)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # a test's own chdir: the file stays put
    monkeypatch.setenv("MUTANT_UNDER_TEST", "hpc_harness.precision.x__fp16_works__mutmut_18")
    plugin.pytest_runtest_logreport(_Report(False))  # a test that passed: no line
    assert not (tmp_path / "mutmut-kills.tsv").exists()
    plugin.pytest_runtest_logreport(_Report(True, "E   assert x\nt.py:3:\tAssertionError"))
    monkeypatch.setenv("MUTANT_UNDER_TEST", "fail")  # mutmut's forced-fail check: not a kill
    plugin.pytest_runtest_logreport(_Report(True))
    monkeypatch.delenv("MUTANT_UNDER_TEST")  # not under mutmut at all
    plugin.pytest_runtest_logreport(_Report(True))
    assert (tmp_path / "mutmut-kills.tsv").read_text() == (
        "hpc_harness.precision.x__fp16_works__mutmut_18\ttests/python/test_x.py::test_y\tcall\t"
        "t.py:3: AssertionError\n"
    )


def test_a_test_process_killed_by_a_signal_kills_its_mutant():
    status_of = _mutation_tool().status_of
    # SIGUSR1's default action ends the process when a mutant no longer installs the handler
    assert status_of(-10) == "killed"
    assert status_of(-11) == status_of(-9) == "killed"  # a crash, the OOM killer
    assert status_of(-24) == "timeout"  # SIGXCPU: mutmut's CPU-time limit
    assert status_of(0) == "survived"
    assert status_of(2) == "other (2)"
    assert status_of(None) == "not checked"
