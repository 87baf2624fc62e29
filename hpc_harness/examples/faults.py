"""Faults the tests provoke in the examples' real jobs, through hidden flags (not in --help).

``--fail-at-step N`` raises after global step N on rank ``--fail-rank`` (0), ``--step-sleep S``
sleeps S seconds after every step, and ``--pause-in-save-at-step N`` holds that step's
checkpoint, written in full under its temporary name, for 120 s before the rename (a job
killed mid-save). The bats suites pass them to ``python -m hpc_harness.train`` and
``python -m hpc_harness.examples.charlm`` inside SLURM jobs. They are the examples' flags:
left out of the run's fingerprint, never in ``TrainConfig``, unknown to the library.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, fields
from typing import Any

from hpc_harness import checkpoint as ckpt

PAUSE_IN_SAVE_S = 120.0


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The hidden flags (:data:`FLAGS` are their names in the parsed arguments)."""
    hide = argparse.SUPPRESS
    parser.add_argument("--fail-at-step", type=int, default=None, help=hide)
    parser.add_argument("--fail-rank", type=int, default=0, help=hide)
    parser.add_argument("--step-sleep", type=float, default=0.0, help=hide)
    parser.add_argument("--pause-in-save-at-step", type=int, default=None, help=hide)


@dataclass
class Faults:
    fail_at_step: int | None = None  # raise after this global step ...
    fail_rank: int = 0  # ... on this rank
    step_sleep: float = 0.0  # seconds to sleep after every step
    pause_in_save_at_step: int | None = None  # hold that checkpoint's temp file 120 s

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Faults:
        return cls(**{name: getattr(args, name) for name in FLAGS})

    @property
    def active(self) -> bool:
        return self != Faults()

    def after_step(self, step: int, rank: int) -> None:
        if step == self.fail_at_step and rank == self.fail_rank:
            raise RuntimeError(f"--fail-at-step {step} on rank {rank} (testing aid)")
        if self.step_sleep:
            time.sleep(self.step_sleep)

    def write(self, state: dict[str, Any], path: str, step: int) -> None:
        """Rank 0's checkpoint write: ``checkpoint.atomic_save``, or at the step to pause at
        the same write held before its rename."""
        if step != self.pause_in_save_at_step:
            ckpt.atomic_save(state, path)
            return
        import torch

        hold = lambda tmp: time.sleep(PAUSE_IN_SAVE_S)  # noqa: E731
        ckpt.atomic_write(path, lambda f: torch.save(state, f), check=hold)


FLAGS = tuple(f.name for f in fields(Faults))


def trainer(faults: Faults, *args: Any, **kwargs: Any) -> Any:
    """``Trainer(*args, **kwargs)``, with ``faults`` applied when one is active."""
    from hpc_harness.trainer import Trainer

    if not faults.active:
        return Trainer(*args, **kwargs)

    class FaultyTrainer(Trainer):
        def _run_batch(self, batch: Any) -> None:
            super()._run_batch(batch)
            faults.after_step(self.global_step + 1, self.rank)  # the step this batch ends

        def _write(self, state: dict[str, Any], path: str) -> None:
            faults.write(state, path, self.global_step)

    return FaultyTrainer(*args, **kwargs)
