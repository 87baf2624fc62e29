"""The pieces in a plain loop (hpc_harness.examples.charlm): a signal mid-run, exit 42 with a
marker, and a resume that ends bitwise equal to an uninterrupted run, at world size 1 and 2."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    bitwise_equal,
    clean_env,
    fit_processes,
    gloo_context,
    load_model,
    module_command,
    run_command,
    run_interrupted,
    spawn_gloo,
)
from torch.utils.data import DataLoader

from hpc_harness.examples.charlm import CharLM, CharWindows, build_parser, make_text
from hpc_harness.pieces import REQUEUE_EXIT_CODE, StopAgreement

ARGS = ["--steps", "60", "--log-every", "5", "--seed", "5", "--checkpoint-every-s", "0"]


def command(world_size: int, args: list[str]) -> list[str]:
    return module_command("hpc_harness.examples.charlm", args, world_size)


def test_the_text_model_and_data_are_small_and_fixed() -> None:
    text = make_text()
    assert text == make_text() and 10_000 < len(text) < 40_000
    data = CharWindows(text, 32)
    x, y = data[3]
    assert torch.equal(x[1:], y[:-1]) and x.shape == (32,)
    model = CharLM(len(data.chars), 32)
    assert model.lm_head.weight is model.tok.weight  # tied
    assert sum(p.numel() for p in model.parameters()) < 300_000
    assert model(x[None]).shape == (1, 32, len(data.chars))


def test_testing_flags_are_hidden(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    assert "--step-sleep" not in capsys.readouterr().out


def test_stop_agreement_alone_reacts_at_its_fixed_interval() -> None:
    stop = StopAgreement(check_every=3, checkpoint_every_s=1e-9).install()
    assert [stop.should_stop() for _ in range(4)] == [False] * 4
    assert stop.checkpoint_due  # the check at step 3: due on one process at once
    stop.saved()
    assert not stop.checkpoint_due
    os.kill(os.getpid(), signal.SIGUSR1)
    assert [stop.should_stop() for _ in range(2)] == [False, True]  # steps 5, 6
    stop.uninstall()
    assert stop.signal_name == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


# Four runs of up to 300 s each: pyproject's 300 s per test would cut a slow
# machine's run short; this is a hang guard, not a bound on the test.
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_signal_mid_run_then_resume_ends_bitwise_equal(tmp_path, world_size: int) -> None:
    env = clean_env(**fit_processes(world_size))
    straight = tmp_path / "straight"
    r = run_command(command(world_size, [*ARGS, "--ckpt-dir", str(straight)]), env)
    assert r.returncode == 0, r.stdout + r.stderr
    ck, marker = tmp_path / "ck", tmp_path / "requeue.json"
    interrupted = run_interrupted(
        command(world_size, [*ARGS, "--ckpt-dir", str(ck), "--step-sleep", "0.03"]),
        {**env, "HPC_REQUEUE_MARKER": str(marker)},
        "hpc_harness: step 10/",
        torchrun_rank=None if world_size == 1 else 1,  # one rank only: the ranks must agree
    )
    out = interrupted.stdout
    if world_size == 1:  # torchrun reports its own failure code; the marker is the channel
        assert interrupted.returncode == REQUEUE_EXIT_CODE, out
    info = json.loads(marker.read_text())
    assert 10 <= info["step"] < 60, out
    # rank 0 writes the marker and names its own signal: none when only rank 1 got one
    assert info["signal"] == ("SIGUSR1" if world_size == 1 else "")
    assert not (ck / "last.pt").exists()
    resumed = run_command(command(world_size, [*ARGS, "--ckpt-dir", str(ck)]), env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {info['checkpoint']}" in resumed.stdout
    assert bitwise_equal(load_model(f"{ck}/last.pt"), load_model(f"{straight}/last.pt"))


def _record_steps(
    monkeypatch, losses: list[float], targets: list[list[int]] | None = None
) -> list[bytes]:
    """charlm's every step recorded: its loss into ``losses``, its batch's targets into
    ``targets``; returns a list that gets the global RNG's state at each step (after the
    forward: dropout's draws)."""
    from hpc_harness.examples import charlm

    rng_states: list[bytes] = []

    class Recording:  # torch.nn.functional, with cross_entropy recording its value
        def __getattr__(self, name: str):
            return getattr(F, name)

        def cross_entropy(self, logits, y, *args, **kwargs):
            loss = F.cross_entropy(logits, y, *args, **kwargs)
            losses.append(loss.item())
            if targets is not None:
                targets.append(y.tolist())
            rng_states.append(torch.get_rng_state().numpy().tobytes())
            return loss

    monkeypatch.setattr(charlm, "F", Recording())
    return rng_states


def _record_worker_seeds(monkeypatch) -> list[int]:
    """A list that gets the base seed of charlm's DataLoader's workers at each epoch's start
    (worker i seeds torch, random and numpy with base seed + i: its augmentations)."""
    from hpc_harness.examples import charlm

    seeds: list[int] = []

    class SeedsRecorded(DataLoader):
        def _get_iterator(self):  # an epoch's iterator, its base seed drawn
            batches = super()._get_iterator()
            seeds.append(batches._base_seed)
            return batches

    monkeypatch.setattr(charlm, "DataLoader", SeedsRecorded)
    return seeds


