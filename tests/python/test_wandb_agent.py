"""The real ``wandb agent`` CLI against the fake backend in fake_wandb.py.

Slow (the agent polls every 5 s: ~11 s per agent; agents here run side by side).
Run with: .venv/bin/python -m pytest tests/python/test_wandb_agent.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S
from fake_wandb import FakeWandb

wandb = pytest.importorskip("wandb")

WANDB_VERSION = "0.31.0"  # the query shapes and agent behaviour below were read from this one
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        wandb.__version__ != WANDB_VERSION,
        reason=f"fake checked against wandb {WANDB_VERSION}, found {wandb.__version__}",
    ),
]

CHILD = """\
import json, os, sys
with open(os.environ["CHILD_LOG"], "a") as fh:
    fh.write(json.dumps({
        "argv": sys.argv[1:],
        "sweep_id": os.environ.get("WANDB_SWEEP_ID"),
        "run_id": os.environ.get("WANDB_RUN_ID"),
        "param_path": os.environ.get("WANDB_SWEEP_PARAM_PATH"),
        "mode": os.environ.get("WANDB_MODE"),
    }) + "\\n")
sys.exit(int(os.environ.get("CHILD_EXIT", "0")))
"""

SWEEP = """\
program: child.py
method: grid
parameters:
  lr: {values: [0.1, 0.2]}
  layers: {values: [1, 2]}
  tag: {value: "a b"}
"""

# How a batch script can learn a trial's exit code: `wandb agent` exits 0 even when
# its run failed, but it starts the run with `python` from PATH, so a `python` shim
# first on PATH can record the code.
PYTHON_SHIM = """\
#!/usr/bin/env bash
"$REAL_PYTHON" "$@"
rc=$?
printf '%s\\n' "$rc" >> "$HPC_TRIAL_EXIT_FILE"
exit "$rc"
"""


@pytest.fixture
def sweep_dir(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "sweep.yml").write_text(SWEEP)
    return tmp_path


@pytest.fixture
def fake(sweep_dir):
    with FakeWandb(sweep_dir / "sweep.yml", lifetime=180) as backend:
        yield backend


def agent_env(fake: FakeWandb, workdir: Path, **extra: str) -> dict[str, str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {
        **os.environ,
        **fake.env(),
        "PATH": path,
        "CHILD_LOG": str(workdir / "child.log"),
        **extra,
    }


def start_agents(
    fake: FakeWandb, workdir: Path, n: int, *args: str, **extra: str
) -> list[subprocess.Popen]:
    wandb_cli = shutil.which("wandb", path=str(Path(sys.executable).parent))
    assert wandb_cli, "wandb CLI not found next to the test's python"
    env = agent_env(fake, workdir, **extra)
    return [
        subprocess.Popen(
            [wandb_cli, "agent", "--count", "1", *args, fake.sweep_path],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(n)
    ]


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=HANG_GUARD_S)
        out.append((proc.returncode, stdout))
    return out


def test_three_agents_run_three_distinct_grid_points(fake, sweep_dir):
    results = finish(start_agents(fake, sweep_dir, 3))
    assert [rc for rc, _ in results] == [0, 0, 0], results
    runs = [json.loads(x) for x in (sweep_dir / "child.log").read_text().splitlines()]
    assert len(runs) == 3
    # Same points as the array job built from this file, first three in manifest order.
    expected = [[f"--{k}={v}" for k, v in p.items()] for p in fake.points[:3]]
    assert sorted(r["argv"] for r in runs) == sorted(expected)
    assert len({tuple(r["argv"]) for r in runs}) == 3
    assert {r["sweep_id"] for r in runs} == {fake.sweep_id}
    assert len({r["run_id"] for r in runs}) == 3
    assert {r["mode"] for r in runs} == {"offline"}
    for r in runs:  # the agent wrote each run's config where WANDB_SWEEP_PARAM_PATH says
        assert Path(r["param_path"]).is_file()
        assert "a b" in Path(r["param_path"]).read_text()
    assert ["--layers=1", "--lr=0.1", "--tag=a b"] in [r["argv"] for r in runs]
    for op in ("Viewer", "SweepWithRuns", "CreateAgent", "Heartbeat"):
        assert op in fake.requests
    assert fake.next_point == 3


def test_a_failed_child_leaves_agent_exit_code_zero_but_a_python_shim_sees_it(fake, sweep_dir):
    shim_dir = sweep_dir / "shim"
    shim_dir.mkdir()
    shim = shim_dir / "python"
    shim.write_text(PYTHON_SHIM)
    shim.chmod(0o755)
    exit_file = sweep_dir / "trial_exit"
    plain = start_agents(fake, sweep_dir, 1, CHILD_EXIT="3")
    strict = start_agents(fake, sweep_dir, 1, "--max-consecutive-failed-runs", "1", CHILD_EXIT="3")
    env_path = (
        f"{shim_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
        f"{os.environ.get('PATH', '')}"
    )
    shimmed = start_agents(
        fake,
        sweep_dir,
        1,
        CHILD_EXIT="3",
        PATH=env_path,
        REAL_PYTHON=sys.executable,
        HPC_TRIAL_EXIT_FILE=str(exit_file),
    )
    (plain_rc, _), (strict_rc, strict_out), (shim_rc, _) = finish(plain + strict + shimmed)
    assert plain_rc == 0
    assert strict_rc == 0  # even when it stops on failures
    assert "consecutive failed runs" in strict_out
    assert shim_rc == 0
    assert exit_file.read_text() == "3\n"
    assert len((sweep_dir / "child.log").read_text().splitlines()) == 3


def test_wrong_api_key_is_refused(fake, sweep_dir):
    env = agent_env(fake, sweep_dir, WANDB_API_KEY="x" * 40)
    wandb_cli = shutil.which("wandb", path=str(Path(sys.executable).parent))
    proc = subprocess.run(
        [wandb_cli, "agent", "--count", "1", fake.sweep_path],
        cwd=sweep_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert not (sweep_dir / "child.log").exists()
    assert "CreateAgent" not in fake.requests
    assert proc.returncode == 1
    assert "invalid api key" in proc.stdout + proc.stderr


def test_points_come_from_trials_py(sweep_dir):
    fake = FakeWandb(sweep_dir / "sweep.yml")
    assert fake.points == [
        {"layers": 1, "lr": 0.1, "tag": "a b"},
        {"layers": 1, "lr": 0.2, "tag": "a b"},
        {"layers": 2, "lr": 0.1, "tag": "a b"},
        {"layers": 2, "lr": 0.2, "tag": "a b"},
    ]
    bad = sweep_dir / "bad.yml"
    bad.write_text(
        textwrap.dedent("""\
        program: child.py
        method: bayes
        parameters: {a: {values: [1]}}
        """)
    )
    with pytest.raises(ValueError, match="fake_wandb: error: .*bayes"):
        FakeWandb(bad)


PREEMPTING_CHILD = """\
import json, os, sys
import wandb
run_id = os.environ["WANDB_RUN_ID"]
marker = os.path.join(os.environ["RUNS_DIR"], run_id + ".started")
first = not os.path.exists(marker)
open(marker, "a").close()
with open(os.environ["CHILD_LOG"], "a") as fh:
    fh.write(json.dumps({"argv": sys.argv[1:], "run_id": run_id, "first": first}) + "\\n")
