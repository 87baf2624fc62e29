"""Exact resume: interrupted runs end with weights bitwise equal to an uninterrupted one."""

from __future__ import annotations

import random

import pytest
from conftest import (
    bitwise_equal,
    clean_env,
    load_model,
    module_command,
    run_command,
    run_interrupted,
    wait_for,
)

from hpc_harness.signals import REQUEUE_EXIT_CODE
from hpc_harness.train import main

# 2 epochs of 45 steps each; small so every run takes well under a second in-process.
COMMON = ["--epochs", "2", "--log-every", "0", "--hidden", "32", "--seed", "7"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, digits_dir: str) -> dict:
    ck = tmp_path_factory.mktemp("ref") / "ck"
    assert main([*COMMON, "--data-dir", digits_dir, "--ckpt-dir", str(ck)]) == 0
    return load_model(str(ck / "last.pt"))


def test_three_interruptions_at_random_steps(tmp_path, digits_dir: str, reference) -> None:
    rnd = random.Random(2024)
    stops = sorted(rnd.sample(range(1, 90), 3))
    ck = str(tmp_path / "ck")
    args = [*COMMON, "--data-dir", digits_dir, "--ckpt-dir", ck, "--checkpoint-every", "13"]
    for stop in stops:
        assert main([*args, "--max-steps", str(stop)]) == 0
    assert main(args) == 0
    assert bitwise_equal(load_model(f"{ck}/last.pt"), reference), f"stops at {stops}"


def test_a_different_seed_differs(tmp_path, digits_dir: str, reference) -> None:
    ck = str(tmp_path / "ck")
    args = [*COMMON, "--data-dir", digits_dir, "--ckpt-dir", ck, "--seed", "8"]
    assert main(args) == 0
    assert not bitwise_equal(load_model(f"{ck}/last.pt"), reference)


def test_exact_resume_with_fp16_scaler(tmp_path, digits_dir: str) -> None:
    base = [*COMMON, "--data-dir", digits_dir, "--precision", "16-mixed"]
    assert main([*base, "--ckpt-dir", str(tmp_path / "a")]) == 0
    assert main([*base, "--ckpt-dir", str(tmp_path / "b"), "--max-steps", "50"]) == 0
    assert main([*base, "--ckpt-dir", str(tmp_path / "b")]) == 0
    a, b = load_model(str(tmp_path / "a/last.pt")), load_model(str(tmp_path / "b/last.pt"))
    assert bitwise_equal(a, b)


def test_real_sigusr1_then_resume_is_exact(tmp_path, digits_dir: str, reference) -> None:
    """SIGUSR1 at an arbitrary moment -> exit 42; the resumed run matches the reference."""
    ck = str(tmp_path / "ck")
    args = [*COMMON, "--data-dir", digits_dir, "--ckpt-dir", ck, "--checkpoint-every", "0"]
    interrupted = run_interrupted(
        module_command("hpc_harness.train", [*args, "--step-sleep", "0.02", "--log-every", "1"]),
        clean_env(),
        "hpc_harness: step 5/",
    )
    assert interrupted.returncode == REQUEUE_EXIT_CODE, interrupted.stdout
    assert "SIGUSR1 received: checkpointed at global step" in interrupted.stdout
    resumed = run_command(module_command("hpc_harness.train", args), clean_env())
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    wait_for(lambda: (tmp_path / "ck" / "last.pt").exists(), 5, "last.pt")
    assert bitwise_equal(load_model(f"{ck}/last.pt"), reference)
