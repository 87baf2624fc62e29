"""StopAgreement from a user's loop, in this process: at which step a signal stops training,
the timed checkpoint, the handlers, and (with a process group) the asynchronous agreement."""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import pytest
import torch

from hpc_harness.signals import StopAgreement


def _ctx(world_size: int = 1, is_main: bool = True) -> SimpleNamespace:
    return SimpleNamespace(world_size=world_size, is_main=is_main, device=torch.device("cpu"))


def _steps_until_stop(stop: StopAgreement, limit: int = 50) -> int:
    for step in range(1, limit + 1):
        if stop.should_stop():
            return step
    return -1


def test_alone_a_signal_stops_at_the_next_check() -> None:
    stop = StopAgreement(_ctx(), check_every=4)
    assert [stop.should_stop() for _ in range(8)] == [False] * 8
    stop.signum = signal.SIGUSR1  # as the handler does
    assert _steps_until_stop(stop) == 4  # checks fall every 4 steps
    assert stop.signal_name == "SIGUSR1"


def test_check_every_one_reacts_at_the_same_step() -> None:
    stop = StopAgreement(check_every=1)
    assert not stop.should_stop()
    stop.signum = signal.SIGTERM
    assert stop.should_stop()
    assert stop.signal_name == "SIGTERM"


def test_the_adaptive_interval_is_about_check_s_of_steps() -> None:
    stop = StopAgreement(check_s=0.05)
    for _ in range(4):
        time.sleep(0.01)
        stop.should_stop()
    # 10 ms steps, a check every 50 ms: about 5 steps (sleep only lengthens a step)
    stop.signum = signal.SIGUSR1
    steps = 1
    while not stop.should_stop():
        time.sleep(0.01)
        steps += 1
    assert steps <= 5, steps  # within check_s of steps, not check_every=1's default of 1 each


def test_the_adaptive_interval_is_at_most_1000_steps() -> None:
    stop = StopAgreement(check_s=3600.0)
    stop.should_stop()  # the first check comes at once: then 1000 steps, not 3600 s of them
    stop.signum = signal.SIGUSR1
    assert _steps_until_stop(stop, 2000) == 1000


def test_a_timed_checkpoint_falls_due_and_saved_restarts_it() -> None:
    stop = StopAgreement(_ctx(), check_every=1, checkpoint_every_s=0.2)
    assert not stop.should_stop() and not stop.checkpoint_due
    time.sleep(0.25)
    assert not stop.should_stop() and stop.checkpoint_due
    assert stop.checkpoint_due  # stays due until saved
    stop.saved()
    assert not stop.checkpoint_due
    assert not stop.should_stop() and not stop.checkpoint_due


def test_no_timed_checkpoint_without_an_interval_or_off_rank_0() -> None:
    for stop in (
        StopAgreement(_ctx(), check_every=1),
        StopAgreement(_ctx(is_main=False), check_every=1, checkpoint_every_s=0.01),
    ):
        time.sleep(0.02)
        stop.should_stop()
        assert not stop.checkpoint_due


def test_install_sets_the_flag_on_a_signal_and_uninstall_restores(monkeypatch) -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    try:
        stop = StopAgreement(check_every=1).install()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.should_stop() and stop.signal_name == "SIGUSR1"
        assert seen == []
        stop.uninstall()
        os.kill(os.getpid(), signal.SIGUSR1)  # the user's handler is back
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_installed_twice_uninstall_still_puts_back_the_users_handler() -> None:
    """A second install() (a loop that installs per epoch, or the Trainer inside a user's
    install) must not record its own handler as the one to put back."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    try:
        stop = StopAgreement(check_every=1).install().install()
        stop.uninstall()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1] and stop.signum is None
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_flag_names_no_signal_until_one_came() -> None:
    stop = StopAgreement()
    assert stop.signum is None and stop.signal_name == ""
    previous = signal.getsignal(signal.SIGTERM)
    stop.install((signal.SIGTERM,))
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM and stop.signal_name == "SIGTERM"
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) == previous


@pytest.fixture
def fake_group():
    """A process group of 2 in which this process is rank 0 and every collective returns this
    rank's own values: the distributed code path, with no second process."""
    import torch.distributed as dist

    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


def test_with_a_group_the_stop_is_read_one_check_later(fake_group) -> None:
    # The flags are all-reduced asynchronously at a check and read at the next one, so
    # training never waits for the reduction: a signal before check k stops at check k+1.
    stop = StopAgreement(_ctx(world_size=2), check_every=3)
    assert _steps_until_stop(stop, 6) == -1
    stop.signum = signal.SIGUSR1
    assert _steps_until_stop(stop) == 6  # check at +3 starts the reduction, +6 reads it


def test_with_a_group_a_drained_stop_is_not_lost(fake_group) -> None:
    stop = StopAgreement(_ctx(world_size=2), check_every=2)
    stop.signum = signal.SIGUSR1
    assert _steps_until_stop(stop, 2) == -1  # reduction in flight
    stop.drain()  # e.g. at an epoch end, before another collective
    stop.drain()  # a second drain changes nothing
    assert _steps_until_stop(stop) == 2


def test_with_a_group_the_timed_checkpoint_is_agreed_too(fake_group) -> None:
    stop = StopAgreement(_ctx(world_size=2), check_every=1, checkpoint_every_s=0.01)
    time.sleep(0.02)
    assert not stop.should_stop() and not stop.checkpoint_due  # proposed, in flight
    assert not stop.should_stop() and stop.checkpoint_due  # read back: due everywhere
