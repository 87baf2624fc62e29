"""The nanoGPT-shaped example (hpc_harness.examples.nanogpt): its size in user code, its
pieces (random windows, weight-decay groups, warmup-cosine LR), and a signal mid-run then a
resume that ends bitwise equal to an uninterrupted run, at world size 1 and 2 (gloo, CPU)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from conftest import (
    bitwise_equal,
    clean_env,
    fit_processes,
    load_model,
    module_command,
    run_command,
    run_interrupted,
)

from hpc_harness.examples import nanogpt
from hpc_harness.pieces import REQUEUE_EXIT_CODE

ARGS = ["--max-iters", "40", "--eval-interval", "10", "--warmup-iters", "4", "--seed", "3"]


def user_lines(source: str, model: tuple[str, ...] = ("GPT",)) -> list[str]:
    """The lines a user writes beyond the model: not blank, comments, docstrings, imports, the
    model's class, nor the tests' hidden flags (faults: a user's script has no such lines)."""
    tree, lines = ast.parse(source), source.splitlines()
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant):  # a docstring
                skip |= set(range(body[0].lineno, body[0].end_lineno + 1))
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
            isinstance(node, ast.ClassDef) and node.name in model
        ):
            skip |= set(range(node.lineno, node.end_lineno + 1))
    return [
        line
        for i, line in enumerate(lines, 1)
        if i not in skip
        and line.strip()
        and not line.strip().startswith("#")
        and "faults." not in line
    ]


def test_the_example_is_at_most_40_lines_beyond_the_model() -> None:
    source = Path(nanogpt.__file__).read_text()
    assert 30 <= len(user_lines(source)) <= 40, "\n".join(user_lines(source))
    assert len(user_lines("import os\nx = 1  # one\n\n# two\n")) == 1


def test_random_windows_are_nanogpts_get_batch() -> None:
    tokens = torch.arange(100)
    data = nanogpt.random_windows(tokens, 8, 50, seed=1)
    again = nanogpt.random_windows(tokens, 8, 50, seed=1)
    x, y = data[:]
    assert x.shape == (50, 8) and torch.equal(x[:, 1:], y[:, :-1])  # targets: shifted by one
    assert torch.equal(x, again[:][0])  # the same draw from the same seed
    assert len({int(s) for s in x[:, 0]}) > 20  # random starts, all within the array
    assert int(y.max()) <= 99


def command(world_size: int, args: list[str]) -> list[str]:
    return module_command("hpc_harness.examples.nanogpt", args, world_size)


# Four runs of up to 300 s each: pyproject's 300 s per test would cut a slow
# machine's run short; this is a hang guard, not a bound on the test.
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_signal_mid_run_then_resume_ends_bitwise_equal(tmp_path, world_size: int) -> None:
    env = clean_env(**fit_processes(world_size))
    straight = tmp_path / "straight"
    r = run_command(command(world_size, [*ARGS, "--ckpt-dir", str(straight)]), env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "epoch 3 test_loss" in r.stdout, r.stdout  # evaluated every eval_interval steps
    ck, marker = tmp_path / "ck", tmp_path / "requeue.json"
    interrupted = run_interrupted(
        command(world_size, [*ARGS, "--ckpt-dir", str(ck), "--step-sleep", "0.05"]),
        {**env, "HPC_REQUEUE_MARKER": str(marker)},
        "hpc_harness: epoch 0 test_loss",  # step 10
        torchrun_rank=None if world_size == 1 else 1,  # one rank only: the ranks must agree
    )
    out = interrupted.stdout
    if world_size == 1:
        assert interrupted.returncode == REQUEUE_EXIT_CODE, out
    info = json.loads(marker.read_text())
    assert 10 <= info["step"] < 40, out
    assert not (ck / "last.pt").exists()
    resumed = run_command(command(world_size, [*ARGS, "--ckpt-dir", str(ck)]), env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {info['checkpoint']}" in resumed.stdout
    assert bitwise_equal(load_model(f"{ck}/last.pt"), load_model(f"{straight}/last.pt"))
    # another setting that shapes the run is another run: refused, not resumed
    other = run_command(
        command(1, [*ARGS, "--ckpt-dir", str(ck), "--weight-decay", "0.5"]), clean_env(), 300
    )
    assert other.returncode != 0 and "weight_decay" in other.stdout + other.stderr
