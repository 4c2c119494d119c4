"""The local shard cache: bounded in bytes, shared by processes, verified on every use.

Layout (content-addressed: an entry is named by the sha256 the manifest records,
so identical shards of two datasets share one entry and a new dataset version
can never meet a stale one)::

    <dir>/blobs/<sha256>        a verified shard (or index)
    <dir>/blobs/<sha256>.ok     its verification stamp; its mtime is the entry's last use
    <dir>/tmp/<sha256>.<pid>.<random>   a download in progress (sized to the full object)
    <dir>/tmp/<sha256>.<pid>.<random>.progress   a streamed one's verified ranges (one byte each)
    <dir>/locks/<xyz>.lock      download locks, striped by the sha256's first 3 hex digits
    <dir>/cache.lock            held while space is reserved and entries evicted

Invariants, for any number of processes sharing the directory (DataLoader
workers, ranks of one node):

* **One download per entry.** A process takes the entry's download lock
  (``flock``), looks again, and only then downloads; the others wait on the
  lock and find the entry.
* **Atomic insert.** Bytes go to a temporary file that is renamed to its blob
  name only once their sha256 matched the manifest: a blob never exists
  partially or unverified.
* **In-use entries are never evicted.** A reader holds a shared ``flock`` on
  its open blob (a pin); eviction takes an exclusive ``flock`` without
  waiting, so a pinned blob is skipped. A reader that opened a blob as it was
  being evicted sees the name gone after locking and starts again.
* **Bounded.** Before a download reserves its bytes (the temporary file is
  sized to the whole object at once, so concurrent downloads count), the least
  recently used unpinned blobs are evicted until the new one fits. A prefetch
  that cannot fit gives up (the cache never grows for a guess); a download the
  consumer needs *now* proceeds even when everything left is pinned, so the
  directory exceeds the limit by at most the shards in use beyond it.
* **Verified on every use.** Each open checks the blob against its stamp: the
  stamp records ``(device, inode, size, mtime_ns, ctime_ns)`` as they were when
  the bytes last hashed to the right sha256. Any change through the filesystem
  (a write, a truncate, ``touch``, a replaced file) changes ``ctime`` and forces
  a full re-hash; a mismatch removes the entry and downloads it again. With
  ``verify="always"`` every open re-hashes. Measured (2-core VM): sha256 runs
  at about 0.6 GB/s, and with K DataLoader workers every worker opens every
  shard of its rank (the batches interleave), so ``always`` hashes each shard K
  times per epoch; ``stat`` hashes it once per download and catches every
  alteration made through the filesystem. What it cannot see is a change that
  leaves the metadata alone (silent media corruption): use ``always`` where
  the cache disk is not trusted for that.
* Temporary files of a process that died are found (nobody holds their lock)
  and removed at the next reservation.
* **A fork keeps no lock.** The download locks, ``cache.lock`` and eviction's
  locks are :mod:`mouthguard.io.forklocks` descriptors: a DataLoader worker
  forked while this process held one lets go of its copy as it starts, so the
  lock is free once this process releases it. What a child still shares are a
  download's temporary file (unlinked or renamed by its owner, so nobody else
  can ask for it) and the pins of open blobs, which only keep those blobs from
  being evicted while the child lives.

The cache directory must be private to the training user: its stamps and
locks are trusted, like the files themselves.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from mouthguard.data.fetching.cachefiles import hash_fd, read_stamp, stat_key
from mouthguard.errors import ShardDamagedError, TierError
from mouthguard.io.forklocks import close_lock_file, flocked, open_lock_file, try_lock

log = logging.getLogger(__name__)

Verify = Literal["stat", "always"]
#: The suffix of a streamed download's record of verified ranges (:mod:`.follow`).
PROGRESS = ".progress"
_ATTEMPTS = 4
#: How often a reader waiting for another process's download lock looks for its stream.
_LOCK_POLL = 0.005


class ShardFile:
    """An open, verified shard, index or byte range: read it with :meth:`read`; close to unpin.

    Args:
        fd: an open file descriptor (owned: closed by :meth:`close`).
        size: the object's (or the range's) size.
        name: the data file's name, for messages.
        base: where the object starts in the file: 0 for a cache entry, a row
            group's offset for a range of a Parquet file read in place.
    """

    def __init__(self, fd: int, size: int, name: str, base: int = 0) -> None:
        self.fd = fd
        self.size = size
        self.name = name
        self.base = base

    def read(self, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)``; a short file is damage, never a short read."""
        whole = os.pread(self.fd, length, self.base + offset)
        if len(whole) == length:  # nearly always: one call per sample, nothing more
            return whole
        parts: list[bytes] = [whole] if whole else []
        done = len(whole)
        while done < length:
            chunk = os.pread(self.fd, length - done, self.base + offset + done)
            if not chunk:
                raise ShardDamagedError(
                    f"{self.name}: file ended at byte {self.base + offset + done}", shard=self.name
                )
            parts.append(chunk)
            done += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Close the file (releasing its pin). Idempotent."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


