"""The loop in hpc_harness.pieces' docstring, run as written (world size 1, in this process),
and its copy in README.md, kept the same."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch
from conftest import REPO, bitwise_equal
from torch.utils.data import DataLoader, TensorDataset

from hpc_harness import pieces

B, SAMPLES, TOTAL_STEPS = 2, 10, 7  # 5 steps an epoch: the run ends 2 steps into epoch 1


def _recipe() -> str:
    """The code block of the pieces docstring (the lines after ``::``), dedented."""
    block = []
    for line in pieces.__doc__.split("::\n\n", 1)[1].splitlines():
        if line and not line.startswith(" "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip() + "\n"


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
    monkeypatch, ckpt_dir: str, stop_at: int, trained: list[list[float]]
) -> tuple[int | None, dict[str, torch.Tensor]]:
    """Run the docstring's loop once as written (AdamW, a model with dropout), appending the
    batches it trains to ``trained``; returns its exit code at a stop (None when it ran to its
    end) and the model's weights then."""
    ds = TensorDataset(torch.arange(float(SAMPLES)))
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

    monkeypatch.setattr(pieces, "StopAgreement", lambda ctx: _StopAt(stop_at))
    namespace.update(
        ds=ds, B=B, DataLoader=DataLoader, torch=torch, ckpt_dir=ckpt_dir,
        total_steps=TOTAL_STEPS, steps_per_epoch=SAMPLES // B, model=model, loss=Loss(),
        opt=opt,
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


def test_the_readme_shows_the_docstrings_recipe() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Your own loop: the pieces", 1)[1]
    shown = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert shown is not None
    assert shown.group(1) == _recipe()
