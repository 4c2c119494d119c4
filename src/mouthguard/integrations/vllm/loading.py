"""The connector worker's background loads (``async_load``).

Pure (no vLLM): a load is a callable that fills a request's pages and
returns the pages it could not fill. :class:`BackgroundLoads` runs such loads one
after another on one thread while their requests wait in vLLM's
``WAITING_FOR_REMOTE_KVS``, and hands back, when the engine next asks
(``get_finished``), which requests are done and which of their pages failed.

Bounds: at most one load per request, and at most :data:`MAX_ASYNC_LOADS` in
flight on a worker (queued or running); the scheduler side stops offering
asynchronous loads at that count, so a worker never refuses one in practice (if
it does, that load's pages are reported failed: a recompute, never a wrong token).
One thread: loads read the store and copy on the host, and a second thread would
only compete with the forward pass for the same cores. Not :data:`mouthguard.io.pool.SHARED`:
the one thread is what orders the loads, and the KV store's reads do not use that pool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)

#: Asynchronous loads in flight per worker (and per scheduler) at most.
MAX_ASYNC_LOADS = 16


class BackgroundLoads:
    """Loads running on one thread, one per request, :data:`MAX_ASYNC_LOADS` at most.

    ``submit`` and ``finished`` are called from the engine's worker thread only;
    the jobs run on this object's thread.
    """

    def __init__(self, limit: int = MAX_ASYNC_LOADS) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._limit = limit
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mouthguard-kv-load")
        # request -> (its pages, its job, pages of a second load refused while it runs)
        self._running: dict[str, tuple[list[int], Future[list[int]], list[int]]] = {}
        self._refused: dict[str, list[int]] = {}  # beyond the bound: failed at once

    def __len__(self) -> int:
        """Loads queued or running (the bound applies to these)."""
        return len(self._running)

    def submit(self, req_id: str, pages: Sequence[int], job: Callable[[], list[int]]) -> None:
        """Run ``job`` (which fills ``pages`` and returns those it could not).

        A load beyond the bound is not run: its pages are reported failed by the
        next :meth:`finished`. A second load for a request still loading is not run
        either: its pages are reported failed with the first load's result (never
        earlier, since the first load still writes that request's pages).
        """
        running = self._running.get(req_id)
        if running is not None or len(self) >= self._limit:
            log.warning(
                "mouthguard: async load of %s refused (%d in flight, at most %d, one "
                "per request); its blocks are recomputed",
                req_id,
                len(self),
                self._limit,
            )
            if running is not None:
                running[2].extend(pages)
            else:
                self._refused.setdefault(req_id, []).extend(pages)
            return
        self._running[req_id] = (list(pages), self._pool.submit(job), [])

    def finished(self) -> tuple[set[str], set[int]]:
        """Requests whose load ended since the last call, and their pages that failed.

        A job that raised counts all its pages as failed (the error is logged).
        """
        done = set(self._refused)
        failed = {page for pages in self._refused.values() for page in pages}
        self._refused.clear()
        for req_id, (pages, future, refused) in list(self._running.items()):
            if not future.done():
                continue
            del self._running[req_id]
            done.add(req_id)
            failed.update(refused)
            try:
                failed.update(future.result())
            except Exception:  # any failure must become a recompute
                log.exception("mouthguard: async load of %s failed", req_id)
                failed.update(pages)
        return done, failed

    def close(self) -> None:
        """Wait for the loads in flight (the engine's pages must outlive them)."""
        self._pool.shutdown(wait=True)
