"""The example end to end in-process: accuracy, last.pt, metrics.csv, curves, options, wandb."""

from __future__ import annotations

import csv
import dataclasses
import json
import os

import pytest
import torch
from conftest import PY, clean_env, run_command

from hpc_harness.examples.faults import FLAGS as TESTING_FLAGS
from hpc_harness.strategy import StrategyError, check_strategy
from hpc_harness.train import (
    build_parser,
    default_ckpt_dir,
    default_data_dir,
    main,
)
from hpc_harness.trainer import TrainConfig
from hpc_tools import metrics, results


def test_example_reaches_90_percent_and_writes_outputs(tmp_path, digits_dir, capsys) -> None:
    ck = tmp_path / "ck"
    rc = main(
        [
            "--data-dir",
            digits_dir,
            "--ckpt-dir",
            str(ck),
            "--epochs",
            "10",
            "--keep-last",
            "2",
            "--checkpoint-every",
            "40",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    acc = float(out.split("final test accuracy ")[1].split()[0])
    assert acc >= 0.90, out
    assert "hpc_harness: rank 0/1 local_rank 0 host" in out
    assert "samples/s" in out and "eta" in out
    last = torch.load(ck / "last.pt", weights_only=False)
    assert set(last["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}
    ckpts = sorted(p for p in os.listdir(ck) if p.startswith("ckpt_step"))
    assert ckpts == ["ckpt_step00000440.pt", "ckpt_step00000450.pt"]  # keep-last 2
    with open(ck / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    names = {r["name"] for r in rows}
    assert {"train_loss", "test_acc", "lr", "samples_per_s"} <= names
    # The login-node reader takes the run folder as the harness wrote it.
    series = metrics.read_metrics(str(ck / "metrics.csv"))
    assert {"train_loss", "test_acc", "lr", "samples_per_s"} <= set(series)
    assert [step for step, _ in series["test_acc"]] == [45 * e for e in range(1, 11)]
    png = tmp_path / "curves.png"
    assert results.main(["results", "--run", str(tmp_path), "--curves", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hyperparameters_accept_both_forms() -> None:
    p = build_parser()
    a = p.parse_args(["--lr", "0.01", "--layers", "3", "--gpus", "2"])
    b = p.parse_args(["--lr=0.01", "--layers=3", "--gpus=2"])
    assert vars(a) == vars(b) and a.lr == 0.01 and a.gpus == "2"
    with pytest.raises(SystemExit):
        p.parse_args(["--strategy", "horovod"])


def test_help_lists_every_option_but_the_testing_aids(capsys) -> None:
    p = build_parser()
    with pytest.raises(SystemExit):
        p.parse_args(["--help"])
    text = capsys.readouterr().out
    for action in p._actions:
        for opt in action.option_strings:
            hidden = action.dest in TESTING_FLAGS
            assert (opt in text) != hidden, opt
    assert "fail" not in text and "sleep" not in text


def test_the_user_facing_config_has_no_testing_aids() -> None:
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert not names & set(TESTING_FLAGS)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--signal-check-every", "-1"],
            "--signal-check-every expects 0 (adaptive) or more, got -1",
        ),
        (["--signal-check-seconds", "0"], "--signal-check-seconds must be more than 0, got 0.0"),
        (["--signal-check-seconds", "-2"], "--signal-check-seconds must be more than 0, got -2.0"),
        (["--signal-check-seconds", "nan"], "--signal-check-seconds must be more than 0, got nan"),
        (["--pause-in-save-at-step", "x"], "--pause-in-save-at-step: invalid int value: 'x'"),
        (["--num-workers", "-1"], "--num-workers expects 0 (load in the training process) or more"),
        (["--num-workers", "two"], "--num-workers: invalid int value: 'two'"),
        (["--max-steps", "0"], "--max-steps: expects a whole number of 1 or more, got '0'"),
        (["--batch-size", "x"], "--batch-size: expects a whole number of 1 or more, got 'x'"),
    ],
)
def test_bad_check_options_exit_2_before_training(args, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_default_dirs_follow_the_job_environment(tmp_path) -> None:
    staged = tmp_path / "tmpdir" / "datasets" / "digits"
    env = {"SLURM_TMPDIR": str(tmp_path / "tmpdir"), "scratch_dir": "/s", "exp_name": "e"}
    assert default_data_dir(env) == os.path.join("/s", "datasets", "digits")  # not staged yet
    staged.mkdir(parents=True)
    assert default_data_dir(env) == str(staged)
    assert default_data_dir({}) == os.path.join(".", "datasets", "digits")
    assert default_ckpt_dir(env) == os.path.join("/s", "e", "checkpoints")
    assert default_ckpt_dir({"scratch_dir": "/s"}) == os.path.join(".", "checkpoints")


def test_strategy_layout_rules() -> None:
    check_strategy("ddp", world_size=8, local_world_size=4, cuda=True)
    check_strategy("ddp2", world_size=2, local_world_size=1, cuda=True)
    check_strategy("ddp2", world_size=4, local_world_size=2, cuda=False)  # CPU: same as ddp
    with pytest.raises(StrategyError, match="dp runs in ONE process"):
        check_strategy("dp", world_size=2, local_world_size=2, cuda=True)
    with pytest.raises(StrategyError, match="ddp2 runs one process per node"):
        check_strategy("ddp2", world_size=4, local_world_size=2, cuda=True)


@pytest.mark.parametrize("strategy", ["dp", "ddp2", "fsdp"])
def test_single_process_strategies_train(strategy, tmp_path, digits_dir) -> None:
    ck = tmp_path / "ck"
    assert (
        main(
            [
                "--data-dir",
                digits_dir,
                "--ckpt-dir",
                str(ck),
                "--strategy",
                strategy,
                "--max-steps",
                "5",
                "--log-every",
                "0",
            ]
        )
        == 0
    )
    assert (ck / "last.pt").exists()


def test_wandb_offline_reuses_the_run_id(tmp_path, digits_dir, capsys, monkeypatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    ck = tmp_path / "ck"
    args = [
        "--data-dir",
        digits_dir,
        "--ckpt-dir",
        str(ck),
        "--wandb",
        "offline",
        "--log-every",
        "10",
    ]
    assert main([*args, "--max-steps", "20"]) == 0
    run_id = (ck / "wandb_run_id").read_text().strip()
    out = capsys.readouterr().out
    assert f"wandb run id {run_id} mode offline" in out and "wandb sync" in out
    assert main([*args, "--max-steps", "30"]) == 0
    assert (ck / "wandb_run_id").read_text().strip() == run_id
    assert any(run_id in d for d in os.listdir(ck / "wandb"))


# --------------------------------------------------------------------------- run identity

SHORT = ["--epochs", "2", "--hidden", "16", "--log-every", "0", "--checkpoint-every", "5"]


def _ckpts(folder) -> list[str]:
    return sorted(p for p in os.listdir(folder) if p.startswith("ckpt_step"))


def test_same_arguments_resume(tmp_path, digits_dir, capsys) -> None:
    base = [*SHORT, "--data-dir", digits_dir, "--ckpt-dir", str(tmp_path / "ck")]
    assert main([*base, "--max-steps", "5"]) == 0
    assert (tmp_path / "ck" / "run.json").exists()
    capsys.readouterr()
    assert main([*base, "--max-steps", "10"]) == 0
    assert "resumed from" in capsys.readouterr().out


def test_a_different_lr_stops_before_training_naming_lr(tmp_path, digits_dir) -> None:
    from conftest import run_example

    ck = tmp_path / "ck"
    base = [*SHORT, "--data-dir", digits_dir, "--ckpt-dir", str(ck)]
    assert main([*base, "--max-steps", "5"]) == 0
    # the refusal as a user meets it: the command's exit code and its stderr alone
    second = run_example([*base, "--lr", "0.1"], cwd=str(tmp_path))
    assert second.returncode == 2, second.stdout + second.stderr
    errors = [ln for ln in second.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1, second.stderr
    assert "lr" in errors[0] and "-e NEW" in errors[0] and "--fresh" in errors[0]
    assert "hidden" not in errors[0]
    assert _ckpts(ck) == ["ckpt_step00000005.pt"]  # nothing trained


def test_a_checkpoint_weights_only_refuses_stops_with_one_line(tmp_path, digits_dir, capsys):
    import numpy as np
    import torch

    ck = tmp_path / "ck"
    base = [*SHORT, "--data-dir", digits_dir, "--ckpt-dir", str(ck)]
    assert main([*base, "--max-steps", "5"]) == 0
    path = ck / "ckpt_step00000005.pt"
    state = torch.load(path, weights_only=False)
    torch.save({**state, "best": np.float64(0.5)}, path)  # as another program could
    capsys.readouterr()
    assert main([*base, "--max-steps", "10"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"hpc_harness: error: {path} is intact")
    assert _ckpts(ck) == ["ckpt_step00000005.pt"]  # nothing trained, nothing removed


def test_fresh_starts_at_step_0_and_keeps_the_old_files_aside(tmp_path, digits_dir, capsys):
    ck = tmp_path / "ck"
    base = [*SHORT, "--data-dir", digits_dir, "--ckpt-dir", str(ck)]
    assert main([*base, "--max-steps", "5"]) == 0
    assert main([*base, "--lr", "0.1", "--max-steps", "3"]) == 2
    capsys.readouterr()
    assert (
        main([*base, "--lr", "0.1", "--max-steps", "3", "--fresh", "--checkpoint-every", "3"]) == 0
    )
    out = capsys.readouterr().out
    assert "resumed" not in out
    assert _ckpts(ck) == ["ckpt_step00000003.pt"]
    aside = [p for p in os.listdir(tmp_path) if p.startswith("ck.old-")]
    assert len(aside) == 1, os.listdir(tmp_path)
    assert _ckpts(tmp_path / aside[0]) == ["ckpt_step00000005.pt"]
    assert (tmp_path / aside[0] / "run.json").exists()
    old = json.loads((tmp_path / aside[0] / "run.json").read_text())["fingerprint"]
    assert old["lr"] == 0.003
    assert json.loads((ck / "run.json").read_text())["fingerprint"]["lr"] == 0.1


def test_precision_cadence_and_logging_may_change_across_a_resume(tmp_path, digits_dir, capsys):
    base = ["--epochs", "2", "--hidden", "16", "--data-dir", digits_dir]
    base += ["--ckpt-dir", str(tmp_path / "ck")]
    assert main([*base, "--max-steps", "5", "--checkpoint-every", "5", "--log-every", "0"]) == 0
    capsys.readouterr()
    changed = ["--precision", "bf16-mixed", "--log-every", "3", "--checkpoint-every", "4"]
    changed += ["--keep-last", "1", "--signal-check-seconds", "0.2", "--max-steps", "8"]
    changed += ["--num-workers", "1"]  # DataLoader worker processes (shielded from signals)
    assert main([*base, *changed]) == 0
    assert "resumed from" in capsys.readouterr().out


def _main_as_rank(rank: int, world_size: int, args: list[str]) -> tuple[int, str]:
    """main(args) as one rank of a gloo group (spawn_gloo; test_torchrun launches the example
    under torchrun itself): its exit code and what it printed."""
    import contextlib
    import io

    from conftest import gloo_context

    from hpc_harness import dist

    monkeypatch = pytest.MonkeyPatch()  # this process is the rank's own
    monkeypatch.setattr(dist, "setup", lambda gpus=None: gloo_context(rank, world_size))
    monkeypatch.setattr(dist, "cleanup", lambda: None)  # spawn_gloo leaves the group
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(args)
    return code, out.getvalue()


def test_world_size_may_change_across_a_resume(tmp_path, digits_dir) -> None:
    from conftest import spawn_gloo

    base = [*SHORT, "--data-dir", digits_dir, "--ckpt-dir", str(tmp_path / "ck")]
    assert main([*base, "--max-steps", "5"]) == 0
    (code0, out0), (code1, out1) = spawn_gloo(
        _main_as_rank, 2, [*base, "--max-steps", "8"], timeout_s=60
    )
    assert (code0, code1) == (0, 0), out0 + out1
    assert "resumed from" in out0
    assert "world size 1 -> 2 in epoch 0" in out0 and "global step 8" in out0, out0


def test_rerunning_a_finished_job_keeps_its_results(tmp_path, digits_dir, capsys) -> None:
    ck = tmp_path / "ck"
    args = [*SHORT, "--data-dir", digits_dir, "--ckpt-dir", str(ck)]
    assert main(args) == 0
    before = (ck / "last.pt").read_bytes()
    ckpts = _ckpts(ck)
    assert torch.load(ck / "last.pt", weights_only=True)["metrics"]["test_acc"] > 0
    capsys.readouterr()
    assert main(args) == 0
    assert "already finished" in capsys.readouterr().out
    assert (ck / "last.pt").read_bytes() == before and _ckpts(ck) == ckpts


def test_rerunning_a_job_that_reached_max_steps_trains_no_further(tmp_path, digits_dir, capsys):
    ck = tmp_path / "ck"
    args = [*SHORT, "--data-dir", digits_dir, "--ckpt-dir", str(ck), "--max-steps", "5"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0
    assert "already finished" in capsys.readouterr().out
    assert _ckpts(ck) == ["ckpt_step00000005.pt"]


def test_a_checkpoint_past_max_steps_is_refused_not_reported_as_this_runs_result(
    tmp_path, digits_dir, capsys
):
    # --max-steps may grow across a resume (a run in pieces), but a checkpoint already past
    # it belongs to a longer run: "already finished" would report step 8's result for a run
    # of 3 steps (a trial's row in results.sh under --max-steps 3).
    ck = tmp_path / "ck"
    args = [*SHORT, "--data-dir", digits_dir, "--ckpt-dir", str(ck)]
    assert main([*args, "--max-steps", "8"]) == 0
    ckpts, before = _ckpts(ck), (ck / "last.pt").read_bytes()
    capsys.readouterr()
    assert main([*args, "--max-steps", "3"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"hpc_harness: error: {ck} holds a checkpoint of global step 8, past max_steps 3: it "
        "belongs to a longer run; use another experiment (-e NEW, or another --ckpt-dir), or "
        "--fresh to start over (the old files are moved aside, not deleted)\n"
    )
    assert _ckpts(ck) == ckpts and (ck / "last.pt").read_bytes() == before
    assert main([*args, "--max-steps", "8"]) == 0  # its own budget: finished, as before
    assert "already finished" in capsys.readouterr().out


def test_fsdp_on_a_torch_without_fully_shard_is_one_clear_error(monkeypatch) -> None:
    import torch.distributed.fsdp as fsdp

    from hpc_harness import dist as hdist
    from hpc_harness.strategy import Strategy

    monkeypatch.delattr(fsdp, "fully_shard")  # as on torch < 2.6
    with pytest.raises(StrategyError, match=r"fsdp needs torch.distributed.fsdp.fully_shard"):
        Strategy("fsdp", hdist.setup(verbose=False))


def test_digits_already_written_start_without_sklearn(digits_dir) -> None:
    """Each node's local rank 0 calls write_digits: where the files are (staged, or written by
    an earlier run), it reads nothing of sklearn, whose import costs every job about a second."""
    check = (
        "import sys\n"
        "from hpc_harness.digits import ensure_digits\n"
        f"ensure_digits({digits_dir!r}, local_rank=0)\n"
        "assert 'sklearn' not in sys.modules, 'sklearn imported'\n"
    )
    r = run_command([PY, "-c", check], clean_env())
    assert r.returncode == 0, r.stderr
