"""SLURM's compressed lists as the launchers read them: host lists (with and without scontrol),
tasks per node, the port from the job id, and the one-line errors that name the bad value."""

from __future__ import annotations

import os
import stat

import pytest

from hpc_harness import dist


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("x[3-3]", ["x3"]),  # a range of one host
        ("n[08-10]", ["n08", "n09", "n10"]),  # the low end's width is kept
        ("a, b[1-2] ,", ["a", "b1", "b2"]),
    ],
)
def test_host_lists(nodelist: str, hosts: list[str]) -> None:
    assert dist.parse_nodelist(nodelist) == hosts


@pytest.mark.parametrize(
    "nodelist, message",
    [
        ("n[1-2-3]", "bad range '1-2-3' in node list"),
        ("n[a-3]", "bad range 'a-3' in node list"),
        ("n[3-a]", "bad range '3-a' in node list"),
        ("n[5-2]", "bad range '5-2' in node list"),
        ("n1]", "unbalanced ']' in node list 'n1]'"),
        ("n[1", "unbalanced '[' in node list 'n[1'"),
    ],
)
def test_bad_host_lists_name_the_value(nodelist: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        dist.parse_nodelist(nodelist)
    assert str(err.value) == message


def _fake_scontrol(tmp_path, monkeypatch, script: str) -> None:
    path = tmp_path / "scontrol"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_first_host_asks_scontrol_when_there_is_one(tmp_path, monkeypatch) -> None:
    _fake_scontrol(
        tmp_path, monkeypatch, 'echo "$@" > "$(dirname "$0")/argv"; echo nodeB; echo nodeC'
    )
    assert dist.first_host("whatever[1-2]") == "nodeB"
    assert (tmp_path / "argv").read_text() == "show hostnames whatever[1-2]\n"


@pytest.mark.parametrize("script", ["exit 1", "true", "echo nodeZ; exit 3"])
def test_first_host_parses_itself_when_scontrol_fails_or_says_nothing(
    tmp_path, monkeypatch, script: str
) -> None:
    _fake_scontrol(tmp_path, monkeypatch, script)
    assert dist.first_host("gpu[07-08]") == "gpu07"


def test_an_empty_node_list_is_an_error_naming_it(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol
    with pytest.raises(dist.LaunchError) as err:
        dist.first_host(" , ")
    assert str(err.value) == "empty node list ' , '"


@pytest.mark.parametrize(
    "spec, counts",
    [
        ("2,1", [2, 1, 1]),  # a count without (xN) is one node; past the end: the last one
        ("4(x2),3", [4, 4, 3, 3]),
        (" 2(x3) ", [2, 2, 2, 2, 2]),
    ],
)
def test_tasks_per_node(spec: str, counts: list[int]) -> None:
    assert [dist.tasks_on_node(spec, i) for i in range(len(counts))] == counts


def test_tasks_per_node_error_names_the_value() -> None:
    with pytest.raises(ValueError) as err:
        dist.tasks_on_node("2(x),1", 0)
    assert str(err.value) == "cannot parse tasks per node '2(x),1'"


def test_port_from_job_id_uses_its_digits() -> None:
    assert dist.port_from_job_id("123") == 20123
    assert dist.port_from_job_id("45678_9") == 20000 + 456789 % 20000  # array task
    assert dist.port_from_job_id("") == dist.port_from_job_id("none") == 20000
