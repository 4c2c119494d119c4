"""RangeFetcher: which ranges go together in one request, and in what order."""

from __future__ import annotations

import threading

from mouthguard.data.fetching.rangefetch import RangeFetcher


class RecordingShard:
    """A shard of ``ranges`` pending ranges that records each request it is handed."""

    def __init__(self, ranges: int, release: threading.Event) -> None:
        self.pending = set(range(ranges))
        self.requests: list[tuple[int, int]] = []
        self.release = release
        self.done = threading.Event()
        self._total = ranges

    def claim(self, k: int) -> int | None:
        if k not in self.pending:
            return None
        self.pending.discard(k)
        return 1

    def fetch(self, k: int, count: int) -> None:
        self.release.wait(timeout=30)  # held until every range is queued
        self.requests.append((k, count))
        if sum(n for _, n in self.requests) == self._total:
            self.done.set()


def test_a_shards_first_range_is_read_alone_and_the_rest_coalesce() -> None:
    release = threading.Event()
    fetcher = RangeFetcher(parallel=1, coalesce=3)
    first, second = RecordingShard(7, release), RecordingShard(4, release)
    fetcher.add(first, 7)
    fetcher.add(second, 4)
    release.set()
    assert first.done.wait(timeout=30) and second.done.wait(timeout=30)
    fetcher.close()
    # One thread: the first shard's ranges front to back, then the second's.
    assert first.requests == [(0, 1), (1, 3), (4, 3)]
    assert second.requests == [(0, 1), (1, 3)]


def test_a_demanded_range_is_read_alone_before_background_work() -> None:
    release = threading.Event()
    fetcher = RangeFetcher(parallel=1, coalesce=3)
    shard = RecordingShard(6, release)
    fetcher.demand([(shard, 4)])  # the reader needs range 4 first
    fetcher.add(shard, 6)
    release.set()
    assert shard.done.wait(timeout=30)
    fetcher.close()
    # Range 4 alone although 5 was pending right after it; then the shard front to back.
    assert shard.requests == [(4, 1), (0, 1), (1, 3), (5, 1)]