class Reservation:
    """A cache entry being filled: its temporary file, open and sized, and its download lock.

    Write the object's bytes into :attr:`fd`, then :meth:`commit` once they are
    verified -- or :meth:`abandon`. Exactly one of the two must be called.
    """

    def __init__(  # noqa: PLR0917 - built in one place, by ShardCache.open_or_reserve
        self, cache: ShardCache, sha256: str, size: int, name: str, fd: int, tmp: Path, lock: int
    ) -> None:
        self.cache = cache
        self.sha256 = sha256
        self.size = size
        self.name = name
        self.fd = fd
        self.tmp = tmp
        self._lock = lock  # -1 once released

    def release_lock(self) -> None:
        """Let other processes download the entry while this one keeps its bytes.

        For a download that gave up part-way (:mod:`~mouthguard.data.fetching.streamed`):
        its verified part stays readable through :attr:`fd`, but it can never
        be committed, so holding the lock would only make others wait for
        nothing. Idempotent; the reservation must then be abandoned.
        """
        if self._lock >= 0:
            close_lock_file(self._lock)
            self._lock = -1

    def commit(self) -> ShardFile:
        """Insert the (verified) bytes as the entry; the open file, pinned, for the caller.

        If it fails, the entry is not inserted and the caller still owns :attr:`fd`.
        """
        if self._lock < 0:
            raise RuntimeError(f"{self.name}: the download lock was released: cannot commit")
        try:
            self.tmp.rename(self.cache.blobs / self.sha256)
        except BaseException:  # the caller still owns (and closes) the fd
            self.tmp.unlink(missing_ok=True)
            self.release_lock()
            raise
        # From the reservation's lock to a pin. flock converts by unlocking first: in
        # that instant an eviction may unlink the new blob. Our fd still reads the
        # verified bytes; the entry is merely downloaded again by its next user.
        fcntl.flock(self.fd, fcntl.LOCK_SH)
        self.release_lock()
        self.cache.write_stamp(self.sha256, self.fd)
        return ShardFile(self.fd, self.size, self.name)

    def abandon(self) -> None:
        """Drop the bytes and release the lock: the next user downloads the entry again."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.tmp.unlink(missing_ok=True)
        self.release_lock()


def _check_download(digest: str, sha256: str, name: str, what: str) -> None:
    if digest != sha256:
        raise ShardDamagedError(
            f"{name}: sha256 of the downloaded {what} does not match the manifest", shard=name
        )


class ShardCache:
    """A cache directory; see the module docstring for its invariants.

    Args:
        directory: the cache directory (created if missing).
        limit: bytes the cache may hold; None: half of the space free on its
            filesystem (plus what it already holds) when it is first filled.
        verify: ``stat`` (re-hash when the file's metadata changed) or ``always``.
    """

    def __init__(
        self, directory: str | os.PathLike[str], limit: int | None, verify: Verify
    ) -> None:
        if limit is not None and limit < 0:
            raise ValueError("cache_limit must be >= 0")
        if verify not in ("stat", "always"):
            raise ValueError(f"verify_cache must be 'stat' or 'always', not {verify!r}")
        self.root = Path(directory)
        self.limit = limit
        self.verify = verify
        self.blobs, self.tmp, self.locks = (self.root / n for n in ("blobs", "tmp", "locks"))
        for path in (self.blobs, self.tmp, self.locks):
            path.mkdir(parents=True, exist_ok=True)

    # --- reading ---------------------------------------------------------------------

    def open(
        self,
        sha256: str,
        size: int,
        fetch: Callable[[int], str],
        *,
        name: str,
        must: bool,
        what: str = "shard",
    ) -> ShardFile | None:
        """A pinned, verified file holding the object ``sha256`` of ``size`` bytes.

        Args:
            sha256: the object's sha256 (hex), as the manifest records it.
            size: its size in bytes.
            fetch: writes the object into the given fd (at offset 0) and returns the
                sha256 hex of what it wrote; called once per missing entry across
                all processes sharing the cache, and once more (over the same file)
                when what it wrote does not match.
            name: the data file's name, for messages and errors.
            must: the consumer needs it now: download even beyond the limit.
            what: what the object is (``shard``, ``index``, ``row group 3``), for messages.

        Returns:
            The open file, or None when ``must`` is false and there is no room.

        Raises:
            ShardDamagedError: the downloaded bytes do not match ``sha256``, twice.
            TierError: the download failed.
        """
        got = self.open_or_reserve(sha256, size, name=name, must=must)
        if not isinstance(got, Reservation):
            return got
        try:
            digest = fetch(got.fd)
            if digest != sha256:  # read mid-overwrite? Once more, then refuse.
                digest = fetch(got.fd)
            _check_download(digest, sha256, name, what)
        except BaseException:
            got.abandon()
            raise
        try:
            return got.commit()
        except BaseException:
            os.close(got.fd)
            raise

    def open_or_reserve(
        self,
        sha256: str,
        size: int,
        *,
        name: str,
        must: bool,
        meanwhile: Callable[[], ShardFile | None] | None = None,
    ) -> ShardFile | Reservation | None:
        """The entry ``sha256`` if it is here (verified, pinned), else a reservation to fill it.

        The reservation holds the entry's download lock until it is committed or
        abandoned: other processes asking for the entry wait for it, then find it.
        None: ``must`` is false and there is no room.

        ``meanwhile``: while another process holds the lock, it is called every
        :data:`_LOCK_POLL` seconds, and what it returns (not None) is returned at
        once instead of waiting on. It lets a reader follow a download that
        starts streaming after the lock was taken (:mod:`.follow`)
        instead of waiting for the whole of it.

        Raises:
            TierError: space could not be reserved, or the entry kept changing.
        """
        for _ in range(_ATTEMPTS):
            found = self._open_verified(sha256, size, name)
            if found is not None:
                return found
            lock = open_lock_file(self.locks / f"{sha256[:3]}.lock")
            try:
                other = self._lock_or(lock, meanwhile)
                if other is not None:
                    close_lock_file(lock)
                    return other
                if (self.blobs / sha256).exists():
                    close_lock_file(lock)
                    continue  # inserted while we waited for the lock: verify it above
                reserved = self._reserve(sha256, size, must=must)
            except BaseException:
                close_lock_file(lock)
                raise
            if reserved is None:
                close_lock_file(lock)
                return None
            return Reservation(self, sha256, size, name, *reserved, lock)
        raise TierError(f"{name}: cache entry kept changing under {self.root}")

    @staticmethod
    def _lock_or(lock: int, meanwhile: Callable[[], ShardFile | None] | None) -> ShardFile | None:
        """Take ``lock`` (exclusive), or return what ``meanwhile`` found while it was held."""
        if meanwhile is None:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return None
        while True:  # ends when the holder releases (done, given up, or dead) or a stream shows
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                return None
            found = meanwhile()
            if found is not None:
                return found
            time.sleep(_LOCK_POLL)

    def open_existing(self, sha256: str, size: int, name: str) -> ShardFile | None:
        """The entry ``sha256``, verified and pinned, if the cache holds it; never downloads."""
        return self._open_verified(sha256, size, name)

    def _open_verified(self, sha256: str, size: int, name: str) -> ShardFile | None:
        path = self.blobs / sha256
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)  # the pin: eviction skips what is locked
        try:
            same = os.path.samestat(os.fstat(fd), path.stat())
        except FileNotFoundError:
            same = False
        if not same:  # evicted or replaced between our open and our lock
            os.close(fd)
            return None
        stamp = self.blobs / f"{sha256}.ok"
        if self.verify == "stat" and read_stamp(stamp) == stat_key(fd):
            self._touch(stamp)
            return ShardFile(fd, size, name)
        if hash_fd(fd, size) == sha256:
            self.write_stamp(sha256, fd)
            return ShardFile(fd, size, name)
        os.close(fd)
        log.warning("cache entry of %s in %s was altered: fetching it again", name, path)
        self._remove(sha256)
        return None

    # --- stamps ----------------------------------------------------------------------

    def write_stamp(self, sha256: str, fd: int) -> None:
        """Record that the blob ``sha256`` open as ``fd`` hashed right, as it is now."""
        stamp = self.blobs / f"{sha256}.ok"
        tmp = self.tmp / f"{sha256}.ok.{uuid.uuid4().hex}"
        tmp.write_text(json.dumps(stat_key(fd)))
        tmp.replace(stamp)

    @staticmethod
    def _touch(stamp: Path) -> None:
        with contextlib.suppress(OSError):
            os.utime(stamp)

    # --- space -----------------------------------------------------------------------

    def _entries(self) -> tuple[list[tuple[float, int, str]], int]:
        """``([(last use, size, sha256)], bytes held)``; removes dead downloads on the way."""
        blobs: list[tuple[float, int, str]] = []
        used = 0
        for entry in os.scandir(self.blobs):
            if entry.name.endswith(".ok"):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = entry.stat(follow_symlinks=False)
                try:
                    last = (self.blobs / f"{entry.name}.ok").stat().st_mtime
                except FileNotFoundError:
                    last = st.st_mtime
                blobs.append((last, st.st_size, entry.name))
                used += st.st_size
        for entry in os.scandir(self.tmp):
            if entry.name.endswith(".ok") or ".ok." in entry.name:
                continue
            if PROGRESS in entry.name:  # a record (or its draft): never a download itself
                download = entry.path[: entry.path.index(PROGRESS)]
                if not Path(download).exists():  # its download is gone
                    Path(entry.path).unlink(missing_ok=True)
                continue
            fd = try_lock(Path(entry.path), os.O_RDONLY | os.O_NOFOLLOW)
            if fd is not None:  # nobody downloads into it: its process died
                with contextlib.suppress(OSError):
                    Path(entry.path).unlink()
                close_lock_file(fd)
                continue
            with contextlib.suppress(FileNotFoundError):
                used += entry.stat(follow_symlinks=False).st_size
        return blobs, used

    def _limit(self, used: int) -> int:
        if self.limit is None:
            self.limit = (shutil.disk_usage(self.root).free + used) // 2
        return self.limit

    def _reserve(self, sha256: str, size: int, *, must: bool) -> tuple[int, Path] | None:
        with flocked(self.root / "cache.lock"):
            blobs, used = self._entries()
            limit = self._limit(used)
            for _, blob_size, blob in sorted(blobs):
                if used + size <= limit:
                    break
                if self._evict(blob):
                    used -= blob_size
            if used + size > limit:
                if not must:
                    return None
                log.info(
                    "shard cache %s: %d bytes in use, over its limit of %d", self.root, used, limit
                )
            tmp = self.tmp / f"{sha256}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)  # alive: _entries leaves it alone
            try:
                os.ftruncate(fd, size)  # the reservation: counted by every process from now on
            except OSError as exc:
                os.close(fd)
                tmp.unlink(missing_ok=True)
                raise TierError(f"cannot reserve {size} bytes in {self.root}: {exc}") from exc
            return fd, tmp

    def _evict(self, sha256: str) -> bool:
        """Remove an unpinned blob (and its stamp); False if it is in use."""
        path = self.blobs / sha256
        fd = try_lock(path, os.O_RDONLY | os.O_NOFOLLOW)
        if fd is None:
            return False
        try:
            if os.path.samestat(os.fstat(fd), path.stat()):
                path.unlink()
                (self.blobs / f"{sha256}.ok").unlink(missing_ok=True)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
        finally:
            close_lock_file(fd)
        return True

    def _remove(self, sha256: str) -> None:
        """Remove a blob that failed verification, pinned or not (its readers keep their fd)."""
        with flocked(self.root / "cache.lock"):
            (self.blobs / sha256).unlink(missing_ok=True)
            (self.blobs / f"{sha256}.ok").unlink(missing_ok=True)

    def held_bytes(self) -> int:
        """Bytes the cache holds now (blobs and downloads in progress)."""
        return self._entries()[1]
