"""BurstGate: background work yields to saves in flight and to announced saves."""

from __future__ import annotations

import threading
import time

from mouthguard.jobs.burst import ANNOUNCE_LEAD_SECONDS, BurstGate


def test_idle_gate_does_not_wait() -> None:
    gate = BurstGate()
    assert not gate.busy
    assert gate.wait(timeout=1.0) < 0.05


def test_wait_blocks_until_the_save_finishes() -> None:
    gate = BurstGate()
    gate.save_started()
    released = threading.Event()

    def finish() -> None:
        time.sleep(0.3)
        released.set()
        gate.save_finished()

    threading.Thread(target=finish).start()
    waited = gate.wait(timeout=5.0)
    assert released.is_set()
    assert waited >= 0.25
    assert gate.yielded_seconds >= 0.25


def test_wait_is_bounded() -> None:
    gate = BurstGate()
    gate.save_started()  # never finished
    started = time.monotonic()
    gate.wait(timeout=0.2)
    assert 0.15 <= time.monotonic() - started < 2.0


def test_announcement_makes_the_gate_busy_shortly_before_the_save() -> None:
    gate = BurstGate()
    gate.announce(seconds_until_save=ANNOUNCE_LEAD_SECONDS + 30, nbytes=1 << 30)
    assert not gate.busy  # far ahead: keep copying
    gate.announce(seconds_until_save=ANNOUNCE_LEAD_SECONDS / 2, nbytes=1 << 30)
    assert gate.busy
    assert gate.announcement is not None and gate.announcement.nbytes == 1 << 30
    gate.save_started()  # the announced save arrived
    assert gate.announcement is None
    gate.save_finished()
    assert not gate.busy
