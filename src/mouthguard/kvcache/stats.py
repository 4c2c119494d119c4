"""Per-tier counters and read latencies, reported by ``KVStore.stats()``.

Counters are plain integers bumped under the store's lock. Latencies are the
last :data:`WINDOW` block reads per tier (a sliding window, so percentiles
describe recent behaviour and memory stays bounded); each read also adds its
bytes, so the window yields a throughput (bytes over the summed read time).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

#: Reads kept per tier for the percentiles.
WINDOW = 8192


@dataclass
class TierStats:
    """What happened on one tier since the store opened."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    corrupt: int = 0
    promotions: int = 0
    demotions: int = 0
    writes: int = 0
    written_bytes: int = 0
    rejected: int = 0
    _reads: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def read(self, seconds: float, nbytes: int) -> None:
        """Record one block read (a hit) of ``nbytes`` taking ``seconds``."""
        self.hits += 1
        self._reads.append((seconds, nbytes))

    def report(
        self, nbytes: int, capacity: int | None, blocks: int
    ) -> dict[str, float | int | None]:
        """The tier's figures (latencies in milliseconds, throughput in GB/s)."""
        result: dict[str, float | int | None] = {
            "bytes": nbytes,
            "capacity": capacity,
            "blocks": blocks,
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "corrupt": self.corrupt,
            "promotions": self.promotions,
            "demotions": self.demotions,
            "writes": self.writes,
            "written_bytes": self.written_bytes,
            "rejected": self.rejected,
            "get_p50_ms": None,
            "get_p99_ms": None,
            "read_gbps": None,
        }
        if self._reads:
            times = np.array([r[0] for r in self._reads])
            result["get_p50_ms"] = float(np.percentile(times, 50) * 1e3)
            result["get_p99_ms"] = float(np.percentile(times, 99) * 1e3)
            total = float(times.sum())
            if total > 0:
                result["read_gbps"] = sum(r[1] for r in self._reads) / total / 1e9
        return result
