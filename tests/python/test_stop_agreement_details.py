"""StopAgreement's details, on fake clocks and a faked process group, in this process: the
defaults, the adaptive check interval (clamped to [1, 1000] steps), the timed checkpoint at
exactly ``checkpoint_every_s``, when the agreement is local, and the distributed agreement:
an asynchronous all-reduce (MAX) of the flags on the context's device, read at the next check.

No second process and no GPU: ``torch.distributed.is_initialized`` and ``all_reduce`` are
faked (:class:`OtherRank` plays rank 1), and the module's clocks are a :class:`FakeClock`."""

from __future__ import annotations

import signal
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_stop_agreement import _ctx, _steps_until_stop

from hpc_harness import signals
from hpc_harness.signals import StopAgreement


class FakeClock:
    """The ``time`` module as hpc_harness.signals sees it: ``perf_counter`` (the pace of the
    steps) and ``monotonic`` (the timed checkpoint) only move when a test moves them."""

    def __init__(self, perf: float = 0.0, mono: float = 100.0) -> None:
        self.perf, self.mono = perf, mono

    def perf_counter(self) -> float:
        return self.perf

    def monotonic(self) -> float:
        return self.mono


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(signals, "time", fake)
    return fake


def _steps(stop: StopAgreement, clock: FakeClock, dt: float, limit: int = 2000) -> int:
    """Steps of ``dt`` seconds each until should_stop() says stop (-1: not within limit)."""
    for step in range(1, limit + 1):
        clock.perf += dt
        if stop.should_stop():
            return step
    return -1


class FakeWork:
    """What ``all_reduce(..., async_op=True)`` returns: the result lands in the tensor at
    wait(), as with a real asynchronous collective."""

    def __init__(self, group: OtherRank, tensor: torch.Tensor, op: Any, other: torch.Tensor):
        self.group, self.tensor, self.op, self.other = group, tensor, op, other

    def wait(self) -> bool:
        self.group.waits += 1
        if self.op == dist.ReduceOp.MAX:
            self.tensor.copy_(torch.maximum(self.tensor, self.other))
        else:  # torch's default op, SUM
            self.tensor.add_(self.other)
        return True


class OtherRank:
    """torch.distributed as rank 0 of two sees it for StopAgreement's one collective, faked in
    this process. ``other`` is what rank 1 contributes, [stop, checkpoint due, -proposal]
    (by default: no signal, no checkpoint, 1000 steps to its next check); it is combined with
    this rank's flags by the op asked for. ``devices`` are those of the tensors reduced."""

    def __init__(self, other: tuple[float, float, float] = (0.0, 0.0, -1000.0)) -> None:
        self.other = other
        self.devices: list[torch.device] = []
        self.ops: list[Any] = []
        self.waits = 0

    def all_reduce(
        self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, async_op: bool = False
    ) -> FakeWork:
        assert async_op  # training never waits for the agreement
        self.devices.append(tensor.device)
        self.ops.append(op)
        return FakeWork(self, tensor, op, torch.tensor(self.other, device=tensor.device))


@pytest.fixture
def group(monkeypatch: pytest.MonkeyPatch) -> OtherRank:
    """A process group that is initialized (faked): the distributed path, no second process."""
    fake = OtherRank()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_reduce", fake.all_reduce)
    return fake


def test_the_defaults_check_every_half_second_and_never_checkpoint(clock: FakeClock) -> None:
    """StopAgreement() alone: world size 1 on rank 0, no checkpoint due, a check about every
    0.5 s of steps (4 steps of 125 ms), and no timed checkpoint however long it runs."""
    stop = StopAgreement()
    assert (stop.is_main, stop.check_s, stop.check_every) == (True, 0.5, 0)
    assert stop.checkpoint_every_s == 0.0 and stop.checkpoint_due is False
    assert _steps(stop, clock, 0.125, limit=1) == -1  # the first check: 125 ms a step
    clock.mono += 1e6
    stop.signum = signal.SIGUSR1
    assert _steps(stop, clock, 0.125) == 4  # 0.5 s / 125 ms
    assert stop.checkpoint_due is False  # checkpoint_every_s 0: never due


def test_the_interval_is_check_s_over_the_measured_pace(clock: FakeClock) -> None:
    """Each check measures the time per step since the last check (elapsed / steps) and
    checks again after check_s of such steps."""
    stop = StopAgreement(check_s=1.0)
    assert _steps(stop, clock, 0.25, limit=1) == -1  # first check at once: 250 ms a step
    assert _steps(stop, clock, 0.0625, limit=4) == -1  # 4 steps later: 62.5 ms a step
    stop.signum = signal.SIGUSR1
    assert _steps(stop, clock, 0.0625) == 16  # 1 s / 62.5 ms


