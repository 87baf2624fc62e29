"""SLURM's compressed lists as the launchers read them: the first host of a node list (without
calling SLURM), tasks per node, and the one-line errors that name the bad value."""

from __future__ import annotations

import pytest

from hpc_harness import dist


@pytest.mark.parametrize(
    "nodelist, host",
    [
        ("x[3-3]", "x3"),  # a range of one host
        ("n[08-10]", "n08"),  # the low end's width is kept
        (" a, b[1-2] ,", "a"),
        ("gpu[07-08,11]", "gpu07"),
    ],
)
def test_first_host(nodelist: str, host: str) -> None:
    assert dist.first_host(nodelist) == host


@pytest.mark.parametrize("nodelist", [" , ", "n1]", "n[1", "[1-2]x]"])
def test_a_node_list_without_a_first_host_is_an_error_naming_it(nodelist: str) -> None:
    with pytest.raises(dist.LaunchError) as err:
        dist.first_host(nodelist)
    assert str(err.value) == f"cannot read the first host of node list '{nodelist}'"


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
    with pytest.raises(dist.LaunchError) as err:
        dist.tasks_on_node("2(x),1", 0)
    assert str(err.value) == "cannot parse tasks per node '2(x),1'"
