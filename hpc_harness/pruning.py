"""Early termination of a sweep's trials (``early_terminate:`` in the sweep file), no server.

Once per epoch, on every rank, with the sweep's metric (a number, or a dict that holds it)::

    if hp.should_stop_trial(val_acc, epoch + 1):   # steps count from 1; rank 0's value counts
        save_checkpoint(...); sys.exit(0)          # pruned: the sweep goes on without it

The Trainer calls it itself. Outside a sweep with ``early_terminate`` it is False at once. In
one, the submission folder holds ``early_terminate.json`` (hpc_files/hpc_tools/prune.py): rank 0
reports the value to this trial's Optuna trial in the experiment's journal file, and Optuna's
SuccessiveHalvingPruner compares it with the other trials' values at the same rung. A pruned
trial is told PRUNED, and ``$HPC_TRIAL_DIR/pruned`` holds ``STEP VALUE`` (status.sh and
results.sh show PRUNED). Programs outside Python, with the job's python, either run once
per epoch ``python -m hpc_harness.pruning STEP VALUE`` (prints continue, exit 0, or prune,
exit 3), or follow the file protocol under ``command: [python, -m, hpc_harness.pruning,
watch, --, PROGRAM, ${args}]`` (see :func:`watch`): append ``STEP VALUE`` lines to
``$HPC_TRIAL_DIR/reports``; stop (checkpoint, exit 0) once ``$HPC_TRIAL_DIR/pruned`` exists.
A trial pruned before a requeue is pruned again at its next report. Optuna is needed only
inside such a sweep (in the job's environment).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

# In the submission folder, written by hpc_files/hpc_tools/prune.py.
CONFIG = "early_terminate.json"
MARKER = "pruned"  # in $HPC_TRIAL_DIR: "STEP VALUE" of the step the trial was pruned at
REPORTS = "reports"  # in $HPC_TRIAL_DIR: the "STEP VALUE" lines a watched program appends
REPORTED = "reported"  # in $HPC_TRIAL_DIR: the last step watch has judged
PRUNE_EXIT_CODE = 3

_state: dict[str, Any] = {}  # the study and trial, opened once per process


def config() -> dict[str, Any] | None:
    """The submission's early-termination settings, or None (no sweep, or no block)."""
    folder = os.environ.get("HPC_SUBMISSION_DIR")
    if not folder or os.environ.get("HPC_TRIAL_INDEX") is None:
        return None
    try:
        with open(os.path.join(folder, CONFIG), encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def pruner(cfg: dict[str, Any]) -> Any:
    """Optuna's pruner from the settings prune.py mapped from wandb's block (why: there)."""
    import optuna

    return optuna.pruners.SuccessiveHalvingPruner(
        min_resource=cfg["min_resource"],
        reduction_factor=cfg["reduction_factor"],
        min_early_stopping_rate=0,
    )


def prune_now(trial: Any, value: float, step: int, cfg: dict[str, Any]) -> bool:
    """Report ``value`` at ``step`` to a running Optuna trial; True when the pruner stops it."""
    trial.report(value, step)
    last = cfg.get("last_rung")  # wandb's max_iter form checks no band past it
    return (last is None or step <= last) and trial.should_prune()


def _trial(cfg: dict[str, Any]) -> tuple[Any, Any]:
    """(study, this trial's Optuna trial): method bayes asked it at submission; a grid or
    random trial asks its own at its first report (keyed by its index, found again after a
    requeue)."""
    if "trial" in _state:
        return _state["study"], _state["trial"]
    try:
        import optuna
    except ImportError:
        raise RuntimeError(
            "the sweep's early_terminate needs Optuna in the job's environment: pip install "
            "'optuna>=4' (or the project's extra: pip install -e '.[search]')"
        ) from None
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=cfg["study"],
        storage=JournalStorage(JournalFileBackend(cfg["journal"])),
        direction=cfg["goal"],
        pruner=pruner(cfg),
        load_if_exists=True,
    )
    index = int(os.environ["HPC_TRIAL_INDEX"])
    mine = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("trial") == index]
    if mine:
        frozen = mine[-1]
    else:
        asked = study.ask()
        asked.set_user_attr("trial", index)
        frozen = study.get_trials(deepcopy=False)[asked.number]
    _state.update(study=study, trial=frozen)
    return study, frozen


