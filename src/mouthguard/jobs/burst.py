"""Burst awareness: background copying yields the disk to checkpoint saves.

A checkpoint save is a sequential burst that should run at the disk's full
speed; a replication copy running at the same time halves it and stretches the
training stall. The :class:`BurstGate` is the shared signal: savers mark their
burst (``save_started``/``save_finished``) or announce it ahead of time
(``announce``), and background jobs call ``wait`` between chunks.

Thread-safe. Never blocks a saver; only background work waits, and always with
a bound so a forgotten ``save_finished`` cannot stall replication forever.

Time comes from the gate's :class:`~mouthguard.clock.Clock` (the real one
by default), so tests drive announcements and bounded waits without sleeping.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from mouthguard.clock import SYSTEM_CLOCK, Clock

#: Start yielding this long before an announced save.
ANNOUNCE_LEAD_SECONDS = 2.0
#: Longest a background job waits for one burst before proceeding anyway.
MAX_YIELD_SECONDS = 600.0


@dataclass(frozen=True)
class Announcement:
    """A save announced ahead of time."""

    at: float
    nbytes: int
    announced_at: float


class BurstGate:
    """Shared signal between savers (foreground) and copiers (background).

    Args:
        clock: where announcements, bounds and waited seconds are measured
            (the real clock by default; a fake one in tests).
    """

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._cond = threading.Condition()
        self._active = 0
        self._announcement: Announcement | None = None
        self._yielded_seconds = 0.0

    def save_started(self) -> None:
        """A save's burst begins: background I/O pauses at its next chunk boundary."""
        with self._cond:
            self._active += 1
            self._announcement = None  # the announced save has arrived

    def save_finished(self) -> None:
        """A save's burst ended."""
        with self._cond:
            self._active = max(0, self._active - 1)
            self._cond.notify_all()

    def announce(self, seconds_until_save: float, nbytes: int) -> None:
        """Say that a save of ``nbytes`` will start in ``seconds_until_save`` seconds."""
        now = self.clock.monotonic()
        with self._cond:
            self._announcement = Announcement(now + max(0.0, seconds_until_save), nbytes, now)
            self._cond.notify_all()

    @property
    def announcement(self) -> Announcement | None:
        """The pending announcement, if any."""
        with self._cond:
            return self._announcement

    @property
    def busy(self) -> bool:
        """Whether background I/O should yield right now."""
        with self._cond:
            return self._busy(self.clock.monotonic())

    def _busy(self, now: float) -> bool:
        if self._active:
            return True
        ann = self._announcement
        if ann is None:
            return False
        if now > ann.at + MAX_YIELD_SECONDS:
            self._announcement = None  # the save never came: stop yielding to it
            return False
        return now >= ann.at - ANNOUNCE_LEAD_SECONDS

    def wait(self, timeout: float = MAX_YIELD_SECONDS) -> float:
        """Block while a save is in flight or imminent; return the seconds waited."""
        start = self.clock.monotonic()
        deadline = start + timeout
        with self._cond:
            while self._busy(now := self.clock.monotonic()) and now < deadline:
                self.clock.wait(self._cond, min(0.25, deadline - now))
            waited = self.clock.monotonic() - start
            self._yielded_seconds += waited
            return waited

    @property
    def yielded_seconds(self) -> float:
        """Total time background work has spent yielding (for reports)."""
        with self._cond:
            return self._yielded_seconds
