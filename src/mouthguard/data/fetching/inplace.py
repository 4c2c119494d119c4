"""A shard read in place while its ranges are hashed: each range handed out once it matched.

A local dataset read without a cache is verified where it lies. Hashed whole
before its first sample, a shuffle window of four 16 MiB shards is read and
hashed (64 MiB, about 80 ms on a 2-CPU VM) before the window's first batch; a
peer that verifies nothing hands its first samples out at once. With a range
table (version 2 manifests), :class:`InPlaceShard` hands the shard out at once
and a thread of its own hashes the ranges in order, front to back -- the order
in which a window's shuffle consumes them.

* **Contract.** :meth:`InPlaceShard.read` returns no byte of a range before
  that range's sha256 matched the manifest; it waits for the ranges it needs.
  When range ``k`` does not match (or cannot be read), ranges before ``k`` are
  still served, and a read that needs ``k`` or a later range raises
  :class:`~mouthguard.errors.ShardDamagedError` naming the shard and range ``k``.
* **Record.** The shard is opened holding its lock in the verification record
  (:class:`~mouthguard.data.fetching.verified.VerifiedFiles`); when every range
  has matched, the record is written and the lock released, so other processes
  trust the shard from then on exactly as if it had been hashed whole (the
  ranges tile the shard and the manifest binds both; ``data verify`` checks
  that they agree). On a mismatch, or closed before the end, no record is
  written and the lock is released.
* **Other processes** (DataLoader workers reading the same window) that open
  the shard while it is being verified follow it: ``matched_range`` publishes
  each matched range in a progress record, and they read a range once it says
  so (:mod:`~mouthguard.data.fetching.inplacefollow`); with no record to follow
  they wait on the lock and then trust the record, as for a shard hashed whole.
* **Bounds.** One thread per shard open and not yet verified, ending with the
  last range (the reader's window and the ``depth`` units the prefetcher,
  :mod:`~mouthguard.data.fetching.prefetch`, keeps open ahead of it); each holds
  one 1 MiB read buffer. The descriptor is closed only by :meth:`close`, after the hashing
  thread has stopped, so it never reads a descriptor number reused for another
  file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from mouthguard.data.fetching.cache import ShardFile
from mouthguard.data.fetching.cachefiles import hash_range
from mouthguard.data.formats.records import RangeTable
from mouthguard.errors import ShardDamagedError


class InPlaceShard(ShardFile):
    """A shard file in place whose ranges a thread verifies front to back (module docstring).

    Args:
        fd: the shard file, open (owned; closed by :meth:`close`).
        size: its size (checked by the caller against the manifest and the file).
        name: its name, for messages.
        table: its range table.
        finished: called once, from the hashing thread, with True when every
            range matched and False otherwise (a mismatch, an error, or closed
            first); it writes or drops the record and releases the lock.
        advice: added to the message of a range that did not match (what to do
            about it, for a dataset whose files are the user's own).
        matched_range: called from the hashing thread with ``k`` once range ``k``
            matched, before any reader is told (it publishes the range to other
            processes: :mod:`~mouthguard.data.fetching.verified`).
    """

    def __init__(
        self,
        fd: int,
        size: int,
        name: str,
        table: RangeTable,
        finished: Callable[[bool], None],
        *,
        advice: str = "",
        matched_range: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(fd, size, name)
        self.advice = advice
        self._matched_range = matched_range
        self.table = table
        self._ranges = len(table.sha256)
        self._verified = 0  # ranges [0, _verified) matched
        self._failure: str | None = None  # why range _verified did not
        self._closing = False
        self._changed = threading.Condition()
        self._finished = finished
        self._thread = threading.Thread(target=self._verify_all, name=f"verify {name}", daemon=True)
        self._thread.start()

    @property
    def complete(self) -> bool:
        """Whether every range has matched."""
        return self._verified == self._ranges

    def read(self, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` once every range they touch has matched.

        Raises:
            ShardDamagedError: a range they touch did not match, or could not be read.
        """
        last = (offset + max(length, 1) - 1) // self.table.size
        if self._verified <= last:
            with self._changed:
                while self._verified <= last and self._failure is None:
                    self._changed.wait()
                if self._verified <= last:
                    raise ShardDamagedError(f"{self._failure}{self.advice}", shard=self.name)
        return super().read(offset, length)

    def _verify_all(self) -> None:
        matched = False
        try:
            for k in range(self._ranges):
                if self._closing:
                    break
                start, length = self.table.span(k, self.size)
                if hash_range(self.fd, start, length) != self.table.sha256[k]:
                    self._fail(
                        f"{self.name}: range {k} (bytes {start} to {start + length}) "
                        "sha256 does not match the manifest"
                    )
                    break
                if self._matched_range is not None:
                    self._matched_range(k)
                with self._changed:
                    self._verified = k + 1
                    self._changed.notify_all()
            matched = self.complete
        except OSError as exc:
            self._fail(f"{self.name}: range {self._verified} could not be read: {exc}")
        except BaseException as exc:  # no reader may wait for a thread that has gone
            self._fail(f"{self.name}: range {self._verified} could not be verified: {exc!r}")
            raise
        finally:
            self._finished(matched)

    def _fail(self, why: str) -> None:
        with self._changed:
            self._failure = why
            self._changed.notify_all()

    def close(self) -> None:
        """Stop hashing (a range in progress is finished first), then close the file."""
        if self.fd >= 0:
            self._closing = True
            self._thread.join()
        super().close()