def _value(value: Any, metric: str) -> float | None:
    if isinstance(value, Mapping):
        value = value.get(metric)
        if value is None:
            if not _state.get("warned"):
                _state["warned"] = True
                print(
                    f"hpc_harness: warning: the sweep's early_terminate ranks by {metric}, which "
                    "this program does not report: its trials are never pruned",
                    file=sys.stderr,
                )
            return None
    return float(value)


def report(value: Any, step: int) -> bool:
    """Rank 0's work: report ``value`` at ``step``; True when this trial is (or was) pruned."""
    cfg = config()
    if cfg is None:
        return False
    number = _value(value, cfg["metric"])
    if number is None:
        return False
    import optuna
    from optuna.trial import TrialState

    study, frozen = _trial(cfg)
    state = study._storage.get_trial(frozen._trial_id).state
    if state == TrialState.PRUNED:  # resumed after it was pruned: stop again
        return True
    if state != TrialState.RUNNING:
        return False
    if not prune_now(optuna.trial.Trial(study, frozen._trial_id), number, step, cfg):
        return False
    _write_marker(step, number)
    study.tell(frozen.number, state=TrialState.PRUNED)
    print(f"hpc_harness: pruned at step {step}: {cfg['metric']} {number:g} (early_terminate)")
    return True


def _write_marker(step: int, value: float) -> None:
    folder = os.environ.get("HPC_TRIAL_DIR")
    if folder:
        _write(os.path.join(folder, MARKER), f"{step} {value!r}\n")


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def watch(argv: list[str], poll_s: float = 0.2) -> int:
    """The file protocol: run ``argv`` (the trial's program) and judge each ``STEP VALUE``
    line it appends to ``$HPC_TRIAL_DIR/reports``; a pruned trial finds ``pruned`` there
    (the program checkpoints and exits 0) and ``reported`` holds the last step judged (a
    program that must not run ahead of the pruner waits for it). Lines written before it
    started (an earlier run's, before a requeue) are not judged again; a ``pruned`` file
    older than the submission is an earlier submission's and is removed. Signals (SLURM's
    wall-time USR1, TERM) go to the program; returns its exit code."""
    folder = os.environ["HPC_TRIAL_DIR"]
    reports, marker = os.path.join(folder, REPORTS), os.path.join(folder, MARKER)
    job = os.path.join(os.environ.get("HPC_SUBMISSION_DIR", folder), "job.sbatch")
    if os.path.exists(marker) and os.path.exists(job):
        if os.path.getmtime(marker) < os.path.getmtime(job):
            os.unlink(marker)
    offset = os.path.getsize(reports) if os.path.exists(reports) else 0
    child = subprocess.Popen(argv)
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    pruned = False
    while True:
        ended = child.poll() is not None
        if os.path.exists(reports):
            with open(reports, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
            whole = data[: data.rfind(b"\n") + 1]  # the last line may be half written
            offset += len(whole)
            for line in whole.decode(errors="replace").splitlines():
                try:
                    step, value = int(line.split()[0]), float(line.split()[1])
                except (ValueError, IndexError):
                    print(f"hpc_harness: {reports}: not STEP VALUE: {line!r}", file=sys.stderr)
                    continue
                pruned = pruned or report(value, step)
                _write(os.path.join(folder, REPORTED), f"{step}\n")
        if ended:
            return child.returncode
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = "python -m hpc_harness.pruning"
    if argv[:2] == ["watch", "--"] and len(argv) > 2:
        return watch(argv[2:])
    try:
        step, value = int(argv[0]), float(argv[1])
        if len(argv) != 2 or step < 1 or math.isinf(value):
            raise ValueError
    except (ValueError, IndexError):
        print(
            f"{prog}: error: expects STEP VALUE (a whole step >= 1, a number) or watch -- "
            f"PROGRAM [ARG...], got {argv}",
            file=sys.stderr,
        )
        return 2
    pruned = report(value, step)
    print("prune" if pruned else "continue")
    return PRUNE_EXIT_CODE if pruned else 0


if __name__ == "__main__":
    sys.exit(main())
