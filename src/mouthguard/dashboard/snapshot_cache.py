"""The latest snapshot, kept fresh without making any request wait for the tiers.

Reading a store of 10,000 checkpoints takes seconds (every manifest and sidecar
of every copy is read), far too long for a page load or a scrape. So requests
are served from the last :class:`~.snapshot.Snapshot`, and one background thread
reads the store again once that is older than ``max_age`` seconds. Contract:

* :meth:`SnapshotCache.latest` blocks only for the very first read; afterwards it
  returns at once, starting a refresh when the snapshot is stale (at most one at
  a time; the data a request sees is never older than ``max_age`` plus one read).
* :meth:`SnapshotCache.refresh` reads now, in the caller's thread: after a
  change made through the dashboard, the response shows the store as it is.
* A refresh that fails keeps the previous snapshot and logs why; the next
  stale request tries again.

Times come from the injected ``monotonic`` clock, so tests never sleep.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable

from mouthguard.checkpoint.surface import Store
from mouthguard.dashboard.snapshot import Snapshot, take_snapshot
from mouthguard.errors import MouthguardError

log = logging.getLogger(__name__)


def utc_now() -> dt.datetime:
    """The wall time, timezone-aware (the default ``now`` clock)."""
    return dt.datetime.now(dt.UTC)


class SnapshotCache:
    """Holds the latest snapshot of ``store`` (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        max_age: float = 10.0,
        now: Callable[[], dt.datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        if max_age < 0:
            raise ValueError(f"max_age must be >= 0 seconds, got {max_age}")
        self.store = store
        self.max_age = max_age
        self.now = now
        self._monotonic = monotonic
        self._background = background
        self._lock = threading.Lock()  # guards the fields below
        self._read_lock = threading.Lock()  # one read of the store at a time
        self._snapshot: Snapshot | None = None
        self._read_at = 0.0
        self._refreshing = False

    def latest(self) -> Snapshot:
        """The latest snapshot; the first call reads the store, later ones never wait."""
        with self._lock:
            snapshot, stale = self._snapshot, self._stale()
            start = snapshot is not None and stale and not self._refreshing
            if start:
                self._refreshing = True
        if snapshot is None:
            return self.refresh()
        if start:
            if self._background:
                # Not io.pool.SHARED: a refresh lists and reads small sidecars, at most
                # one at a time, and must not queue behind a checkpoint's transfers.
                threading.Thread(target=self._refresh_quietly, daemon=True).start()
            else:  # tests: the same refresh, in the caller's thread
                self._refresh_quietly()
                with self._lock:
                    return self._snapshot or snapshot
        return snapshot

    def refresh(self) -> Snapshot:
        """Read the store now and keep the result (raises what the read raises)."""
        with self._read_lock:
            started = self._monotonic()
            snapshot = take_snapshot(self.store, now=self.now, monotonic=self._monotonic)
            with self._lock:
                self._snapshot, self._read_at = snapshot, started
            return snapshot

    def _stale(self) -> bool:
        return self._monotonic() - self._read_at >= self.max_age

    def _refresh_quietly(self) -> None:
        try:
            self.refresh()
        except MouthguardError as exc:
            log.warning("reading %s failed; serving the previous snapshot: %s", self.store, exc)
        except Exception:  # a refresher must never die unheard; the next request retries
            log.exception("reading %s failed; serving the previous snapshot", self.store)
        finally:
            with self._lock:
                self._refreshing = False
