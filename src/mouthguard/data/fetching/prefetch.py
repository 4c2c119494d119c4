"""Prefetch: opening the reader's upcoming units ahead of it, yielding to checkpoint bursts.

A unit is what the loader fetches and verifies as a whole: a tar shard, or a
Parquet row group. :class:`Prefetcher` runs ahead of the consumer in a
background thread, keeping at most ``depth`` units opened and waiting. Before
each download it yields to a checkpoint burst
(:class:`~mouthguard.data.burst.BurstSignal`), a bounded wait. It never makes
the consumer wait for a burst: a unit the consumer needs that the prefetcher
has not started is opened by the consumer itself, at once (and beyond the cache
limit if it must), and the prefetcher skips it.

The bound on one burst wait is counted in the seconds the signal reports having
waited (``wait``'s return value), not on this process's clock: a gate on a fake
clock is waited for in fake time, and a signal that returns at once while busy
still counts a whole step per call, so the wait ends.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from mouthguard.data.burst import BurstSignal

log = logging.getLogger(__name__)

#: A burst is waited for in steps this long, checking in between whether to stop.
_BURST_STEP = 0.5


class Closeable(Protocol):
    """An opened unit: closing it releases it (a cache pin, memory)."""

    def close(self) -> None:
        """Release the unit."""


Unit = TypeVar("Unit", bound=Closeable)
UnitT_co = TypeVar("UnitT_co", bound=Closeable, covariant=True)


class Opener(Protocol[UnitT_co]):
    """Opens unit ``number`` verified; None when ``must`` is false and there is no room."""

    def open_unit(self, number: int, *, must: bool) -> UnitT_co | None:
        """Open unit ``number`` (see the class docstring)."""


class _Ready(Generic[Unit]):
    """A prefetched unit: opened, or the error that stopped it."""

    def __init__(self, unit: Unit | None, error: BaseException | None) -> None:
        self.unit = unit
        self.error = error


_RUNNING = object()


class Prefetcher(Generic[Unit]):
    """Opens the consumer's upcoming units ahead of it; see the module docstring.

    Args:
        source: opens units.
        depth: units opened ahead and not yet taken, at most.
        burst: a checkpoint-burst signal to yield to before each download.
        max_burst_wait: the longest one wait for a burst lasts (seconds the
            signal reports).
    """

    def __init__(
        self,
        source: Opener[Unit],
        *,
        depth: int,
        burst: BurstSignal | None = None,
        max_burst_wait: float = 60.0,
    ) -> None:
        self.source = source
        self.depth = depth
        self.burst = burst
        self.max_burst_wait = max_burst_wait
        self._cond = threading.Condition()
        self._queue: deque[int] = deque()
        self._slots: dict[int, object] = {}  # unit -> _RUNNING or _Ready
        self._claimed: set[int] = set()  # the consumer opens these itself
        self._closed = False
        self._thread: threading.Thread | None = None
        self.burst_waits = 0  # how often prefetch yielded to a burst (for reports and tests)

    def announce(self, units: Iterable[int]) -> None:
        """Queue units the consumer will take, in the order it will take them."""
        if self.depth <= 0:
            return
        with self._cond:
            self._queue.extend(units)
            if self._thread is None:
                # A loop for the consumer's lifetime, waiting on it: on io.pool.SHARED it
                # would hold a thread that checkpoint writes and loads need.
                self._thread = threading.Thread(target=self._run, name="prefetch", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _ready_count(self) -> int:
        return sum(1 for slot in self._slots.values() if isinstance(slot, _Ready))

    def _next(self) -> int | None:
        with self._cond:
            while not self._closed and (not self._queue or self._ready_count() >= self.depth):
                self._cond.wait()
            if self._closed:
                return None
            return self._queue.popleft()

    def _run(self) -> None:
        while (unit := self._next()) is not None:
            with self._cond:
                if unit in self._claimed or unit in self._slots:
                    continue
            self._yield_to_burst()
            with self._cond:
                if unit in self._claimed or self._closed:
                    continue
                self._slots[unit] = _RUNNING
            ready: _Ready[Unit]
            try:
                ready = _Ready(self.source.open_unit(unit, must=False), None)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer, who retries
                ready = _Ready(None, exc)
            with self._cond:
                if self._stopped():
                    if ready.unit is not None:
                        ready.unit.close()
                    return
                self._slots[unit] = ready
                self._cond.notify_all()

    def _yield_to_burst(self) -> None:
        """Wait while a burst is on (at most ``max_burst_wait``), in steps: close() stays quick."""
        burst = self.burst
        if burst is None or not burst.busy:
            return
        self.burst_waits += 1
        waited = 0.0
        while burst.busy and not self._stopped() and waited < self.max_burst_wait:
            step = min(_BURST_STEP, self.max_burst_wait - waited)
            # What the signal says it waited, at least a step: a signal that returns at
            # once while still busy must not turn this loop into a spin without end.
            waited += max(burst.wait(step), step)

    def _stopped(self) -> bool:
        # A method, not the attribute: close() may set it while a download runs.
        return self._closed

    def take(self, unit: int) -> Unit:
        """Unit ``unit``, opened: the prefetched one, or opened now (never waits for a burst).

        Raises:
            ShardDamagedError, TierError: as the source's ``open_unit``.
        """
        with self._cond:
            while self._slots.get(unit) is _RUNNING:  # its download runs: the fastest way
                self._cond.wait()
            slot = self._slots.pop(unit, None)
            self._claimed.add(unit)
            self._cond.notify_all()
        if isinstance(slot, _Ready) and slot.unit is not None:
            return slot.unit  # type: ignore[no-any-return]
        if isinstance(slot, _Ready) and slot.error is not None:
            log.info("prefetch of unit %d failed (%s): reading it now", unit, slot.error)
        opened = self.source.open_unit(unit, must=True)
        assert opened is not None  # must=True never gives up
        return opened

    def close(self) -> None:
        """Stop prefetching and close every unit opened ahead."""
        with self._cond:
            self._closed = True
            slots, self._slots = self._slots, {}
            self._cond.notify_all()
        for slot in slots.values():
            if isinstance(slot, _Ready) and slot.unit is not None:
                slot.unit.close()
        if self._thread is not None:
            self._thread.join(timeout=60)
