"""Metrics: a CSV in the run folder (always) and Weights & Biases (when installed and wanted).

Rank 0 only. The CSV ``<run_dir>/metrics.csv`` is appended to across requeues, one row per
value: ``time,step,epoch,name,value`` (long format, so new metric names need no new columns).
Rows logged after the last checkpoint of an interrupted attempt appear again after resume;
readers (``hpc_files/hpc_tools/metrics.py``: results.sh's tables and ``--curves``) keep the last
row for each (name, step). A run that resumes no checkpoint (``new_run``) renames an earlier
run's metrics.csv and W&B run id aside and starts its own.

The W&B mode is :func:`resolve_wandb_mode`'s. The run id is kept in ``<run_dir>/wandb_run_id``
and reused with ``resume="allow"``, so a requeued job continues the same wandb run; in a sweep
(``wandb agent`` set ``WANDB_SWEEP_ID`` and ``WANDB_RUN_ID``) the run id is the agent's. A
requeue ends the run *preempted* (:meth:`MetricsLogger.mark_preempting`), an exception
*failed*; live sync from offline nodes is :func:`trigger_wandb_sync`.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import importlib.util
import logging
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from hpc_harness.checkpoint import aside_name

WANDB_MODES = ("auto", "online", "offline", "disabled")
CSV_NAME = "metrics.csv"
CSV_FIELDS = ("time", "step", "epoch", "name", "value")
WANDB_ID_FILE = "wandb_run_id"
FAILED = "failed"  # the CSV row of a run that ended in an exception
SYNC_DIR_ENV = "HPC_WANDB_SYNC_DIR"  # --wandb-sync login: wandb-osh's communication folder
# Seconds between writes of a running run's records to its .wandb file (a wandb without the
# setting ignores the variable).
FLUSH_INTERVAL_ENV = "WANDB__TRANSACTION_LOG_FLUSH_INTERVAL"


def _has_rows(csv_path: str) -> bool:
    """``csv_path`` holds a row below its header (a job killed at once leaves the header)."""
    try:
        with open(csv_path) as f:
            return bool(f.readline() and f.readline())
    except FileNotFoundError:
        return False


def _server_url() -> SplitResult:
    return urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")


def _address(url: SplitResult, default_host: str = "") -> tuple[str, int]:
    try:
        port = url.port
    except ValueError:
        port = None
    return url.hostname or default_host, port or (80 if url.scheme == "http" else 443)


def wandb_server() -> tuple[str, int]:
    """(host, port) of the W&B server: ``WANDB_BASE_URL`` (self-hosted) or api.wandb.ai."""
    return _address(_server_url(), "api.wandb.ai")


def wandb_proxy(server_host: str) -> tuple[str, int] | None:
    """(host, port) of the proxy wandb (its HTTP client, requests) reaches the server through:
    ``HTTPS_PROXY`` (``HTTP_PROXY`` for an http server) as urllib reads them; None without
    one, or when ``NO_PROXY`` names ``server_host``."""
    import urllib.request  # here: it imports http and email, the probe alone needs it

    proxy = urllib.request.getproxies().get(_server_url().scheme)
    if not proxy or urllib.request.proxy_bypass(server_host):
        return None
    return _address(urlsplit(proxy if "://" in proxy else f"http://{proxy}"))


def _has_api_key() -> bool:
    """``WANDB_API_KEY``, or a netrc entry for the server (``wandb login`` writes one)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        with open(os.path.join(os.path.expanduser("~"), ".netrc")) as f:
            return wandb_server()[0] in f.read().split()
    except OSError:
        return False


