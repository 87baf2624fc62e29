"""The login-node half of ``--wandb-sync login``: wandb-osh's syncer for one experiment.

Run by ``hpc_files/wandb_sync.sh [EXP]`` (its --help is USAGE below). The jobs, offline,
leave wandb-osh trigger files in ``$SCRATCH/<project>/<exp>/wandb_osh``; this runs the
package's own syncer on that folder (``wandb_osh.cli.main``: ``wandb-osh --command-dir DIR``, which
runs ``wandb sync .`` in each run folder a trigger names) while any job of the experiment is
queued or running, then stops it and syncs every run once more, so the last records (the
summary and exit code, written as a run finishes) reach W&B whatever the syncer was doing
then. The job ids come from the experiment's submission folders (``job_id``,
``setup_job_id``, ``bayes_controller_job_id``), read again at every poll so that a later
bayes round counts; ``squeue`` says which are alive. Standard library and wandb-osh only.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from hpc_tools.errors import ToolError, report

PROG = "wandb_sync.sh"
# wandb-osh 1.2.2 as it is, and what this file adds around it:
# - its loop never ends: it runs in a child, stopped with SIGINT when the jobs have ended;
# - it unlinks the triggers of a round after syncing them, also one a job rewrote meanwhile:
#   the last pass syncs every run written to since the start, and the triggers left;
# - after a round that took T s it sleeps T - --wait s (not --wait - T): a round of syncs
#   that takes 5 s comes about every 10 s;
# - under pytest (PYTEST_CURRENT_TEST) it neither runs wandb nor loops: the variable is
#   dropped, as the tests here run it for real.
# Its own command line (wandb-osh --command-dir ...), quiet when stop() ends it with SIGINT:
# the KeyboardInterrupt traceback of every normal end would read as a failure.
OSH_CLI = """import sys
from wandb_osh.cli import main


try:
    main(sys.argv[1:])
except KeyboardInterrupt:
    pass
"""
JOB_ID_FILES = ("job_id", "setup_job_id", "bayes_controller_job_id")
SYNC_FOLDER = "wandb_osh"  # the experiment's trigger folder (plan_wandb_sync_dir)

USAGE = """\
Usage: wandb_sync.sh [options] [EXP]

Uploads the W&B runs of experiment EXP (default: the newest submission's) while its
jobs run, for jobs submitted with --wandb-sync login (or a site profile with
'wandb_sync = login'), whose compute nodes cannot reach W&B: the jobs run W&B
offline and leave wandb-osh triggers in $SCRATCH/{project}/EXP/wandb_osh; this runs
wandb-osh's syncer on that folder ('wandb sync' of each run it names, as you, with
your own 'wandb login') until no job of EXP is queued or running, then syncs every
run of EXP once more and exits.

It must outlive your login session: run it under tmux or screen, e.g.
  tmux new -d -s sync 'bash hpc_files/wandb_sync.sh EXP'     (tmux attach -t sync)
  screen -dmS sync bash hpc_files/wandb_sync.sh EXP          (screen -r sync)
Start it after submitting: with no job of EXP queued or running it syncs once and
exits. Ctrl-C stops it (the jobs go on; run it again to resume syncing).

Options:
  --poll SECONDS     how often squeue is asked whether EXP's jobs are still queued
                     or running (default: 10)
  --wait SECONDS     wandb-osh's pause between looks at the trigger folder (default: 1)
  --timeout SECONDS  the longest one 'wandb sync' may take (wandb-osh retries it
                     later; default: 120)
  --project NAME     the project folder under $SCRATCH (default: {project}, the
                     folder holding hpc_files/)
  -h, --help         this help

Needs wandb-osh and wandb for the python that runs it (HPC_PYTHON, else the project's
.venv, else python3: pip install 'wandb-osh' 'wandb'); 'wandb' is taken from PATH,
else from beside that python. Environment: SCRATCH (required).
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ToolError(f"{message} (see --help)")


def parse_args(argv: Sequence[str], project: str) -> argparse.Namespace:
    parser = _Parser(prog=PROG, add_help=False)
    parser.add_argument("exp", nargs="?")
    parser.add_argument("--poll", type=_seconds("--poll"), default=10.0)
    parser.add_argument("--wait", type=_seconds("--wait"), default=1.0)
    parser.add_argument("--timeout", type=_seconds("--timeout"), default=120.0)
    parser.add_argument("--project", default=project)
    return parser.parse_args(argv)


