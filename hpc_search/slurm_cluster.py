"""test-tube's SlurmCluster + HyperOptArgumentParser, as a door onto job_submitter.sh.

The Lightning docs' recipe keeps working, but nothing here writes a batch script: the
search space becomes a sweep file in the format ``sweeper.yml`` uses, and
``hpc_files/job_submitter.sh --sweep FILE --trials N ...`` submits it, so the trials are
exactly what ``python3 -m hpc_tools.trials --sweep FILE --list`` prints (hpc_files/ on
PYTHONPATH; ``SlurmCluster.plan()`` shows them without submitting)::

    from hpc_search.test_tube import HyperOptArgumentParser, SlurmCluster

    parser = HyperOptArgumentParser(strategy="grid_search")
    parser.opt_list("--learning_rate", type=float, options=[1e-3, 1e-2, 1e-1], tunable=True)
    parser.opt_list("--layers", type=int, options=[16, 32, 64], tunable=True)
    cluster = SlurmCluster(hyperparam_optimizer=parser.parse_args(), log_path="/unused")
    cluster.per_experiment_nb_gpus = 2
    cluster.optimize_parallel_cluster_gpu(main, nb_trials=9, job_name="lr_layers")

On the login node that call submits a 9-task array job; each task runs this file again as
``python FILE --hpc-trial --learning_rate=0.01 --layers=32``, where the same call runs
``main(hparams)`` instead of submitting.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Union

REPO = Path(__file__).resolve().parent.parent
HPC_FILES = REPO / "hpc_files"  # the folder of the hpc_tools package (python -m hpc_tools.trials)
SUBMITTER_ENV = "HPC_JOB_SUBMITTER"
TRIAL_FLAG = "--hpc-trial"

MainOrScript = Union[Callable[..., Any], str, os.PathLike]


class HyperOptNamespace(argparse.Namespace):
    """parse_args()'s result: the values, plus a hidden link back to the parser."""

    __slots__ = ("_hyperopt_parser",)

    @property
    def hyperopt_parser(self) -> HyperOptArgumentParser:
        return self._hyperopt_parser


class HyperOptArgumentParser(argparse.ArgumentParser):
    """argparse with tunable options; strategy 'grid_search' or 'random_search'."""

    def __init__(self, strategy: str = "grid_search", **kwargs: Any) -> None:
        if strategy not in ("grid_search", "random_search"):
            raise ValueError(f"strategy must be 'grid_search' or 'random_search', got {strategy!r}")
        super().__init__(**kwargs)
        self.strategy = strategy
        self.tunables: list[dict] = []
        # Set on the command line of every trial this parser's script runs as.
        self.add_argument(TRIAL_FLAG, dest="hpc_trial", action="store_true", help=argparse.SUPPRESS)

    def _tunable_name(self, args: Sequence[str]) -> str:
        longs = [a for a in args if a.startswith("--")]
        if not longs:
            raise ValueError(f"a tunable option needs a --long name, got {list(args)!r}")
        return longs[0][2:]

    def opt_list(
        self, *args: str, options: Sequence[Any], tunable: bool = True, **kwargs: Any
    ) -> argparse.Action:
        """add_argument(*args, **kwargs); if tunable, search over ``options``."""
        action = self.add_argument(*args, **kwargs)
        if tunable:
            options = list(options)
            if not options:
                raise ValueError(f"{args[0]}: options is empty")
            self.tunables.append({"name": self._tunable_name(args), "values": options})
        return action

    def opt_range(
        self,
        *args: str,
        low: float,
        high: float,
        nb_samples: int = 10,
        log_base: float | None = None,
        tunable: bool = True,
        **kwargs: Any,
    ) -> argparse.Action:
        """add_argument(*args, **kwargs); if tunable, search over [low, high].

        grid_search: nb_samples evenly spaced values (geometric with log_base).
        random_search: ``uniform`` / ``int_uniform`` / ``log_uniform_values`` (log_base
        given); nb_trials draws, seeded by ``SlurmCluster(sweep_seed=...)`` (default 0).
        In both, opt_list's options become ``values``; a grid runs its first nb_trials
        points, the first option varying slowest.
        """
        action = self.add_argument(*args, **kwargs)
        if not tunable:
            return action
        if low > high:
            raise ValueError(f"{args[0]}: low {low} > high {high}")
        if log_base is not None and low <= 0:
            raise ValueError(f"{args[0]}: log_base needs low > 0")
        is_int = kwargs.get("type") is int
        name = self._tunable_name(args)
        if self.strategy == "grid_search":
            if nb_samples < 1:
                raise ValueError(f"{args[0]}: nb_samples must be >= 1")
            values = _spaced(low, high, nb_samples, log_base is not None)
            if is_int:
                values = list(dict.fromkeys(int(round(v)) for v in values))
            self.tunables.append({"name": name, "values": values})
        elif is_int and log_base is None:
            self.tunables.append(
                {"name": name, "distribution": "int_uniform", "min": int(low), "max": int(high)}
            )
        else:
            dist = "log_uniform_values" if log_base is not None else "uniform"
            if is_int:
                dist = "q_log_uniform_values"
            spec = {"name": name, "distribution": dist, "min": float(low), "max": float(high)}
            if is_int:
                spec["q"] = 1
            self.tunables.append(spec)
        return action

    def parse_args(
        self,
        args: Sequence[str] | None = None,  # type: ignore[override]
        namespace: Any = None,
    ) -> HyperOptNamespace:
        ns = super().parse_args(args, namespace or HyperOptNamespace())
        if isinstance(ns, HyperOptNamespace):
            ns._hyperopt_parser = self
        return ns

    def sweep_spec(self, program: str, command: list[str]) -> dict:
        """The sweep (sweeper.yml format) this parser describes."""
        if not self.tunables:
            raise ValueError("no tunable options: add opt_list/opt_range(..., tunable=True)")
        params = {}
        for t in self.tunables:
            body = {k: v for k, v in t.items() if k != "name"}
            if "values" in body and len(body["values"]) == 1:
                body = {"value": body["values"][0]}
            params[t["name"]] = body
        return {
            "program": program,
            "method": "grid" if self.strategy == "grid_search" else "random",
            "parameters": params,
            "command": command,
        }