run = wandb.init(dir=os.path.join(os.environ["RUNS_DIR"], run_id), resume="allow")
run.log({"x": 1.0})
if first and os.environ.get("PREEMPT_FIRST"):
    run.mark_preempting()
    run.finish(exit_code=42)
    sys.exit(42)
run.finish()
"""


def test_a_preempted_run_is_reissued_to_the_next_agent_with_its_id_and_parameters(tmp_path):
    """W&B's preemption protocol, as the fake models it: a run that marked itself preempting
    and exited non-zero goes to the next agent that asks, before any new grid point."""
    (tmp_path / "child.py").write_text(PREEMPTING_CHILD)
    (tmp_path / "sweep.yml").write_text(SWEEP)
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    extra = {"RUNS_DIR": str(runs_dir), "PREEMPT_FIRST": "1"}
    with FakeWandb(tmp_path / "sweep.yml", lifetime=180, offline_root=runs_dir) as fake:
        [(rc1, out1)] = finish(start_agents(fake, tmp_path, 1, **extra))
        assert rc1 == 0, out1  # wandb agent exits 0 whatever its run did
        [first] = list(fake.runs)
        fake.refresh()
        assert fake.runs[first]["state"] == "preempted"
        assert fake.runs[first]["exit_code"] == 42
        [(rc2, out2)] = finish(start_agents(fake, tmp_path, 1, **extra))
        assert rc2 == 0, out2
        assert list(fake.runs) == [first]  # no new run: the same one came back
        fake.refresh()
        assert fake.runs[first]["state"] == "finished"
        assert fake.runs[first]["issued"] == ["agent-1", "agent-2"]
        assert fake.next_point == 1
        [(rc3, out3)] = finish(start_agents(fake, tmp_path, 1, **extra))
        assert rc3 == 0, out3
    log = [json.loads(x) for x in (tmp_path / "child.log").read_text().splitlines()]
    assert [(r["run_id"], r["first"]) for r in log[:2]] == [(first, True), (first, False)]
    assert log[0]["argv"] == log[1]["argv"] == [f"--{k}={v}" for k, v in fake.points[0].items()]
    assert log[2]["run_id"] != first  # then the sweep goes on with the next point
    assert log[2]["argv"] == [f"--{k}={v}" for k, v in fake.points[1].items()]


def test_a_run_that_exits_non_zero_without_preempting_is_failed_not_reissued(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "sweep.yml").write_text(SWEEP)
    with FakeWandb(tmp_path / "sweep.yml", lifetime=180, offline_root=tmp_path) as fake:
        finish(start_agents(fake, tmp_path, 1, CHILD_EXIT="3"))
        fake.refresh()
        assert fake.requeue == []
        [(rc, _)] = finish(start_agents(fake, tmp_path, 1))
        assert rc == 0
        assert len(fake.runs) == 2


def test_read_records_reads_a_run_file_of_many_blocks(tmp_path):
    """The fake reads what a run recorded from its .wandb file (32 KiB blocks; records that
    span blocks): here ~1 MB, every history row, the preempting record and the exit code."""
    from fake_wandb import read_records

    script = """\
import sys, wandb
run = wandb.init(project="p", id="big00001", dir=sys.argv[1])
for i in range(3000):
    run.log({"a": i * 1.5, "b": "x" * (i % 50)}, step=i)
run.mark_preempting()
run.finish(exit_code=42)
"""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], env=env, check=True, timeout=HANG_GUARD_S
    )
    [path] = tmp_path.rglob("run-big00001.wandb")
    assert path.stat().st_size > 10 * 32768
    kinds = [r.WhichOneof("record_type") for r in read_records(path)]
    assert kinds.count("history") == 3000
    assert "preempting" in kinds
    assert [r.exit.exit_code for r in read_records(path) if r.HasField("exit")] == [42]
