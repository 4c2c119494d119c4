"""One object streamed to a tier from pushed chunks, hashed on the same bytes.

A tier's ``put`` pulls its data from an iterable; a writer that receives samples
one at a time has data to push. :class:`Upload` bridges the two with a bounded
queue and one thread that runs ``put(mode=CREATE)`` over a generator reading the
queue. The generator computes the sha256 (and the size) of exactly the chunks it
hands to the tier, so the digest is of the bytes stored, with no second pass --
and, given ``range_size``, the sha256 of each range of that many bytes too.

Contract:

* ``send`` blocks while the queue is full (at most ``depth`` chunks in flight)
  and raises the tier's error as soon as the upload has failed.
* ``finish`` ends the stream and returns ``(size, sha256 hex)`` once ``put`` has
  returned: the object is then complete on the tier.
* ``abort`` makes the generator raise, so the tier abandons the object (the
  local tier removes its temporary file, S3 aborts the multipart upload): an
  aborted upload never becomes visible. Safe to call at any time, more than once.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Iterator

from mouthguard.data.formats.rangehash import FixedRanges
from mouthguard.tiers import PutMode, Tier

#: How long ``send`` and the generator wait before looking at the other side again.
_POLL_SECONDS = 0.1
#: How long ``abort`` waits for the tier to clean up before leaving it to its thread.
_ABORT_JOIN_SECONDS = 30.0
_END = object()


class UploadAborted(Exception):  # noqa: N818 - a signal to the tier, never seen by callers
    """Raised inside the data stream to make the tier abandon the object."""


class Upload:
    """Stream pushed chunks into ``tier.put(key, ..., mode=CREATE)``; see the module docstring.

    Args:
        tier: where the object goes.
        key: its key (create-only: an existing object fails the upload).
        depth: chunks queued at most.
    """

    def __init__(
        self, tier: Tier, key: str, *, depth: int = 8, range_size: int | None = None
    ) -> None:
        self.key = key
        self._ranges = FixedRanges(range_size) if range_size is not None else None
        self._tier = tier
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._sha = hashlib.sha256()
        self._size = 0
        self._error: BaseException | None = None
        self._aborted = threading.Event()
        self._done = threading.Event()
        # A thread of its own, not io.pool.SHARED: it waits on the writer's queue for the
        # whole upload, and its tier.put may wait on SHARED (io.direct_write) in turn.
        self._thread = threading.Thread(target=self._run, name=f"upload {key}", daemon=True)
        self._thread.start()

    def _chunks(self) -> Iterator[bytes]:
        while True:
            if self._aborted.is_set():
                raise UploadAborted(self.key)
            try:
                item = self._queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            if item is _END:
                return
            assert isinstance(item, bytes)
            self._sha.update(item)
            if self._ranges is not None:
                self._ranges.feed(item)
            self._size += len(item)
            yield item

    def _run(self) -> None:
        try:
            self._tier.put(self.key, self._chunks(), mode=PutMode.CREATE)
        except BaseException as exc:  # noqa: BLE001 - handed to the writer's thread by send/finish
            self._error = exc
        finally:
            self._done.set()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def send(self, chunk: bytes) -> None:
        """Queue ``chunk`` (not copied: pass bytes nobody changes) for the tier."""
        while True:
            self._raise_if_failed()
            if self._done.is_set():
                raise RuntimeError(f"upload of {self.key} has already ended")
            try:
                self._queue.put(chunk, timeout=_POLL_SECONDS)
            except queue.Full:
                continue
            return

    def finish(self) -> tuple[int, str]:
        """End the stream, wait for the tier; return ``(size, sha256 hex)``.

        Raises:
            TierError: the tier failed (ObjectExistsError if the key exists).
        """
        while not self._done.is_set():
            try:
                self._queue.put(_END, timeout=_POLL_SECONDS)
            except queue.Full:
                continue
            break
        self._thread.join()
        self._raise_if_failed()
        return self._size, self._sha.hexdigest()

    def range_digests(self) -> tuple[str, ...]:
        """After :meth:`finish`: the sha256 of each ``range_size`` range (empty without one)."""
        return () if self._ranges is None else self._ranges.digests()

    def abort(self) -> None:
        """Abandon the object (see the module docstring); returns once the tier let go."""
        self._aborted.set()
        self._thread.join(timeout=_ABORT_JOIN_SECONDS)
