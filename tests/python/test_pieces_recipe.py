"""The pieces recipe of docs/harness.md, run as written (world size 1, in this process)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, bitwise_equal, gloo_context
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness import pieces

B, SAMPLES, TOTAL_STEPS = 2, 10, 7  # 5 steps an epoch: the run ends 2 steps into epoch 1


def _recipe() -> str:
    """The python block of docs/harness.md's section on the pieces."""
    page = (REPO / "docs" / "harness.md").read_text()
    section = page.split("## Your own loop: the pieces", 1)[1]
    shown = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert shown is not None, "no python block in docs/harness.md's pieces section"
    return shown.group(1)


class _StopAt:
    """StopAgreement as the recipe calls it, saying stop at the ``stop_at``-th step."""

    signal_name = "SIGUSR1"

    def __init__(self, stop_at: int) -> None:
        self.stop_at, self.checks = stop_at, 0

    def install(self) -> _StopAt:
        return self

    def should_stop(self) -> bool:
        self.checks += 1
        return self.checks == self.stop_at


def _run_recipe(
    monkeypatch,
    ckpt_dir: str,
    stop_at: int,
    trained: list[list[float]],
    rank: int = 0,
    world_size: int = 1,
    worker_seeds: list[int] | None = None,
    samples: int = SAMPLES,
    group: bool = False,
) -> tuple[int | None, dict[str, torch.Tensor]]:
    """Run the recipe's loop once as written (AdamW, a model with dropout), appending the
    batches it trains to ``trained``; returns its exit code at a stop (None when it ran to its
    end) and the model's weights then. With ``world_size`` above 1 it is rank ``rank``'s part
    alone (its gradients not averaged: the other ranks are not here), or with ``group`` one
    rank of the gloo group this process is in (averaged). ``worker_seeds`` gets
    each epoch's base seed of the DataLoader's workers (worker i seeds torch, random and numpy
    with base seed + i: its augmentations)."""
    ds = TensorDataset(torch.arange(float(samples)))
    torch.manual_seed(0)  # the same initial weights in every run
    model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    namespace: dict = {}

    class Loss:  # the user's step: what the recipe writes as loss.backward()
        def backward(self) -> None:
            (x,) = namespace["batch"]
            trained.append(x.tolist())
            opt.zero_grad()
            model(x[:, None]).pow(2).mean().backward()  # dropout draws on the global RNG

    class SeedsRecorded(DataLoader):
        def _get_iterator(self):  # an epoch's iterator, its base seed drawn
            batches = super()._get_iterator()
            (worker_seeds if worker_seeds is not None else []).append(batches._base_seed)
            return batches

    monkeypatch.setattr(pieces, "StopAgreement", lambda ctx: _StopAt(stop_at))
    if group:  # the group outlives the recipe's exit: the next run in this process uses it
        ctx = gloo_context(rank, world_size)
        monkeypatch.setattr(pieces, "setup", lambda: ctx)
        monkeypatch.setattr(pieces, "cleanup", lambda: None)
    elif world_size > 1:
        ctx = SimpleNamespace(rank=rank, world_size=world_size)  # no group: no collective
        monkeypatch.setattr(pieces, "setup", lambda: ctx)
        monkeypatch.setattr(pieces, "average_gradients", lambda model, world_size: None)
    namespace.update(
        ds=ds, B=B, DataLoader=SeedsRecorded, torch=torch, ckpt_dir=ckpt_dir,
        total_steps=TOTAL_STEPS, steps_per_epoch=samples // (B * world_size), model=model,
        loss=Loss(), opt=opt,
    )  # fmt: skip
    code = None
    try:
        exec(_recipe(), namespace)  # the user's part
    except SystemExit as stopped:
        code = stopped.code
    return code, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("stop_at", [3, 9])
def test_the_recipe_interrupted_and_resumed_trains_as_an_uninterrupted_run(
    tmp_path, monkeypatch, stop_at: int
) -> None:
    """Its inner loop went on to the epoch's end, past total_steps (10 steps, not 7); a stop
    in that stretch (at step 9) left a checkpoint whose resume trained nothing more, so that
    run ended in another state than an uninterrupted one. The recipe saved the model alone
    and never loaded it (a comment said to): a user who copied it resumed AdamW's moments
    from zero, and the resumed weights were not the uninterrupted run's."""
    straight: list[list[float]] = []
    code, straight_weights = _run_recipe(monkeypatch, str(tmp_path / "straight"), 0, straight)
    assert code is None and len(straight) == TOTAL_STEPS
    interrupted: list[list[float]] = []
    code, weights = _run_recipe(monkeypatch, str(tmp_path / "ck"), stop_at, interrupted)
    if stop_at <= TOTAL_STEPS:  # checkpointed and exited 42; the resume trains the rest
        assert code == pieces.REQUEUE_EXIT_CODE and len(interrupted) == stop_at
        code, weights = _run_recipe(monkeypatch, str(tmp_path / "ck"), 0, interrupted)
    assert code is None  # (a stop at step 9: the run ended before it)
    assert interrupted == straight
    assert bitwise_equal(weights, straight_weights)


def test_the_recipes_workers_seeds_differ_by_rank_and_epoch_and_resume_alike(
    tmp_path, monkeypatch
) -> None:
    """The recipe's loader had a torch.Generator() of its own and nothing more: every rank's
    workers drew the same seeds (the same augmentations on every rank), and a resumed process
    drew epoch 0's seeds again in the epoch it resumed (the generator is not checkpointed)."""
    seeds = {}
    for rank in (0, 1):
        seeds[rank] = []
        path = str(tmp_path / f"rank{rank}")
        _run_recipe(monkeypatch, path, 0, [], rank, 2, worker_seeds=seeds[rank])
    assert len(seeds[0]) == 4  # 2 steps an epoch: 7 steps end in epoch 3
    assert all(a != b for a, b in zip(seeds[0], seeds[1])), seeds
    assert len(set(seeds[0])) == len(seeds[0]), seeds[0]
    resumed: list[int] = []
    code, _ = _run_recipe(monkeypatch, str(tmp_path / "ck"), 3, [], 0, 2, worker_seeds=resumed)
    assert code == pieces.REQUEUE_EXIT_CODE and resumed == seeds[0][:2]
    _run_recipe(monkeypatch, str(tmp_path / "ck"), 0, [], 0, 2, worker_seeds=resumed)
    assert resumed == seeds[0][:2] + seeds[0][1:]  # the resume starts in epoch 1 again


def test_the_pieces_docstring_points_to_the_recipe() -> None:
    assert "docs/harness.md" in pieces.__doc__
    assert "hp.setup()" in _recipe()
