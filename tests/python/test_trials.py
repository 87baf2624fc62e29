"""hpc_tools.trials: configs file / sweep file / --seeds -> trials manifest."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tools_env

REPO = Path(__file__).resolve().parents[2]

GRID = """\
program: train.py
method: grid
metric: {name: val_acc, goal: maximize}
parameters:
  lr:
    values: [0.01, 0.05]
  layers:
    values: [1, 2, 3]
  epochs:
    value: 2
"""

RANDOM = """\
program: train.py
method: random
parameters:
  a: {distribution: uniform, min: -1, max: 1}
  b: {distribution: log_uniform_values, min: 1.0e-5, max: 1.0e-1}
  c: {values: [x, y, z], probabilities: [0.2, 0.3, 0.5]}
  d: {distribution: int_uniform, min: 1, max: 4}
  e: {distribution: q_uniform, min: 0, max: 100, q: 8}
  f: {distribution: q_log_uniform_values, min: 1, max: 1000, q: 0.5}
  g: {distribution: normal, mu: 3, sigma: 0.1}
  h: {distribution: q_normal, mu: 3, sigma: 10}
  i: {distribution: log_normal}
  j: {distribution: inv_log_uniform_values, min: 0.01, max: 0.1}
  k: {distribution: inv_log_uniform, min: 0, max: 3}
  l: {distribution: log_uniform, min: 0, max: 3}
  m: {distribution: q_log_normal, q: 2}
  n: {value: true}
  o: {min: 0.5, max: 2}
  p: {values: [small, big]}
