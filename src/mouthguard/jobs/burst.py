"""Burst awareness: background copying yields the disk to checkpoint saves.

A checkpoint save is a sequential burst that should run at the disk's full
speed; a replication copy running at the same time halves it and stretches the
training stall. The :class:`BurstGate` is the shared signal: savers mark their
burst (``save_started``/``save_finished``) or announce it ahead of time
(``announce``), and background jobs call ``wait`` between chunks.

Thread-safe. Never blocks a saver; only background work waits, and always with
a bound so a forgotten ``save_finished`` cannot stall replication forever.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

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
    """Shared signal between savers (foreground) and copiers (background)."""

    def __init__(self) -> None:
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
        now = time.monotonic()
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
            return self._busy(time.monotonic())

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
        start = time.monotonic()
        deadline = start + timeout
        with self._cond:
            while self._busy(now := time.monotonic()) and now < deadline:
                self._cond.wait(timeout=min(0.25, deadline - now))
            waited = time.monotonic() - start
            self._yielded_seconds += waited
            return waited

    @property
    def yielded_seconds(self) -> float:
        """Total time background work has spent yielding (for reports)."""
        with self._cond:
            return self._yielded_seconds