def _run_in_process(monkeypatch, argv: list[str], losses: list[float]) -> int:
    """charlm.main in this process (world size 1), every step's loss recorded."""
    _record_steps(monkeypatch, losses)
    return _main_in_process(argv)


def _main_in_process(argv: list[str]) -> int:
    """charlm.main in this process (world size 1)."""
    from hpc_harness.examples import charlm

    # main installs its StopAgreement's handlers for good (a process of its own); put back
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        return charlm.main(argv)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def test_a_resumed_run_logs_the_mean_loss_of_the_steps_since_the_resume(
    tmp_path, monkeypatch, capsys
) -> None:
    """Resumed at step 7 and logging every 5: the line at step 10 is the mean of steps 8-10
    (it divided their sum by 5)."""
    args = ["--log-every", "5", "--checkpoint-every-s", "0", "--ckpt-dir", str(tmp_path)]
    assert _run_in_process(monkeypatch, ["--steps", "7", *args], []) == 0
    losses: list[float] = []
    capsys.readouterr()
    assert _run_in_process(monkeypatch, ["--steps", "12", *args], losses) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "step 10/12" in x)
    assert line.endswith(f"loss {sum(losses[:3]) / 3:.4f}"), (line, losses)


def test_a_resume_with_other_arguments_stops_before_training(tmp_path, monkeypatch, capsys) -> None:
    args = ["--steps", "3", "--checkpoint-every-s", "0", "--ckpt-dir", str(tmp_path)]
    assert _run_in_process(monkeypatch, args, []) == 0
    capsys.readouterr()
    losses: list[float] = []
    assert _run_in_process(monkeypatch, [*args, "--lr", "0.1"], losses) == 2
    assert losses == []
    err = capsys.readouterr().err
    assert err.startswith(f"hpc_harness: error: {tmp_path} holds checkpoints of another run: lr ")
    assert err.count("\n") == 1
    # the way out the message names: --fresh moves the earlier run's folder aside
    ck = tmp_path / "ck"
    args[-1] = str(ck)
    assert _run_in_process(monkeypatch, args, []) == 0
    assert _run_in_process(monkeypatch, [*args, "--lr", "0.1", "--fresh"], losses) == 0
    assert len(losses) == 3
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("ck.old-")]) == 1
    assert "starting fresh; the earlier run's files are in " in capsys.readouterr().out


def test_the_examples_resume_free_flags_may_change_across_a_resume(tmp_path, monkeypatch) -> None:
    """charlm.RESUME_FREE: more --steps, another --log-every and a testing flag resume."""
    args = ["--checkpoint-every-s", "0", "--ckpt-dir", str(tmp_path)]
    assert _run_in_process(monkeypatch, ["--steps", "3", *args], []) == 0
    losses: list[float] = []
    more = ["--steps", "5", "--log-every", "0", "--step-sleep", "0.001", *args]
    assert _run_in_process(monkeypatch, more, losses) == 0
    assert len(losses) == 2


def test_a_checkpoint_past_steps_stops_before_training(tmp_path, monkeypatch, capsys) -> None:
    # --steps may grow across a resume, but a checkpoint already past it is a longer run's:
    # its model must not become this run's last.pt.
    args = ["--checkpoint-every-s", "0", "--ckpt-dir", str(tmp_path)]
    assert _run_in_process(monkeypatch, ["--steps", "5", *args], []) == 0
    before = (tmp_path / "last.pt").read_bytes()
    capsys.readouterr()
    assert _run_in_process(monkeypatch, ["--steps", "3", *args], []) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"hpc_harness: error: {tmp_path} holds a checkpoint of global step 5, past --steps 3"
    )
    assert err.count("\n") == 1 and (tmp_path / "last.pt").read_bytes() == before


def test_a_checkpoint_weights_only_refuses_stops_before_training(
    tmp_path, monkeypatch, capsys
) -> None:
    import numpy as np

    args = ["--steps", "3", "--checkpoint-every-s", "0", "--ckpt-dir", str(tmp_path)]
    assert _run_in_process(monkeypatch, args, []) == 0
    path = tmp_path / "ckpt_step00000003.pt"
    torch.save({**torch.load(path, weights_only=False), "best": np.float64(1.0)}, path)
    capsys.readouterr()
    losses: list[float] = []
    assert _run_in_process(monkeypatch, [*args[:1], "6", *args[2:]], losses) == 2
    assert losses == []
    err = capsys.readouterr().err
    assert err.startswith(f"hpc_harness: error: {path} is intact") and err.count("\n") == 1