"""


def run(*args: str, cwd: Path | None = None, python_flags: tuple[str, ...] = ()):
    return subprocess.run(
        [sys.executable, *python_flags, "-m", "hpc_tools.trials", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=tools_env(),
        check=False,
    )


def manifest(*args: str, cwd: Path | None = None) -> list[dict]:
    proc = run(*args, "--list", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture
def write(tmp_path: Path):
    def _write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    return _write


def bash_argv(line: str) -> list[str]:
    """What the node gets from eval "set -- $line"."""
    out = subprocess.run(
        ["bash", "-c", 'eval "set -- $1"; printf "%s\\0" "$@"', "_", line],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split("\0")[:-1]


# ------------------------------------------------------------------ sweeps


def test_grid_2x3_in_wandb_order_sorted_names_last_fastest(write):
    trials = manifest("--sweep", write("s.yml", GRID))
    assert [t["trial"] for t in trials] == list(range(6))
    assert [(t["params"]["layers"], t["params"]["lr"]) for t in trials] == [
        (1, 0.01),
        (1, 0.05),
        (2, 0.01),
        (2, 0.05),
        (3, 0.01),
        (3, 0.05),
    ]
    assert trials[3] == {
        "trial": 3,
        "source": "sweep:grid",
        "params": {"lr": 0.05, "layers": 2, "epochs": 2},
        "argv": ["/usr/bin/env", "python", "train.py", "--epochs=2", "--layers=2", "--lr=0.05"],
    }


def test_grid_order_matches_wandb_sweeps_package(write):
    sweeps = pytest.importorskip("sweeps")  # pip install 'wandb[sweeps]' (pins numpy < 2)
    text = (
        "program: t.py\nmethod: grid\nparameters:\n  b: {values: [1, 1.0, 2]}\n"
        "  A: {values: [x, y]}\n  c: {distribution: q_uniform, min: 0, max: 1, q: 0.25}\n"
        "  d: {distribution: int_uniform, min: 1, max: 2}\n  e: {value: 5}\n"
    )
    config = yaml_load(text)
    runs = []
    while (run_ := sweeps.next_run(config, runs, validate=True)) is not None:
        run_.state = sweeps.RunState.finished
        runs.append(run_)
    expected = [json.dumps({k: v["value"] for k, v in r.config.items()}) for r in runs]
    trials = manifest("--sweep", write("s.yml", text))
    assert [json.dumps(t["params"]) for t in trials] == expected  # 1 and 1.0 told apart


def test_grid_duplicate_values_take_the_last_ones_value_at_the_first_ones_place(write):
    # wandb's grid (sweeps/grid_search.py, checked with sweeps 0.3.0): values that hash alike
    # (1 and 1.0) are one grid point, at the first one's place, and its value is the last one's
    # (dict(zip(hashes, values))): the agent passes --b=1.0, which argparse's int refuses.
    text = "program: t.py\nmethod: grid\nparameters:\n  b: {values: [1, 2, 1.0, 2]}\n"
    trials = manifest("--sweep", write("s.yml", text))
    assert [json.dumps(t["params"]) for t in trials] == ['{"b": 1.0}', '{"b": 2}']
    assert [t["argv"][-1] for t in trials] == ["--b=1.0", "--b=2"]


def yaml_load(text: str):
    import yaml

    return yaml.safe_load(text)


def test_grid_trials_keeps_first_n_and_int_uniform_enumerates(write):
    path = write(
        "s.yml",
        "program: t.py\nmethod: grid\nparameters:\n"
        "  a: {distribution: int_uniform, min: 3, max: 5}\n  b: {values: [x]}\n",
    )
    assert [t["params"] for t in manifest("--sweep", path)] == [
        {"a": 3, "b": "x"},
        {"a": 4, "b": "x"},
        {"a": 5, "b": "x"},
    ]
    q_grid = write(
        "q.yml",
        "program: t.py\nmethod: grid\nparameters:\n"
        "  a: {distribution: q_uniform, min: 0, max: 1, q: 0.25}\n",
    )
    assert [t["params"]["a"] for t in manifest("--sweep", q_grid)] == [0.0, 0.25, 0.5, 0.75]
    assert [t["params"]["a"] for t in manifest("--sweep", path, "--trials", "2")] == [3, 4]


def test_repo_sweeper_yml_is_a_valid_2x3_grid():
    trials = manifest("--sweep", str(REPO / "sweeper.yml"))
    assert len(trials) == 6
    assert trials[0]["argv"][:4] == ["/usr/bin/env", "python", "-m", "hpc_harness.train"]
    assert all(t["params"]["epochs"] == 2 for t in trials)


def test_repo_experiment_configurations_txt_parses():
    trials = manifest("--configs", str(REPO / "experiment_configurations.txt"))
    assert trials and trials[0]["argv"][:3] == ["python", "-m", "hpc_harness.train"]


def test_random_is_seeded_reproducible_and_prefix_stable(write):
    path = write("r.yml", RANDOM)
    first = run("--sweep", path, "--trials", "50", "--list")
    again = run("--sweep", path, "--trials", "50", "--list")
    other = run("--sweep", path, "--trials", "50", "--sweep-seed", "1", "--list")
    fewer = run("--sweep", path, "--trials", "10", "--list")
    assert first.returncode == 0, first.stderr
    assert first.stdout == again.stdout
    assert first.stdout != other.stdout
    assert first.stdout.startswith(fewer.stdout)


def test_random_values_stay_in_their_ranges(write):
    trials = manifest("--sweep", write("r.yml", RANDOM), "--trials", "300")
    ps = [t["params"] for t in trials]
    assert all(-1 <= p["a"] <= 1 for p in ps)
    assert all(1e-5 <= p["b"] <= 1e-1 for p in ps)
    assert {p["c"] for p in ps} == {"x", "y", "z"}
    assert {p["d"] for p in ps} == {1, 2, 3, 4}
    assert all(isinstance(p["e"], int) and p["e"] % 8 == 0 for p in ps)
    assert all((p["f"] * 2).is_integer() for p in ps)
    assert all(2 < p["g"] < 4 for p in ps)
    assert all(isinstance(p["h"], int) for p in ps)
    assert all(p["i"] > 0 for p in ps)
    assert all(0.01 <= p["j"] <= 0.1 for p in ps)
    assert all(math.exp(-3) <= p["k"] <= 1 for p in ps)
    assert all(1 <= p["l"] <= math.exp(3) for p in ps)
    assert all(p["m"] % 2 == 0 for p in ps)
    assert all(p["n"] is True for p in ps)
    assert all(0.5 <= p["o"] <= 2 for p in ps)
    assert "--n=True" in trials[0]["argv"]  # booleans are str()-formatted, like wandb agent


def test_command_macros(write):
    path = write(
        "m.yml",
        """\
