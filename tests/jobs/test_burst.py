"""BurstGate: background work yields to saves in flight and to announced saves.

Driven by a fake clock: a save "finishes meanwhile" through a clock callback,
so no test sleeps or depends on how fast the machine is.
"""

from __future__ import annotations

import threading

from mouthguard.clock import SystemClock
from mouthguard.jobs.burst import ANNOUNCE_LEAD_SECONDS, MAX_YIELD_SECONDS, BurstGate
from tests.fake_clock import FakeClock


def test_idle_gate_does_not_wait() -> None:
    clock = FakeClock()
    gate = BurstGate(clock=clock)
    assert not gate.busy
    assert gate.wait(timeout=1.0) == 0.0
    assert clock.waited == []  # not even one poll of the condition
    assert gate.yielded_seconds == 0.0


def test_wait_blocks_until_the_save_finishes() -> None:
    clock = FakeClock()
    gate = BurstGate(clock=clock)
    gate.save_started()
    finished_at: list[float] = []

    def finish() -> None:
        finished_at.append(clock.monotonic())
        gate.save_finished()

    clock.call_later(3.375, finish)  # between two polls; binary-exact, so == below is fair
    waited = gate.wait(timeout=60.0)
    assert finished_at == [clock.monotonic()]  # it returned when the save ended, not later
    assert waited == 3.375
    assert gate.yielded_seconds == 3.375
    assert not gate.busy


def test_wait_is_bounded() -> None:
    clock = FakeClock()
    gate = BurstGate(clock=clock)
    gate.save_started()  # never finished
    assert gate.wait(timeout=2.0) == 2.0
    assert gate.busy  # it gave up waiting; the save is still marked
    # Polls are at most a quarter second apart, so a missed notification costs little.
    assert max(clock.waited) <= 0.25 and sum(clock.waited) == 2.0


def test_default_bound_is_the_longest_yield() -> None:
    clock = FakeClock()
    gate = BurstGate(clock=clock)
    gate.save_started()
    assert gate.wait() == MAX_YIELD_SECONDS


class _ReportingClock(SystemClock):
    """The real clock, telling the test when a waiter has parked on the condition."""

    def __init__(self) -> None:
        self.parked = threading.Event()

    def wait(self, cond: threading.Condition, timeout: float) -> None:
        self.parked.set()
        super().wait(cond, timeout)


def test_a_save_finished_in_another_thread_ends_the_wait() -> None:
    """Real threads and the real condition: the waiter is parked when the save ends."""
    clock = _ReportingClock()
    gate = BurstGate(clock=clock)
    gate.save_started()
    woke = threading.Event()

    def waiter() -> None:
        gate.wait(timeout=3600.0)  # a wait that never ends hangs the test, it does not pass
        woke.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert clock.parked.wait(timeout=60)
    assert not woke.is_set()  # the save is still in flight: nothing may end the wait yet
    gate.save_finished()
    thread.join(timeout=60)
    assert woke.is_set()


def test_announcement_makes_the_gate_busy_shortly_before_the_save() -> None:
    clock = FakeClock()
    gate = BurstGate(clock=clock)
    gate.announce(seconds_until_save=ANNOUNCE_LEAD_SECONDS + 30, nbytes=1 << 30)
    assert not gate.busy  # far ahead: keep copying
    clock.advance(29.5)
    assert not gate.busy  # still more than the lead time ahead
    clock.advance(0.5)
    assert gate.busy  # within the lead time now
    assert gate.announcement is not None and gate.announcement.nbytes == 1 << 30
    gate.save_started()  # the announced save arrived
    assert gate.announcement is None
    gate.save_finished()
    assert not gate.busy


def test_an_announced_save_that_never_comes_stops_the_yielding() -> None:
    clock = FakeClock()
    gate = BurstGate(clock=clock)
    gate.announce(seconds_until_save=10.0, nbytes=1)
    clock.advance(10.0)
    assert gate.busy
    assert gate.wait(timeout=2 * MAX_YIELD_SECONDS) == MAX_YIELD_SECONDS + 0.25
    assert not gate.busy and gate.announcement is None
