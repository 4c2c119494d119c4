"""The disk tier: blocks packed into segment files, a persistent index, compaction.

:class:`DiskLevel` owns a directory of segments (format and recovery rule in
:mod:`~mouthguard.kvcache.segments`). Its *metadata* methods are not locked:
the store calls them under its own lock, which is what keeps a block in exactly
one tier across memory, disk and remote. Its *I/O* methods (:meth:`write`,
:meth:`read`, :meth:`flush_drops`, :meth:`unlink`) take no lock and run outside
the store's lock; only the store's single background mover writes or unlinks.

Space is the bytes of the data files, dead records included (what ``du`` sees),
and never exceeds the capacity: a record is *planned* (its bytes counted) before
it is written; deletes only make records dead; space comes back when a segment
is unlinked -- one without live records, or the oldest one, evicted whole.

**Eviction is by segment, oldest first, with a second chance** (a CLOCK over
segments, as log-structured flash caches do): when room is needed, the oldest
segment's blocks that were read since they were written (:meth:`DiskLevel.touch`)
or are pinned are *relocated* into the active segment, the others leave the
tier (to the remote tier, or dropped), and the file is unlinked. A hit therefore
never writes, and a block that is never read again is never copied: the disk
is written about once per block stored, instead of a compaction copying most of
a segment to reclaim the scattered holes a per-block LRU leaves. New records may
fill only ``capacity - segment_bytes`` (:attr:`DiskLevel.append_limit`): the
last segment's worth is headroom for the relocated copies.

Invariants (under the store's lock):

* ``file_bytes`` = the sum of ``size`` over segments <= ``capacity``.
* a segment's ``live`` = the spans of the index's locations in it; ``pending``
  counts records planned into it but not yet published or abandoned, and a
  segment with pending records is never unlinked.
* the active segment is the only one appended to; it is sealed when the next
  record would push it past ``segment_bytes``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy.typing as npt

from mouthguard.errors import KVCacheBusyError, KVCacheError
from mouthguard.io.direct_write import enable_direct
from mouthguard.io.forklocks import close_lock_file, open_lock_file
from mouthguard.kvcache.blocks import Payload, aligned_frame, block_checksum, padded
from mouthguard.kvcache.segments import (
    SegmentEntry,
    append,
    data_path,
    drop_record,
    index_path,
    log_header,
    put_record,
    read_log,
    read_payload,
    segment_ids,
    write_payloads,
)

log = logging.getLogger(__name__)

LOCK_NAME = "kvstore.lock"
#: Largest segment file; smaller caches get capacity / 32 (dead space and the
#: compaction headroom are both about one segment, so small segments waste little).
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
#: A segment is compacted to make room once this share of it is dead; below it,
#: copying its live records would cost more writes than evicting a block.
COMPACT_DEAD_FRACTION = 0.25


@dataclass
class Segment:
    """Accounting of one segment (see the module invariants)."""

    size: int = 0
    live: int = 0
    pending: int = 0
    keys: set[bytes] = field(default_factory=set)


class DiskLevel:
    """Segments in ``directory`` holding at most ``capacity`` bytes.

    Args:
        directory: created if missing; locked (``flock``) for this instance's life (a
            forked child does not hold the lock: :mod:`mouthguard.io.forklocks`).
        capacity: bytes of data files allowed.
        segment_bytes: target size of one segment file (default: see above).
        direct_io: write with O_DIRECT where the filesystem allows.

    Raises:
        KVCacheBusyError: another open store holds the directory.
        KVCacheError: the capacity is too small to hold a segment.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        capacity: int,
        *,
        segment_bytes: int | None = None,
        direct_io: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.capacity = capacity
        self.direct_io = direct_io
        wanted = segment_bytes or min(DEFAULT_SEGMENT_BYTES, capacity // 32)
        self.segment_bytes = max(padded(1), wanted - wanted % padded(1))
        if capacity < 2 * self.segment_bytes:
            raise KVCacheError(f"disk capacity {capacity} holds fewer than two segments")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_directory(self.directory)
        self.index: dict[bytes, SegmentEntry] = {}
        self.segments: dict[int, Segment] = {}
        self.file_bytes = 0
        self.active: int | None = None
        self._next_id = 1
        self._drops: list[tuple[int, bytes]] = []
        #: Keys read since they were written here: kept when their segment is evicted.
        self.referenced: set[bytes] = set()
        try:
            self.recovered = self._recover()
        except BaseException:
            self.close()  # a failed open must not keep the directory locked
            raise

    # --- recovery ---

    def _recover(self) -> int:
        """Rebuild the index from the index logs; return how many blocks it found."""
        ids = sorted(segment_ids(self.directory))
        for segment in ids:
            data, idx = data_path(self.directory, segment), index_path(self.directory, segment)
            if not (data.exists() and idx.exists()):
                self._remove_files(segment)  # one half of an unlink or of a creation
                continue
            size = data.stat().st_size
            live, valid = read_log(idx, segment, size)
            if valid == 0:
                self._remove_files(segment)
                continue
            if valid < idx.stat().st_size:
                os.truncate(idx, valid)  # cut a torn tail so later appends stay readable
            self.segments[segment] = Segment(size=size)
            self.file_bytes += size
            for key, location in live.items():
                previous = self.index.get(key)
                if previous is not None:  # a relocation interrupted before the unlink
                    self.segments[previous.segment].live -= previous.span
                    self.segments[previous.segment].keys.discard(key)
                self._publish(key, location)
        self._next_id = (ids[-1] + 1) if ids else 1
        return len(self.index)

    def _remove_files(self, segment: int) -> None:
        for path in (data_path(self.directory, segment), index_path(self.directory, segment)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    # --- metadata (under the store's lock) ---

    def plan(self, payload: Payload) -> SegmentEntry:
        """Count a record for ``payload`` in the active segment and return its location.

        The caller has made room: ``file_bytes + padded(payload.nbytes) <= capacity``.
        """
        span = padded(payload.nbytes)
        assert self.file_bytes + span <= self.capacity, "plan() without room"
        active = self.segments.get(self.active) if self.active is not None else None
        segment = self.active
        full = active is not None and active.size > 0 and active.size + span > self.segment_bytes
        if segment is None or active is None or full:
            segment, self._next_id = self._next_id, self._next_id + 1
            self.active = segment
            active = self.segments[segment] = Segment()
            self._create(segment)
        location = SegmentEntry(
            segment, active.size, payload.nbytes, payload.checksum, payload.desc
        )
        active.size += span
        active.pending += 1
        self.file_bytes += span
        return location

    def _create(self, segment: int) -> None:
        # Ids are never reused within a process, so no unlink can race this creation.
        data_path(self.directory, segment).touch()
        index_path(self.directory, segment).write_bytes(log_header(segment))

    def publish(self, key: bytes, location: SegmentEntry) -> None:
        """Make a written record the key's disk copy (an older copy becomes dead)."""
        self.segments[location.segment].pending -= 1
        self.forget(key)
        self._publish(key, location)

    def _publish(self, key: bytes, location: SegmentEntry) -> None:
        self.index[key] = location
        segment = self.segments[location.segment]
        segment.live += location.span
        segment.keys.add(key)

    def _unpublish(self, key: bytes) -> SegmentEntry | None:
        location = self.index.pop(key, None)
        if location is not None:
            segment = self.segments[location.segment]
            segment.live -= location.span
            segment.keys.discard(key)
            self.referenced.discard(key)
        return location

    def abandon(self, key: bytes, location: SegmentEntry) -> None:
        """Give up a planned record (its write failed, or its block went away meanwhile)."""
        self.segments[location.segment].pending -= 1
        self._drops.append((location.segment, drop_record(key, location.offset)))

    def forget(self, key: bytes) -> SegmentEntry | None:
        """Remove the key's disk copy (its record becomes dead space)."""
        location = self._unpublish(key)
        if location is not None:
            self._drops.append((location.segment, drop_record(key, location.offset)))
        return location

    def relocated(self, key: bytes, old: SegmentEntry, new: SegmentEntry) -> bool:
        """Publish a compaction copy if ``key`` still lives at ``old``; else abandon it.

        The key keeps its place in the eviction order: a copy is not a use.
        """
        if self.index.get(key) != old:
            self.abandon(key, new)
            return False
        source, target = self.segments[old.segment], self.segments[new.segment]
        source.live -= old.span
        source.keys.discard(key)
        target.pending -= 1
        target.live += new.span
        target.keys.add(key)
        self.index[key] = new
        self.referenced.discard(key)  # the copy is its second chance
        return True

    def touch(self, key: bytes) -> None:
        """Note a read of ``key``: its block gets a second chance at eviction."""
        if key in self.index:
            self.referenced.add(key)

    def oldest_segment(self) -> int | None:
        """The segment to evict next: the oldest without records being written.

        The active segment only when it is the only one (it is sealed first).
        """
        candidates = [s for s, info in self.segments.items() if not info.pending]
        older = [s for s in candidates if s != self.active]
        if older:
            return min(older)
        if candidates and self.active in candidates:
            self.active = None
            return candidates[0]
        return None

    def dead_segment(self) -> int | None:
        """A segment with no live and no pending records (its space can be returned)."""
        for segment, info in self.segments.items():
            if info.live == 0 and info.pending == 0 and (info.size or segment != self.active):
                return segment
        return None

    @property
    def append_limit(self) -> int:
        """Bytes new records may fill; the last segment's worth is kept for compaction."""
        return self.capacity - self.segment_bytes

    def compaction_candidate(self, min_dead_fraction: float = COMPACT_DEAD_FRACTION) -> int | None:
        """The segment with the most dead bytes, if compacting it is worth it and fits.

        Worth it: at least ``min_dead_fraction`` of it is dead. Fits: its live
        records fit in the space left, headroom included. If that is the active
        segment it is sealed (the copies go to a new one).
        """
        best, best_dead = None, 0
        for segment, info in self.segments.items():
            dead = info.size - info.live
            if info.pending or dead <= best_dead or dead < min_dead_fraction * info.size:
                continue
            if self.file_bytes + info.live <= self.capacity:
                best, best_dead = segment, dead
        if best is not None and best == self.active:
            self.active = None
        return best

    def live_in(self, segment: int) -> list[tuple[bytes, SegmentEntry]]:
        """The live records of ``segment``."""
        return [(k, self.index[k]) for k in self.segments[segment].keys]

    def detach(self, segment: int) -> None:
        """Stop counting ``segment``, whose files were just unlinked (:meth:`unlink`)."""
        info = self.segments.pop(segment)
        assert info.live == 0, "detach of a segment with live records"
        assert info.pending == 0, "detach of a segment with records being written"
        self.file_bytes -= info.size
        if self.active == segment:
            self.active = None
        self._drops = [d for d in self._drops if d[0] != segment]

    def take_drops(self) -> list[tuple[int, bytes]]:
        """Drop records waiting to be appended (handed to :meth:`flush_drops`)."""
        drops, self._drops = self._drops, []
        return drops

    def eligible(self, pinned: Callable[[bytes], bool]) -> Callable[[bytes], bool]:
        """Eviction filter: not pinned and still on disk."""
        return lambda key: key in self.index and not pinned(key)

    # --- I/O (no lock) ---

    def write(self, records: Sequence[tuple[bytes, SegmentEntry, Payload]]) -> None:
        """Write planned records (payloads, then their index-log records).

        Raises:
            OSError: a write failed; the caller abandons every record.
        """
        by_segment: dict[int, list[tuple[bytes, SegmentEntry, Payload]]] = {}
        for record in records:
            by_segment.setdefault(record[1].segment, []).append(record)
        for segment, batch in by_segment.items():
            path = data_path(self.directory, segment)
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                direct = self.direct_io and enable_direct(fd)
                run: list[tuple[bytes, SegmentEntry, Payload]] = []
                for record in sorted(batch, key=lambda r: r[1].offset):
                    if run and run[-1][1].offset + run[-1][1].span != record[1].offset:
                        direct = write_payloads(fd, run[0][1].offset, [r[2] for r in run], direct)
                        run = []
                    run.append(record)
                if run:
                    write_payloads(fd, run[0][1].offset, [r[2] for r in run], direct)
            finally:
                os.close(fd)
            log_records = b"".join(put_record(k, loc) for k, loc, _ in batch)
            append(index_path(self.directory, segment), log_records)

    def read(self, key: bytes, location: SegmentEntry) -> npt.NDArray[Any] | None:
        """The payload's bytes, or None if they are gone or fail their checksum."""
        frame = self.read_frame(key, location)
        return None if frame is None else frame[: location.nbytes]

    def read_frame(self, key: bytes, location: SegmentEntry) -> npt.NDArray[Any] | None:
        """The payload in an aligned frame (:func:`aligned_frame`), checked; else None."""
        frame = aligned_frame(location.nbytes)
        out = frame[: location.nbytes]
        try:
            read_payload(data_path(self.directory, location.segment), location.offset, out)
        except (OSError, EOFError) as exc:
            log.debug("kv block unreadable in segment %d: %s", location.segment, exc)
            return None
        if block_checksum(key, out) != location.checksum:
            return None
        return frame

    def flush_drops(self, drops: Sequence[tuple[int, bytes]]) -> None:
        """Append drop records to their segments' logs (a segment already gone is skipped)."""
        by_segment: dict[int, list[bytes]] = {}
        for segment, record in drops:
            by_segment.setdefault(segment, []).append(record)
        for segment, records in by_segment.items():
            with contextlib.suppress(FileNotFoundError):
                append(index_path(self.directory, segment), b"".join(records))

    def unlink(self, segment: int) -> None:
        """Remove a segment's files (the index log first: no log, no records).

        Called before :meth:`detach`, so the bytes counted never fall below the
        bytes on disk.
        """
        for path in (index_path(self.directory, segment), data_path(self.directory, segment)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def close(self) -> None:
        """Release the directory lock."""
        if self._lock_fd is not None:
            close_lock_file(self._lock_fd)
            self._lock_fd = None


def _lock_directory(directory: Path) -> int | None:
    fd = open_lock_file(directory / LOCK_NAME)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        close_lock_file(fd)
        raise KVCacheBusyError(f"{directory} is in use by another KVStore") from exc
    return fd
