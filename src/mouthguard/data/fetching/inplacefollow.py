"""Following another process's range-by-range verification of a shard read in place.

A local dataset read without a cache is verified where it lies, one process
per shard hashing its ranges while holding the shard's lock in the shared
record (:class:`~mouthguard.data.fetching.verified.VerifiedFiles`,
:mod:`~mouthguard.data.fetching.inplace`). DataLoader workers read the same
shuffle window side by side, so without this module every other worker waits
on that lock until the whole shard has hashed: 25-140 ms per shard measured
with 4 workers over 16 MiB shards, page cache dropped, at the start of each
window. The verifying process keeps a record beside the lock::

    <dir>/<name>.progress    one byte per range: 0 not yet, 1 matched, 2 given up;
                             then the stamp: 16 bytes derived from the file's stat key

The stamp is taken from the file's stat key when the verification began, and a
process follows only a record whose stamp is its own view of the file -- the
stat-stamp rule of the ``.ok`` record. The record is written aside and renamed
in once the lock is held; a range's byte becomes 1 only after the range's bytes
matched the manifest (on the hashing thread, before its own reader is told); on
a mismatch, an error or an early close, every byte not yet 1 becomes 2. It is
removed when the verification ends, before the lock is released; one left by a
killed verifier is removed by the next process that takes the lock to hash the
file (one path, so no directory is listed).

A process that finds the lock taken opens the record, checks its stamp and
reads the file through its own descriptor, a range once its byte says 1
(:class:`~mouthguard.data.fetching.follow.FollowedShard`: polling every
millisecond, checking every 100 ms that the verifier still holds the lock). It
falls back to the ordinary way -- waiting for the lock, then trusting the
``.ok`` record or hashing the file itself -- when a byte it needs says 2, when
the verifier let go of the lock before those ranges matched, or when there is
no record to follow (not yet written, or it could not be). A follower trusts a
range exactly as far as a process trusts the ``.ok`` record: another process
of the training user hashed those bytes of the same, unchanged file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from mouthguard.data.fetching.cache import ShardFile
from mouthguard.data.fetching.cachefiles import write_at
from mouthguard.data.fetching.follow import GIVEN_UP, VERIFIED, FollowedShard
from mouthguard.data.formats.records import RangeTable
from mouthguard.io.forklocks import close_lock_file, try_lock

log = logging.getLogger(__name__)

PROGRESS = ".progress"
STAMP_BYTES = 16


def progress_path(record: Path) -> Path:
    """The progress record beside ``record`` (a ``.ok`` path)."""
    return record.with_suffix(PROGRESS)


def stamp_of(key: list[int]) -> bytes:
    """The stamp of a file of stat ``key`` in a progress record."""
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:STAMP_BYTES].encode()


def drop_progress(record: Path) -> None:
    """Remove the progress record beside ``record`` (call with its lock held).

    With the lock held no verification of the file is under way, so a record
    left is a killed verifier's; the next verification writes its own.
    """
    with contextlib.suppress(OSError):
        progress_path(record).unlink(missing_ok=True)


class RangeProgress:
    """The verifier's side: the record of which ranges matched, for the other processes.

    Made with the shard's lock held; :meth:`end` before the lock is released.
    Writing it is best effort: a record that cannot be made or written (a full
    disk) is logged, and the others wait for the lock as they would without it.
    """

    def __init__(self, path: Path, ranges: int, key: list[int]) -> None:
        self.path = path
        self.ranges = ranges
        self._done = 0  # ranges [0, _done) marked matched
        self._fd = -1
        draft = path.with_name(f"{path.name}.{uuid.uuid4().hex}")
        try:
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                write_at(fd, bytes(ranges) + stamp_of(key), 0)
                draft.replace(path)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        except OSError as exc:
            log.warning("no progress record for %s (the others wait for it whole): %s", path, exc)
        finally:
            with contextlib.suppress(OSError):
                draft.unlink(missing_ok=True)  # renamed in, or never to be

    def matched(self, k: int) -> None:
        """Range ``k`` matched the manifest (ranges are marked in order)."""
        if self._fd < 0:
            return
        try:
            os.pwrite(self._fd, bytes([VERIFIED]), k)
            self._done = k + 1
        except OSError as exc:  # the others fall back to the lock: slower, never wrong
            log.warning("progress record %s not written: %s", self.path, exc)
            self._close()

    def end(self, matched: bool) -> None:
        """The verification is over: unless every range matched, the rest are given up."""
        if self._fd < 0:
            return
        try:
            if not matched and self._done < self.ranges:
                os.pwrite(self._fd, bytes([GIVEN_UP]) * (self.ranges - self._done), self._done)
        except OSError as exc:
            log.warning("progress record %s not written: %s", self.path, exc)
        finally:
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)
            self._close()

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = -1


def follow_in_place(
    fd: int,
    *,
    progress: Path,
    key: list[int],
    lock: Path,
    table: RangeTable,
    size: int,
    name: str,
    fallback: Callable[[], ShardFile],
) -> FollowedShard | None:
    """Read shard file ``fd`` (of stat ``key``) as another process verifies it.

    None: no record to follow. ``fd`` passes to the returned shard (closed with
    it); with None it stays the caller's. ``fallback`` opens the shard the
    ordinary way (see the module docstring).
    """
    try:
        record = os.open(progress, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None  # not written yet, or finished meanwhile
    ranges = len(table.sha256)
    try:
        ours = os.fstat(record).st_size == ranges + STAMP_BYTES and os.pread(
            record, STAMP_BYTES, ranges
        ) == stamp_of(key)
    except OSError:
        ours = False
    if not ours:
        os.close(record)
        return None  # a record of another table, or of the file as it was
    return FollowedShard(fd, record, table, size, name, fallback, alive=lambda: _held(lock))


def _held(lock: Path) -> bool:
    """Whether some process holds ``lock`` (taken and let go at once when free)."""
    fd = try_lock(lock, os.O_RDWR)  # never created here: a missing lock is nobody's
    if fd is None:
        return lock.exists()
    close_lock_file(fd)
    return False
