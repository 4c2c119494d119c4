"""A tier decorator that paces writes to a fixed bandwidth.

:class:`ThrottledTier` wraps any tier and delegates every operation to it
unchanged, except that the bytes of ``put`` are fed to the inner tier in pieces
of at most 1 MiB, sleeping after each piece until the stream is no faster than
``write_bytes_per_second``. Reads, listings, deletes and renames are not slowed.

Uses: simulating a slow network filesystem or object store in tests and
benchmarks, and making a save last long enough to be interrupted at a known
moment (the ``mouthguard demo`` kills a worker in the middle of a throttled save).

Because the inner tier does the actual writing, every guarantee it gives
(all-or-nothing ``put``, durability, atomic create) holds for the wrapper too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from typing_extensions import override

from mouthguard.clock import SYSTEM_CLOCK, Clock
from mouthguard.tiers.base import ObjectInfo, PutData, PutMode, Tier, iter_buffers
from mouthguard.tiers.wrapper import WrappedTier

#: Largest piece handed to the inner tier at once; keeps the pacing smooth, so a
#: file on disk grows steadily instead of in a few big jumps.
MAX_PIECE_BYTES = 1024 * 1024


class ThrottledTier(WrappedTier):
    """Wraps ``inner`` and paces its ``put`` streams to ``write_bytes_per_second``.

    The wrapper has the inner tier's name, domain, capabilities and locations, so
    a store or checkpointer cannot tell it apart from the inner tier except by
    speed. After ``put`` has handed ``n`` bytes to the inner tier, at least
    ``n / write_bytes_per_second`` seconds have passed since the put started
    (the inner tier's own time counts towards the budget, so a slow disk is not
    slowed down twice).

    Args:
        inner: the tier that stores the bytes.
        write_bytes_per_second: the write bandwidth to simulate; finite and > 0.
        clock: the clock the pacing reads and sleeps on (the real one by default).

    Raises:
        ValueError: ``write_bytes_per_second`` is not a finite positive number.
    """

    def __init__(
        self, inner: Tier, write_bytes_per_second: float, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        rate = float(write_bytes_per_second)
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(
                "write_bytes_per_second must be a finite positive number, "
                f"got {write_bytes_per_second!r}"
            )
        super().__init__(inner)
        self.write_bytes_per_second = rate
        self.clock = clock

    @override
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        """Store ``data`` through the inner tier, no faster than the configured rate.

        Errors (including those raised by ``data`` itself) are the inner tier's:
        an interrupted paced stream is as all-or-nothing as any other put.
        """
        return self.inner.put(key, self._paced(data), mode=mode)

    def _paced(self, data: PutData) -> Iterator[memoryview]:
        started = self.clock.monotonic()
        sent = 0
        for chunk in iter_buffers(data):
            for start in range(0, chunk.nbytes, MAX_PIECE_BYTES):
                piece = chunk[start : start + MAX_PIECE_BYTES]
                yield piece
                # Sleep *after* the inner tier took the piece: n bytes then cost
                # n / rate seconds in total, including the final piece. Each sleep
                # is bounded by MAX_PIECE_BYTES / rate.
                sent += piece.nbytes
                delay = started + sent / self.write_bytes_per_second - self.clock.monotonic()
                if delay > 0:
                    self.clock.sleep(delay)

    @override
    def __repr__(self) -> str:
        return (
            f"ThrottledTier({self.inner!r}, write_bytes_per_second={self.write_bytes_per_second:g})"
        )
