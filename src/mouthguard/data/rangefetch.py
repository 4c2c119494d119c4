"""A bounded pool of ranged reads for one process, most urgent range first.

A shard streamed range by range (:class:`~mouthguard.data.streamed.StreamedShard`)
hands its ranges to the process's :class:`RangeFetcher`: ``parallel`` threads
take the most urgent pending range, read it from the tier, and hand the bytes
back to the shard, which verifies and writes them. So:

* **Requests in flight**: at most ``parallel`` per process (per DataLoader
  worker), whatever the number of shards open; ``parallel`` times the workers
  of a node, per node.
* **Memory**: a thread holds one range's bytes from the read until the shard
  has written them, so at most ``parallel * range_size`` bytes are in memory
  at once (:attr:`peak_bytes` records the most seen, for tests and reports).
* **Order**: ranges the reader is about to need (*demanded*, in the order it
  will need them) go before everything else; then, in the order the shards
  were opened, every range of every open shard front to back -- so the next
  shard's first ranges arrive while the current one is being read.

The queue holds entries, not bytes: each range of an open shard at most once
as background work and once as demanded, so it is bounded by twice the ranges
of the shards open (entries of a closed or failed shard are dropped as they
come up).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Iterable
from typing import Protocol

#: Priority classes: what the reader waits for, then what it will read later.
_DEMANDED, _BACKGROUND = 0, 1


class RangeSink(Protocol):
    """A shard being filled: it says which ranges are still wanted, and takes them."""

    def claim(self, k: int) -> int | None:
        """Mark range ``k`` in flight and return its size in bytes; None if not wanted now."""

    def fetch(self, k: int) -> None:
        """Read, verify and store range ``k`` (claimed); errors are the sink's to keep."""


class RangeFetcher:
    """``parallel`` threads reading ranges, most urgent first; see the module docstring."""

    def __init__(self, parallel: int) -> None:
        if parallel < 1:
            raise ValueError("range_parallel must be >= 1")
        self.parallel = parallel
        self._heap: list[tuple[int, int, int, int, RangeSink]] = []
        self._counter = itertools.count()
        self._opened = itertools.count()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.in_flight = 0
        self.peak_in_flight = 0
        self.bytes_held = 0
        self.peak_bytes = 0

    def add(self, sink: RangeSink, ranges: int) -> None:
        """Queue all ``ranges`` of a newly opened shard as background work, front to back."""
        opened = next(self._opened)
        with self._cond:
            for k in range(ranges):
                heapq.heappush(self._heap, (_BACKGROUND, opened, k, next(self._counter), sink))
            self._start_threads()
            self._cond.notify_all()

    def demand(self, wanted: Iterable[tuple[RangeSink, int]]) -> None:
        """Queue ranges the reader needs next, ahead of all background work, in this order."""
        with self._cond:
            for sink, k in wanted:
                order = next(self._counter)
                heapq.heappush(self._heap, (_DEMANDED, order, k, order, sink))
            self._start_threads()
            self._cond.notify_all()

    def _start_threads(self) -> None:
        while len(self._threads) < self.parallel and not self._closed:
            thread = threading.Thread(target=self._run, name="range-fetch", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _next(self) -> tuple[RangeSink, int, int] | None:
        with self._cond:
            while True:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return None
                _, _, k, _, sink = heapq.heappop(self._heap)
                size = sink.claim(k)
                if size is None:
                    continue  # done, in flight, or its shard closed or failed
                self.in_flight += 1
                self.bytes_held += size
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                self.peak_bytes = max(self.peak_bytes, self.bytes_held)
                return sink, k, size

    def _run(self) -> None:
        while (job := self._next()) is not None:
            sink, k, size = job
            try:
                sink.fetch(k)
            finally:
                with self._cond:
                    self.in_flight -= 1
                    self.bytes_held -= size

    def close(self) -> None:
        """Stop the threads (a read in progress finishes first); queued work is dropped."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=60)
