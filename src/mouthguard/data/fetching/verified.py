"""Which shard files read in place have hashed right: one record, shared by processes.

A local dataset read without a cache is verified where it lies: no sample of a
shard is read before the whole file hashed to the manifest's sha256 or, for a
shard with a range table (a version 2 manifest), before the range that holds
it did (:mod:`~mouthguard.data.fetching.inplace`). DataLoader
workers are new processes every epoch and each of them opens every shard of its
rank (the batches interleave), so a record kept in one process's memory would
hash each shard once per worker per epoch -- the dataset K times over with K
workers. :class:`VerifiedFiles` keeps the record in a directory that every
process of one :class:`~mouthguard.data.loading.stream.StreamingDataset` names::

    <dir>/<name>.ok      the file's stat key when its bytes last hashed right
    <dir>/<name>.lock    held while one process hashes it; the others wait, then trust
    <dir>/<name>.progress   while a shard is hashed range by range: which ranges
                         matched, for the others to read them at once
                         (:mod:`~mouthguard.data.fetching.inplacefollow`)

where ``<name>`` is derived from the file's path, the part's offset and its
expected sha256 (a part is a whole shard, or a verified byte range of a file such
as a Parquet row group), so two datasets or versions never share a record.

The trust is the cache's (:mod:`~mouthguard.data.fetching.cache`): with ``verify="stat"``
a file whose ``(device, inode, size, mtime_ns, ctime_ns)`` is what it was when
it hashed right is not hashed again. Any change made through the filesystem
(a write, a truncate, ``touch``, a replaced file) changes ``ctime`` and forces a
full re-hash; silent media corruption does not, so ``verify="always"`` hashes
on every open (no record is consulted). The directory must be private to the
training user, like a cache directory.

A record that cannot be written (a full disk) is logged and costs the next
process one hash; the reader is not failed for it. The locks are
:mod:`mouthguard.io.forklocks` descriptors: a DataLoader worker forked while
this process hashes a file lets go of the lock as it starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from pathlib import Path

from mouthguard.data.fetching.cache import ShardFile, Verify
from mouthguard.data.fetching.cachefiles import hash_range, read_stamp, stat_key
from mouthguard.data.fetching.inplace import InPlaceShard
from mouthguard.data.fetching.inplacefollow import (
    RangeProgress,
    drop_progress,
    follow_in_place,
    progress_path,
)
from mouthguard.data.formats.part import Part
from mouthguard.data.formats.records import RangeTable
from mouthguard.errors import ShardDamagedError
from mouthguard.io.forklocks import close_lock_file, flocked, try_lock

log = logging.getLogger(__name__)


class VerifiedFiles:
    """The shared record of in-place files that matched the manifest.

    Args:
        directory: the record's directory (created if missing).
        verify: ``stat`` trusts an unchanged file hashed before by any process
            naming ``directory``; ``always`` hashes on every open.
    """

    def __init__(self, directory: str | os.PathLike[str], verify: Verify) -> None:
        if verify not in ("stat", "always"):
            raise ValueError(f"verify_cache must be 'stat' or 'always', not {verify!r}")
        self.root = Path(directory)
        self.verify = verify
        self.root.mkdir(parents=True, exist_ok=True)

    def check(self, fd: int, path: str, part: Part) -> None:
        """Return once bytes ``part`` of the open file ``fd`` (at ``path``) match the manifest.

        The file must have the manifest's size and the part's bytes its sha256.
        Hashes them unless the record says it already did, the file unchanged
        since; with several processes asking at once, one hashes and the others
        wait for it, then trust its record.

        Raises:
            ShardDamagedError: they do not match (names the data file); the record
                of the part is removed.
        """
        if self.verify == "always":
            _hash(fd, part)
            return
        record, lock = self.paths(path, part)
        key = stat_key(fd)
        if read_stamp(record) == key:
            return
        with flocked(lock):
            if read_stamp(record) == key:  # hashed by another process while we waited
                return
            drop_progress(record)  # a killed verifier's: nobody else holds the lock
            try:
                _hash(fd, part)
            except ShardDamagedError:
                record.unlink(missing_ok=True)
                raise
            try:
                _write_record(record, key)
            except OSError as exc:  # the bytes matched: the reader goes on
                log.warning("the verification record of %s was not written: %s", part.name, exc)

    def open_ranges(
        self, fd: int, path: str, part: Part, table: RangeTable, *, advice: str = ""
    ) -> ShardFile | None:
        """Shard ``part`` of ``fd`` handed out range by range as they match; None: trusted already.

        For a whole shard with a range table. None when the record says the file
        hashed right (unchanged since). When another process is verifying it,
        a shard that reads each range once that process's progress record says
        it matched (:mod:`~mouthguard.data.fetching.inplacefollow`), or, with no
        record to follow, None after waiting for it as :meth:`check` does and
        trusting its record. Otherwise this process takes the file's lock and
        returns an :class:`~mouthguard.data.fetching.inplace.InPlaceShard` that
        verifies the ranges on a thread of its own, publishes each in its
        progress record, and writes the record when all matched. With
        ``verify="always"`` no record is read or written. ``advice`` ends the
        message of a range that does not match. A returned shard owns ``fd``.

        Raises:
            ShardDamagedError: the file does not have the manifest's size, or
                (waiting for another process) its bytes do not match.
        """
        if os.fstat(fd).st_size != part.file_size:
            raise ShardDamagedError(
                f"{part.name}: {part.what} size does not match the manifest", shard=part.name
            )
        if self.verify == "always":
            return InPlaceShard(fd, part.size, part.name, table, _no_record, advice=advice)
        record, lock_path = self.paths(path, part)
        key = stat_key(fd)
        if read_stamp(record) == key:
            return None
        lock = try_lock(lock_path)
        if lock is None:  # another process is verifying it: follow it, or wait for its word
            return self._follow(fd, path, part, table, key)
        try:
            if read_stamp(record) == key:  # verified by another process before we locked
                close_lock_file(lock)
                return None
            drop_progress(record)  # a killed verifier's: nobody else holds the lock
            progress = RangeProgress(progress_path(record), len(table.sha256), key)
        except BaseException:
            close_lock_file(lock)
            raise

        def finished(matched: bool) -> None:
            # On the hashing thread, after the last range: a record that cannot be
            # written (a full disk) costs the next process a hash, nothing more.
            try:
                if matched:
                    _write_record(record, key)
                else:
                    record.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("the verification record of %s was not written: %s", part.name, exc)
            finally:
                progress.end(matched)  # before the lock: a follower then sees the end
                close_lock_file(lock)

        return InPlaceShard(
            fd, part.size, part.name, table, finished, advice=advice, matched_range=progress.matched
        )

    def _follow(
        self, fd: int, path: str, part: Part, table: RangeTable, key: list[int]
    ) -> ShardFile | None:
        """Follow the process verifying ``part``; without its progress record, wait for it."""
        record, lock = self.paths(path, part)

        def fallback() -> ShardFile:
            self.check(fd, path, part)  # its lock, then its record -- or a hash of our own
            return ShardFile(os.dup(fd), part.size, part.name)

        followed = follow_in_place(
            fd,
            progress=progress_path(record),
            key=key,
            lock=lock,
            table=table,
            size=part.size,
            name=part.name,
            fallback=fallback,
        )
        if followed is None:
            self.check(fd, path, part)
        return followed

    def paths(self, path: str, part: Part) -> tuple[Path, Path]:
        """The record and the lock of ``part`` of the file at ``path``."""
        tag = hashlib.sha256(f"{path}\0{part.offset}\0{part.sha256}".encode()).hexdigest()[:32]
        return self.root / f"{tag}.ok", self.root / f"{tag}.lock"


def _write_record(record: Path, key: list[int]) -> None:
    """Record ``key`` (the file's stat key) as hashed right: written aside, renamed in."""
    tmp = record.with_name(f"{record.name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps(key))
    tmp.replace(record)


def _no_record(matched: bool) -> None:
    """Nothing to write or release: with ``verify="always"`` no record is kept."""


def _hash(fd: int, part: Part) -> None:
    if (
        os.fstat(fd).st_size != part.file_size
        or hash_range(fd, part.offset, part.size) != part.sha256
    ):
        raise ShardDamagedError(
            f"{part.name}: {part.what} sha256 does not match the manifest", shard=part.name
        )
