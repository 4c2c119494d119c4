"""A fake :class:`~mouthguard.clock.Clock` for tests: time moves only when the code waits.

``sleep`` and ``wait`` return at once, having moved the clock forward as far as
the wait would have lasted; callbacks scheduled with :meth:`FakeClock.call_at`
run when the clock reaches their time, in the thread that moved it. A test makes
something happen "meanwhile" (a save finishing while a copy yields) with a
callback instead of a thread and a real sleep, so it is deterministic and
takes no wall-clock time, however busy the machine is.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable


class FakeClock:
    """A clock that advances only through :meth:`sleep`, :meth:`wait` and :meth:`advance`.

    ``wait(cond, timeout)`` models an undisturbed ``Condition.wait``: it advances
    by ``timeout``, unless a callback is due before that, in which case the clock
    stops at the callback's time, runs it (it may notify ``cond``: the caller
    holds it, and the conditions used here are re-entrant) and returns early, as
    a notified wait would. ``sleep`` is not interruptible: it runs every callback
    due on the way and ends at the full duration.

    Attributes:
        now: the current time (starts at an arbitrary non-zero value, as
            ``time.monotonic`` does).
        slept: every ``sleep`` duration asked for, in order.
        waited: every ``wait`` timeout asked for, in order.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []
        self.waited: list[float] = []
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._lock = threading.RLock()

    def monotonic(self) -> float:
        """The current fake time."""
        with self._lock:
            return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the clock reaches ``when`` (scheduling order breaks ties)."""
        with self._lock:
            heapq.heappush(self._due, (when, next(self._order), callback))

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` once ``delay`` seconds have passed on this clock."""
        self.call_at(self.monotonic() + delay, callback)

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``, running every callback due on the way."""
        with self._lock:
            target = self.now + max(0.0, seconds)
            while self._due and self._due[0][0] <= target:
                self._run_next()
            self.now = target

    def sleep(self, seconds: float) -> None:
        """Record the sleep and advance through it at once."""
        with self._lock:
            self.slept.append(seconds)
        self.advance(seconds)

    def wait(self, cond: threading.Condition, timeout: float) -> None:
        """Record the wait; advance to the first due callback (then return) or by ``timeout``."""
        with self._lock:
            self.waited.append(timeout)
            target = self.now + max(0.0, timeout)
            if self._due and self._due[0][0] <= target:
                self._run_next()
                return
            self.now = target

    def _run_next(self) -> None:
        when, _, callback = heapq.heappop(self._due)
        self.now = max(self.now, when)
        callback()
