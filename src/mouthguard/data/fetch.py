"""Getting verified shards to the reader: downloads into the cache, and prefetch ahead of it.

:class:`ShardSource` opens a shard as a verified local file, in one of two ways:

* **through the cache** (any tier): a missing entry is downloaded with several
  concurrent range reads (:mod:`~mouthguard.data.ranged`), hashed in order as it
  is written, and inserted only if its sha256 is the manifest's
  (:mod:`~mouthguard.data.cache`);
* **in place** (a local dataset and no cache): the dataset's own file is opened
  and hashed before use; with ``verify="stat"`` a record shared by the dataset's
  processes (:mod:`~mouthguard.data.verified`) spares the re-hash, in every
  process and epoch, while the file's metadata is unchanged.

Either way no sample of a shard is read before the whole shard matched the
manifest. Indexes are checked (size, sha256) and parsed as hostile input before use.

:class:`Prefetcher` runs ahead of the consumer in a background thread, keeping
at most ``depth`` shards opened and waiting. Before each download it yields to
a checkpoint burst (:class:`~mouthguard.data.burst.BurstSignal`), a bounded wait.
It never makes the consumer wait for a burst: a shard the consumer needs that
the prefetcher has not started is fetched by the consumer itself, at once
(and beyond the cache limit if it must), and the prefetcher skips it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from mouthguard.data.burst import BurstSignal
from mouthguard.data.cache import ShardCache, ShardFile
from mouthguard.data.dataset import Dataset, check_index
from mouthguard.data.index import ShardIndex
from mouthguard.data.manifest import ShardRecord
from mouthguard.data.ranged import read_ranges
from mouthguard.data.verified import VerifiedFiles
from mouthguard.errors import ObjectNotFoundError, ShardDamagedError
from mouthguard.tiers.local import LocalTier

log = logging.getLogger(__name__)

#: A burst is waited for in steps this long, checking in between whether to stop.
_BURST_STEP = 0.5
#: Parsed indexes kept per process (a block's shards plus those prefetched).
_INDEX_MEMO = 16


@dataclass(frozen=True)
class ReadSettings:
    """How shards are downloaded: bytes per range read, and ranges in flight."""

    range_size: int = 8 * 1024 * 1024
    parallel: int = 4


class ShardSource:
    """Verified shard files and indexes of ``dataset``, for the calling process.

    Args:
        dataset: the opened dataset (its location's tier belongs to this process).
        place: where verified shards come from: the shared cache, or (a local
            dataset read in place) the shared record of files that hashed right.
        settings: range reads of downloads.
    """

    def __init__(
        self,
        dataset: Dataset,
        place: ShardCache | VerifiedFiles,
        settings: ReadSettings,
    ) -> None:
        tier = dataset.location.tier
        if isinstance(place, VerifiedFiles) and not isinstance(tier, LocalTier):
            raise TypeError("a dataset that is not local needs a cache directory")
        self.dataset = dataset
        self.cache = place if isinstance(place, ShardCache) else None
        self.verified = place if isinstance(place, VerifiedFiles) else None
        self.settings = settings
        self._indexes: OrderedDict[int, ShardIndex] = OrderedDict()
        self._lock = threading.Lock()

    def _check_size(self, key: str, record_size: int, name: str) -> None:
        """ShardDamagedError unless ``key`` exists with the manifest's size."""
        try:
            size = self.dataset.location.tier.head(key).size
        except ObjectNotFoundError:
            raise ShardDamagedError(f"shard {name}: {key} is missing", shard=name) from None
        if size != record_size:
            raise ShardDamagedError(
                f"shard {name}: {key} is {size} bytes, the manifest says {record_size}"
                + (" (truncated)" if size < record_size else ""),
                shard=name,
            )

    def _download(self, key: str, size: int, name: str, fd: int) -> str:
        self._check_size(key, size, name)
        digest = hashlib.sha256()
        for start, data in read_ranges(
            self.dataset.location.tier,
            key,
            size,
            shard=name,
            range_size=self.settings.range_size,
            parallel=self.settings.parallel,
        ):
            view, at = memoryview(data), start
            while view:
                written = os.pwrite(fd, view, at)
                view, at = view[written:], at + written
            digest.update(data)
        return digest.hexdigest()

    def open_shard(self, number: int, *, must: bool) -> ShardFile | None:
        """Shard ``number`` as a verified, open file (None: no room for a prefetch).

        Raises:
            ShardDamagedError: the shard does not match the manifest (names it).
            TierError: it could not be read.
        """
        record = self.dataset.shards[number]
        key = self.dataset.shard_key(record)
        if self.cache is None:
            return self._open_in_place(record, key)
        return self.cache.open(
            record.sha256,
            record.size,
            lambda fd: self._download(key, record.size, record.name, fd),
            name=record.name,
            must=must,
        )

    def _open_in_place(self, record: ShardRecord, key: str) -> ShardFile:
        tier = self.dataset.location.tier
        assert isinstance(tier, LocalTier)
        self._check_size(key, record.size, record.name)
        path = tier.path_of(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise ShardDamagedError(f"shard {record.name} is missing", shard=record.name) from None
        assert self.verified is not None  # no cache: in place, with the shared record
        try:
            self.verified.check(fd, str(path), record.sha256, record.size, record.name)
        except BaseException:
            os.close(fd)
            raise
        return ShardFile(fd, record.size, record.name)

    def index(self, number: int) -> ShardIndex:
        """The checked, parsed index of shard ``number`` (memoised per process)."""
        with self._lock:
            found = self._indexes.get(number)
            if found is not None:
                self._indexes.move_to_end(number)
                return found
        record = self.dataset.shards[number]
        if self.cache is None:
            parsed = self.dataset.read_index(record)
        else:
            key = self.dataset.index_key(record)
            handle = self.cache.open(
                record.index.sha256,
                record.index.size,
                lambda fd: self._download(key, record.index.size, record.name, fd),
                name=record.name,
                must=True,
                what="index",
            )
            assert handle is not None  # must=True never gives up
            try:
                parsed = check_index(record, handle.read(0, record.index.size))
            finally:
                handle.close()
        with self._lock:
            self._indexes[number] = parsed
            while len(self._indexes) > _INDEX_MEMO:
                self._indexes.popitem(last=False)
        return parsed


class _Ready:
    """A prefetched shard: its open file, or the error that stopped it."""

    def __init__(self, file: ShardFile | None, error: BaseException | None) -> None:
        self.file = file
        self.error = error


_RUNNING = object()


class Prefetcher:
    """Opens the consumer's upcoming shards ahead of it; see the module docstring.

    Args:
        source: where shards come from.
        depth: shards opened ahead and not yet taken, at most.
        burst: a checkpoint-burst signal to yield to before each download.
        max_burst_wait: the longest one wait for a burst lasts.
    """

    def __init__(
        self,
        source: ShardSource,
        *,
        depth: int,
        burst: BurstSignal | None = None,
        max_burst_wait: float = 60.0,
    ) -> None:
        self.source = source
        self.depth = depth
        self.burst = burst
        self.max_burst_wait = max_burst_wait
        self._cond = threading.Condition()
        self._queue: deque[int] = deque()
        self._slots: dict[int, object] = {}  # shard -> _RUNNING or _Ready
        self._claimed: set[int] = set()  # the consumer fetches these itself
        self._closed = False
        self._thread: threading.Thread | None = None
        self.burst_waits = 0  # how often prefetch yielded to a burst (for reports and tests)

    def announce(self, shards: Iterable[int]) -> None:
        """Queue shards the consumer will take, in the order it will take them."""
        if self.depth <= 0:
            return
        with self._cond:
            self._queue.extend(shards)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="prefetch", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _ready_count(self) -> int:
        return sum(1 for slot in self._slots.values() if isinstance(slot, _Ready))

    def _next(self) -> int | None:
        with self._cond:
            while not self._closed and (not self._queue or self._ready_count() >= self.depth):
                self._cond.wait()
            if self._closed:
                return None
            return self._queue.popleft()

    def _run(self) -> None:
        while (shard := self._next()) is not None:
            with self._cond:
                if shard in self._claimed or shard in self._slots:
                    continue
            self._yield_to_burst()
            with self._cond:
                if shard in self._claimed or self._closed:
                    continue
                self._slots[shard] = _RUNNING
            try:
                ready = _Ready(self.source.open_shard(shard, must=False), None)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer, who retries
                ready = _Ready(None, exc)
            with self._cond:
                if self._stopped():
                    if ready.file is not None:
                        ready.file.close()
                    return
                self._slots[shard] = ready
                self._cond.notify_all()

    def _yield_to_burst(self) -> None:
        """Wait while a burst is on (at most ``max_burst_wait``), in steps: close() stays quick."""
        burst = self.burst
        if burst is None or not burst.busy:
            return
        self.burst_waits += 1
        deadline = time.monotonic() + self.max_burst_wait
        while burst.busy and not self._stopped() and (left := deadline - time.monotonic()) > 0:
            burst.wait(min(_BURST_STEP, left))

    def _stopped(self) -> bool:
        # A method, not the attribute: close() may set it while a download runs.
        return self._closed

    def take(self, shard: int) -> ShardFile:
        """Shard ``shard``, opened: the prefetched one, or fetched now (never waits for a burst).

        Raises:
            ShardDamagedError, TierError: as :meth:`ShardSource.open_shard`.
        """
        with self._cond:
            while self._slots.get(shard) is _RUNNING:  # its download runs: the fastest way
                self._cond.wait()
            slot = self._slots.pop(shard, None)
            self._claimed.add(shard)
            self._cond.notify_all()
        if isinstance(slot, _Ready) and slot.file is not None:
            return slot.file
        if isinstance(slot, _Ready) and slot.error is not None:
            log.info("prefetch of shard %d failed (%s): reading it now", shard, slot.error)
        file = self.source.open_shard(shard, must=True)
        assert file is not None  # must=True never gives up
        return file

    def close(self) -> None:
        """Stop prefetching and close every shard opened ahead."""
        with self._cond:
            self._closed = True
            slots, self._slots = self._slots, {}
            self._cond.notify_all()
        for slot in slots.values():
            if isinstance(slot, _Ready) and slot.file is not None:
                slot.file.close()
        if self._thread is not None:
            self._thread.join(timeout=60)
