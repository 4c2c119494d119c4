"""The store's single background writer: a priority queue of jobs run in order.

Every write and delete of the disk and remote tiers runs in this one thread
(:mod:`~mouthguard.kvcache.writedown`), so a tier's capacity check and the write
that fills it can never race another writer's, and no delete can overtake a
newer write of the same key. The memory tier is changed by callers under the
store's lock (:mod:`~mouthguard.kvcache.placement`). Readers never wait for the
mover (they read wherever a block is now).

Jobs run by priority, then in submission order: :data:`PREFETCH` (prefetches --
a request is waiting to read those blocks) before :data:`STORE` (writing down
what memory evicted) before :data:`MAINTENANCE` (compaction, the spill at close).
A job's exception is delivered through its future and counted; the thread
keeps running.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

log = logging.getLogger(__name__)

PREFETCH, STORE, MAINTENANCE = 0, 1, 2
_STOP = 99


class Mover:
    """One daemon thread running submitted jobs by priority.

    Args:
        name: the thread's name.
        idle: called after each job when the queue is empty (housekeeping).
    """

    def __init__(self, name: str, idle: Callable[[], None] | None = None) -> None:
        self._queue: queue.PriorityQueue[tuple[int, int, Callable[[], Any], Future[Any]]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()
        self._idle = idle
        self.failures = 0
        self._closed = False
        self._lock = threading.Lock()
        # One thread, not io.pool.SHARED: the order of its queue is the contract
        # (prefetch before store), and it is the one writer of the active segment.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, priority: int, job: Callable[[], Any]) -> Future[Any]:
        """Queue ``job``; its result or exception arrives through the future.

        Raises:
            RuntimeError: the mover was closed.
        """
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the mover is closed")
            self._queue.put((priority, next(self._order), job, future))
        return future

    def pending(self) -> int:
        """Jobs waiting (not counting the one running)."""
        return self._queue.qsize()

    def drain(self) -> None:
        """Wait until every job submitted so far has run."""
        if threading.current_thread() is self._thread:
            return
        self.submit(_STOP - 1, lambda: None).result()

    def close(self) -> None:
        """Run what is queued, then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            done: Future[Any] = Future()
            self._queue.put((_STOP, next(self._order), lambda: None, done))
        self._thread.join()

    def _run(self) -> None:
        while True:
            priority, _, job, future = self._queue.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(job())
                except BaseException as exc:  # handed to the submitter
                    self.failures += 1
                    log.warning("kv cache background job failed: %s", exc, exc_info=exc)
                    future.set_exception(exc)
            if priority == _STOP:
                return
            if self._idle is not None and self._queue.empty():
                try:
                    self._idle()
                except Exception as exc:  # noqa: BLE001 - housekeeping must not kill the writer
                    log.warning("kv cache housekeeping failed: %s", exc)
