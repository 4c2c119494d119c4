"""Time as a parameter: the clock that waiting, pacing and flushing code reads.

Code that waits, paces or schedules (the burst gate, the background service,
the replicator's ``wait_protected``, the write pipeline's flush of a slow
producer, :class:`~mouthguard.tiers.throttle.ThrottledTier`,
:class:`~mouthguard.tiers.faults.FaultyTier`'s delays) takes a :class:`Clock`
instead of calling :mod:`time` itself. Production code gets
:data:`SYSTEM_CLOCK`, which is exactly ``time.monotonic``, ``time.sleep`` and
``Condition.wait``; tests pass a fake clock, so they neither sleep for real nor
depend on how busy the machine is.

It sits below every layer (it imports nothing of mouthguard), so the write
pipeline under the tiers, the tiers and the jobs above them can all take one.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from typing_extensions import override


class Clock(Protocol):
    """Monotonic time, sleeping, and timed waits on a condition."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences mean anything."""
        ...

    def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...

    def wait(self, cond: threading.Condition, timeout: float) -> None:
        """Wait on ``cond``, which the caller holds, until notified or ``timeout`` passes.

        May return early (a notification, or a spurious wakeup, as
        :meth:`threading.Condition.wait` may): callers re-check their
        predicate and the time in a loop.
        """
        ...


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.sleep`, ``Condition.wait``."""

    def monotonic(self) -> float:
        """:func:`time.monotonic`."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """:func:`time.sleep`."""
        time.sleep(seconds)

    def wait(self, cond: threading.Condition, timeout: float) -> None:
        """``cond.wait(timeout)``."""
        cond.wait(timeout)

    @override
    def __repr__(self) -> str:
        return "SYSTEM_CLOCK"


#: The default of every ``clock=`` parameter.
SYSTEM_CLOCK: Clock = SystemClock()