def resolve_wandb_mode(requested: str | None) -> tuple[str, str]:
    """Decide the wandb mode; returns ``(mode, reason)`` with mode online/offline/disabled.

    wandb modes (``--wandb``):
        auto      (default) online when wandb is importable and an API key is configured
                  (``WANDB_API_KEY`` or ``wandb login``'s netrc entry for the server),
                  otherwise disabled; ``WANDB_MODE=disabled`` (``offline``, ``dryrun``) in the
                  environment makes it disabled (offline);
                  ``HPC_WANDB`` in the environment overrides the default.
        online    needs a key and a reachable server (``WANDB_BASE_URL`` for a self-hosted one,
                  else api.wandb.ai; through ``HTTPS_PROXY`` when set, as wandb goes); otherwise
                  falls back to offline.
        offline   writes ``<run_dir>/wandb/offline-run-*``; prints the ``wandb sync`` command.
        disabled  no wandb at all (it is not even imported).
    """
    requested = requested or os.environ.get("HPC_WANDB") or "auto"
    if requested not in WANDB_MODES:
        raise ValueError(f"--wandb expects one of {', '.join(WANDB_MODES)}, got '{requested}'")
    if requested == "disabled":
        return "disabled", "requested"
    if importlib.util.find_spec("wandb") is None:
        return "disabled", "wandb is not installed"
    if os.environ.get(SYNC_DIR_ENV):
        return "offline", "--wandb-sync login: hpc_files/wandb_sync.sh uploads it"
    kept_off = os.environ.get("WANDB_MODE", "")  # wandb's own opt-out; init(mode=) beats it
    if requested == "auto" and kept_off in ("disabled", "offline", "dryrun"):
        return ("disabled" if kept_off == "disabled" else "offline"), f"auto: WANDB_MODE={kept_off}"
    if requested == "auto" and not _has_api_key():
        return "disabled", "auto: no wandb API key"
    if requested in ("auto", "online"):
        if not _has_api_key():
            return "offline", "no wandb API key"
        host, port = wandb_server()
        proxy = wandb_proxy(host)
        try:
            socket.create_connection(proxy or (host, port), timeout=3.0).close()
        except OSError:
            where = host if (host, port) == ("api.wandb.ai", 443) else f"{host}:{port}"
            through = f" (through the proxy {proxy[0]}:{proxy[1]})" if proxy else ""
            return "offline", f"{where} not reachable{through}"
        return "online", "requested"
    return requested, "requested"


