"""A shard read while it downloads: each range handed out only once its own sha256 matched.

A version 2 manifest records the sha256 of every fixed-size range of a tar
shard (:class:`~mouthguard.data.formats.records.RangeTable`). A :class:`StreamedShard`
is a cache reservation (:class:`~mouthguard.data.fetching.cache.Reservation`) being
filled range by range by the process's
:class:`~mouthguard.data.fetching.rangefetch.RangeFetcher`; each range is read from the
tier, hashed, compared with the manifest and only then written and marked
verified. :meth:`StreamedShard.read` waits until every range its bytes touch
is verified (asking the fetcher for the missing ones first), so:

* **Contract.** No byte of a range is ever returned before that range matched
  the manifest. Samples of ranges that matched are handed out while later
  ranges are still on their way. When range ``k`` does not match (or cannot
  be read), ranges before ``k`` are still fetched and served, so a sequential
  reader gets exactly the samples that end before range ``k`` and then the
  :class:`~mouthguard.errors.ShardDamagedError` (or tier error) naming the
  shard and the range; no range from ``k`` on is fetched any more, and a read
  that needs one raises that error. Other processes are not kept waiting for
  it: at the failure the record says "given up" from ``k`` on and the
  download lock is released, so they read those ranges themselves -- even
  while this process's reader is not asking (a DataLoader worker whose next
  batch is not due), which otherwise deadlocks the workers.
* **Cache.** When the last range has matched, the file becomes the cache entry
  (named by the whole shard's sha256) exactly as a whole download does. The
  whole-shard sha256 is not computed again on the way: the ranges tile the
  shard (:class:`~mouthguard.data.formats.records.RangeTable`) and the manifest binds
  both, and ``data verify`` checks that they agree. A shard closed before it
  is complete is dropped (the next reader downloads it again).
* **Other processes.** Beside its temporary file the shard keeps a record of
  its verified ranges, so DataLoader workers sharing the cache read the ranges
  as they arrive instead of waiting for the whole shard
  (:mod:`~mouthguard.data.fetching.follow`).
* **Files.** The file descriptor is closed only by :meth:`close`, after the
  fetches of this shard in flight have finished (at most one request each),
  so a fetch never writes into a descriptor number reused for another file.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from mouthguard.data.fetching.cache import PROGRESS, Reservation, ShardFile
from mouthguard.data.fetching.cachefiles import write_at
from mouthguard.data.fetching.follow import GIVEN_UP, VERIFIED
from mouthguard.data.fetching.ranged import DEFAULT_RETRY, get_range
from mouthguard.data.fetching.rangefetch import RangeFetcher
from mouthguard.data.formats.records import RangeTable
from mouthguard.errors import ShardDamagedError
from mouthguard.tiers import Tier
from mouthguard.tiers.retry import RetryPolicy

log = logging.getLogger(__name__)


class RangeMismatchError(ShardDamagedError):
    """A range's bytes do not match the manifest's sha256 for it."""


_PENDING, _FLIGHT, _DONE = 0, 1, 2


def _new_record(path: Path, ranges: int) -> int:
    """A record of ``ranges`` zero bytes at ``path``, open for writing; whole when it appears."""
    draft = Path(f"{path}.new")
    fd = os.open(draft, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, ranges)
        draft.replace(path)
    except BaseException:
        os.close(fd)
        draft.unlink(missing_ok=True)
        raise
    return fd


class StreamedShard(ShardFile):
    """A shard being downloaded into the cache, readable range by range as ranges verify.

    Args:
        reservation: the cache entry to fill (owned: committed or abandoned here).
        table: the shard's range table from the manifest.
        fetcher: the process's range reads.
        tier: where the shard is.
        key: its key.
        where: the dataset, for error messages (its path or URL).
        retry: how transient read failures are retried.
        awaiting_check: the opener still checks the object itself (its size): the
            file becomes the cache entry only once :meth:`check_passed` is called
            as well as every range matched; closed before that, it is dropped.
    """

    def __init__(
        self,
        reservation: Reservation,
        table: RangeTable,
        fetcher: RangeFetcher,
        tier: Tier,
        key: str,
        *,
        where: str = "",
        retry: RetryPolicy = DEFAULT_RETRY,
        awaiting_check: bool = False,
    ) -> None:
        super().__init__(reservation.fd, reservation.size, reservation.name)
        self._reservation: Reservation | None = reservation
        self.table = table
        self._fetcher = fetcher
        self._tier = tier
        self._key = key
        self._where = where
        self._prefix = f"{where}: " if where else ""
        self._retry = retry
        self._state = bytearray(len(table.sha256))
        self._asked = bytearray(len(table.sha256))  # demanded once already: not queued again
        self._left = len(table.sha256)
        self._flight = 0
        self._error: BaseException | None = None
        self._failed_at = len(table.sha256)  # the first range that failed: none yet
        self._closed = False
        self._committing = False
        self._awaiting_check = awaiting_check
        self._cond = threading.Condition()
        self._record_path = Path(f"{reservation.tmp}{PROGRESS}")
        self._record = _new_record(self._record_path, len(table.sha256))
        fetcher.add(self, len(table.sha256))

    @property
    def complete(self) -> bool:
        """Whether every range has been verified (the file is then the cache entry)."""
        return self._left == 0

    def ranges_of(self, offset: int, length: int) -> range:
        """The ranges that bytes ``[offset, offset + length)`` touch."""
        last = offset + max(length, 1) - 1
        return range(offset // self.table.size, last // self.table.size + 1)

    def missing(self, offset: int, length: int) -> list[int]:
        """The ranges of those bytes that are not verified yet."""
        return [k for k in self.ranges_of(offset, length) if self._state[k] != _DONE]

    def want(self, ranges: Iterable[int]) -> None:
        """Ask for these ranges ahead of all background work, in this order (each once)."""
        fresh = [k for k in ranges if self._state[k] == _PENDING and not self._asked[k]]
        for k in fresh:
            self._asked[k] = 1
        if fresh:
            self._fetcher.demand((self, k) for k in fresh)

    def read(self, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` once every range they touch has matched.

        Raises:
            ShardDamagedError: a range did not match the manifest (names the shard and range).
            TierError: a range could not be read.
        """
        if self._left:
            self._wait(self.missing(offset, length))
        return super().read(offset, length)

    def _wait(self, ranges: list[int]) -> None:
        if not ranges:
            return
        self.want(ranges)
        with self._cond:
            while any(self._state[k] != _DONE for k in ranges):
                if self._error is not None and ranges[-1] >= self._failed_at:
                    raise self._error  # it needs a range that failed, or one never fetched now
                self._cond.wait()

    # --- the fetcher's side ------------------------------------------------------------

    def claim(self, k: int) -> int | None:
        """Range ``k`` is now in flight; its size.

        None: done, in flight, closed, failed, or past the last range.
        """
        with self._cond:
            if self._closed or k >= self._failed_at or self._state[k] != _PENDING:
                return None
            self._state[k] = _FLIGHT
            self._flight += 1
            return self.table.span(k, self.size)[1]

    def fetch(self, k: int, count: int = 1) -> None:
        """Read ranges ``k .. k + count - 1`` in one request; check and write each.

        Each range is checked against the manifest on its own; a failure is
        recorded per range (one that matched is served whatever its neighbours).
        A transient failure of the request is retried (:func:`get_range`); a
        range that does not match is read once more on its own and refused if
        it does not match again (see the module docstring).
        """
        errors = self._fetch_checked(k, count)
        with self._cond:
            self._flight -= count
            failed = False
            for j, error in enumerate(errors, start=k):
                if error is not None:
                    self._state[j] = _PENDING
                    if j < self._failed_at:  # the earliest failure: the one readers meet first
                        self._error, self._failed_at = error, j
                        failed = True
                else:
                    self._state[j] = _DONE
                    self._left -= 1
            if failed:
                self._give_up_after_failure()
            self._cond.notify_all()
            finish = self._take_commit()
        if finish:
            self._commit()

    def check_passed(self) -> None:
        """The opener's own check of the object passed: the file may become the cache entry."""
        with self._cond:
            self._awaiting_check = False
            finish = self._take_commit()
        if finish:
            self._commit()

    def _take_commit(self) -> bool:
        """Whether the caller commits the entry now (condition held).

        True once: every range matched, the opener's check passed, the shard is
        open and not committed or being committed already.
        """
        finish = (
            self._left == 0
            and not self._awaiting_check
            and not self._closed
            and self._reservation is not None
            and not self._committing
        )
        if finish:
            self._committing = True
        return finish

    def _fetch_checked(self, k: int, count: int) -> list[BaseException | None]:
        """Ranges ``k .. k + count - 1`` read, checked and written; each one's error or None."""
        mismatched: list[int] = []
        errors: list[BaseException | None] = []
        try:
            data = memoryview(self._get(k, count))
        except Exception as exc:  # noqa: BLE001 - kept for the reader, who raises it
            return [exc] * count
        with data:
            for j in range(k, k + count):
                try:
                    self._store(j, data, self.table.span(k, self.size)[0])
                except RangeMismatchError as exc:
                    mismatched.append(j)
                    errors.append(exc)
                except Exception as exc:  # noqa: BLE001 - kept for the reader, who raises it
                    errors.append(exc)
                else:
                    errors.append(None)
        # The request's bytes are released above (and its errors hold none): a range
        # read again alone keeps the bytes held by this thread within one request's.
        for j in mismatched:
            try:
                with memoryview(self._get(j, 1)) as again:
                    self._store(j, again, self.table.span(j, self.size)[0])
            except RangeMismatchError as exc:
                errors[j - k] = ShardDamagedError(f"{exc} (read twice)", shard=self.name)
            except Exception as exc:  # noqa: BLE001 - kept for the reader, who raises it
                errors[j - k] = exc
            else:
                errors[j - k] = None
        return errors

    def _get(self, k: int, count: int) -> bytes:
        """The bytes of ranges ``k .. k + count - 1``, transient failures retried."""
        start = self.table.span(k, self.size)[0]
        last, length = self.table.span(k + count - 1, self.size)
        return get_range(
            self._tier,
            self._key,
            start,
            last + length,
            where=f"{self._where}: shard {self.name}" if self._where else f"shard {self.name}",
            retry=self._retry,
            wait=self._backoff,
        )

    def _backoff(self, seconds: float) -> bool:
        """Wait ``seconds`` before a retry; False (no retry) once the shard is closed."""
        with self._cond:
            return not self._cond.wait_for(lambda: self._closed, timeout=seconds)

    def _store(self, k: int, got: memoryview, got_at: int) -> None:
        """Check range ``k`` and write it: its part of ``got``, bytes read from ``got_at``.

        ``got`` holds the whole range (:func:`get_range` returns every byte asked
        for). A mismatch raises with the range's view released, so the error,
        kept for the reader, holds none of the bytes.
        """
        offset, length = self.table.span(k, self.size)
        data = got[offset - got_at : offset - got_at + length]
        if hashlib.sha256(data).hexdigest() != self.table.sha256[k]:
            data.release()
            raise RangeMismatchError(
                f"{self._prefix}{self.name}: range {k} (bytes {offset} to {offset + length}): "
                "sha256 does not match the manifest",
                shard=self.name,
            )
        write_at(self.fd, data, offset)
        os.pwrite(self._record, bytes([VERIFIED]), k)  # after the bytes: followers read them

    def _give_up_after_failure(self) -> None:
        """Ranges from :attr:`_failed_at` on will never be fetched here: let others have them.

        Called with the condition held. Without this, the download lock and a
        record saying "not yet" would stay until this process's reader reached
        the failed range and raised -- and a reader that is not asking (a
        DataLoader worker waiting for its next request while the batch before
        waits on this shard in another worker) never does: a deadlock. So the
        record says "given up" for every range not verified from the failed one
        on (followers read those the ordinary way), its name is removed (later
        readers do not follow it), and the download lock is released (a reader
        waiting on it downloads the shard itself). This process still serves
        the ranges before the failed one from its file, and raises the error
        for the others, as before.
        """
        if self._record >= 0:
            for j in range(self._failed_at, len(self._state)):
                if self._state[j] != _DONE:
                    with contextlib.suppress(OSError):
                        os.pwrite(self._record, bytes([GIVEN_UP]), j)
            # The descriptor stays open: a fetch in flight still writes its byte into it.
            self._record_path.unlink(missing_ok=True)
        if self._reservation is not None and not self._committing:
            self._reservation.release_lock()

    def _drop_record(self, give_up: bool) -> None:
        """Remove the record of ranges; ``give_up``: tell its followers first."""
        if self._record < 0:
            return
        if give_up:
            with contextlib.suppress(OSError):
                os.pwrite(self._record, bytes([GIVEN_UP]) * len(self._state), 0)
        self._record_path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            os.close(self._record)
        self._record = -1

    def _commit(self) -> None:
        reservation = self._reservation
        assert reservation is not None
        try:
            reservation.commit()  # the same fd, now the pinned cache entry
        except Exception as exc:  # noqa: BLE001 - the bytes are verified: reads still serve
            log.warning("%s: verified, but not kept in the cache (%s)", self.name, exc)
        self._drop_record(give_up=False)  # every range says verified: followers read on
        with self._cond:
            self._reservation = None
            self._committing = False
            self._cond.notify_all()

    def close(self) -> None:
        """Stop fetching; once this shard's fetches in flight are done, release the file.

        A shard whose every range matched (and whose opener's check passed) is
        kept as the cache entry; any other is dropped.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # a fetch waiting to retry gives up now
            while self._flight or self._committing:
                self._cond.wait()  # a fetch, or a commit in progress: neither waits on us
            reservation, self._reservation = self._reservation, None
        if reservation is not None and self._left == 0 and not self._awaiting_check:
            self._reservation, self._committing = reservation, True
            self._commit()  # verified whole just as it was closed: keep it
        elif reservation is not None:  # incomplete: not a cache entry
            self._drop_record(give_up=True)
            reservation.abandon()
            self.fd = -1
            return
        super().close()
