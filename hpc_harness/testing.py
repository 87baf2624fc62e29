"""Testing aids: a Trainer that fails, slows down or stalls a save on purpose.

Not part of the user-facing configuration (``TrainConfig`` holds only what users set). The
examples build :class:`TestingTrainer` only when one of their hidden ``--fail-at-step``,
``--fail-rank``, ``--step-sleep`` or ``--pause-in-save-at-step`` flags is given; the
integration tests (tests/bats/integration/harness.bats, tests/bats/reliability/faults.bats)
use them to provoke a crash, a slow step or a rank killed mid-write.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from hpc_harness import checkpoint as ckpt
from hpc_harness.trainer import Trainer

PAUSE_IN_SAVE_S = 120.0


@dataclass
class TestingHooks:
    fail_at_step: int | None = None  # raise after this global step ...
    fail_rank: int = 0  # ... on this rank
    step_sleep: float = 0.0  # seconds to sleep after every step
    pause_in_save_at_step: int | None = None  # hold that checkpoint's temp file 120 s

    __test__ = False  # not a pytest class

    @property
    def active(self) -> bool:
        return self != TestingHooks()

    def after_step(self, step: int, rank: int) -> None:
        if step == self.fail_at_step and rank == self.fail_rank:
            raise RuntimeError(f"--fail-at-step {step} on rank {rank} (testing aid)")
        if self.step_sleep:
            time.sleep(self.step_sleep)

    def pause_before_rename(self, step: int) -> float:
        return PAUSE_IN_SAVE_S if step == self.pause_in_save_at_step else 0.0


class TestingTrainer(Trainer):
    """:class:`~hpc_harness.trainer.Trainer` with :class:`TestingHooks` applied."""

    __test__ = False

    def __init__(self, *args: Any, hooks: TestingHooks, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hooks = hooks

    def _run_batch(self, batch: Any) -> None:
        super()._run_batch(batch)
        self.hooks.after_step(self.global_step + 1, self.rank)  # the step this batch ends

    def _write(self, state: dict[str, Any], path: str) -> None:
        pause = self.hooks.pause_before_rename(self.global_step)
        ckpt.atomic_save(state, path, pause_before_rename=pause)
