"""One pass over a file, several sha256s: the whole file's and each of some byte ranges'.

Indexing and verifying a Parquet file read it once, front to back, and need the
sha256 of the whole file, of its footer and of every row group. A
:class:`RangeHasher` takes the chunks in order and feeds each range's digest
with the part of the chunk that falls inside it. Ranges must be sorted and
non-overlapping (the manifest's checks guarantee it); a chunk may cover
several ranges, a range span several chunks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


class RangeHasher:
    """sha256 of a whole file and of each of ``ranges`` (``(offset, size)``, sorted, disjoint)."""

    def __init__(self, ranges: Sequence[tuple[int, int]]) -> None:
        self.ranges = list(ranges)
        self.whole = hashlib.sha256()
        self.parts = [hashlib.sha256() for _ in self.ranges]
        self.position = 0
        self._next = 0  # the first range that may still receive bytes

    def feed(self, start: int, data: bytes) -> None:
        """The chunk at ``start`` (each chunk starts where the previous one ended)."""
        if start != self.position:
            raise ValueError(f"chunk at {start}, expected {self.position}")
        self.whole.update(data)
        end = start + len(data)
        view = memoryview(data)
        i = self._next
        while i < len(self.ranges):
            offset, size = self.ranges[i]
            if offset >= end:
                break
            lo, hi = max(offset, start), min(offset + size, end)
            if lo < hi:
                self.parts[i].update(view[lo - start : hi - start])
            if offset + size <= end:
                self._next = i + 1
            i += 1
        self.position = end

    def digests(self) -> list[str]:
        """Each range's sha256 hex, in order."""
        return [h.hexdigest() for h in self.parts]