class MetricsLogger:
    """CSV (+ optional wandb) logger. Does nothing on ranks other than 0."""

    def __init__(
        self,
        run_dir: str,
        enabled: bool = True,
        wandb_mode: str | None = "disabled",
        config: dict[str, Any] | None = None,
        project: str | None = None,
        new_run: bool = False,
    ) -> None:
        self.enabled, self.run_dir = enabled, run_dir
        self.csv_path = os.path.join(run_dir, CSV_NAME)
        self.id_file = os.path.join(run_dir, WANDB_ID_FILE)  # the W&B run id, kept for requeues
        self.wandb_run: Any = None
        self.sync_hook: Any = None  # wandb-osh's trigger, with --wandb-sync login
        self.sync_target = ""  # the folder the trigger names: the run's offline-run-* folder
        self.wandb_exit_code = 0
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        if new_run:
            self._set_aside_earlier_run()
        new = not os.path.exists(self.csv_path) or os.path.getsize(self.csv_path) == 0
        self._file = open(self.csv_path, "a", newline="")
        self._csv = csv.writer(self._file)
        if new:
            self._csv.writerow(CSV_FIELDS)
            self._file.flush()
        mode, reason = resolve_wandb_mode(wandb_mode)
        if mode != "disabled":
            self._start_wandb(mode, reason, config or {}, project)
        elif wandb_mode not in (None, "disabled", "auto"):
            print(f"hpc_harness: wandb disabled ({reason})", flush=True)

    def _set_aside_earlier_run(self) -> None:
        """``new_run`` (the Trainer resumed no checkpoint: ``--no-resume``, or an attempt killed
        before its first one): rows and the W&B run id found in the run folder are an earlier
        run's; they are renamed aside, so that this run's steps neither mix with its rows nor
        go into its W&B run (which drops steps lower than its last)."""
        earlier = [self.csv_path] if _has_rows(self.csv_path) else []
        earlier += [self.id_file] if os.path.exists(self.id_file) else []
        moved = [aside_name(path) for path in earlier]
        for path, aside in zip(earlier, moved):
            os.rename(path, aside)
        if moved:
            where = " and ".join(moved)
            print(
                f"hpc_harness: this run resumes no checkpoint: the earlier run's metrics are in "
                f"{where}",
                flush=True,
            )

    def _start_wandb(
        self, mode: str, reason: str, config: dict[str, Any], project: str | None
    ) -> None:
        import wandb

        if os.environ.get("WANDB_SWEEP_ID") and os.environ.get("WANDB_RUN_ID"):
            run_id = os.environ["WANDB_RUN_ID"]  # the sweep's run, also when handed out again
        elif os.path.exists(self.id_file):
            with open(self.id_file) as f:
                run_id = f.read().strip()
        else:
            run_id = secrets.token_hex(4)
        with open(self.id_file, "w") as f:
            f.write(run_id + "\n")
        if reason != "requested":
            print(f"hpc_harness: wandb {mode} ({reason})", flush=True)
        if mode == "offline" and os.environ.get(SYNC_DIR_ENV):
            # wandb writes a running run's records to its .wandb file every 15 s by default
            # (x_transaction_log_flush_interval); the login node syncs what is written.
            os.environ.setdefault(FLUSH_INTERVAL_ENV, "2")
        self.wandb_run = wandb.init(
            project=project or os.environ.get("project_name") or "hpc_harness",
            name=os.environ.get("exp_name"),
            id=run_id,
            resume="allow",
            mode=mode,
            dir=self.run_dir,
            config=config,
        )
        print(f"hpc_harness: wandb run id {run_id} mode {mode}", flush=True)
        if mode == "offline":
            print(f"hpc_harness: to upload later: wandb sync {self.wandb_run.dir}/..", flush=True)
            self._start_sync_hook()

    def _start_sync_hook(self) -> None:
        """With ``HPC_WANDB_SYNC_DIR``: wandb-osh's hook, which ``_trigger_sync`` calls."""
        where = os.environ.get(SYNC_DIR_ENV)
        if not where:
            return
        try:
            from wandb_osh.hooks import TriggerWandbSyncHook
        except ImportError:
            print(
                f"hpc_harness: warning: {SYNC_DIR_ENV} is set but wandb-osh is not installed "
                "(pip install wandb-osh); the run is synced only by a later wandb sync",
                flush=True,
            )
            return
        self.sync_filter = _OnceFilter()
        osh_log = logging.getLogger("wandb_osh")
        osh_log.addFilter(self.sync_filter)
        if not sys.stderr.isatty():  # its colour codes in a job's log file are noise
            for handler in osh_log.handlers:
                if hasattr(handler.formatter, "no_color"):
                    handler.formatter.no_color = True
        TriggerWandbSyncHook(where)  # makes the folder and says which wandb-osh this is
        self.sync_hook = functools.partial(trigger_wandb_sync, folder=where)
        # The folder that holds the run's .wandb file: wandb-osh's own default, made explicit.
        self.sync_target = os.path.dirname(os.path.abspath(self.wandb_run.dir))
        print(f"hpc_harness: wandb-osh triggers in {where}", flush=True)

    def _trigger_sync(self) -> None:
        """Ask the login node's syncer to upload the run; never stops the training."""
        if self.sync_hook is None:
            return
        try:
            self.sync_hook(self.sync_target)
        except OSError as exc:
            print(f"hpc_harness: warning: could not leave a wandb-osh trigger: {exc}", flush=True)

    def log(
        self, step: int, epoch: int, values: dict[str, float], *, last_at_step: bool = False
    ) -> None:
        """One row of values at ``step``; ``last_at_step``: nothing more is logged at it (the
        Trainer's end-of-epoch evaluation), so with ``--wandb-sync login`` W&B writes the row
        now: it otherwise holds a step's row open until a later step begins, and the login node
        would see an epoch's results only with the next epoch's first log."""
        if not self.enabled:
            return
        now = f"{time.time():.3f}"
        self._csv.writerows((now, step, epoch, k, f"{v:.6g}") for k, v in values.items())
        self._file.flush()
        if self.wandb_run is not None:
            row = {**values, "epoch": epoch}
            if last_at_step and self.sync_hook is not None:
                self.wandb_run.log(row, step=step, commit=True)
            else:
                self.wandb_run.log(row, step=step)
            self._trigger_sync()

    def mark_preempting(self, exit_code: int) -> None:
        """Tell W&B the run is being preempted; ``close()`` then finishes it with ``exit_code``.

        Before the harness exits 42 for a requeue: W&B marks the run *preempted* (not
        finished, not crashed), and a sweep hands it, with its id and parameters, to the next
        agent that asks for work. Errors from wandb here never change the exit code: a TERM
        sent to the whole job also ends wandb's own service process."""
        if self.wandb_run is None:
            return
        self.wandb_exit_code = exit_code
        try:
            self.wandb_run.mark_preempting()
            print(f"hpc_harness: wandb run {self.wandb_run.id} marked preempting", flush=True)
        except Exception as exc:  # wandb's service may be gone (TERM to the whole job)
            print(f"hpc_harness: warning: could not mark the wandb run preempting: {exc}")

    def mark_failed(self, step: int, epoch: int) -> None:
        """The run ends in an exception: a ``failed`` row (value 1) in the CSV, and ``close()``
        finishes the W&B run with exit code 1, so W&B and a sweep see a failed trial."""
        if not self.enabled:
            return
        self.wandb_exit_code = 1
        with contextlib.suppress(OSError):  # the exception on its way out matters more
            self._csv.writerow((f"{time.time():.3f}", step, epoch, FAILED, "1"))
            self._file.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        run, self.wandb_run = self.wandb_run, None
        try:
            if run is not None:
                run.finish(exit_code=self.wandb_exit_code)
        except Exception as exc:
            if not self.wandb_exit_code:
                raise
            print(f"hpc_harness: warning: could not finish the wandb run: {exc}", flush=True)
        # The finished run's last records (summary, exit code) are on disk only now.
        self._trigger_sync()
        if self.sync_hook is not None:
            logging.getLogger("wandb_osh").removeFilter(self.sync_filter)


