"""Parallel reads, consumed in file order.

:func:`read_in_order` keeps :data:`READ_AHEAD` ranged reads in flight on the
process's one I/O pool (:mod:`~mouthguard.io.pool`; ``preadv`` and object-store
range GETs release the GIL), and hands the filled buffers back strictly in the order they were asked
for. The disk or object store sees a queue of requests, while the caller feeds
a streaming checksum with bytes in file order -- so verification stays inline
and still costs no second pass.

Invariant: when the generator finishes, fails or is closed early, every read it
started has finished. No read ever lands in a buffer after the caller moved on
(a fallback load reuses the same ``into=`` tensors for the next copy).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, wait

from mouthguard.io.pool import SHARED
from mouthguard.tiers.base import Tier

#: Reads in flight per file.
READ_AHEAD = 8


def read_in_order(
    tier: Tier,
    key: str,
    jobs: Iterable[tuple[int, memoryview]],
    *,
    ahead: int = READ_AHEAD,
) -> Iterator[memoryview]:
    """Fill each ``(offset, view)`` from object ``key``; yield the views in job order.

    A buffer may be reused by a later job only after it has been yielded and
    the caller has asked for the next one (at most ``ahead + 1`` buffers are
    live). A failed read raises its tier error when its turn comes. The reads
    run on the process's one I/O pool (:data:`~mouthguard.io.pool.SHARED`).
    """
    pending: deque[tuple[Future[None], memoryview]] = deque()
    try:
        for offset, view in jobs:
            pending.append((SHARED.submit(tier.read_into, key, offset, view), view))
            if len(pending) >= ahead:
                future, filled = pending.popleft()
                future.result()
                yield filled
        while pending:
            future, filled = pending.popleft()
            future.result()
            yield filled
    finally:
        with contextlib.suppress(Exception):
            wait([future for future, _ in pending])
