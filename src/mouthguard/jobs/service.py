"""The background service: replication, retention and scrubbing in one thread.

One service per store object per process, shared by every Checkpointer on that
store, so they share one :class:`BurstGate`. The thread wakes when a checkpoint
commits (newest first), and otherwise makes a full pass every ``interval``
seconds, which also picks up copies other processes wrote or damaged.

Lifecycle: started on first use, a daemon thread, stopped at interpreter exit
(bounded). A copy cut off by the process ending leaves only invisible staging
debris on the destination, collected later like any interrupted save.

The service is the store's :class:`~mouthguard.checkpoint.listeners.CheckpointListener`
(``mouthguard/wiring.py`` makes it so): checkpointers report their saves (the burst
gate), commits and the damage ``load()`` finds through it, without importing jobs.

Backlog warning: the service estimates how long the checkpoints still waiting
for replication take at the measured copy bandwidth, and warns when that
outlasts the interval between saves — the replication tier cannot keep up and
protection is falling behind. Only commits count toward that interval: a repair
(damage found by a load or a scrub) is queued the same way but is not a save.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections import deque
from dataclasses import dataclass

from typing_extensions import override

from mouthguard.checkpoint.listeners import CheckpointListener
from mouthguard.checkpoint.store import Store
from mouthguard.clock import SYSTEM_CLOCK, Clock
from mouthguard.jobs.burst import BurstGate
from mouthguard.jobs.replicator import ReplicationReport, Replicator
from mouthguard.jobs.retention import apply_retention
from mouthguard.jobs.scrub import DEFAULT_MAX_AGE_SECONDS, scrub

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_SECONDS = 30.0
#: Retention passes are cheap but not urgent: nothing is purged before the trash delay.
DEFAULT_RETENTION_INTERVAL_SECONDS = 300.0
#: Scrub passes re-read copies whose receipt is older than the scrub age.
DEFAULT_SCRUB_INTERVAL_SECONDS = 3600.0
_STOP_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class ServiceStatus:
    """A snapshot for status displays and tests."""

    running: bool
    queued: int
    busy: bool
    passes: int
    copied_bytes: int
    bandwidth_bytes_per_s: float | None
    last_shortfalls: tuple[str, ...]
    backlog_warning: str | None


class BackgroundService(CheckpointListener):
    """Replicates committed checkpoints of one store in a background thread.

    Args:
        store: the store.
        interval: seconds between full passes when no commit wakes the thread.
        retention_interval: seconds between retention passes (None: never; retention
            is then left to the agent).
        scrub_interval: seconds between scrub passes (None: never).
        scrub_max_age: a copy is re-read once its receipt is this old.
        clock: the schedule's clock, shared with the burst gate and the
            replicator (the real one by default; tests drive a fake one).
    """

    def __init__(
        self,
        store: Store,
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        retention_interval: float | None = DEFAULT_RETENTION_INTERVAL_SECONDS,
        scrub_interval: float | None = DEFAULT_SCRUB_INTERVAL_SECONDS,
        scrub_max_age: float = DEFAULT_MAX_AGE_SECONDS,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.clock = clock
        self.retention_interval = retention_interval
        self.scrub_interval = scrub_interval
        self.scrub_max_age = scrub_max_age
        self._next_scrub = clock.monotonic() + (scrub_interval or 0.0)
        self._next_retention = clock.monotonic() + (retention_interval or 0.0)
        self.gate = BurstGate(clock=clock)
        self.replicator = Replicator(store, store.policy, self.gate, clock=clock)
        self.interval = interval
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, int]] = deque()
        self._busy = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self._passes = 0
        self._copied = 0
        self._bandwidth: float | None = None
        self._shortfalls: tuple[str, ...] = ()
        self._backlog_warning: str | None = None
        self._last_commit: float | None = None
        # The first full pass after start picks up work from before this process
        # (and from other processes); until it ran, the service is not idle.
        self._full_pass_pending = True
        self._commit_interval: float | None = None

    # --- control -------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (idempotent)."""
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop = False
            # A loop of its own, not io.pool.SHARED: its copies put through the tiers,
            # whose large writes run on SHARED and are waited for (a deadlock on SHARED).
            self._thread = threading.Thread(
                target=self._loop, name=f"mouthguard-replication[{self.store.source}]", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = _STOP_TIMEOUT_SECONDS) -> None:
        """Ask the thread to finish its current copy and exit; wait at most ``timeout``."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    # --- what checkpointers report (CheckpointListener) -------------------------

    @override
    def save_started(self) -> None:
        """A save's burst begins: copies wait at their next chunk boundary."""
        self.gate.save_started()

    @override
    def save_finished(self) -> None:
        """The save's burst is over: copies may resume."""
        self.gate.save_finished()

    @override
    def announce(self, seconds_until_save: float, nbytes: int) -> None:
        """A save is coming: copies yield ahead of it (see :class:`BurstGate`)."""
        self.gate.announce(seconds_until_save, nbytes)

    @override
    def notify_commit(self, run: str, step: int) -> None:
        """A checkpoint committed: replicate it soon (newest commits first).

        Commits alone measure the interval between saves that the backlog warning uses.
        """
        now = self.clock.monotonic()
        with self._cond:
            if self._last_commit is not None:
                gap = now - self._last_commit
                self._commit_interval = _ewma(self._commit_interval, gap)
            self._last_commit = now
        self._enqueue(run, step)

    @override
    def request_repair(self, run: str, step: int) -> None:
        """A copy was found damaged: the replicator confirms it and makes a new one, soon.

        Not a save: the interval between saves is left alone.
        """
        self._enqueue(run, step)

    def _enqueue(self, run: str, step: int) -> None:
        with self._cond:
            self._queue.appendleft((run, step))
            self._cond.notify_all()

    @override
    def wait_idle(self, timeout: float) -> bool:
        deadline = self.clock.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy or self._full_pass_pending:
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    return False
                self.clock.wait(self._cond, min(remaining, 0.2))
            return True

    def status(self) -> ServiceStatus:
        """A snapshot of what the service is doing."""
        with self._cond:
            return ServiceStatus(
                running=self._thread is not None and self._thread.is_alive(),
                queued=len(self._queue),
                busy=self._busy,
                passes=self._passes,
                copied_bytes=self._copied,
                bandwidth_bytes_per_s=self._bandwidth,
                last_shortfalls=self._shortfalls,
                backlog_warning=self._backlog_warning,
            )

    # --- the thread ------------------------------------------------------------

    def _loop(self) -> None:
        next_pass = self.clock.monotonic()
        while True:
            with self._cond:
                while not self._stop and not self._queue and self.clock.monotonic() < next_pass:
                    self.clock.wait(
                        self._cond, min(1.0, max(0.0, next_pass - self.clock.monotonic()))
                    )
                if self._stop:
                    return
                item = self._queue.popleft() if self._queue else None
                self._busy = True
            try:
                if item is not None:
                    report = self.replicator.replicate(*item)
                else:
                    report = self.replicator.run_once()
                    next_pass = self.clock.monotonic() + self.interval
                    with self._cond:
                        self._full_pass_pending = False
                self._record(report)
                self._maybe_apply_retention()
                self._maybe_scrub()
            except Exception:
                log.exception("replication pass failed; retrying at the next pass")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _maybe_apply_retention(self) -> None:
        if self.retention_interval is None or self.clock.monotonic() < self._next_retention:
            return
        self._next_retention = self.clock.monotonic() + self.retention_interval
        report = apply_retention(self.store, self.store.policy, pause=self.gate.wait)
        if report.count("trash") or report.count("purge") or report.count("demote"):
            log.info(
                "retention: %d trashed, %d purged, %d demoted",
                report.count("trash"),
                report.count("purge"),
                report.count("demote"),
            )

    def _maybe_scrub(self) -> None:
        if self.scrub_interval is None or self.clock.monotonic() < self._next_scrub:
            return
        self._next_scrub = self.clock.monotonic() + self.scrub_interval
        report = scrub(self.store, max_age_seconds=self.scrub_max_age, gate=self.gate)
        for damaged in report.damaged:
            self.request_repair(damaged.run, damaged.step)

    def _record(self, report: ReplicationReport) -> None:
        with self._cond:
            self._passes += 1
            self._copied += report.copied_bytes
            for copy in report.copies:
                self._bandwidth = _ewma(self._bandwidth, copy.bytes_per_second)
            self._shortfalls = tuple(
                f"{s.run} step {s.step}: {s.reason}" for s in report.shortfalls
            )
            self._backlog_warning = self._check_backlog(report)
        for line in self._shortfalls:
            log.warning("replication shortfall: %s", line)

    def _check_backlog(self, report: ReplicationReport) -> str | None:
        """Warn when the pending copies would outlast the interval between saves."""
        if self._bandwidth is None or self._commit_interval is None or not report.copies:
            return None
        pending = sum(c.nbytes for c in report.copies) * (len(self._queue) + 1)
        seconds = pending / max(self._bandwidth, 1.0)
        # Sub-second backlogs are noise (bursts of tiny saves), not a trend.
        if seconds <= max(self._commit_interval, 1.0):
            return None
        message = (
            f"replication backlog needs ~{seconds:.0f} s at {self._bandwidth / 2**20:.0f} MiB/s "
            f"but checkpoints arrive every ~{self._commit_interval:.0f} s: "
            "protection is falling behind (add bandwidth, save less often, or demote routine saves)"
        )
        log.warning(message)
        return message


def _ewma(previous: float | None, sample: float) -> float:
    """Exponentially weighted mean: recent copies and gaps count most."""
    return sample if previous is None else 0.7 * previous + 0.3 * sample


_SERVICES: weakref.WeakKeyDictionary[Store, BackgroundService] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def service_for(store: Store, *, start: bool = True) -> BackgroundService:
    """The background service of ``store`` in this process (created on first use)."""
    with _LOCK:
        service = _SERVICES.get(store)
        if service is None:
            service = BackgroundService(store)
            _SERVICES[store] = service
    if start:
        service.start()
    return service


@atexit.register
def _stop_all() -> None:
    for service in list(_SERVICES.values()):
        service.stop(timeout=1.0)
