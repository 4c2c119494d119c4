"""Reading a shard another process is streaming into the shared cache, range by range.

DataLoader workers share one cache directory, and every worker reads every
shard of its rank (the batches interleave). The first to ask for a shard
streams it (:mod:`~mouthguard.data.fetching.streamed`) while holding the entry's download
lock; without this module the others would wait on that lock for the whole
shard. The streaming process keeps a record beside its temporary file::

    <cache>/tmp/<sha256>.<pid>.<random>             the shard's bytes, as they arrive
    <cache>/tmp/<sha256>.<pid>.<random>.progress    one byte per range: 0 not yet,
                                                    1 verified and written, 2 given up

and writes a range's byte only after the range's bytes, which it writes only
after they matched the manifest. A :class:`FollowedShard` opens both and reads
a sample once every range it touches says 1 (polling the record every
millisecond while it waits). It falls back to the ordinary way -- taking the
lock, hence the finished entry or a download of its own -- when the record
says 2, or when the streaming process is gone (nobody holds the temporary
file's lock any more) before the ranges it needs arrived. The streaming
process writes 2 and releases the lock as soon as a range fails, not when its
own reader meets the failure. The record is written just after the lock is
taken; a reader that finds the lock taken and no record yet polls the lock
and follows the record once it appears
(:meth:`.cache.ShardCache.open_or_reserve`, ``meanwhile``). So a follower trusts
exactly what the cache's stamps are trusted for: files in the private cache
directory written by the training user's own processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from mouthguard.data.fetching.cache import PROGRESS, ShardCache, ShardFile
from mouthguard.data.formats.records import RangeTable

#: How long a follower sleeps between looks at the record, and between checks
#: that the streaming process is still alive.
_POLL = 0.001
_ALIVE_CHECK = 0.1
VERIFIED, GIVEN_UP = 1, 2


def find_stream(cache: ShardCache, sha256: str) -> tuple[Path, Path] | None:
    """``(temporary file, record)`` of a streamed download of ``sha256`` in progress, if any."""
    for record in cache.tmp.glob(f"{sha256}.*{PROGRESS}"):
        return Path(str(record)[: -len(PROGRESS)]), record
    return None


class FollowedShard(ShardFile):
    """A shard another process streams into the cache; see the module docstring.

    Args:
        data: the temporary file, open (owned).
        record: its record of verified ranges, open (owned).
        table: the shard's range table.
        size: the shard's size.
        name: its name.
        fallback: opens the shard the ordinary way (called at most once).
        alive: whether the process writing the record still works on it (None:
            whether it still holds its exclusive lock on ``data``, as a streaming
            download does).
    """

    def __init__(  # noqa: PLR0917 - built in one place, by follow()
        self,
        data: int,
        record: int,
        table: RangeTable,
        size: int,
        name: str,
        fallback: Callable[[], ShardFile],
        *,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(data, size, name)
        self._record = record
        self._alive = self._streamer_alive if alive is None else alive
        self.table = table
        self._fallback = fallback
        self._own: ShardFile | None = None
        #: Ranges [0, _ready) seen verified: a read within them looks at the record no
        #: more (a verified range never changes), so a sample costs one ``pread``, not two.
        self._ready = 0

    def read(self, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` once every range they touch is verified."""
        if self._own is not None:
            return self._own.read(offset, length)
        last = (offset + max(length, 1) - 1) // self.table.size
        if last >= self._ready and not self._wait(offset // self.table.size, last):
            self._own = self._fallback()
            return self._own.read(offset, length)
        return super().read(offset, length)

    def _wait(self, first: int, last: int) -> bool:
        """True once ranges ``first..last`` are verified; False: read it the ordinary way."""
        checked = time.monotonic()
        while True:
            record = os.pread(self._record, len(self.table.sha256), 0)
            # The verified prefix, for the reads that follow; ranges may also be
            # verified out of order (the reader's demands first), so look at ours too.
            self._ready = max(self._ready, len(record) - len(record.lstrip(bytes([VERIFIED]))))
            states = record[first : last + 1]
            if states == bytes([VERIFIED]) * (last - first + 1):
                return True
            if GIVEN_UP in states:
                return False
            now = time.monotonic()
            if now - checked >= _ALIVE_CHECK:
                checked = now
                if not self._alive():
                    # It may have finished between our look and this check: look once more.
                    states = os.pread(self._record, last - first + 1, first)
                    return states == bytes([VERIFIED]) * (last - first + 1)
            time.sleep(_POLL)

    def _streamer_alive(self) -> bool:
        """Whether the streaming process still holds its exclusive lock on the file."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return False  # gone -- or done: its lock became a shared pin; either way, fall back

    def close(self) -> None:
        """Close the files (and the ordinary one, if it fell back)."""
        if self._own is not None:
            self._own.close()
            self._own = None
        if self._record >= 0:
            with contextlib.suppress(OSError):
                os.close(self._record)
            self._record = -1
        super().close()


def follow(
    cache: ShardCache,
    sha256: str,
    *,
    table: RangeTable,
    size: int,
    name: str,
    fallback: Callable[[], ShardFile],
) -> FollowedShard | None:
    """Follow a streamed download of ``sha256`` in progress; None if there is none."""
    found = find_stream(cache, sha256)
    if found is None:
        return None
    path, record_path = found
    try:
        data = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None  # finished or dropped meanwhile
    try:
        record = os.open(record_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        os.close(data)
        return None
    if os.fstat(record).st_size != len(table.sha256) or os.fstat(data).st_size != size:
        os.close(data)
        os.close(record)
        return None  # not (yet) a record of this table: do it the ordinary way
    return FollowedShard(data, record, table, size, name, fallback)
