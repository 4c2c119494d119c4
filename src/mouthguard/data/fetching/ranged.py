"""Whole-object reads as several concurrent ranged reads, handed back in order.

An object store serves one GET at a fraction of what the link can carry;
several range GETs of one object at once fill it. :func:`read_ranges` keeps up
to ``parallel`` ranges in flight and yields them in object order, so a caller
can hash (and write) them sequentially while the next ones are on their way.
Memory in flight is at most ``parallel * range_size``.

Every ranged read here and in :mod:`~mouthguard.data.fetching.streamed` goes through
:func:`get_range`: a transient failure (an I/O error, a dropped connection, a
5xx or a timeout that the tier's own client did not absorb, or fewer bytes than
asked for) is retried with backoff (:class:`~mouthguard.tiers.retry.RetryPolicy`),
and only after the last try does the read fail, with an error naming the
dataset, the shard and the byte range. A retry happens on the thread that made
the read, which holds no bytes of it meanwhile, so the bounds on reads in
flight and bytes held are the same while retrying.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from mouthguard.errors import ShardDamagedError, TierError
from mouthguard.tiers import Tier
from mouthguard.tiers.retry import RetryPolicy, is_transient

MiB = 1024 * 1024
DEFAULT_RANGE_SIZE = 8 * MiB
DEFAULT_PARALLEL = 4
DEFAULT_RETRY = RetryPolicy()


class ShortReadError(TierError):
    """A ranged read returned fewer bytes than asked for (a truncated body): transient."""


class RangeReadError(TierError):
    """A ranged read failed on every try; the message names the dataset, shard and bytes."""


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return True


def get_range(
    tier: Tier,
    key: str,
    start: int,
    end: int,
    *,
    where: str,
    retry: RetryPolicy = DEFAULT_RETRY,
    wait: Callable[[float], bool] = _sleep,
) -> bytes:
    """Bytes ``[start, end)`` of ``key``, exactly ``end - start`` of them.

    A transient failure (:func:`~mouthguard.tiers.retry.is_transient`, or a
    short read) is retried up to ``retry.retries`` times; before each retry
    ``wait(delay)`` waits the backoff delay and may return False to stop
    retrying (the reader went away). ``where`` names the dataset and shard
    in the error.

    Raises:
        RangeReadError: the last try failed transiently (``__cause__``: its error).
        TierError: a permanent failure (a missing object, ...), at once.
    """
    attempt = 0
    while True:
        try:
            data = tier.get(key, start, end)
        except TierError as exc:
            if not is_transient(exc):
                raise
            failure: TierError = exc
        else:
            if len(data) == end - start:
                return data
            failure = ShortReadError(f"short read: {len(data)} of {end - start} bytes")
            del data  # not held through the backoff
        if attempt >= retry.retries or not wait(retry.delay(attempt)):
            tries = f"{attempt + 1} {'try' if attempt == 0 else 'tries'}"
            raise RangeReadError(
                f"{where}: bytes {start} to {end} of {key} could not be read "
                f"({tries}; the last failed with: {failure})"
            ) from failure
        attempt += 1


def read_ranges(
    tier: Tier,
    key: str,
    size: int,
    *,
    shard: str,
    range_size: int = DEFAULT_RANGE_SIZE,
    parallel: int = DEFAULT_PARALLEL,
    offset: int = 0,
    where: str = "",
    retry: RetryPolicy = DEFAULT_RETRY,
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, bytes)`` covering ``[0, size)`` of ``key``, in order.

    With ``offset``, the bytes are ``[offset, offset + size)`` of the object (a
    Parquet row group), and the offsets yielded are relative to ``offset``.
    ``range_size`` is rounded up to a multiple of 512 so that no tar header is
    split between two ranges. Closing the iterator early cancels what is queued.
    Each range is read by :func:`get_range` (transient failures retried);
    ``where`` names the dataset in its error (default: the shard alone);
    ``retry`` says how often.

    Raises:
        RangeReadError: a range failed on every try (names the shard and bytes).
        TierError: a read failed for good (ObjectNotFoundError when the object is missing).
    """
    where = f"{where}: shard {shard}" if where else f"shard {shard}"
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
                    future = pool.submit(
                        get_range, tier, key, offset + start, offset + end, where=where, retry=retry
                    )
                    pending.append((start, future))
                if not pending:
                    return
                start, future = pending.popleft()
                try:
                    data = future.result()
                except RangeReadError as exc:
                    if not isinstance(exc.__cause__, ShortReadError):
                        raise
                    # Short on every try: the object is shorter than the manifest says.
                    raise ShardDamagedError(
                        f"{shard}: short read at byte {offset + start}", shard=shard
                    ) from exc
                yield start, data
        finally:
            for _, future in pending:
                future.cancel()
