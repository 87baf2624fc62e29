"""The examples' hidden testing flags (hpc_harness/examples/faults.py)."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from hpc_harness.examples import faults


def test_the_flags_parse_into_faults_and_none_is_active_by_default() -> None:
    parser = argparse.ArgumentParser()
    faults.add_flags(parser)
    assert not faults.Faults.from_args(parser.parse_args([])).active
    given = parser.parse_args(["--fail-at-step", "3", "--fail-rank", "1", "--step-sleep", "0.5"])
    assert faults.Faults.from_args(given) == faults.Faults(3, 1, 0.5, None)
    assert faults.FLAGS == ("fail_at_step", "fail_rank", "step_sleep", "pause_in_save_at_step")


def test_the_failure_comes_after_its_step_on_its_rank_alone() -> None:
    provoked = faults.Faults(fail_at_step=3, fail_rank=1)
    provoked.after_step(3, 0)
    provoked.after_step(2, 1)
    with pytest.raises(RuntimeError, match=r"^--fail-at-step 3 on rank 1 \(testing aid\)$"):
        provoked.after_step(3, 1)


def test_the_save_at_its_step_is_held_complete_before_its_rename(tmp_path, monkeypatch) -> None:
    held: list = []
    monkeypatch.setattr(
        faults.time, "sleep", lambda s: held.append((s, sorted(os.listdir(tmp_path))))
    )
    provoked = faults.Faults(pause_in_save_at_step=4)
    provoked.write({"a": 1}, str(tmp_path / "x.pt"), step=3)
    assert held == []
    provoked.write({"a": 2}, str(tmp_path / "y.pt"), step=4)
    assert held == [(faults.PAUSE_IN_SAVE_S, [f".y.pt.tmp.{os.getpid()}", "x.pt"])]
    assert torch.load(tmp_path / "y.pt") == {"a": 2}
