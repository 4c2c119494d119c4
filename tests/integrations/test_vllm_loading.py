"""The connector worker's background loads (no engine: pure torch).

The jobs run on the real background thread; events decide when each may end, so
nothing here depends on timing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from mouthguard.integrations.vllm.loading import MAX_ASYNC_LOADS, BackgroundLoads

WAIT_S = 30.0  # a bound on each wait, not a measurement


def _gated(
    failed: list[int], gate: threading.Event, started: threading.Event
) -> Callable[[], list[int]]:
    def job() -> list[int]:
        started.set()
        assert gate.wait(WAIT_S)
        return failed

    return job


def _drain(loads: BackgroundLoads, want: set[str]) -> tuple[set[str], set[int]]:
    """Poll ``finished`` as the engine does each step until ``want`` is reported."""
    done: set[str] = set()
    failed: set[int] = set()
    for _ in range(10_000):
        more, bad = loads.finished()
        done |= more
        failed |= bad
        if want <= done:
            return done, failed
        threading.Event().wait(0.01)
    raise AssertionError(f"{want - done} never finished")


def test_a_load_is_reported_once_when_its_job_ends_with_its_failed_pages() -> None:
    loads = BackgroundLoads()
    gate, started = threading.Event(), threading.Event()
    loads.submit("r1", [7, 8, 9], _gated([9], gate, started))
    assert started.wait(WAIT_S)
    assert loads.finished() == (set(), set())  # still running: not reported
    assert len(loads) == 1
    gate.set()
    assert _drain(loads, {"r1"}) == ({"r1"}, {9})
    assert loads.finished() == (set(), set())  # reported once
    assert len(loads) == 0
    loads.close()


def test_a_job_that_raises_fails_all_its_pages() -> None:
    loads = BackgroundLoads()

    def broken() -> list[int]:
        raise RuntimeError("disk gone")

    loads.submit("r1", [3, 4], broken)
    assert _drain(loads, {"r1"}) == ({"r1"}, {3, 4})
    loads.close()


def test_one_load_per_request_and_at_most_the_bound_in_flight() -> None:
    loads = BackgroundLoads(limit=2)
    gate = threading.Event()
    loads.submit("r1", [1], _gated([], gate, threading.Event()))
    loads.submit("r2", [2], _gated([], gate, threading.Event()))
    assert len(loads) == 2
    loads.submit("r3", [3], _gated([], gate, threading.Event()))  # beyond the bound
    loads.submit("r1", [4], _gated([], gate, threading.Event()))  # r1 is still loading
    assert len(loads) == 2  # neither was queued
    # beyond the bound: reported at once, every page failed (a recompute); r1 is not
    # reported while its first load still writes its pages
    assert loads.finished() == ({"r3"}, {3})
    gate.set()
    # r1's result carries the refused second load's pages as failed
    assert _drain(loads, {"r1", "r2"}) == ({"r1", "r2"}, {4})
    loads.close()
    assert MAX_ASYNC_LOADS >= 1


def test_close_waits_for_the_loads_in_flight() -> None:
    loads = BackgroundLoads()
    finished = threading.Event()

    def job() -> list[int]:
        finished.set()
        return []

    loads.submit("r1", [1], job)
    loads.close()
    assert finished.is_set()


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BackgroundLoads(limit=0)