def test_the_interval_is_at_least_one_step(clock: FakeClock) -> None:
    """A step slower than check_s is checked at every step, not every other one."""
    stop = StopAgreement(check_s=0.5)
    assert _steps(stop, clock, 2.0, limit=1) == -1
    stop.signum = signal.SIGTERM
    assert _steps(stop, clock, 2.0) == 1


def test_the_interval_is_at_most_1000_steps(clock: FakeClock) -> None:
    """Even a step that takes no measurable time is checked within 1000 steps."""
    stop = StopAgreement()
    assert _steps(stop, clock, 0.0, limit=1) == -1
    stop.signum = signal.SIGUSR1
    assert _steps(stop, clock, 0.0) == 1000


def test_a_timed_checkpoint_falls_due_at_exactly_checkpoint_every_s(clock: FakeClock) -> None:
    """checkpoint_due turns True at the first check once checkpoint_every_s has passed (>=)
    since construction or the last saved(); saved() makes it False again."""
    stop = StopAgreement(_ctx(), check_every=1, checkpoint_every_s=2.0)
    seen = []
    for mono in (101.5, 102.0, 102.5):  # built at 100.0
        clock.mono = mono
        seen.append((stop.should_stop(), stop.checkpoint_due))
    assert seen == [(False, False), (False, True), (False, True)]  # stays due until saved
    stop.saved()
    assert stop.checkpoint_due is False
    seen = []
    for mono in (104.0, 104.5):  # saved at 102.5
        clock.mono = mono
        seen.append((stop.should_stop(), stop.checkpoint_due))
    assert seen == [(False, False), (False, True)]