program: prog.py
method: grid
parameters:
  flag: {values: [true, false]}
  lr: {value: 0.1}
command:
  - ${env}
  - ${interpreter}
  - ${program}
  - ${args_no_boolean_flags}
  - ${args_no_hyphens}
  - ${args_json}
  - --literal=${SLURM_TMPDIR}
""",
    )
    trials = manifest("--sweep", path)
    assert trials[0]["argv"] == [
        "/usr/bin/env",
        "python",
        "prog.py",
        "--flag",
        "--lr=0.1",
        "flag=True",
        "lr=0.1",
        '{"flag": true, "lr": 0.1}',
        "--literal=${SLURM_TMPDIR}",
    ]
    assert trials[1]["argv"][3:6] == ["--lr=0.1", "flag=False", "lr=0.1"]


def test_seeds_repeat_each_trial_trial_major(write):
    trials = manifest("--sweep", write("s.yml", GRID), "--seeds", "3")
    assert len(trials) == 18
    assert [(t["params"]["lr"], t["params"]["seed"]) for t in trials[:6]] == [
        (0.01, 0),
        (0.01, 1),
        (0.01, 2),
        (0.05, 0),
        (0.05, 1),
        (0.05, 2),
    ]
    assert trials[5]["argv"][-2:] == ["--lr=0.05", "--seed=2"]
    assert [t["trial"] for t in trials] == list(range(18))


# ------------------------------------------------------------------ configs

CONFIGS = """\
# a comment line

   # an indented comment
python train.py --lr 0.1 --name "two words" \\
    --data "$SLURM_TMPDIR/data"   # trailing comment