def _seconds(option: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 < value <= 86400:
            accepted = "seconds (a number above 0, at most 86400)"
            raise ToolError(f"{option} expects {accepted}, got {text!r}")
        return value

    return parse


def experiment_dir(project_dir: Path, exp: str | None) -> Path:
    """EXP's folder, or the folder of the newest submission; ToolError when there is none."""
    subs = sorted(project_dir.glob("*/*/job.sbatch"), key=lambda p: p.parent.name)
    exps = sorted({p.parent.parent.name for p in subs if p.parent.parent.name != "hpc_outputs"})
    if exp is None:
        if not subs:
            raise ToolError(f"no submissions under {project_dir}")
        return subs[-1].parent.parent
    if exp not in exps:
        known = ", ".join(exps) or "none"
        raise ToolError(f"no experiment {exp!r} under {project_dir} (experiments: {known})")
    return project_dir / exp


def job_ids(exp_dir: Path) -> list[str]:
    """Every job id the experiment's submission folders name (training, setup, controller)."""
    found = set()
    for sub in exp_dir.glob("*/job.sbatch"):
        for name in JOB_ID_FILES:
            try:
                text = (sub.parent / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit():
                found.add(text)
    return sorted(found, key=int)


def alive_jobs(ids: Sequence[str]) -> list[str] | None:
    """The ids (array tasks as squeue shows them) still queued or running; None when squeue
    failed for another reason than not knowing the jobs (then the caller asks again)."""
    if not ids:
        return []
    result = subprocess.run(
        ["squeue", "--noheader", "--format=%i %T", f"--jobs={','.join(ids)}"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        # squeue refuses a list of jobs it no longer holds: they ended long ago.
        return [] if "Invalid job id" in result.stderr else None
    return [line.split()[0] for line in result.stdout.splitlines() if line.split()]


def final_targets(exp_dir: Path, command_dir: Path, since: float) -> list[Path]:
    """The run folders to sync once more: those the triggers left in the folder name, and
    every offline run under the experiment written to since this syncer started."""
    targets = set()
    for command_file in command_dir.glob("*.command"):
        try:
            targets.add(Path(command_file.read_text().strip()))
        except OSError:
            continue
    for records in exp_dir.glob("**/offline-run-*/run-*.wandb"):
        try:
            if records.stat().st_mtime >= since:
                targets.add(records.parent)
        except OSError:
            continue
    return sorted(t for t in targets if t.is_dir())


def syncer_environment() -> dict[str, str]:
    """The syncer's environment: ``wandb`` from PATH, else from beside this python (a venv's
    bin folder); no colour codes in a log file."""
    env = dict(os.environ)
    here = os.path.dirname(sys.executable)
    env["PATH"] = f"{env['PATH']}:{here}" if env.get("PATH") else here
    if not sys.stderr.isatty():
        env.setdefault("NO_COLOR", "1")
    return env


def say(message: str) -> None:
    sys.stdout.write(f"{PROG}: {message}\n")
    sys.stdout.flush()


def _default_sigint() -> None:
    """In the syncer's process before it starts: a process started in the background ('&')
    ignores SIGINT, and a python started so never raises KeyboardInterrupt: stop() needs it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(process: subprocess.Popen) -> bool:
    """SIGINT: wandb-osh's 'wandb sync' child is killed with it (subprocess.run does so on
    KeyboardInterrupt); KILL after 10 s. A second TERM or Ctrl-C meanwhile would leave the
    syncer running without this process: they are ignored until it has ended. False when
    it had to be killed."""
    signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = [signal.signal(signum, signal.SIG_IGN) for signum in signums]
    try:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=10)
        return True
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False
    finally:
        for signum, handler in zip(signums, before):
            signal.signal(signum, handler)


def run(args: argparse.Namespace) -> int:
    scratch = os.environ.get("SCRATCH", "")
    if not scratch:
        raise ToolError("SCRATCH is not set (the folder job_submitter.sh writes under)")
    exp_dir = experiment_dir(Path(scratch) / args.project, args.exp)
    command_dir = exp_dir / SYNC_FOLDER
    try:
        from wandb_osh.syncer import WandbSyncer
    except ImportError as exc:
        raise ToolError(
            f"wandb-osh is not installed for {sys.executable} ({exc}); pip install wandb-osh, "
            "or set HPC_PYTHON to a python that has it",
            1,
        ) from exc
    # wandb-osh skips the real 'wandb sync' (and stops its loop) under pytest; this tool's
    # own tests run it for real, with a stand-in wandb.
    os.environ.pop("PYTEST_CURRENT_TEST", None)
    command_dir.mkdir(parents=True, exist_ok=True)
    since = time.time() - 1  # file times may lag the clock by a little on a shared filesystem
    syncer = subprocess.Popen(
        [sys.executable, "-c", OSH_CLI, "--command-dir", str(command_dir),
         "--wait", str(args.wait), "--timeout", str(int(args.timeout))],
        env=syncer_environment(),
        preexec_fn=_default_sigint,
    )  # fmt: skip
    say(f"syncing experiment {exp_dir.name} from {command_dir} (wandb-osh pid {syncer.pid})")
    try:
        while True:
            ids = job_ids(exp_dir)
            alive = alive_jobs(ids)
            if alive == []:
                break
            if syncer.poll() is not None:
                raise ToolError(f"wandb-osh exited with code {syncer.returncode}", 1)
            if alive is None:
                say("squeue failed; asking again later")
            time.sleep(args.poll)
    finally:
        if not stop(syncer):
            say("warning: wandb-osh did not stop on SIGINT within 10 s; killed it")
    say(f"no job of {exp_dir.name} is queued or running (jobs: {' '.join(ids) or 'none'})")
    final = WandbSyncer(command_dir, wandb_options=[], timeout=args.timeout)
    for target in final_targets(exp_dir, command_dir, since):
        say(f"last sync of {target}")
        try:
            final.sync(target)
        except subprocess.TimeoutExpired:
            say(f"warning: wandb sync of {target} timed out; run 'wandb sync {target}'")
    for command_file in command_dir.glob("*.command"):
        command_file.unlink(missing_ok=True)
    say("done")
    return 0


def _interrupt(signum: int, _frame: object) -> NoReturn:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    project = os.environ.get("HPC_PROJECT_NAME", "<project>")
    before_end = args[: args.index("--")] if "--" in args else args
    if "-h" in before_end or "--help" in before_end:  # help wins over bad options
        sys.stdout.write(USAGE.format(project=project))
        return 0
    # tmux kill-session and a logout send TERM (HUP): stop wandb-osh on the way out too.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    try:
        return run(parse_args(args, project))
    except ToolError as exc:
        return report(PROG, exc)
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted; the jobs go on (run it again to sync)\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
