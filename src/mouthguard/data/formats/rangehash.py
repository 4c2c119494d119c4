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


class FixedRanges:
    """sha256 of each consecutive ``size``-byte range of a stream of chunks (the last shorter).

    For a writer that does not know the total size in advance: chunks come in
    order, of any length; :meth:`digests` closes the last, partial range.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("range size must be >= 1")
        self.size = size
        self._done: list[str] = []
        self._current = hashlib.sha256()
        self._filled = 0  # bytes in the current range

    def feed(self, data: bytes | memoryview) -> None:
        """The next chunk of the stream."""
        view = memoryview(data)
        while view:
            take = min(len(view), self.size - self._filled)
            self._current.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.size:
                self._done.append(self._current.hexdigest())
                self._current, self._filled = hashlib.sha256(), 0

    def digests(self) -> tuple[str, ...]:
        """Each range's sha256 hex, in order, the partial last one included (if any bytes)."""
        tail = (self._current.hexdigest(),) if self._filled else ()
        return (*self._done, *tail)
