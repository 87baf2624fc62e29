"""hpc_search.test_tube: the seed's SlurmCluster API over hpc_tools.trials + job_submitter.sh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import HPC_FILES, tools_env

from hpc_search.test_tube import HyperOptArgumentParser, HyperOptNamespace, SlurmCluster

REPO = Path(__file__).resolve().parents[2]

# A stand-in for hpc_files/job_submitter.sh: logs its argv (NUL-separated) and keeps a
# copy of the sweep file it was given.
FAKE_SUBMITTER = """\
#!/usr/bin/env bash
set -euo pipefail
printf '%s\\0' "$@" > "$FAKE_LOG"
printf '%s' "${FOO-unset}" > "$FAKE_LOG.env"
while [ $# -gt 0 ]; do
  if [ "$1" = --sweep ]; then cp "$2" "$FAKE_LOG.sweep.yml"; fi
  shift
done
exit "${FAKE_EXIT:-0}"
"""


def main(hparams):  # the seed's train function; the trials re-run this file
    return ("trained", hparams.learning_rate, hparams.layers)


def seed_parser(strategy: str = "grid_search") -> HyperOptArgumentParser:
    parser = HyperOptArgumentParser(strategy=strategy, add_help=False)
    parser.opt_list(
        "--learning_rate", default=0.001, type=float, options=[1e-3, 1e-2, 1e-1], tunable=True
    )
    parser.opt_list("--layers", default=1, type=float, options=[16, 32, 64], tunable=True)
    parser.opt_list("--note", default="x", options=["unused"], tunable=False)
    return parser


@pytest.fixture
def fake(tmp_path, monkeypatch):
    (tmp_path / "toolkit" / "hpc_files").mkdir(parents=True)  # its project: toolkit/
    script = tmp_path / "toolkit" / "hpc_files" / "fake submitter.sh"
    script.write_text(FAKE_SUBMITTER)
    script.chmod(0o755)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("HPC_JOB_SUBMITTER", str(script))

    def argv() -> list[str]:
        return log.read_text().split("\0")[:-1]

    argv.log = log
    argv.script = script
    return argv


def list_trials(sweep_file: Path, *args: str) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_tools.trials", "--sweep", str(sweep_file), *args, "--list"],
        capture_output=True,
        text=True,
        env=tools_env(),
        check=True,
    )
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_seed_recipe_submits_a_9_trial_grid_through_the_submitter(fake):
    hparams = seed_parser().parse_args([])
    assert isinstance(hparams, HyperOptNamespace)
    cluster = SlurmCluster(hyperparam_optimizer=hparams, log_path="/some/path/to/save")
    cluster.add_command("export NCCL_DEBUG=INFO")
    cluster.add_command("export FOO='a b'")
    cluster.load_modules(["NCCL/2.4.7-1-cuda.10.0", "cuda/11"])
    cluster.per_experiment_nb_nodes = 12
    cluster.per_experiment_nb_gpus = 8
    cluster.per_experiment_nb_cpus = 4
    cluster.job_time = "0-02:00:00"
    cluster.memory_mb_per_node = 16000
    cluster.add_slurm_cmd(cmd="ntasks-per-node", value=8, comment="1 task per gpu")
    cluster.notify_job_status(email="me@example.com", on_done=True, on_fail=True)
    cluster.optimize_parallel_cluster_gpu(main, nb_trials=9, job_name="name_for_squeue")

    argv = fake()
    assert argv[0] == "--sweep"
    assert argv[2:] == [
        "--trials=9",
        "--num-nodes=12",
        "--gpus=8",
        "--cpus=4",
        "--time=0-02:00:00",
        "--exp-name=name_for_squeue",
        "--modules",
        "NCCL/2.4.7-1-cuda.10.0 cuda/11",
        "--sbatch-arg=--mem=16000M",
        "--sbatch-arg=--ntasks-per-node=8",
        "--sbatch-arg=--mail-user=me@example.com",
        "--sbatch-arg=--mail-type=END,FAIL",
    ]
    assert Path(str(fake.log) + ".env").read_text() == "a b"
    assert not Path(argv[1]).exists()  # the temporary sweep file is gone afterwards

    # The API's plan, the submitted sweep file and a hand-written sweeper.yml agree.
    submitted = list_trials(Path(str(fake.log) + ".sweep.yml"), "--trials", "9")
    planned = cluster.plan(main, nb_trials=9)
    assert submitted == planned
    assert len(planned) == 9
    # wandb's grid order: names sorted (layers < learning_rate), the last fastest.
    assert [(t["params"]["layers"], t["params"]["learning_rate"]) for t in planned[:4]] == [
        (16, 1e-3),
        (16, 1e-2),
        (16, 1e-1),
        (32, 1e-3),
    ]
    assert planned[1]["argv"] == [
        "/usr/bin/env",
        "python",
        __file__,
        "--hpc-trial",
        "--layers=16",
        "--learning_rate=0.01",
    ]


def test_plan_equals_a_hand_written_sweep(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    parser = HyperOptArgumentParser(strategy="grid_search")
    parser.opt_list("--lr", type=float, options=[0.01, 0.05])
    parser.opt_list("--layers", type=int, options=[1, 2, 3])
    parser.opt_list("--epochs", type=int, options=[2])
    cluster = SlurmCluster(hyperparam_optimizer=parser)
    by_hand = tmp_path / "sweeper.yml"
    by_hand.write_text(
        textwrap.dedent(f"""\
        program: {script}
        method: grid
        parameters:
          lr: {{values: [0.01, 0.05]}}
          layers: {{values: [1, 2, 3]}}
          epochs: {{value: 2}}
        """)
    )
    assert cluster.plan(str(script), nb_trials=6) == list_trials(by_hand, "--trials", "6")
    assert cluster.plan(str(script), nb_trials=4, seeds=2) == list_trials(
        by_hand, "--trials", "4", "--seeds", "2"
    )


def test_random_search_with_ranges_is_reproducible(tmp_path):
    parser = HyperOptArgumentParser(strategy="random_search")
    parser.opt_range("--lr", type=float, low=1e-4, high=1e-1, log_base=10)
    parser.opt_range("--width", type=int, low=8, high=64)
    parser.opt_range("--dropout", type=float, low=0.0, high=0.5)
    parser.opt_list("--act", options=["relu", "gelu"])
    cluster = SlurmCluster(hyperparam_optimizer=parser, sweep_seed=7)
    first = cluster.plan("train.py", nb_trials=20)
    assert first == cluster.plan("train.py", nb_trials=20)
    assert all(t["source"] == "sweep:random" for t in first)
    assert all(1e-4 <= t["params"]["lr"] <= 1e-1 for t in first)
    assert all(
        isinstance(t["params"]["width"], int) and 8 <= t["params"]["width"] <= 64 for t in first
    )
    assert {t["params"]["act"] for t in first} == {"relu", "gelu"}
    other = SlurmCluster(hyperparam_optimizer=parser, sweep_seed=8).plan("train.py", 20)
    assert other != first


def test_grid_opt_range_spaces_samples():
    parser = HyperOptArgumentParser(strategy="grid_search")
    parser.opt_range("--lr", type=float, low=1e-3, high=1e-1, nb_samples=3, log_base=10)
    parser.opt_range("--n", type=int, low=1, high=3, nb_samples=5)
    spec = parser.sweep_spec("p.py", ["${args}"])
    lr = spec["parameters"]["lr"]["values"]
    assert lr[0] == pytest.approx(1e-3) and lr[1] == pytest.approx(1e-2)
    assert lr[2] == pytest.approx(1e-1)
    assert spec["parameters"]["n"] == {"values": [1, 2, 3]}


def test_cpu_dry_run_list_trials_and_constructor_submitter(tmp_path, fake, monkeypatch):
    monkeypatch.delenv("HPC_JOB_SUBMITTER")
    cluster = SlurmCluster(
        hyperparam_optimizer=seed_parser(), submitter=fake.script, python_cmd="python3 -u"
    )
    cluster.mem_per_gpu = "10G"
    cluster.optimize_parallel_cluster_cpu(
        str(tmp_path / "t.py"), nb_trials=2, job_name="c", dry_run=True, list_trials=True, seeds=3
    )
    assert fake()[2:] == [
        "--trials=2",
        "--seeds=3",
        "--gpus=0",
        "--exp-name=c",
        "--mem-per-gpu=10G",
        "--dry-run",
        "--list-trials",
    ]
    trials = list_trials(Path(str(fake.log) + ".sweep.yml"), "--trials", "2")
    assert trials[0]["argv"][:4] == ["/usr/bin/env", "python3", "-u", str(tmp_path / "t.py")]


def test_a_script_in_the_project_runs_from_the_snapshot(tmp_path, fake, monkeypatch, capsys):
    """The sweep names the script relative to the project (the folder holding hpc_files/):
    the node runs it in the code snapshot. Its absolute path ran the live tree: a trial queued
    before an edit ran the edited code."""
    project = tmp_path / "proj"
    (project / "hpc_files").mkdir(parents=True)
    (project / "hpc_files" / "job_submitter.sh").symlink_to(fake.script)
    (project / "src").mkdir()
    monkeypatch.setenv("HPC_JOB_SUBMITTER", str(project / "hpc_files" / "job_submitter.sh"))
    cluster = SlurmCluster(hyperparam_optimizer=seed_parser())
    cluster.optimize_parallel_cluster_cpu(str(project / "src" / "t.py"), nb_trials=1)
    trials = list_trials(Path(str(fake.log) + ".sweep.yml"), "--trials", "1")
    assert trials[0]["argv"][:3] == ["/usr/bin/env", "python", "src/t.py"]
    assert capsys.readouterr().err == ""
    # outside the project: its absolute path, and a warning that no snapshot holds it
    cluster.optimize_parallel_cluster_cpu(str(tmp_path / "t.py"), nb_trials=1)
    trials = list_trials(Path(str(fake.log) + ".sweep.yml"), "--trials", "1")
    assert trials[0]["argv"][2] == str(tmp_path / "t.py")
    assert "is outside the project" in capsys.readouterr().err


def test_submitter_failure_raises(fake, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "3")
    cluster = SlurmCluster(hyperparam_optimizer=seed_parser())
    with pytest.raises(subprocess.CalledProcessError) as err:
        cluster.optimize_parallel_cluster_gpu(main, nb_trials=1)
    assert err.value.returncode == 3


def test_inside_a_trial_main_runs_instead_of_submitting(fake):
    hparams = seed_parser().parse_args(["--hpc-trial", "--learning_rate=0.1", "--layers=32"])
    cluster = SlurmCluster(hyperparam_optimizer=hparams)
    assert cluster.optimize_parallel_cluster_gpu(main, nb_trials=9) == ("trained", 0.1, 32.0)
    assert not fake.log.exists()


def test_refusals():
    with pytest.raises(ValueError, match="strategy"):
        HyperOptArgumentParser(strategy="bayes")
    cluster = SlurmCluster(hyperparam_optimizer=seed_parser())
    with pytest.raises(ValueError, match="export NAME=VALUE"):
        cluster.add_command("source ~/.bashrc")
    with pytest.raises(TypeError):
        SlurmCluster(hyperparam_optimizer=object())
    empty = SlurmCluster(hyperparam_optimizer=HyperOptArgumentParser())
    with pytest.raises(ValueError, match="no tunable options"):
        empty.plan("t.py", 1)
    hostile = HyperOptArgumentParser()
    hostile.opt_list("--x", options=["a\nb"])
    with pytest.raises(ValueError, match="newline"):
        SlurmCluster(hyperparam_optimizer=hostile).plan("t.py", 1)


def test_end_to_end_trials_rerun_the_script_and_call_main(tmp_path):
    """Submit via a fake submitter that runs every trial the way the node does."""
    script = tmp_path / "my train.py"
    script.write_text(
        textwrap.dedent("""\
        import json, os, sys
        from hpc_search.test_tube import HyperOptArgumentParser, SlurmCluster

        def main(hparams):
            with open(os.environ["RESULTS"], "a") as fh:
                fh.write(json.dumps([hparams.lr, hparams.name]) + "\\n")

        if __name__ == "__main__":
            parser = HyperOptArgumentParser(strategy="grid_search")
            parser.opt_list("--lr", type=float, options=[0.1, 0.2])
            parser.opt_list("--name", options=["a b", "$(touch pwned)"])
            cluster = SlurmCluster(hyperparam_optimizer=parser.parse_args())
            cluster.optimize_parallel_cluster_gpu(main, nb_trials=4, job_name="e2e")
        """)
    )
    (tmp_path / "hpc_files").mkdir()
    node = tmp_path / "hpc_files" / "node submitter.sh"
    node.write_text(
        textwrap.dedent(f"""\
        #!/usr/bin/env bash
        set -euo pipefail
        sweep=$2; shift 2
        cd "$(dirname "$0")/.."  # the project, where the node runs the trials (its snapshot)
        trial_args=()
        for arg; do
          case $arg in --trials=*|--seeds=*|--sweep-seed=*) trial_args+=("$arg") ;; esac
        done
        PYTHONPATH="{HPC_FILES}" "{sys.executable}" -m hpc_tools.trials --sweep "$sweep" \\
          "${{trial_args[@]}}" \\
          --out-dir "$OUT_DIR" >/dev/null
        while IFS= read -r line; do
          eval "set -- $line"
          "$@"
        done < "$OUT_DIR/commands.txt"
        """)
    )
    node.chmod(0o755)
    results = tmp_path / "results.jsonl"
    env = {
        **os.environ,
        "HPC_JOB_SUBMITTER": str(node),
        "RESULTS": str(results),
        "OUT_DIR": str(tmp_path / "sub"),
        "PYTHONPATH": str(REPO),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, check=True)
    got = [json.loads(x) for x in results.read_text().splitlines()]
    assert got == [[0.1, "a b"], [0.1, "$(touch pwned)"], [0.2, "a b"], [0.2, "$(touch pwned)"]]
    assert not (tmp_path / "pwned").exists()
