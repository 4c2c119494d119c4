"""A bounded pool of ranged reads for one process, most urgent range first.

A shard streamed range by range (:class:`~mouthguard.data.fetching.streamed.StreamedShard`)
hands its ranges to the process's :class:`RangeFetcher`: ``parallel`` threads
take the most urgent pending range -- and, for background work, up to
``coalesce - 1`` pending ranges right after it in the same shard -- read them
from the tier in one request, and hand the bytes back to the shard, which
verifies and writes each range on its own. A range the reader is waiting for
is read alone, so a longer request never delays it; so is a shard's first
range, which a shuffled window's first batch needs of every shard. So:

* **Requests in flight**: at most ``parallel`` per process (per DataLoader
  worker), whatever the number of shards open; ``parallel`` times the workers
  of a node, per node. Each request covers at most ``coalesce`` ranges: fewer,
  larger requests where a request's latency, not its bytes, is the cost.
* **Per node**: with ``slots`` (:class:`~mouthguard.data.fetching.nodeslots.NodeSlots`),
  a request also holds one of the node's slots while in flight, so every
  process sharing the slots' directory has at most ``slots.count`` in flight
  together (a thread that claimed its ranges waits for a slot).
* **Memory**: a thread holds one request's bytes from the read until the shard
  has written them, so at most ``parallel * coalesce * range_size`` bytes are in
  memory at once (:attr:`peak_bytes` records the most seen, for tests and reports).
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

import contextlib
import heapq
import itertools
import threading
from collections.abc import Iterable
from typing import Protocol

from mouthguard.data.fetching.nodeslots import NodeSlots

#: Priority classes: what the reader waits for, then what it will read later.
_DEMANDED, _BACKGROUND = 0, 1


class RangeSink(Protocol):
    """A shard being filled: it says which ranges are still wanted, and takes them."""

    def claim(self, k: int) -> int | None:
        """Mark range ``k`` in flight and return its size in bytes; None if not wanted now."""

    def fetch(self, k: int, count: int) -> None:
        """Read ranges ``k .. k + count - 1`` (claimed) in one request; verify, store each.

        Errors are the sink's to keep.
        """


class RangeFetcher:
    """``parallel`` threads reading runs of up to ``coalesce`` ranges, most urgent first.

    See the module docstring. :attr:`requests` counts the reads made.
    """

    def __init__(self, parallel: int, coalesce: int = 1, slots: NodeSlots | None = None) -> None:
        if parallel < 1:
            raise ValueError("range_parallel must be >= 1")
        if coalesce < 1:
            raise ValueError("range_coalesce must be >= 1")
        self.parallel = parallel
        self.coalesce = coalesce
        self.slots = slots
        self.requests = 0
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
            # Loops that wait for demand, in forked workers: not io.pool.SHARED (data.ranged).
            thread = threading.Thread(target=self._run, name="range-fetch", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _next(self) -> tuple[RangeSink, int, int, int] | None:
        with self._cond:
            while True:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return None
                urgency, _, k, _, sink = heapq.heappop(self._heap)
                size = sink.claim(k)
                if size is None:
                    continue  # done, in flight, or its shard closed or failed
                # A demanded range is read alone: the reader waits for it, and a longer
                # read would only make it wait longer. So is a shard's first range: a
                # shuffled window's first batch needs the first range of each of its
                # shards, fetched as background work as the shards open (cold, 4
                # workers, S3 on loopback: the first batch's median 473, 519 and 451
                # ms against 621, 578 and 551 with it coalesced). The rest coalesce.
                most = self.coalesce if urgency == _BACKGROUND and k > 0 else 1
                count = 1
                while count < most and (more := sink.claim(k + count)) is not None:
                    size += more  # the next range is pending too: the same request
                    count += 1
                self.in_flight += 1
                self.requests += 1
                self.bytes_held += size
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                self.peak_bytes = max(self.peak_bytes, self.bytes_held)
                return sink, k, count, size

    def _run(self) -> None:
        while (job := self._next()) is not None:
            sink, k, count, size = job
            try:
                with self.slots.held() if self.slots else contextlib.nullcontext():
                    sink.fetch(k, count)
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
