"""metrics.py with ``HPC_WANDB_SYNC_DIR`` (``--wandb-sync login``): the run is offline and
wandb-osh's trigger hook leaves a ``<hash>.command`` file naming the run's folder after every
``log()`` and at ``close()``; the login node's syncer (hpc_files/wandb_sync.py) consumes them.
A stand-in ``wandb`` module first, then one run with the real wandb (offline). And the row and
exit code of a run that ends in an exception (mark_failed), with the stand-in."""

from __future__ import annotations

import io
import logging
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import JobLog, job_log

from hpc_harness import metrics

pytest.importorskip("wandb_osh")


@pytest.fixture
def sync_dir(tmp_path, monkeypatch) -> Path:
    where = tmp_path / "exp dir" / "wandb_osh"
    monkeypatch.setenv(metrics.SYNC_DIR_ENV, str(where))
    return where


@pytest.fixture
def log(monkeypatch) -> JobLog:
    return job_log(monkeypatch, metrics)


def _triggers(where: Path) -> list[str]:
    return sorted(p.read_text() for p in where.glob("*.command"))


def test_the_sync_folder_makes_auto_and_online_offline_without_a_key_and_leaves_disabled(
    wandb_runs, sync_dir
) -> None:
    reason = "--wandb-sync login: hpc_files/wandb_sync.sh uploads it"
    assert metrics.resolve_wandb_mode("auto") == ("offline", reason)
    assert metrics.resolve_wandb_mode("online") == ("offline", reason)
    assert metrics.resolve_wandb_mode("offline") == ("offline", reason)
    assert metrics.resolve_wandb_mode("disabled") == ("disabled", "requested")


def test_every_log_and_the_close_leave_a_trigger_naming_the_run_folder(
    tmp_path, wandb_runs, sync_dir, log
) -> None:
    logger = metrics.MetricsLogger(str(tmp_path / "run"), wandb_mode="auto")
    (run,) = wandb_runs
    assert run.settings["mode"] == "offline"
    run_folder = str(Path(run.dir).parent.resolve())
    assert _triggers(sync_dir) == []  # nothing to sync before the first log
    for step in range(3):
        logger.log(step, 0, {"loss": 1.0 / (step + 1)})
        assert run.logged[-1] == ({"loss": 1.0 / (step + 1), "epoch": 0}, step)
        # The syncer took the trigger (wandb-osh deletes it after its wandb sync).
        assert _triggers(sync_dir) == [run_folder]
        for trigger in sync_dir.glob("*.command"):
            trigger.unlink()
    logger.close()
    assert run.finished == [0]
    assert _triggers(sync_dir) == [run_folder]
    assert f"hpc_harness: wandb-osh triggers in {sync_dir}" in log.shown


def test_an_untaken_trigger_is_warned_about_once_not_at_every_log(
    tmp_path, wandb_runs, sync_dir, caplog
) -> None:
    logger = metrics.MetricsLogger(str(tmp_path / "run"), wandb_mode="auto")
    for step in range(5):
        logger.log(step, 0, {"loss": 1.0})
    logger.close()
    warned = [r for r in caplog.records if "Syncing not active or too slow" in r.getMessage()]
    (command,) = sync_dir.glob("*.command")
    assert [r.getMessage() for r in warned] == [
        f"Syncing not active or too slow: Command {command} file still exists"
    ]


def test_the_once_filter_passes_wandb_oshs_other_messages() -> None:
    once = metrics._OnceFilter()
    other = logging.LogRecord("wandb_osh", logging.INFO, __file__, 1, "Syncing", None, None)
    assert once.filter(other) and once.filter(other) and not once.warned


def test_the_last_row_of_a_step_is_committed_at_once_only_when_synced(
    tmp_path, wandb_runs, sync_dir, monkeypatch
) -> None:
    """wandb holds a step's row open until a later step: the epoch's evaluation (the Trainer's
    last_at_step) is written at once, so the login node sees it this epoch, not the next."""
    logger = metrics.MetricsLogger(str(tmp_path / "synced"), wandb_mode="auto")
    logger.log(5, 0, {"loss": 1.0})
    logger.log(5, 0, {"test_acc": 0.5}, last_at_step=True)
    logger.close()
    assert wandb_runs[0].commits == [None, True]
    assert wandb_runs[0].logged[-1] == ({"test_acc": 0.5, "epoch": 0}, 5)
    assert os.environ[metrics.FLUSH_INTERVAL_ENV] == "2"
    monkeypatch.delenv(metrics.SYNC_DIR_ENV)
    logger = metrics.MetricsLogger(str(tmp_path / "plain"), wandb_mode="offline")
    logger.log(5, 0, {"test_acc": 0.5}, last_at_step=True)
    logger.close()
    assert wandb_runs[1].commits == [None]


def test_without_the_folder_no_trigger_and_without_wandb_osh_a_warning(
    tmp_path, wandb_runs, monkeypatch, log
) -> None:
    monkeypatch.delenv(metrics.SYNC_DIR_ENV, raising=False)
    logger = metrics.MetricsLogger(str(tmp_path / "plain"), wandb_mode="offline")
    logger.log(0, 0, {"loss": 1.0})
    logger.close()
    assert logger.sync_hook is None
    where = tmp_path / "sync"
    monkeypatch.setenv(metrics.SYNC_DIR_ENV, str(where))
    monkeypatch.setitem(sys.modules, "wandb_osh.hooks", None)  # import fails
    logger = metrics.MetricsLogger(str(tmp_path / "run"), wandb_mode="auto")
    logger.log(0, 0, {"loss": 1.0})
    logger.close()
    assert not where.exists()
    assert any(
        "wandb-osh is not installed (pip install wandb-osh); the run is synced only by a later "
        "wandb sync" in line
        for line in log.shown.splitlines()
    )


