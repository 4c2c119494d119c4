"""Getting verified bytes to the reader: whole shards, or byte ranges of a file, via the cache.

:class:`ShardSource` opens a shard -- or a byte range of a data file with its own
sha256 in the manifest (a Parquet row group, a footer) -- as a verified local
file, in one of two ways:

* **through the cache** (any tier): a missing entry is downloaded with several
  concurrent range reads (:mod:`~mouthguard.data.fetching.ranged`), hashed in order as it
  is written, and inserted only if its sha256 is the manifest's
  (:mod:`~mouthguard.data.fetching.cache`; entries are named by that sha256, so a range
  is an entry of its own);
* **in place** (a local dataset and no cache): the dataset's own file is opened
  and the bytes hashed before use; with ``verify="stat"`` a record shared by the
  dataset's processes (:mod:`~mouthguard.data.fetching.verified`) spares the re-hash, in
  every process and epoch, while the file's metadata is unchanged.

A tar shard whose manifest records a range table (version 2) is not downloaded
whole first: through the cache it is **streamed** (:mod:`~mouthguard.data.fetching.streamed`),
each range read by the process's bounded
:class:`~mouthguard.data.fetching.rangefetch.RangeFetcher`, hashed, and handed out once it
matched its own sha256 -- the reader waits for the ranges a sample touches, not
for the shard. Otherwise no byte of a shard or range is used before the whole
of it matched the manifest. The data file must have the manifest's size (a truncated file
is damage, not a short read). Indexes are checked (size, sha256) and parsed as
hostile input before use. Prefetching ahead of the reader is
:mod:`~mouthguard.data.fetching.prefetch`.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from mouthguard.data.dataset import Dataset, check_index
from mouthguard.data.fetching.cache import Reservation, ShardCache, ShardFile
from mouthguard.data.fetching.cachefiles import write_at
from mouthguard.data.fetching.follow import follow
from mouthguard.data.fetching.nodeslots import NodeSlots
from mouthguard.data.fetching.ranged import DEFAULT_RETRY, read_ranges
from mouthguard.data.fetching.rangefetch import RangeFetcher
from mouthguard.data.fetching.streamed import StreamedShard
from mouthguard.data.fetching.verified import VerifiedFiles
from mouthguard.data.formats.index import ShardIndex
from mouthguard.data.formats.part import Part
from mouthguard.data.formats.records import RangeTable, ShardRecord
from mouthguard.errors import ObjectNotFoundError, ShardDamagedError
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.retry import RetryPolicy

#: Parsed indexes kept per dataset object (a block's shards plus those prefetched,
#: and small datasets whole, so a second pass parses nothing).
_INDEX_MEMO = 32


class IndexMemo:
    """Parsed indexes of one dataset object, shared by its passes (its ShardSources).

    Keyed by the shard's name, its sha256, its index's sha256 (all from the
    manifest) and whether it was adopted, so an entry is the parse of exactly
    those verified bytes. Bounded (:data:`_INDEX_MEMO`, least recently used out).
    A new dataset object starts empty, so it reads (and checks) every index
    again. In another process (a forked or spawned worker) it starts empty too,
    with a lock of its own: a lock copied by ``fork`` may have been held.
    """

    def __init__(self, size: int = _INDEX_MEMO) -> None:
        self._size = size
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._items: OrderedDict[tuple[str, str, str, bool], ShardIndex] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, int]:
        return {"size": self._size}

    def __setstate__(self, state: dict[str, int]) -> None:
        self._size = state["size"]
        self._reset()

    def get(self, key: tuple[str, str, str, bool]) -> ShardIndex | None:
        """The parse stored under ``key``, or None."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[str, str, str, bool], parsed: ShardIndex) -> None:
        """Keep ``parsed`` under ``key`` (the least recently used goes past the bound)."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            self._items[key] = parsed
            while len(self._items) > self._size:
                self._items.popitem(last=False)


#: Range requests in flight per node that a dataset's default splits among its DataLoader
#: workers (``range_parallel=None``): one process alone gets all 8, the fastest measured
#: in one process; 4 workers get 2 each. 8 per worker (32 in flight for 4 workers) took
#: the first batch from 0.78 s to 0.59 s (median of 5, 256 MiB of 100 KB samples on the
#: Ceph RGW on loopback) when split, and samples/s up 12%; at 20 ms per request, 0.76 s
#: to 0.54 s and up 7% (docs/benchmarks-data.md): requests that share one server all
#: finish late, the first batch's among them.
NODE_RANGE_REQUESTS = 8
#: The fewest per process: a range the reader waits for need not queue behind the one
#: background read in flight.
MIN_RANGE_PARALLEL = 2


def split_parallel(workers: int) -> int:
    """Range requests in flight per process for ``workers`` DataLoader workers (0: in process).

    :data:`NODE_RANGE_REQUESTS` divided among them, at least :data:`MIN_RANGE_PARALLEL`
    each (so more than 4 workers have more than 8 in flight together).
    """
    return max(MIN_RANGE_PARALLEL, NODE_RANGE_REQUESTS // max(workers, 1))


@dataclass(frozen=True)
class ReadSettings:
    """How shards are downloaded: bytes per range read, and ranges in flight.

    ``range_size`` applies to shards the manifest has no range table for (and
    to indexes, Parquet row groups); a shard with one is read in its own ranges.
    ``parallel`` bounds the range reads in flight of one process; ``coalesce``
    the ranges of a streamed shard one read covers (adjacent ones, each still
    verified on its own: :mod:`~mouthguard.data.fetching.rangefetch`); ``node`` (None:
    none) the requests in flight of every process sharing the cache directory
    (:mod:`~mouthguard.data.fetching.nodeslots`); ``retry`` how a read that failed
    transiently is retried (:func:`~mouthguard.data.fetching.ranged.get_range`).
    """

    range_size: int = 8 * 1024 * 1024
    parallel: int = 8
    coalesce: int = 1
    node: int | None = None
    retry: RetryPolicy = DEFAULT_RETRY


class ShardSource:
    """Verified shard files and indexes of ``dataset``, for the calling process.

    Args:
        dataset: the opened dataset (its location's tier belongs to this process).
        place: where verified shards come from: the shared cache, or (a local
            dataset read in place) the shared record of files that hashed right.
        settings: range reads of downloads.
        indexes: the dataset object's parsed indexes, kept across its passes
            (default: this source's own).
    """

    def __init__(
        self,
        dataset: Dataset,
        place: ShardCache | VerifiedFiles,
        settings: ReadSettings,
        indexes: IndexMemo | None = None,
    ) -> None:
        tier = dataset.location.tier
        if isinstance(place, VerifiedFiles) and not isinstance(tier, LocalTier):
            raise TypeError("a dataset that is not local needs a cache directory")
        self.dataset = dataset
        self.cache = place if isinstance(place, ShardCache) else None
        self.verified = place if isinstance(place, VerifiedFiles) else None
        self.settings = settings
        self._indexes = indexes if indexes is not None else IndexMemo()
        self._fetcher: RangeFetcher | None = None  # started by the first streamed shard

    def _check_size(self, key: str, record_size: int, name: str) -> None:
        """ShardDamagedError unless ``key`` exists with the manifest's size."""
        try:
            size = self.dataset.location.tier.head(key).size
        except ObjectNotFoundError:
            raise ShardDamagedError(f"{name}: {key} is missing", shard=name) from None
        if size != record_size:
            raise ShardDamagedError(
                f"{name}: {key} is {size} bytes, the manifest says {record_size}"
                + (" (truncated)" if size < record_size else ""),
                shard=name,
            )

    def _download(self, key: str, part: Part, fd: int) -> str:
        self._check_size(key, part.file_size, part.name)
        digest = hashlib.sha256()
        for start, data in read_ranges(
            self.dataset.location.tier,
            key,
            part.size,
            shard=part.name,
            range_size=self.settings.range_size,
            parallel=self.settings.parallel,
            offset=part.offset,
            where=self.dataset.location.describe(),
            retry=self.settings.retry,
        ):
            write_at(fd, data, start)
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
        if self.cache is not None and record.ranges is not None:
            return self._stream(key, record, must=must)
        part = Part(record.name, "shard", record.size, 0, record.size, record.sha256)
        return self.open_part(key, part, must=must, table=record.ranges)

    def _stream(self, key: str, record: ShardRecord, *, must: bool) -> ShardFile | None:
        """The cache entry, or a download handing out each range once it matched."""
        assert self.cache is not None
        assert record.ranges is not None
        found = self.cache.open_existing(record.sha256, record.size, record.name)
        if found is not None:
            return found
        table, cache = record.ranges, self.cache

        def follow_stream() -> ShardFile | None:
            return follow(
                cache,
                record.sha256,
                table=table,
                size=record.size,
                name=record.name,
                fallback=lambda: self._stream_now(key, record),
            )

        followed = follow_stream()
        if followed is not None:
            return followed
        # The download lock may be taken by a process that has not written its record
        # yet: keep looking for the record while waiting, not for the whole shard.
        return self._stream_own(key, record, must=must, meanwhile=follow_stream)

    def _stream_now(self, key: str, record: ShardRecord) -> ShardFile:
        # A follower falling back: the stream it followed stopped, so it does not
        # follow again (a stale record could send it round); it waits for the lock.
        opened = self._stream_own(key, record, must=True)
        assert opened is not None  # must=True never gives up
        return opened

    def _stream_own(
        self,
        key: str,
        record: ShardRecord,
        *,
        must: bool,
        meanwhile: Callable[[], ShardFile | None] | None = None,
    ) -> ShardFile | None:
        """Stream the shard in this process, or find it finished in the cache.

        ``meanwhile``: see :meth:`~mouthguard.data.fetching.cache.ShardCache.open_or_reserve`.
        """
        assert self.cache is not None
        assert record.ranges is not None
        got = self.cache.open_or_reserve(
            record.sha256, record.size, name=record.name, must=must, meanwhile=meanwhile
        )
        if not isinstance(got, Reservation):
            return got
        if self._fetcher is None:
            node = self.settings.node
            slots = None if node is None else NodeSlots(self.cache.root / "slots", node)
            self._fetcher = RangeFetcher(self.settings.parallel, self.settings.coalesce, slots)
        try:
            streamed = StreamedShard(
                got,
                record.ranges,
                self._fetcher,
                self.dataset.location.tier,
                key,
                where=self.dataset.location.describe(),
                retry=self.settings.retry,
                awaiting_check=True,
            )
        except BaseException:
            got.abandon()  # its download lock above all: held, it would stall every reader
            raise
        # The size is checked with the shard's first ranges already on their way and its
        # record written: the other workers follow it at once instead of a round trip
        # later. This process hands out no byte before the check passed (the shard is
        # returned only then); a follower may read ranges that matched their sha256
        # meanwhile, as it may before any other failure. A wrong size closes the shard:
        # its record says given up, and each follower opens it itself and meets the error.
        # Until the check passed the shard is not committed to the cache, even once every
        # range matched: a wrong size is refused on every open, not only the first.
        try:
            self._check_size(key, record.size, record.name)
        except BaseException:
            streamed.close()
            raise
        streamed.check_passed()
        return streamed

    @property
    def fetcher(self) -> RangeFetcher | None:
        """The range reads of streamed shards (None until the first), for reports and tests."""
        return self._fetcher

    def close(self) -> None:
        """Stop this source's range reads (its streamed shards must be closed first)."""
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None

    def open_part(
        self, key: str, part: Part, *, must: bool, table: RangeTable | None = None
    ) -> ShardFile | None:
        """``part`` of the data file ``key`` as a verified, open file (None: no room to prefetch).

        ``table``: the range table of a whole shard read in place; its ranges are
        then verified as it is read (:mod:`~mouthguard.data.fetching.inplace`) unless
        the record already trusts it.

        Raises:
            ShardDamagedError: the file or the bytes do not match the manifest (names them).
            TierError: they could not be read.
        """
        try:
            if self.cache is None:
                return self._open_in_place(key, part, table)
            return self.cache.open(
                part.sha256,
                part.size,
                lambda fd: self._download(key, part, fd),
                name=part.name,
                must=must,
                what=part.what,
            )
        except ShardDamagedError as exc:
            if not self.dataset.manifest.adopted:
                raise
            raise ShardDamagedError(f"{exc}{self._advice()}", shard=exc.shard) from None

    def _advice(self) -> str:
        """What ends a damage message: for an adopted dataset, how to take a change in.

        An adopted dataset's files are the user's: changed on purpose more often than
        damaged. The message alone crosses from a DataLoader worker to the parent.
        """
        if not self.dataset.manifest.adopted:
            return ""
        where = self.dataset.location.describe()
        return f" (if the file was changed on purpose: mouthguard data index --again {where})"

    def _open_in_place(self, key: str, part: Part, table: RangeTable | None) -> ShardFile:
        tier = self.dataset.location.tier
        assert isinstance(tier, LocalTier)
        self._check_size(key, part.file_size, part.name)
        path = tier.path_of(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise ShardDamagedError(f"{part.name} is missing", shard=part.name) from None
        assert self.verified is not None  # no cache: in place, with the shared record
        try:
            if table is not None and part.offset == 0 and part.size == part.file_size:
                ranged = self.verified.open_ranges(
                    fd, str(path), part, table, advice=self._advice()
                )
                if ranged is not None:
                    return ranged
            else:
                self.verified.check(fd, str(path), part)
        except BaseException:
            os.close(fd)
            raise
        return ShardFile(fd, part.size, part.name, base=part.offset)

    def index(self, number: int) -> ShardIndex:
        """The checked, parsed index of shard ``number`` (memoised per dataset object)."""
        record = self.dataset.shards[number]
        adopted = self.dataset.manifest.adopted
        memo_key = (record.name, record.sha256, record.index.sha256, adopted)
        found = self._indexes.get(memo_key)
        if found is not None:
            return found
        if self.cache is None:
            parsed = self.dataset.read_index(record)
        else:
            key = self.dataset.index_key(record)
            index = record.index
            part = Part(record.name, "index", index.size, 0, index.size, index.sha256)
            handle = self.cache.open(
                index.sha256,
                index.size,
                lambda fd: self._download(key, part, fd),
                name=record.name,
                must=True,
                what="index",
            )
            assert handle is not None  # must=True never gives up
            try:
                parsed = check_index(record, handle.read(0, record.index.size), adopted=adopted)
            finally:
                handle.close()
        self._indexes.put(memo_key, parsed)
        return parsed