def test_a_resume_under_another_world_size_stops_before_training(
    tmp_path, monkeypatch, capsys
) -> None:
    """The loop's position is its step count (divmod by the steps of an epoch, which depend on
    the world size): resumed by another number of ranks it trained the wrong part of the data
    (2 ranks at step 40 had read epoch 2 to sample 64; 1 rank went on in epoch 1 after 32)."""
    from hpc_harness import checkpoint as ckpt

    args = ["--steps", "3", "--checkpoint-every-s", "0", "--ckpt-dir", str(tmp_path)]
    assert _run_in_process(monkeypatch, args, []) == 0
    path = str(tmp_path / "ckpt_step00000003.pt")
    state = torch.load(path, weights_only=False)
    assert state["world_size"] == 1
    ckpt.atomic_save({**state, "world_size": 2}, path)
    capsys.readouterr()
    losses: list[float] = []
    assert _run_in_process(monkeypatch, [*args[:1], "6", *args[2:]], losses) == 2
    assert losses == []
    assert capsys.readouterr().err == (
        f"hpc_harness: error: {path} was written by 2 ranks; this loop resumes with as many "
        "(its position is a step count): run with 2, or start another --ckpt-dir\n"
    )


def test_log_every_0_trains_without_progress_lines(tmp_path, monkeypatch, capsys) -> None:
    """0 means no progress lines, as in the Trainer (it divided the step by zero)."""
    args = ["--steps", "3", "--log-every", "0", "--checkpoint-every-s", "0"]
    losses: list[float] = []
    assert _run_in_process(monkeypatch, [*args, "--ckpt-dir", str(tmp_path)], losses) == 0
    assert len(losses) == 3
    assert "hpc_harness: step " not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    help_words = " ".join(capsys.readouterr().out.split())
    assert "--log-every LOG_EVERY steps between progress lines, 0: none (default: 20)" in help_words


# 128 windows a batch: 4 steps an epoch on one rank, 2 on each of two
SHORT = ["--batch-size", "128", "--log-every", "0", "--checkpoint-every-s", "0", "--seed", "3"]


def test_each_epoch_trains_another_order_and_seeds_its_workers_anew(tmp_path, monkeypatch) -> None:
    """Without the sampler's set_epoch every epoch repeated epoch 0's order; the loader's
    generator, never seeded, gave a resumed process epoch 0's worker seeds in the epoch it
    resumed (1 here)."""
    targets: list[list[int]] = []
    seeds = _record_worker_seeds(monkeypatch)
    _record_steps(monkeypatch, [], targets)
    args = [*SHORT, "--ckpt-dir", str(tmp_path / "straight")]
    assert _main_in_process(["--steps", "6", *args]) == 0
    assert len(targets) == 6 and targets[4:] != targets[:2]  # epoch 1 (steps 5, 6) != epoch 0
    assert len(seeds) == 2 and seeds[0] != seeds[1]
    resumed_seeds = _record_worker_seeds(monkeypatch)
    args = [*SHORT, "--ckpt-dir", str(tmp_path / "ck")]
    assert _main_in_process(["--steps", "5", *args]) == 0  # ends one step into epoch 1
    assert _main_in_process(["--steps", "6", *args]) == 0  # resumed there
    assert resumed_seeds == [*seeds, seeds[1]]


def _rank_of_two(rank: int, world_size: int, ckpt_dir: str) -> tuple[str, str, list[int]]:
    """charlm.main as one rank of a gloo group (spawn_gloo): a digest of its final weights and
    one of the global RNG's state at its first step (after dropout drew), and its worker seeds
    (digests: spawn_gloo's queue is a pipe that holds 64 KiB until it is read after the join)."""
    import hashlib

    from hpc_harness import pieces
    from hpc_harness.examples import charlm

    monkeypatch = pytest.MonkeyPatch()  # this process is the rank's own
    monkeypatch.setattr(pieces, "setup", lambda: gloo_context(rank, world_size))
    monkeypatch.setattr(pieces, "cleanup", lambda: None)  # spawn_gloo leaves the group
    models: list[torch.nn.Module] = []

    class Kept(charlm.CharLM):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            models.append(self)

    monkeypatch.setattr(charlm, "CharLM", Kept)
    rng_states = _record_steps(monkeypatch, [])
    seeds = _record_worker_seeds(monkeypatch)
    assert charlm.main(["--steps", "3", *SHORT, "--ckpt-dir", ckpt_dir]) == 0
    weights = hashlib.sha256()
    for name, tensor in models[0].state_dict().items():
        weights.update(name.encode() + tensor.numpy().tobytes())
    return weights.hexdigest(), hashlib.sha256(rng_states[0]).hexdigest(), seeds


def test_two_ranks_end_with_one_model_from_their_own_dropout_and_worker_seeds(tmp_path) -> None:
    """Each rank draws its own dropout masks (seed + rank) and worker seeds, and averaging the
    gradients keeps their models equal. The bitwise test above compares rank 0's model alone:
    ranks training independently (no average_gradients), or with one another's dropout masks
    (every rank seeded alike), passed it."""
    (weights0, dropout0, seeds0), (weights1, dropout1, seeds1) = spawn_gloo(
        _rank_of_two, 2, str(tmp_path)
    )
    assert weights0 == weights1
    assert dropout0 != dropout1
    assert len(seeds0) == 2 and all(a != b for a, b in zip(seeds0, seeds1))