def trigger_wandb_sync(run_dir: str, folder: str | None = None) -> None:
    """Leave wandb-osh's trigger for the offline run in ``run_dir`` (the folder of its .wandb
    file) in ``folder`` (default ``$HPC_WANDB_SYNC_DIR``), under wandb-osh's own name, written
    whole: wandb-osh's hook creates the file empty and then writes it, and its syncer, reading
    in between, syncs its own folder and deletes the trigger, losing that sync.

    Live sync from offline nodes (``--wandb-sync login`` of the submitter): the job's
    ``HPC_WANDB_SYNC_DIR`` names a folder on the shared filesystem; the run is then offline
    (``auto`` and ``online`` become offline) and after each ``log()`` and at ``close()`` the
    harness leaves a wandb-osh trigger file there (``trigger_wandb_sync``), which
    ``hpc_files/wandb_sync.sh`` on the login node turns into ``wandb sync``. A program outside the
    Trainer does the same after its own ``wandb.log``::

        hpc_harness.metrics.trigger_wandb_sync(os.path.dirname(wandb.run.dir))
    """
    from wandb_osh.util.hash_id import hash_id

    where = Path(folder or os.environ[SYNC_DIR_ENV])
    target = Path(run_dir).resolve().as_posix()
    command = where / f"{hash_id(target)}.command"
    if command.is_file():  # the hook's own warning, through its logger (said once per run)
        logging.getLogger("wandb_osh").warning(
            "Syncing not active or too slow: Command %s file still exists", command
        )
    where.mkdir(parents=True, exist_ok=True)
    partial = where / f".{command.name}.{os.getpid()}"  # not *.command: the syncer skips it
    partial.write_text(target)
    os.replace(partial, command)


class _OnceFilter(logging.Filter):
    """wandb-osh warns at every trigger while no syncer has taken the last one: say it once."""

    def __init__(self) -> None:
        super().__init__()
        self.warned = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "still exists" not in record.getMessage():
            return True
        if self.warned:
            return False
        self.warned = True
        return True