python train.py --msg='it"s' $(touch {marker}) --tag=#1 --home=$HOME
\tpython other.py
"""


def test_configs_lines_comments_continuations_quotes(tmp_path, write):
    marker = tmp_path / "pwned"
    path = write("c.txt", CONFIGS.format(marker=marker))
    trials = manifest("--configs", path)
    assert [t["source"] for t in trials] == ["configs:4", "configs:6", "configs:7"]
    assert trials[0]["argv"] == [
        "python",
        "train.py",
        "--lr",
        "0.1",
        "--name",
        "two words",
        "--data",
        "$SLURM_TMPDIR/data",
    ]
    assert trials[1]["argv"] == [
        "python",
        "train.py",
        '--msg=it"s',
        "$(touch",
        f"{marker})",
        "--tag=#1",
        "--home=$HOME",
    ]
    assert trials[2] == {
        "trial": 2,
        "argv": ["python", "other.py"],
        "params": {},
        "source": "configs:7",
    }
    out = tmp_path / "out"
    assert run("--configs", path, "--out-dir", str(out), "--seeds", "2").stdout == "6\n"
    assert not marker.exists()
    lines = (out / "commands.txt").read_text().splitlines()
    assert lines[0] == (
        'python train.py --lr 0.1 --name "two words"     --data "$SLURM_TMPDIR/data" --seed=0'
    )
    assert lines[5] == "python other.py --seed=1"
    # On the node, $VAR expands as the user wrote it.
    env_line = subprocess.run(
        ["bash", "-c", 'eval "set -- $1"; printf "%s\\n" "$@"', "_", lines[0]],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SLURM_TMPDIR": "/t m"},
    )
    assert env_line.stdout.splitlines()[-3:] == ["--data", "/t m/data", "--seed=0"]


def test_configs_without_variables_round_trip_through_bash(tmp_path, write):
    line = "python a.py --x 'a b' --y \"c'd\" e\\ f --z=\"\" --w='$HOME'"
    path = write("c.txt", line + "\n")
    out = tmp_path / "out"
    assert run("--configs", path, "--out-dir", str(out)).stdout == "1\n"
    assert (out / "commands.txt").read_text() == line + "\n"
    trial = json.loads((out / "trials.jsonl").read_text())
    assert trial["argv"] == [
        "python",
        "a.py",
        "--x",
        "a b",
        "--y",
        "c'd",
        "e f",
        "--z=",
        "--w=$HOME",
    ]
    assert bash_argv(line) == trial["argv"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("python a.py --x 'oops\n", "c.txt:1: unbalanced ' quote (opened at column 17)"),
        ('# ok\n\npython a.py \\\n  --x "y\n', 'c.txt:4: unbalanced " quote'),
        ("python a.py; rm -rf x\n", "c.txt:1: unquoted ';' at column 12"),
        ("python a.py > log\n", "c.txt:1: unquoted '>'"),
        ("python a.py --x $(date\n", "c.txt:1: unbalanced '$('"),
        ("python a.py \\", "c.txt:1: '\\' continues a line but the file ends"),
        ("\n# only comments\n   \n", "c.txt: no experiments"),
        ("", "c.txt: no experiments"),
        ("python a.py --seed 3\n", "c.txt:1: the trial already sets --seed"),
        ("A=1 B='x y'\n", "c.txt:1: only environment assignments ('A=1 B=x y'), no program"),
        ('python a.py\n""\n', "c.txt:2: the program to run is an empty word"),
        ('# c\nA=1 "" a.py\n', "c.txt:2: the program to run is an empty word"),
    ],
)
def test_configs_errors(tmp_path, write, text, message):
    path = write("c.txt", text)
    args = ["--configs", path, "--out-dir", str(tmp_path / "out")]
    if "--seed" in message:
        args += ["--seeds", "2"]
    assert_refused(run(*args), message, tmp_path / "out")


# ------------------------------------------------------------------ refusals


def assert_refused(proc, message: str, out_dir: Path | None = None, code: int = 2) -> None:
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("trials.py: error: ")
    assert message in lines[0], lines[0]
    if out_dir is not None:
        assert not out_dir.exists() or not any(out_dir.iterdir())


BAD_SWEEPS = [
    ("a: [\n", "invalid YAML"),
    ("- 1\n- 2\n", "must be a mapping"),
    ("just text\n", "must be a mapping"),
    (
        "program: t.py\nmethod: sobol\nparameters: {a: {values: [1]}}\n",
        "method must be grid, random or bayes, got 'sobol'",
    ),
    ("program: t.py\nparameters: {a: {values: [1]}}\n", "method must be grid, random or bayes"),
    (
        "program: t.py\nmethod: bayes\nparameters: {a: {values: [1]}}\n",
        "method bayes needs metric: with name:",
    ),
    ("program: t.py\nmethod: grid\n", "no parameters"),
    ("program: t.py\nmethod: grid\nparameters: {}\n", "no parameters"),
    ("program: t.py\nmethod: grid\nparameters: {a: {values: []}}\n", "values is empty"),
    (
        "program: t.py\nmethod: grid\n"
        "parameters: {a: {distribution: int_uniform, min: 2, max: 1}}\n",
        "min 2 > max 1",
    ),
    (
        "program: t.py\nmethod: grid\nparameters: {a: {min: 0.1, max: 1.0}}\n",
        "distribution uniform cannot be used in a grid",
    ),
    (
        "program: t.py\nmethod: grid\nparameters: {1: {values: [1]}}\n",
        "parameter names must be strings",
    ),
    (
        "program: t.py\nmethod: grid\n"
        "parameters: {a: {values: [1, 2], probabilities: [0.5, 0.5]}}\n",
        "probabilities are not allowed in a grid",
    ),
    ("method: grid\nparameters: {a: {values: [1]}}\n", "program missing"),
    (
        'program: t.py\nmethod: grid\nparameters: {a: {values: ["x\\ny"]}}\n',
        "contains a newline or NUL",
    ),
    (
        'program: t.py\nmethod: grid\nparameters: {a: {value: "x\\0y"}}\n',
        "contains a newline or NUL",
    ),
    (
        "program: t.py\nmethod: random\nparameters: {a: {distribution: beta}}\n",
        "unknown distribution 'beta'",
    ),
    ("program: t.py\nmethod: random\nparameters: {a: 3}\n", "must be a mapping"),
    ("program: t.py\nmethod: random\nparameters: {a: {foo: 1}}\n", "needs value, values"),
    ("program: t.py\nmethod: random\nparameters: {a: {values: [1], value: 1}}\n", "not both"),
    (
        "program: t.py\nmethod: random\nparameters: {a: {parameters: {b: {value: 1}}}}\n",
        "nested parameters",
    ),
    (
        "program: t.py\nmethod: random\nparameters: {a: {distribution: log_uniform_values, "
        "min: 0, max: 1}}\n",
        "min must be > 0",
    ),
    (
        "program: t.py\nmethod: random\nparameters: {a: {distribution: normal, sigma: 0}}\n",
        "sigma must be > 0",
    ),
    ("program: t.py\nmethod: random\nparameters: {a: {value: .nan}}\n", "is not allowed"),
    (
        'program: t.py\nmethod: grid\nparameters: {a: {value: 1}}\ncommand: [x, "${foo}"]\n',
        "unknown macro '${foo}'",
    ),
    (
        'program: t.py\nmethod: grid\nparameters: {a: {value: 1}}\ncommand: ["${envvar:HOME}"]\n',
        "${envvar:...} is not supported",
    ),
    (
        "program: t.py\nmethod: grid\nparameters: {a: {value: 1}}\n"
        'command: ["${args_json_file}"]\n',
        "${args_json_file} is not supported",
    ),
    (
        "program: t.py\nmethod: grid\nparameters: {a: {value: 1}}\ncommand: []\n",
        "command must be a non-empty list",
    ),
    (
        "program: t.py\nmethod: random\nparameters: {a: {value: 1}}\n",
        "method random needs --trials",
    ),
    (
        "program: t.py\nmethod: grid\nparameters: {a: {value: 1}}\n"
        'command: ["${args_no_hyphens}"]\n',
        "s.yml: only environment assignments ('a=1'), no program to run",
    ),
    ("program: t.py\nmethod: grid\nparameters: {seed: {values: [1, 2]}}\n", "already sets --seed"),
    (
        "program: t.py\nmethod: grid\nmetric: {name: loss, goal: lowest}\n"
        "parameters: {a: {value: 1}}\n",
        "metric goal must be minimize or maximize, got 'lowest'",
    ),
    (
        "program: t.py\nmethod: grid\nmetric: loss\nparameters: {a: {value: 1}}\n",
        "metric must be a mapping with name: (and goal: minimize or maximize)",
    ),
]


@pytest.mark.parametrize("text, message", BAD_SWEEPS)
def test_sweep_refusals(tmp_path, write, text, message):
    path = write("s.yml", text)
    args = ["--sweep", path, "--out-dir", str(tmp_path / "out")]
    if "seed" in text:
        args += ["--seeds", "2"]
    assert_refused(run(*args), message, tmp_path / "out")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trials", "0"], "--trials expects a whole number >= 1, got '0'"),
        (["--trials", "-3"], "--trials expects a whole number >= 1, got '-3'"),
        (["--trials", "2.5"], "--trials expects a whole number >= 1, got '2.5'"),
        (["--trials=x"], "--trials expects a whole number >= 1, got 'x'"),
        (["--seeds", "0"], "--seeds expects a whole number >= 1, got '0'"),
        (["--sweep-seed", "-1"], "--sweep-seed expects a whole number >= 0"),
        (["--bogus"], "unknown option '--bogus'"),
        (["stray"], "unexpected argument 'stray'"),
        (["--trials"], "--trials expects a value"),
    ],
)
def test_cli_refusals(tmp_path, write, args, message):
    path = write("s.yml", GRID)
    out = tmp_path / "out"
    assert_refused(run("--sweep", path, "--out-dir", str(out), *args), message, out)


def test_cli_needs_a_source_and_one_output(tmp_path, write):
    configs = write("c.txt", "python a.py\n")
    assert_refused(run("--list"), "give --configs FILE, --sweep FILE or --wandb-sweep ID")
    assert_refused(run("--configs", configs), "give exactly one of --list or --out-dir")
    assert_refused(
        run("--configs", configs, "--list", "--out-dir", str(tmp_path / "o")),
        "give exactly one of --list or --out-dir",
        tmp_path / "o",
    )
    assert_refused(
        run("--configs", configs, "--trials", "3", "--list"), "--trials applies to --sweep only"
    )
    assert_refused(
        run("--configs", str(tmp_path / "missing.txt"), "--list"), "--configs: cannot read"
    )


def test_configs_assignments_before_a_program_are_its_environment(write):
    """As on the node (launch.sh build_command): leading NAME=value words set the
    program's environment; a word with '=' that is not such an assignment is a program."""
    trials = manifest("--configs", write("c.txt", "A=1 _b=2 python a.py\n--x=1 a.py\n"))
    assert [t["argv"][0] for t in trials] == ["A=1", "--x=1"]


