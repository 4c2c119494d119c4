"""Prefetch: units opened ahead of the consumer, yielding to bursts with a bound in signal time."""

from __future__ import annotations

import threading

import pytest

from mouthguard.data.fetching.prefetch import Prefetcher
from mouthguard.jobs.burst import BurstGate
from tests.fake_clock import FakeClock


class Unit:
    def __init__(self, number: int) -> None:
        self.number = number
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Units:
    """Opens units, noting which thread opened which."""

    def __init__(self) -> None:
        self.opened: list[tuple[int, str]] = []
        self.event = threading.Event()

    def open_unit(self, number: int, *, must: bool) -> Unit:
        self.opened.append((number, threading.current_thread().name))
        self.event.set()
        return Unit(number)


class Instant:
    """A signal that is always busy and whose waits return at once, claiming none."""

    def __init__(self) -> None:
        self.waits = 0

    @property
    def busy(self) -> bool:
        return True

    def wait(self, timeout: float) -> float:
        self.waits += 1
        return 0.0


@pytest.mark.timeout(60)
def test_a_burst_that_never_ends_is_waited_for_its_bound_in_the_gate_s_own_time() -> None:
    clock = FakeClock()
    gate = BurstGate(clock=clock)
    gate.save_started()  # never finished
    units = Units()
    prefetcher = Prefetcher(units, depth=1, burst=gate, max_burst_wait=10.0)
    try:
        prefetcher.announce([0])
        assert units.event.wait(30)
        assert units.opened == [(0, "prefetch")]  # it gave up waiting, and prefetched
        assert sum(clock.waited) == pytest.approx(10.0)  # ten fake seconds, no real ones
        assert prefetcher.burst_waits == 1
        assert prefetcher.take(0).number == 0
    finally:
        prefetcher.close()


@pytest.mark.timeout(60)
def test_a_signal_that_returns_at_once_cannot_make_the_wait_spin() -> None:
    signal = Instant()
    units = Units()
    prefetcher = Prefetcher(units, depth=1, burst=signal, max_burst_wait=5.0)
    try:
        prefetcher.announce([0])
        assert units.event.wait(30)
        assert signal.waits == 10  # each call counts a whole 0.5 s step
    finally:
        prefetcher.close()


def test_the_consumer_takes_a_unit_itself_and_close_closes_the_rest() -> None:
    units = Units()
    prefetcher = Prefetcher(units, depth=0)  # no prefetch at all
    prefetcher.announce([0, 1])
    taken = prefetcher.take(1)
    assert taken.number == 1 and units.opened == [(1, threading.current_thread().name)]
    prefetcher.close()
