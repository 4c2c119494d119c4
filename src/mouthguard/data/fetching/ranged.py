"""Whole-object reads as several concurrent ranged reads, handed back in order.

An object store serves one GET at a fraction of what the link can carry;
several range GETs of one object at once fill it. :func:`read_ranges` keeps up
to ``parallel`` ranges in flight and yields them in object order, so a caller
can hash (and write) them sequentially while the next ones are on their way.
Memory in flight is at most ``parallel * range_size``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from mouthguard.errors import ShardDamagedError
from mouthguard.tiers import Tier

MiB = 1024 * 1024
DEFAULT_RANGE_SIZE = 8 * MiB
DEFAULT_PARALLEL = 4


def read_ranges(
    tier: Tier,
    key: str,
    size: int,
    *,
    shard: str,
    range_size: int = DEFAULT_RANGE_SIZE,
    parallel: int = DEFAULT_PARALLEL,
    offset: int = 0,
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, bytes)`` covering ``[0, size)`` of ``key``, in order.

    With ``offset``, the bytes are ``[offset, offset + size)`` of the object (a
    Parquet row group), and the offsets yielded are relative to ``offset``.
    ``range_size`` is rounded up to a multiple of 512 so that no tar header is
    split between two ranges. Closing the iterator early cancels what is queued.

    Raises:
        ShardDamagedError: the object is shorter than ``size`` (names ``shard``).
        TierError: a read failed (ObjectNotFoundError when the object is missing).
    """
    step = max(512, -(-range_size // 512) * 512)
    starts = iter(range(0, size, step))
    # A pool per call, not io.pool.SHARED: this runs in DataLoader workers forked from
    # the training process, where a pool the parent had started has no threads (a
    # ThreadPoolExecutor copied by fork can wait forever for one); ``parallel`` is the
    # caller's depth of requests on this one object.
    pending: deque[tuple[int, Future[bytes]]] = deque()
    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="range") as pool:
        try:
            while True:
                while len(pending) < max(1, parallel):
                    start = next(starts, None)
                    if start is None:
                        break
                    end = min(size, start + step)
                    future = pool.submit(tier.get, key, offset + start, offset + end)
                    pending.append((start, future))
                if not pending:
                    return
                start, future = pending.popleft()
                data = future.result()
                if len(data) != min(size, start + step) - start:
                    raise ShardDamagedError(
                        f"{shard}: short read at byte {offset + start}", shard=shard
                    )
                yield start, data
        finally:
            for _, future in pending:
                future.cancel()
