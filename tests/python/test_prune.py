"""hpc_tools.early_terminate: a sweep's early_terminate block (wandb's hyperband) mapped to
Optuna's SuccessiveHalvingPruner; bad blocks refused in one line with exit 2 (no Optuna
needed: this runs on the login node)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import tools_env

from hpc_tools import early_terminate
from hpc_tools.errors import ToolError

HYPERBAND = {"type": "hyperband", "min_iter": 1, "eta": 3}


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        # wandb's bands (sweeps' tests): min_iter 3, eta 3 -> 3, 9, 27, ...
        ({"type": "hyperband", "min_iter": 3, "eta": 3}, (3, 3, None)),
        # max_iter 81, s 3, eta 3 -> 3, 9, 27; max_iter 18, s 2 -> 2, 6
        ({"type": "hyperband", "max_iter": 81, "s": 3, "eta": 3}, (3, 3, 27)),
        ({"type": "hyperband", "max_iter": 18, "s": 2, "eta": 3, "strict": True}, (2, 3, 6)),
        ({"type": "hyperband", "min_iter": 2}, (2, 3, None)),  # eta: wandb's default 3
    ],
)
def test_wandb_bands_map_to_the_pruner(block, expected) -> None:
    got = early_terminate.parse("s.yml", block, "val_acc")
    assert (got["min_resource"], got["reduction_factor"], got["last_rung"]) == expected


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"type": "asha", "min_iter": 1}, "early_terminate type must be hyperband, got 'asha'"),
        ({"type": "hyperband", "min_iter": 0}, "early_terminate min_iter must be at least 1"),
        ({"type": "hyperband", "min_iter": 1, "eta": 2.5}, "eta must be a whole number"),
        ({"type": "hyperband", "min_iter": "x"}, "min_iter must be a whole number"),
        ({"type": "hyperband", "max_iter": 9}, "needs min_iter, or max_iter and s"),
        ({"type": "hyperband", "min_iter": 1, "max_iter": 9, "s": 1}, "not both"),
        ({"type": "hyperband", "min_iter": 1, "rate": 2}, "unknown key 'rate'"),
    ],
)
def test_a_bad_block_is_refused_in_one_line_with_exit_2(tmp_path, block, message) -> None:
    import yaml

    sweep = tmp_path / "s.yml"
    doc = {
        "program": "p.py",
        "method": "grid",
        "metric": {"name": "val_acc", "goal": "maximize"},
        "parameters": {"lr": {"values": [0.1]}},
        "early_terminate": block,
    }
    sweep.write_text(yaml.safe_dump(doc))
    run = subprocess.run(
        [sys.executable, "-m", "hpc_tools.trials", "--sweep", str(sweep), "--list"],
        capture_output=True,
        text=True,
        env=tools_env(),
    )
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("trials.py: error: ")
    assert message in run.stderr


def test_early_terminate_needs_a_metric(tmp_path) -> None:
    with pytest.raises(ToolError, match="needs metric"):
        early_terminate.parse("s.yml", HYPERBAND, None)