def test_a_trigger_that_cannot_be_written_warns_and_training_goes_on(
    tmp_path, wandb_runs, sync_dir, log
) -> None:
    logger = metrics.MetricsLogger(str(tmp_path / "run"), wandb_mode="auto")
    os.rmdir(sync_dir)
    sync_dir.write_text("a file where the folder was")
    logger.log(0, 0, {"loss": 1.0})
    logger.close()
    assert wandb_runs[0].logged and wandb_runs[0].finished == [0]
    assert "could not leave a wandb-osh trigger" in log.shown


def test_an_offline_run_without_the_sync_folder_keeps_wandbs_flush_interval(
    tmp_path, wandb_runs, monkeypatch
) -> None:
    monkeypatch.delenv(metrics.SYNC_DIR_ENV, raising=False)
    metrics.MetricsLogger(str(tmp_path / "plain"), wandb_mode="offline").close()
    assert metrics.FLUSH_INTERVAL_ENV not in os.environ


def test_triggers_go_to_the_folder_of_the_start_even_if_the_variable_changes(
    tmp_path, wandb_runs, sync_dir, monkeypatch
) -> None:
    logger = metrics.MetricsLogger(str(tmp_path / "run"), wandb_mode="auto")
    monkeypatch.setenv(metrics.SYNC_DIR_ENV, str(tmp_path / "elsewhere"))
    logger.log(0, 0, {"loss": 1.0})
    logger.close()
    assert len(_triggers(sync_dir)) == 1 and not (tmp_path / "elsewhere").exists()


def test_a_trigger_makes_its_folder_and_the_folders_above(tmp_path) -> None:
    where = tmp_path / "not" / "yet" / "there"
    metrics.trigger_wandb_sync(str(tmp_path / "run"), str(where))
    assert _triggers(where) == [(tmp_path / "run").resolve().as_posix()]


class _Stderr(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [False, True])
def test_wandb_oshs_colours_are_off_in_a_log_file_and_kept_in_a_terminal(
    tmp_path, wandb_runs, sync_dir, monkeypatch, tty: bool
) -> None:
    formatters = [h.formatter for h in logging.getLogger("wandb_osh").handlers]
    coloured = [f for f in formatters if hasattr(f, "no_color")]
    assert coloured, "wandb-osh's log handler has a colorlog formatter"
    for formatter in coloured:
        monkeypatch.setattr(formatter, "no_color", False)
    monkeypatch.setattr(sys, "stderr", _Stderr(tty))
    metrics.MetricsLogger(str(tmp_path / "run"), wandb_mode="auto").close()
    assert [f.no_color for f in coloured] == [not tty] * len(coloured)


def test_a_run_that_raises_ends_with_a_failed_row_and_exit_code_1(tmp_path, wandb_runs) -> None:
    logger = metrics.MetricsLogger(str(tmp_path / "run"), wandb_mode="offline")
    logger.log(2, 0, {"loss": 1.0})
    logger.mark_failed(3, 1)
    logger.close()
    assert wandb_runs[0].finished == [1]
    rows = (tmp_path / "run" / metrics.CSV_NAME).read_text().splitlines()
    assert rows[-1].split(",")[1:] == ["3", "1", "failed", "1"]
    metrics.MetricsLogger(str(tmp_path / "off"), enabled=False).mark_failed(3, 1)  # no file


def test_a_failed_row_that_cannot_be_written_leaves_the_exception_alone(
    tmp_path, wandb_runs
) -> None:
    logger = metrics.MetricsLogger(str(tmp_path / "run"), wandb_mode="offline")

    def full(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    logger._csv = types.SimpleNamespace(writerow=full)
    logger.mark_failed(3, 1)  # no OSError on top of the run's own exception
    logger.close()
    assert wandb_runs[0].finished == [1]


@pytest.mark.slow
def test_with_the_real_wandb_each_trigger_names_the_folder_whose_records_hold_the_step(
    tmp_path, monkeypatch, sync_dir
) -> None:
    """What the login node's 'wandb sync .' reads: the run's .wandb file in the folder the
    trigger names holds every step logged before it (read as tests/python/fake_wandb does)."""
    pytest.importorskip("wandb")
    from fake_wandb import read_records

    for name in ("WANDB_API_KEY", "WANDB_SWEEP_ID", "WANDB_RUN_ID", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv(metrics.FLUSH_INTERVAL_ENV, "")
    monkeypatch.delenv(metrics.FLUSH_INTERVAL_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    logger = metrics.MetricsLogger(str(tmp_path / "run"), wandb_mode="auto")
    for step in range(3):
        logger.log(step, step, {"loss": float(step)})
        logger.log(step, step, {"test_acc": 0.5}, last_at_step=True)
        (target,) = _triggers(sync_dir)
        (records,) = Path(target).glob("run-*.wandb")
        deadline = time.monotonic() + 60
        while _history_steps(read_records, records) != list(range(step + 1)):
            assert time.monotonic() < deadline, _history_steps(read_records, records)
            time.sleep(0.1)
    logger.close()
    kinds = [r.WhichOneof("record_type") for r in read_records(records)]
    assert "exit" in kinds
    assert _triggers(sync_dir) == [target]


def _history_steps(read_records, path: Path) -> list[int]:
    try:
        found = read_records(path)
    except Exception:  # a record half written: read again
        return []
    return [r.history.step.num for r in found if r.WhichOneof("record_type") == "history"]
