"""metrics.py: the wandb key check and network probe follow WANDB_BASE_URL (self-hosted W&B);
the CSV rows, and what MetricsLogger hands to wandb and prints (a stand-in wandb module)."""

from __future__ import annotations

import csv
import glob
import re
import socket
import sys
import time
from typing import Any

import pytest
from conftest import JobLog, free_port, job_log

from hpc_harness import metrics


@pytest.fixture
def server():
    """A local TCP listener standing in for a self-hosted W&B server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_key_for_the_self_hosted_server_in_netrc_counts(tmp_path, monkeypatch, server) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server}")
    (tmp_path / ".netrc").write_text("machine 127.0.0.1\n  login user\n  password abc\n")
    assert metrics.resolve_wandb_mode("online") == ("online", "requested")
    assert metrics.resolve_wandb_mode("auto") == ("online", "requested")


def test_the_probe_goes_to_the_self_hosted_server(tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    closed = free_port()
    monkeypatch.setenv("WANDB_BASE_URL", f"https://127.0.0.1:{closed}")
    assert metrics.resolve_wandb_mode("online") == (
        "offline",
        f"127.0.0.1:{closed} not reachable",
    )


def test_without_base_url_the_key_is_looked_up_for_api_wandb_ai(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    assert metrics._has_api_key()
    assert metrics.wandb_server() == ("api.wandb.ai", 443)


def test_without_a_key_in_the_environment_or_netrc_there_is_none(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no .netrc there
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert metrics._has_api_key() is False


# --------------------------------------------------------------------------- the wandb run
# MetricsLogger against a stand-in ``wandb`` module (in sys.modules, so nothing is imported or
# sent): what it hands to wandb.init, the run id it keeps, what it prints, and the requeue path.


@pytest.fixture
def log(monkeypatch) -> JobLog:
    return job_log(monkeypatch, metrics)


def _logger(run_dir, mode: str = "offline", **kw: Any) -> metrics.MetricsLogger:
    return metrics.MetricsLogger(str(run_dir), wandb_mode=mode, **kw)


def test_a_new_run_gets_an_id_kept_in_the_run_folder_and_says_how_to_sync(
    tmp_path, wandb_runs, log
) -> None:
    logger = _logger(tmp_path, config={"lr": 0.1}, project="proj")
    logger.close()
    (run,) = wandb_runs
    assert re.fullmatch(r"[0-9a-f]{8}", run.id)
    assert (tmp_path / "wandb_run_id").read_text() == run.id + "\n"
    assert run.settings == {
        "project": "proj",
        "name": None,
        "id": run.id,
        "resume": "allow",
        "mode": "offline",
        "dir": str(tmp_path),
        "config": {"lr": 0.1},
    }
    assert log.shown == (
        f"hpc_harness: wandb run id {run.id} mode offline\n"
        f"hpc_harness: to upload later: wandb sync {run.dir}/..\n"
    )
    assert run.finished == [0]


def test_a_requeued_job_continues_the_run_of_its_folder(tmp_path, wandb_runs, monkeypatch) -> None:
    (tmp_path / "wandb_run_id").write_text("0123abcd\n")
    monkeypatch.setenv("WANDB_RUN_ID", "notasweep")  # without WANDB_SWEEP_ID: not an agent's
    _logger(tmp_path).close()
    monkeypatch.delenv("WANDB_RUN_ID")
    monkeypatch.setenv("WANDB_SWEEP_ID", "sw01")  # a sweep id alone names no run
    _logger(tmp_path).close()
    assert [run.settings["id"] for run in wandb_runs] == ["0123abcd", "0123abcd"]
    assert (tmp_path / "wandb_run_id").read_text() == "0123abcd\n"


def test_in_a_sweep_the_agents_run_id_wins_and_is_kept(tmp_path, wandb_runs, monkeypatch) -> None:
    (tmp_path / "wandb_run_id").write_text("0123abcd\n")
    monkeypatch.setenv("WANDB_SWEEP_ID", "sw01")
    monkeypatch.setenv("WANDB_RUN_ID", "swrun042")
    _logger(tmp_path).close()
    assert wandb_runs[0].settings["id"] == "swrun042"
    assert (tmp_path / "wandb_run_id").read_text() == "swrun042\n"


def test_project_and_name_come_from_the_argument_then_the_environment(
    tmp_path, wandb_runs, monkeypatch
) -> None:
    monkeypatch.setenv("project_name", "envproj")
    monkeypatch.setenv("exp_name", "exp1")
    _logger(tmp_path / "a", project="mine").close()
    _logger(tmp_path / "b").close()
    monkeypatch.delenv("project_name")
    monkeypatch.delenv("exp_name")
    _logger(tmp_path / "c").close()
    got = [(run.settings["project"], run.settings["name"]) for run in wandb_runs]
    assert got == [("mine", "exp1"), ("envproj", "exp1"), ("hpc_harness", None)]


def test_a_fallback_to_offline_says_why_before_wandb_starts(
    tmp_path, wandb_runs, log, monkeypatch
) -> None:
    # wandb.init can take long or hang: the job log must already say why the run is offline.
    start = sys.modules["wandb"].init
    shown_at_init = []
    monkeypatch.setattr(
        sys.modules["wandb"], "init", lambda **kw: shown_at_init.append(log.shown) or start(**kw)
    )
    _logger(tmp_path, mode="online").close()  # no API key
    (run,) = wandb_runs
    assert run.settings["mode"] == "offline"
    assert shown_at_init == ["hpc_harness: wandb offline (no wandb API key)\n"]


def test_an_online_run_prints_its_id_and_no_sync_hint(
    tmp_path, wandb_runs, log, monkeypatch, server
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server}")
    _logger(tmp_path, mode="online").close()
    (run,) = wandb_runs
    assert log.shown == f"hpc_harness: wandb run id {run.id} mode online\n"


def test_log_writes_a_csv_row_per_value_and_sends_them_to_wandb_at_the_step(
    tmp_path, wandb_runs
) -> None:
    logger = _logger(tmp_path)
    logger.log(3, 1, {"loss": 0.5, "acc": 0.25})
    logger.close()
    assert wandb_runs[0].logged == [({"loss": 0.5, "acc": 0.25, "epoch": 1}, 3)]
    with open(tmp_path / metrics.CSV_NAME, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(metrics.CSV_FIELDS)
    assert [row[1:] for row in rows[1:]] == [["3", "1", "loss", "0.5"], ["3", "1", "acc", "0.25"]]
    for row in rows[1:]:
        assert re.fullmatch(r"\d+\.\d{3}", row[0]) and abs(float(row[0]) - time.time()) < 60


def test_a_preempted_run_is_finished_with_the_requeue_exit_code(tmp_path, wandb_runs, log) -> None:
    logger = _logger(tmp_path)
    logger.mark_preempting(42)
    (run,) = wandb_runs
    assert run.preempting
    assert log.shown.endswith(f"hpc_harness: wandb run {run.id} marked preempting\n")
    logger.close()
    assert run.finished == [42]


def test_wandb_errors_at_a_requeue_only_warn(tmp_path, wandb_runs, log) -> None:
    logger = _logger(tmp_path)
    run = wandb_runs[0]
    run.fail = RuntimeError("service gone")
    logger.mark_preempting(42)
    logger.close()  # no raise: the requeue's exit code must not change
    assert logger.wandb_exit_code == 42
    assert log.shown.splitlines()[-2:] == [
        "hpc_harness: warning: could not mark the wandb run preempting: service gone",
        "hpc_harness: warning: could not finish the wandb run: service gone",
    ]


def test_a_wandb_error_at_a_normal_end_is_raised(tmp_path, wandb_runs) -> None:
    logger = _logger(tmp_path)
    wandb_runs[0].fail = RuntimeError("service gone")
    with pytest.raises(RuntimeError, match="service gone"):
        logger.close()


def test_without_wandb_preempting_and_closing_do_nothing(tmp_path, log) -> None:
    logger = _logger(tmp_path, mode="disabled")
    logger.mark_preempting(42)
    logger.close()
    assert logger.wandb_exit_code == 0 and log.getvalue() == ""
    other_rank = metrics.MetricsLogger(str(tmp_path / "rank1"), enabled=False)
    other_rank.log(1, 0, {"loss": 1.0})
    other_rank.close()
    assert not (tmp_path / "rank1").exists()


def test_a_new_run_over_an_earlier_ones_folder_gets_a_run_of_its_own(
    tmp_path, wandb_runs, monkeypatch, log
) -> None:
    """``new_run`` (the Trainer resumed nothing): the earlier W&B run id and rows go aside;
    logging this run's steps into that run would mix two runs (and W&B drops steps lower than
    its last). A header-only metrics.csv (killed before its first row) is just reused. In a
    sweep the agent's id still wins."""
    (tmp_path / "wandb_run_id").write_text("0123abcd\n")
    old_rows = b"time,step,epoch,name,value\r\n1.0,7,0,loss,0.5\r\n"
    (tmp_path / metrics.CSV_NAME).write_bytes(old_rows)
    _logger(tmp_path, new_run=True).close()
    assert wandb_runs[0].settings["id"] != "0123abcd"
    assert (tmp_path / "wandb_run_id").read_text() == wandb_runs[0].id + "\n"
    [id_aside] = glob.glob(str(tmp_path / "wandb_run_id.old-*"))
    [csv_aside] = glob.glob(str(tmp_path / "metrics.csv.old-*"))
    assert open(id_aside).read() == "0123abcd\n" and open(csv_aside, "rb").read() == old_rows
    assert log.shown.startswith(
        "hpc_harness: this run resumes no checkpoint: the earlier run's metrics are in "
        f"{csv_aside} and {id_aside}\n"
    )
    assert (tmp_path / metrics.CSV_NAME).read_bytes() == b"time,step,epoch,name,value\r\n"
    _logger(tmp_path, new_run=True).close()  # a header only: used again
    assert glob.glob(str(tmp_path / "metrics.csv.old-*")) == [csv_aside]
    monkeypatch.setenv("WANDB_SWEEP_ID", "sw01")
    monkeypatch.setenv("WANDB_RUN_ID", "swrun042")
    _logger(tmp_path, new_run=True).close()
    assert wandb_runs[-1].settings["id"] == "swrun042"