def test_configs_with_a_utf8_bom_runs_its_first_program(write):
    """Editors on Windows start a file with a byte-order mark: the first line's program
    is 'python', not '\\ufeffpython' (exit 127 on the node)."""
    trials = manifest("--configs", write("bom.txt", "\ufeffpython a.py --x 1\npython b.py\n"))
    assert [t["argv"][:2] for t in trials] == [["python", "a.py"], ["python", "b.py"]]


def test_configs_label_names_the_configs_in_messages_instead_of_file_and_line(write):
    """The submitter's command after '--' comes as a temporary configs file: its messages
    name 'the command after '--'', not that file."""
    label = "the command after '--'"
    seeded = write("inline.txt", "python a.py --seed 3\n")
    assert_refused(
        run("--configs", seeded, "--configs-label", label, "--seeds", "2", "--list"),
        f"error: {label}: the trial already sets --seed; drop it or drop --seeds",
    )
    binary = write("binary.txt", "")
    Path(binary).write_bytes(b"python '\xff'\n")
    assert_refused(
        run("--configs", binary, "--configs-label", label, "--list"),
        f"error: {label}: not UTF-8 text",
    )


def test_prog_names_the_errors_and_help_exits_zero():
    proc = run("--prog", "job_submitter.sh", "--list")
    assert proc.returncode == 2
    assert (
        proc.stderr
        == "job_submitter.sh: error: give --configs FILE, --sweep FILE or --wandb-sweep ID\n"
    )
    helped = run("--help")
    assert helped.returncode == 0
    for option in (
        "--configs",
        "--sweep",
        "--trials",
        "--sweep-seed",
        "--seeds",
        "--prog",
        "--list",
        "--out-dir",
    ):
        assert option in helped.stdout