@pytest.mark.parametrize(
    ("ctx", "initialized"),
    [(_ctx(world_size=2), False), (_ctx(world_size=1), True), (None, True)],
    ids=["two-ranks-no-group", "one-rank-in-a-group", "no-ctx-in-a-group"],
)
def test_without_two_ranks_in_a_group_the_agreement_is_local(
    ctx: SimpleNamespace | None,
    initialized: bool,
    group: OtherRank,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only world size > 1 with an initialized process group reduces anything (ctx None is
    world size 1): otherwise a signal stops at the very check it came before, no all-reduce."""
    monkeypatch.setattr(dist, "is_initialized", lambda: initialized)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: ctx.world_size if ctx else 1)
    stop = StopAgreement(ctx, check_every=2)
    assert [stop.should_stop() for _ in range(4)] == [False] * 4
    stop.signum = signal.SIGUSR1
    assert _steps_until_stop(stop) == 2
    assert group.devices == []


def test_with_a_group_the_flags_are_reduced_on_the_ctx_device(group: OtherRank) -> None:
    """The flags tensor is made on ctx.device (a GPU's for NCCL, faked here by the meta
    device), not on the CPU, and all-reduced with MAX."""
    ctx = SimpleNamespace(world_size=2, is_main=True, device=torch.device("meta"))
    stop = StopAgreement(ctx, check_every=1)
    assert stop.should_stop() is False
    assert group.devices == [torch.device("meta")]
    assert group.ops == [dist.ReduceOp.MAX]


def test_with_a_group_the_agreement_is_the_max_read_one_check_later(group: OtherRank) -> None:
    """Each check starts an all-reduce (MAX) of [stop, due, -proposal] and reads the previous
    one: the smallest proposal sets the interval (here 1 step; a sum would make it 1001), a
    checkpoint is due only when a rank said so (flag > 0, not 0), the stop comes from the other
    rank through the reduction, and a stop is read once: the next check agrees afresh."""
    stop = StopAgreement(_ctx(world_size=2), check_every=1)
    seen = [(stop.should_stop(), stop.checkpoint_due) for _ in range(3)]
    assert seen == [(False, False)] * 3
    assert len(group.ops) == 3  # a check at every step
    group.other = (1.0, 0.0, -1000.0)  # rank 1 got SIGUSR1
    assert [stop.should_stop() for _ in range(2)] == [False, True]  # read one check later
    assert stop.signum is None and stop.checkpoint_due is False
    assert len(group.ops) == 4  # no new reduction once stopped
    # A loop that goes on anyway: the next check starts a new agreement, not the old result.
    assert [stop.should_stop() for _ in range(2)] == [False, True]
    assert len(group.ops) == group.waits == 5  # each read once, none left in flight


def test_with_a_group_a_checkpoint_due_on_rank_0_is_due_on_every_rank(group: OtherRank) -> None:
    """A rank that is not rank 0 never times a checkpoint itself; it reads rank 0's from the
    reduction, at the same step as rank 0."""
    stop = StopAgreement(_ctx(world_size=2, is_main=False), check_every=1, checkpoint_every_s=1.0)
    group.other = (0.0, 1.0, -1.0)
    seen = [(stop.should_stop(), stop.checkpoint_due) for _ in range(2)]
    assert seen == [(False, False), (False, True)]


def test_a_drained_reduction_is_read_once_at_the_next_check(group: OtherRank) -> None:
    """drain() waits for the reduction in flight (once, however often it is called); the next
    check reads its result and starts a new one, which the check after that reads."""
    stop = StopAgreement(_ctx(world_size=2), check_every=2)
    assert [stop.should_stop() for _ in range(2)] == [False, False]  # one reduction in flight
    stop.drain()
    stop.drain()
    assert group.waits == 1
    group.other = (1.0, 0.0, -1000.0)  # too late for the drained reduction
    assert [stop.should_stop() for _ in range(2)] == [False, False]  # read; a new one started
    assert (len(group.ops), group.waits) == (2, 1)
    assert [stop.should_stop() for _ in range(2)] == [False, True]


def _saves(
    stop: StopAgreement, clock: FakeClock, steps: int, step_s: float, checkpoint_every: int = 0
) -> list[int]:
    """The steps at which the Trainer's loop would save: ``steps`` steps of ``step_s`` seconds,
    each checked (no stop expected), then a save when a timed checkpoint is due or at every
    ``checkpoint_every`` steps, as the Trainer does it: drain, save, saved()."""
    saves = []
    for step in range(1, steps + 1):
        clock.perf += step_s
        clock.mono += step_s
        assert not stop.should_stop()
        if stop.checkpoint_due or (checkpoint_every and step % checkpoint_every == 0):
            stop.drain()
            saves.append(step)
            stop.saved()
    return saves


def test_with_a_group_a_timed_checkpoint_is_saved_once_per_interval(
    group: OtherRank, clock: FakeClock
) -> None:
    """The check that reads an agreed "due" must not propose it again: the save follows at
    this step (and saved() restarts the interval), so a second reduction carrying the same due
    would make every rank save again one check later (it did: every timed checkpoint of a
    multi-rank run was written twice, five steps apart here)."""
    stop = StopAgreement(_ctx(world_size=2), check_every=5, checkpoint_every_s=1.0)
    assert _saves(stop, clock, steps=400, step_s=0.01) == [105, 210, 315]


def test_a_save_between_two_checks_makes_the_due_in_flight_stale(
    group: OtherRank, clock: FakeClock
) -> None:
    """A step checkpoint (checkpoint_every) right after the check that proposed a timed one:
    the due read at the next check was proposed before that save, so it is not acted on (it
    was: every rank saved again one check later, steps 5 and 6 here)."""
    stop = StopAgreement(_ctx(world_size=2), check_every=1, checkpoint_every_s=4.5)
    assert _saves(stop, clock, steps=12, step_s=1.0, checkpoint_every=5) == [5, 10]


def test_stop_now_waits_for_the_reduction_in_flight_then_asks_every_rank_at_once(
    group: OtherRank, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop_now() (an epoch's end): the reduction in flight first (every rank issues the
    collectives in the same order), then one blocking MAX all-reduce of the stop flag."""
    stop = StopAgreement(_ctx(world_size=2), check_every=1)
    assert stop.should_stop() is False  # one reduction in flight
    asked: list[Any] = []

    def all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, async_op: bool = False):
        if async_op:
            return group.all_reduce(tensor, op, async_op)
        asked.append((op, group.waits, tensor.tolist()))
        tensor.fill_(1.0)  # rank 1 had a signal
        return None

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    assert stop.stop_now() is True
    assert asked == [(dist.ReduceOp.MAX, 1, [0.0])]
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None: asked.append(t.tolist()))
    assert stop.stop_now() is False  # no rank had a signal: the MAX is 0
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    alone = StopAgreement(_ctx(world_size=1))  # a group of one (initialized): no collective
    alone.signum = 10
    assert alone.stop_now() is True and asked[1:] == [[0.0]]


def test_stop_now_alone_is_this_process_signal() -> None:
    stop = StopAgreement(_ctx())
    assert stop.stop_now() is False
    stop.signum = 10
    assert stop.stop_now() is True
