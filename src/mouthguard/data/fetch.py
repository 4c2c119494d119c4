"""Getting verified bytes to the reader: whole shards, or byte ranges of a file, via the cache.

:class:`ShardSource` opens a shard -- or a byte range of a data file with its own
sha256 in the manifest (a Parquet row group, a footer) -- as a verified local
file, in one of two ways:

* **through the cache** (any tier): a missing entry is downloaded with several
  concurrent range reads (:mod:`~mouthguard.data.ranged`), hashed in order as it
  is written, and inserted only if its sha256 is the manifest's
  (:mod:`~mouthguard.data.cache`; entries are named by that sha256, so a range
  is an entry of its own);
* **in place** (a local dataset and no cache): the dataset's own file is opened
  and the bytes hashed before use; with ``verify="stat"`` a record shared by the
  dataset's processes (:mod:`~mouthguard.data.verified`) spares the re-hash, in
  every process and epoch, while the file's metadata is unchanged.

Either way no byte of a shard or range is used before the whole of it matched
the manifest, and the data file must have the manifest's size (a truncated file
is damage, not a short read). Indexes are checked (size, sha256) and parsed as
hostile input before use. Prefetching ahead of the reader is
:mod:`~mouthguard.data.prefetch`.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

from mouthguard.data.cache import ShardCache, ShardFile
from mouthguard.data.dataset import Dataset, check_index
from mouthguard.data.index import ShardIndex
from mouthguard.data.part import Part
from mouthguard.data.ranged import read_ranges
from mouthguard.data.verified import VerifiedFiles
from mouthguard.errors import ObjectNotFoundError, ShardDamagedError
from mouthguard.tiers.local import LocalTier

#: Parsed indexes kept per process (a block's shards plus those prefetched, and
#: small datasets whole, so a second pass parses nothing).
_INDEX_MEMO = 32


class _IndexMemo:
    """Parsed indexes by content, shared by every :class:`ShardSource` of this process.

    Keyed by the shard's name, its sha256, its index's sha256 (all from the
    manifest) and whether it was adopted, so an entry is the parse of exactly
    those verified bytes, whichever dataset object or pass asks. Bounded
    (:data:`_INDEX_MEMO`, least recently used out). Its lock is made anew in a
    forked child, which may have been forked while another thread held it.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, str, str, bool], ShardIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str, bool]) -> ShardIndex | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[str, str, str, bool], parsed: ShardIndex) -> None:
        with self._lock:
            self._items[key] = parsed
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def reset(self) -> None:
        self._lock = threading.Lock()
        self._items = OrderedDict()


_MEMO = _IndexMemo(_INDEX_MEMO)
os.register_at_fork(after_in_child=_MEMO.reset)


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
        part = Part(record.name, "shard", record.size, 0, record.size, record.sha256)
        return self.open_part(self.dataset.shard_key(record), part, must=must)

    def open_part(self, key: str, part: Part, *, must: bool) -> ShardFile | None:
        """``part`` of the data file ``key`` as a verified, open file (None: no room to prefetch).

        Raises:
            ShardDamagedError: the file or the bytes do not match the manifest (names them).
            TierError: they could not be read.
        """
        if self.cache is None:
            return self._open_in_place(key, part)
        return self.cache.open(
            part.sha256,
            part.size,
            lambda fd: self._download(key, part, fd),
            name=part.name,
            must=must,
            what=part.what,
        )

    def _open_in_place(self, key: str, part: Part) -> ShardFile:
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
            self.verified.check(fd, str(path), part)
        except BaseException:
            os.close(fd)
            raise
        return ShardFile(fd, part.size, part.name, base=part.offset)

    def index(self, number: int) -> ShardIndex:
        """The checked, parsed index of shard ``number`` (memoised per process, by content)."""
        record = self.dataset.shards[number]
        adopted = self.dataset.manifest.adopted
        memo_key = (record.name, record.sha256, record.index.sha256, adopted)
        found = _MEMO.get(memo_key)
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
        _MEMO.put(memo_key, parsed)
        return parsed