def test_sweep_wins_over_configs(write):
    trials = manifest("--configs", write("c.txt", "python a.py\n"), "--sweep", write("s.yml", GRID))
    assert len(trials) == 6 and trials[0]["source"] == "sweep:grid"


# ------------------------------------------------------------------ output files


def test_list_writes_nothing(tmp_path, write):
    path = write("s.yml", GRID)
    before = sorted(tmp_path.rglob("*"))
    assert len(manifest("--sweep", path, cwd=tmp_path)) == 6
    assert sorted(tmp_path.rglob("*")) == before


def test_out_dir_is_byte_stable_and_matches_list(tmp_path, write):
    path = write("r.yml", RANDOM)
    for name in ("a", "b"):
        proc = run(
            "--sweep",
            path,
            "--trials",
            "7",
            "--seeds",
            "2",
            "--out-dir",
            str(tmp_path / name / "new dir"),
        )
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "14\n", "")
    a, b = tmp_path / "a" / "new dir", tmp_path / "b" / "new dir"
    assert sorted(p.name for p in a.iterdir()) == ["commands.txt", "trials.jsonl"]
    for name in ("commands.txt", "trials.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    listed = run("--sweep", path, "--trials", "7", "--seeds", "2", "--list").stdout
    assert (a / "trials.jsonl").read_text() == listed
    first = (a / "trials.jsonl").read_text().splitlines()[0]
    assert first.startswith('{"argv":[') and ", " not in first.split('"params"')[1]


def test_commands_txt_round_trips_through_bash_for_sweeps(tmp_path, write):
    marker = tmp_path / "pwned"
    hostile = [
        "a b",
        "it's",
        'say "hi"',
        f"$(touch {marker})",
        f"`touch {marker}`",
        "*",
        "$HOME",
        "back\\slash",
        "tab\there",
        "ünï",
        "-x",
        "",
    ]
    values = ", ".join(json.dumps(v) for v in hostile)
    path = write(
        "h.yml",
        f"program: 'my prog.py'\nmethod: grid\nparameters:\n"
        f"  v: {{values: [{values}]}}\n  n: {{values: [1, 2.5]}}\n",
    )
    out = tmp_path / "out"
    assert run("--sweep", path, "--out-dir", str(out), "--seeds", "2").stdout == "48\n"
    trials = [json.loads(x) for x in (out / "trials.jsonl").read_text().splitlines()]
    lines = (out / "commands.txt").read_text().split("\n")
    assert lines[-1] == "" and len(lines) == 49
    script = 'for line; do eval "set -- $line"; printf "%s\\0" "$#" "$@"; done'
    raw = subprocess.run(
        ["bash", "-c", script, "_", *lines[:-1]], capture_output=True, text=True, check=True
    ).stdout.split("\0")[:-1]
    got = []
    while raw:
        n = int(raw.pop(0))
        got.append(raw[:n])
        del raw[:n]
    assert got == [t["argv"] for t in trials]
    assert trials[27]["argv"] == [
        "/usr/bin/env",
        "python",
        "my prog.py",
        "--n=2.5",
        "--v=it's",
        "--seed=1",
    ]
    assert not marker.exists()
    assert [shlex.split(x) for x in lines[:-1]] == [t["argv"] for t in trials]


def test_stdlib_only_for_configs_and_clear_error_without_yaml(write):
    configs = write("c.txt", "python a.py\n")
    no_site = run("--configs", configs, "--list", python_flags=("-S",))
    assert no_site.returncode == 0, no_site.stderr
    sweep = write("s.yml", GRID)
    probe = subprocess.run(
        [sys.executable, "-S", "-c", "import yaml"],
        capture_output=True,
        env=tools_env(),
        check=False,
    )
    if probe.returncode == 0:
        pytest.skip("yaml importable without site-packages here")
    proc = run("--sweep", sweep, "--list", python_flags=("-S",))
    assert_refused(proc, "--sweep needs PyYAML", code=1)


def test_wandb_sweep_id_gives_count_identical_agent_trials(tmp_path):
    proc = run("--wandb-sweep", "e/p/abc", "--count", "2", "--list")
    assert proc.returncode == 0, proc.stderr
    argv = '["wandb","agent","--count","1","e/p/abc"]'
    lines = [
        f'{{"argv":{argv},"params":{{}},"source":"wandb:e/p/abc","trial":{k}}}\n' for k in (0, 1)
    ]
    assert proc.stdout == "".join(lines)
    out = tmp_path / "out"
    assert run("--wandb-sweep", "abc", "--count", "3", "--out-dir", str(out)).stdout == "3\n"
    assert (out / "commands.txt").read_text() == "wandb agent --count 1 abc\n" * 3
    assert_refused(
        run("--wandb-sweep", "abc", "--list"), "--wandb-sweep ID and --count K go together"
    )
    assert_refused(
        run("--wandb-sweep", "abc", "--count", "2", "--seeds", "2", "--list"),
        "--seeds does not apply to a wandb sweep",
    )