def _spaced(low: float, high: float, n: int, log: bool) -> list[float]:
    if n == 1:
        return [low]
    if log:
        a, b = math.log(low), math.log(high)
        return [math.exp(a + (b - a) * i / (n - 1)) for i in range(n)]
    return [low + (high - low) * i / (n - 1) for i in range(n)]


class SlurmCluster:
    """Settings for one submission; optimize_parallel_cluster_* submit the search."""

    def __init__(
        self,
        hyperparam_optimizer: HyperOptArgumentParser | HyperOptNamespace,
        log_path: str | None = None,
        python_cmd: str = "python",
        submitter: str | os.PathLike | None = None,
        sweep_seed: int | None = None,
        enable_log_err: bool = True,
        enable_log_out: bool = True,
        test_tube_exp_name: str | None = None,
    ) -> None:
        if isinstance(hyperparam_optimizer, HyperOptArgumentParser):
            self.parser = hyperparam_optimizer
            self.hparams: HyperOptNamespace | None = None
        elif isinstance(hyperparam_optimizer, HyperOptNamespace):
            self.parser = hyperparam_optimizer.hyperopt_parser
            self.hparams = hyperparam_optimizer
        else:
            raise TypeError(
                "hyperparam_optimizer must be a HyperOptArgumentParser or what its "
                "parse_args() returned"
            )
        self.log_path = log_path
        self.python_cmd = python_cmd
        self.submitter = submitter
        self.sweep_seed = sweep_seed
        self.per_experiment_nb_nodes: int | None = None
        self.per_experiment_nb_gpus: int | None = None
        self.per_experiment_nb_cpus: int | None = None
        self.job_time: str | None = None
        self.memory_mb_per_node: int | None = None
        self.mem_per_gpu: str | None = None
        self.modules: list[str] = []
        self.slurm_commands: list[tuple[str, Any, str | None]] = []
        self.env: dict[str, str] = {}
        self.email: str | None = None
        self.notify_on_end = False
        self.notify_on_fail = False

    # -- settings -------------------------------------------------------------
    def add_slurm_cmd(self, cmd: str, value: Any = None, comment: str | None = None) -> None:
        """An extra #SBATCH option, e.g. add_slurm_cmd('ntasks-per-node', 8)."""
        self.slurm_commands.append((cmd.lstrip("-"), value, comment))

    def load_modules(self, modules: Sequence[str]) -> None:
        self.modules.extend(modules)

    def add_command(self, cmd: str) -> None:
        """Only ``export NAME=VALUE``: it reaches the job through the environment."""
        words = shlex.split(cmd)
        if (
            len(words) == 2
            and words[0] == "export"
            and "=" in words[1]
            and words[1].split("=", 1)[0].isidentifier()
        ):
            name, value = words[1].split("=", 1)
            self.env[name] = value
            return
        raise ValueError(
            f"add_command supports only 'export NAME=VALUE', got {cmd!r}; put "
            "other setup in a wrapper script and submit that"
        )

    def notify_job_status(self, email: str, on_done: bool = False, on_fail: bool = False) -> None:
        self.email = email
        self.notify_on_end = on_done
        self.notify_on_fail = on_fail

    # -- what runs ------------------------------------------------------------
    def _program(self, main_or_script: MainOrScript) -> tuple[str, list[str]]:
        python = shlex.split(self.python_cmd)
        interp = ["${interpreter}"] if python == ["python"] else python
        if callable(main_or_script):
            module = sys.modules.get(main_or_script.__module__)
            path = getattr(module, "__file__", None) or inspect.getsourcefile(main_or_script)
            if not path:
                raise ValueError(f"cannot find the file that defines {main_or_script!r}")
            program = self._in_snapshot(Path(path))
            return program, ["${env}", *interp, "${program}", TRIAL_FLAG, "${args}"]
        program = self._in_snapshot(Path(main_or_script))
        return program, ["${env}", *interp, "${program}", "${args}"]

    def _in_snapshot(self, script: Path) -> str:
        """The script's path relative to the project (the folder holding hpc_files/, as
        job_submitter.sh's project_paths has it): the trials run from the code snapshot taken
        at submission, not the live tree a later edit changes. A script outside the project
        keeps its absolute path (no snapshot holds it), with a warning."""
        script = script.resolve()
        project = Path(os.path.abspath(self._submitter_path())).parent.parent.resolve()
        if script.is_relative_to(project):
            return str(script.relative_to(project))
        print(
            f"hpc_search: warning: {script} is outside the project {project}: the trials run "
            "it as it is when they start, not a snapshot of it",
            file=sys.stderr,
        )
        return str(script)

    def write_sweep(self, main_or_script: MainOrScript, path: str | os.PathLike) -> dict:
        """Write the sweep file for this search; return the spec."""
        import yaml

        program, command = self._program(main_or_script)
        spec = self.parser.sweep_spec(program, command)
        Path(path).write_text(
            yaml.safe_dump(spec, sort_keys=False, default_flow_style=False), encoding="utf-8"
        )
        return spec

    def _with_sweep(self, main_or_script: MainOrScript, fn: Callable[[str], Any]) -> Any:
        tmp = tempfile.mkdtemp(prefix="hpc_sweep_")
        try:
            path = os.path.join(tmp, "sweep.yml")
            self.write_sweep(main_or_script, path)
            return fn(path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _trials_args(self, nb_trials: int, seeds: int | None) -> list[str]:
        args = [f"--trials={int(nb_trials)}"]
        if self.sweep_seed is not None:
            args.append(f"--sweep-seed={int(self.sweep_seed)}")
        if seeds is not None:
            args.append(f"--seeds={int(seeds)}")
        return args

    def plan(
        self, main_or_script: MainOrScript, nb_trials: int, seeds: int | None = None
    ) -> list[dict]:
        """The trials a submission would run: ``hpc_tools.trials --sweep FILE --list``, parsed."""

        def run(path: str) -> list[dict]:
            argv = [
                sys.executable,
                "-m",
                "hpc_tools.trials",
                "--prog",
                "SlurmCluster.plan",
                "--sweep",
                path,
                *self._trials_args(nb_trials, seeds),
                "--list",
            ]
            path_env = os.pathsep.join(filter(None, [str(HPC_FILES), os.environ.get("PYTHONPATH")]))
            env = {**os.environ, "PYTHONPATH": path_env}
            proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
            if proc.returncode != 0:
                raise ValueError(proc.stderr.strip())
            return [json.loads(line) for line in proc.stdout.splitlines()]

        return self._with_sweep(main_or_script, run)

    def submitter_argv(
        self,
        sweep_file: str,
        nb_trials: int,
        job_name: str | None,
        gpus: int | None,
        seeds: int | None = None,
        dry_run: bool = False,
        list_trials: bool = False,
        extra_args: Sequence[str] = (),
    ) -> list[str]:
        """The job_submitter.sh command line (an argv list, never a shell string).

        Only settings you set are passed: per_experiment_nb_nodes -> ``--num-nodes``,
        per_experiment_nb_gpus -> ``--gpus`` (``optimize_parallel_cluster_cpu`` passes
        ``--gpus=0``), per_experiment_nb_cpus -> ``--cpus``, job_time -> ``--time`` (as
        given), job_name -> ``--exp-name``, load_modules -> ``--modules "a b"``,
        memory_mb_per_node -> ``--sbatch-arg=--mem=NM``, mem_per_gpu ->
        ``--mem-per-gpu=X``, add_slurm_cmd -> ``--sbatch-arg=--CMD=V``, notify_job_status ->
        ``--sbatch-arg=--mail-user=..`` and ``--mail-type=END,FAIL``. add_command("export
        NAME=VALUE") goes to the submitter's environment (sbatch's default ``--export=ALL``
        carries it into the job). log_path is accepted and unused: logs go where the
        submitter puts them.
        """
        argv = [self._submitter_path(), "--sweep", sweep_file, *self._trials_args(nb_trials, seeds)]
        if self.per_experiment_nb_nodes is not None:
            argv.append(f"--num-nodes={int(self.per_experiment_nb_nodes)}")
        if gpus is not None:
            argv.append(f"--gpus={int(gpus)}")
        if self.per_experiment_nb_cpus is not None:
            argv.append(f"--cpus={int(self.per_experiment_nb_cpus)}")
        if self.job_time is not None:
            argv.append(f"--time={self.job_time}")
        if job_name:
            argv.append(f"--exp-name={job_name}")
        if self.modules:
            argv += ["--modules", " ".join(self.modules)]
        if self.mem_per_gpu is not None:  # the submitter's own: sbatch refuses it beside --mem
            argv.append(f"--mem-per-gpu={self.mem_per_gpu}")
        sbatch = []
        if self.memory_mb_per_node is not None:
            sbatch.append(f"--mem={int(self.memory_mb_per_node)}M")
        for cmd, value, _comment in self.slurm_commands:
            sbatch.append(f"--{cmd}" if value is None else f"--{cmd}={value}")
        if self.email:
            types = [
                t for t, on in (("END", self.notify_on_end), ("FAIL", self.notify_on_fail)) if on
            ]
            sbatch.append(f"--mail-user={self.email}")
            if types:
                sbatch.append(f"--mail-type={','.join(types)}")
        argv += [f"--sbatch-arg={s}" for s in sbatch]
        if dry_run:
            argv.append("--dry-run")
        if list_trials:
            argv.append("--list-trials")
        argv += list(extra_args)
        return argv

    def _submitter_path(self) -> str:
        path = self.submitter or os.environ.get(SUBMITTER_ENV) or (HPC_FILES / "job_submitter.sh")
        return str(path)

    def _optimize(
        self,
        main_or_script: MainOrScript,
        nb_trials: int,
        job_name: str | None,
        gpus: int | None,
        **options: Any,
    ) -> subprocess.CompletedProcess | Any:
        """Submit, or inside a trial run main; options: submitter_argv's keywords."""
        if self.hparams is not None and getattr(self.hparams, "hpc_trial", False):
            if not callable(main_or_script):
                raise ValueError(f"{TRIAL_FLAG} is set but main_or_script is not a function")
            return main_or_script(self.hparams)  # inside a trial: train, do not submit

        def submit(path: str) -> subprocess.CompletedProcess:
            argv = self.submitter_argv(path, nb_trials, job_name, gpus, **options)
            if not os.access(argv[0], os.X_OK):
                argv.insert(0, "bash")
            return subprocess.run(argv, env={**os.environ, **self.env}, check=True)

        return self._with_sweep(main_or_script, submit)

    def optimize_parallel_cluster_gpu(
        self,
        main_or_script: MainOrScript,
        nb_trials: int,
        job_name: str | None = None,
        *,
        seeds: int | None = None,
        dry_run: bool = False,
        list_trials: bool = False,
        extra_args: Sequence[str] = (),
    ) -> Any:
        """Submit nb_trials trials as one array job (GPU settings as configured).

        Inside a trial (the script re-run with --hpc-trial) call main(hparams) instead.
        Raises subprocess.CalledProcessError if the submitter fails.
        """
        return self._optimize(
            main_or_script,
            nb_trials,
            job_name,
            self.per_experiment_nb_gpus,
            seeds=seeds,
            dry_run=dry_run,
            list_trials=list_trials,
            extra_args=extra_args,
        )

    def optimize_parallel_cluster_cpu(
        self,
        main_or_script: MainOrScript,
        nb_trials: int,
        job_name: str | None = None,
        **options: Any,
    ) -> Any:
        """As optimize_parallel_cluster_gpu (the same keyword options), with --gpus=0."""
        return self._optimize(main_or_script, nb_trials, job_name, 0, **options)
