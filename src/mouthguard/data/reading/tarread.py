"""The loader's reader of tar shards: samples out of verified shard files, by index.

A shard is opened verified (:class:`~mouthguard.data.fetching.fetch.ShardSource`): whole
against the manifest's sha256 before any of its samples is read, or -- streamed
from a remote tier with a range table -- range by range, a sample read only
once every range it touches matched (:mod:`~mouthguard.data.fetching.streamed`); its
index is checked and parsed as hostile input. A sample is then one read of its span,
cut into members as the index says. An adopted gzip-compressed shard
(``.tar.gz``, ``.tgz``) is verified whole, then inflated once into a temporary
file as it is opened (:mod:`~mouthguard.data.reading.gztar`), and read from there.

Packed shards are also checked member by member: each member's USTAR header must
be where the index puts it and name the member, with its size
(:func:`~mouthguard.data.formats.tarfmt.member_mismatch`), so an index that points
anywhere else is caught as the sample is read. The header's own checksum is not
recomputed there: the whole shard already matched the manifest's sha256. An
adopted shard's headers are whatever the user's writer chose (GNU long names,
PAX records) and have no one-block form to compare with; its index was derived
from those very bytes by ``tarfile`` (:mod:`~mouthguard.data.indexing.tarscan`), the
bytes are verified whole first, and ``verify`` derives the index again and
compares -- so the reader takes the verified index as it is.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mouthguard.data.fetching.cache import ShardFile
from mouthguard.data.fetching.fetch import ShardSource
from mouthguard.data.fetching.streamed import StreamedShard
from mouthguard.data.formats import names, tarfmt
from mouthguard.data.formats.index import Member, SampleEntry, ShardIndex
from mouthguard.data.reading.gztar import unpack
from mouthguard.errors import ShardDamagedError

Sample = dict[str, Any]


#: Samples of at least this many bytes are read member by member, each member of at least
#: this size straight into the ``bytes`` handed out, instead of in one read of the span
#: with each member copied out of it. CPU per 64 KiB member read and handed on (2-CPU
#: VM): 7.5 µs against 9.4 with a DataLoader worker's heap settings (data.loading.heap),
#: 22.5 against 43.8 without them; at 1 MiB 155 against 210, and 268 against 707.
DIRECT_READ = 64 * 1024
#: Indexes fetched and parsed at once ahead of the reader (a shuffle window's, typically).
INDEX_THREADS = 4
#: Announced indexes kept until asked for. A unit of a block this worker reads no sample
#: of is never asked for: past the bound the oldest is forgotten (and its parse, if
#: done, is in the source's bounded memo anyway).
_MAX_PENDING = 64


class TarUnits:
    """Shards as the loader's units: open one (verified), read samples of the open ones.

    Indexes of announced shards (:meth:`warm`) are fetched and parsed on at most
    :data:`INDEX_THREADS` threads while the shards are opened, rather than one
    after another when their first sample is read: a shuffled block's first
    samples need every index of its window. Their failures surface where the
    reader asks for the index.
    """

    def __init__(self, source: ShardSource) -> None:
        self.source = source
        self.adopted = source.dataset.manifest.adopted
        self._pool: ThreadPoolExecutor | None = None
        #: Announced, not yet asked for, oldest first (at most _MAX_PENDING).
        self._pending: dict[int, Future[ShardIndex]] = {}
        self._lock = threading.Lock()  # the reader and the prefetch thread both ask

    def warm(self, units: Sequence[int]) -> None:
        """Start fetching and parsing the indexes of ``units`` in the background."""
        with self._lock:
            for unit in units:
                if unit in self._pending:
                    continue
                if self._pool is None:
                    # Not io.pool.SHARED: this runs in forked DataLoader workers, where a
                    # pool the parent had started has no threads (see data.ranged).
                    self._pool = ThreadPoolExecutor(INDEX_THREADS, thread_name_prefix="index")
                self._pending[unit] = self._pool.submit(self.source.index, unit)
                while len(self._pending) > _MAX_PENDING:
                    self._pending.pop(next(iter(self._pending))).cancel()

    def _index(self, unit: int) -> ShardIndex:
        with self._lock:
            pending = self._pending.pop(unit, None)
        if pending is not None:
            return pending.result()  # its error, if any, is raised here, in the reader
        return self.source.index(unit)

    def open_unit(self, number: int, *, must: bool) -> ShardFile | None:
        """Shard ``number``, verified and open (None: no room for a prefetch).

        A gzip-compressed shard, verified whole, comes back as the tar inside it,
        inflated into a temporary file of its own (:func:`~mouthguard.data.reading.gztar.unpack`):
        in the cache's directory, or without a cache the system's temporary one.
        """
        opened = self.source.open_shard(number, must=must)
        if opened is None or not names.is_gzip_tar(opened.name):
            return opened
        try:
            tar_size = self._index(number).size
            directory = None if self.source.cache is None else str(self.source.cache.tmp)
            return unpack(opened, tar_size, directory)
        finally:
            opened.close()  # the compressed file is not read again: unpinned now

    def read(
        self, opened: Mapping[int, ShardFile], units: Sequence[int], items: Sequence[int]
    ) -> Iterator[Sample]:
        """Sample ``items[i]`` of shard ``units[i]``, for each ``i`` in turn, one at a time."""
        # Each unit's index looked up once per call, not once per sample: the lookup goes
        # through two locks and the memo (about 5 us a sample, a sixth of a 10 KB sample).
        indexes: dict[int, ShardIndex] = {}
        self._ask_ahead(opened, units, items, indexes)
        for unit, number in zip(units, items, strict=True):
            yield self._sample(opened[unit], self._index_in(indexes, unit).samples[number])

    def _index_in(self, indexes: dict[int, ShardIndex], unit: int) -> ShardIndex:
        """``unit``'s index from ``indexes``, looked up and kept there the first time."""
        index = indexes.get(unit)
        if index is None:
            index = indexes[unit] = self._index(unit)
        return index

    def close(self) -> None:
        """Stop the index reads and the source's range reads (every shard is closed)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        with self._lock:
            self._pending.clear()
        self.source.close()

    def _ask_ahead(
        self,
        opened: Mapping[int, ShardFile],
        units: Sequence[int],
        items: Sequence[int],
        indexes: dict[int, ShardIndex],
    ) -> None:
        """Ask for the ranges these samples touch, in the order they will be read.

        The indexes it looks up are kept in ``indexes`` for the read that follows.

        A shuffled block needs its shards' ranges in an order of its own; fetched
        in that order, its first samples are ready after a few ranges, not after
        whole shards.
        """
        streaming = {
            u: f for u, f in opened.items() if isinstance(f, StreamedShard) and not f.complete
        }
        if not streaming:
            return
        asked: dict[int, set[int]] = {u: set() for u in streaming}
        for unit, number in zip(units, items, strict=True):
            file = streaming.get(unit)
            if file is None:
                continue
            entry = self._index_in(indexes, unit).samples[number]
            fresh = [k for k in file.ranges_of(entry.offset, entry.length) if k not in asked[unit]]
            if fresh:
                asked[unit].update(fresh)
                file.want(fresh)

    def _sample(self, file: ShardFile, entry: SampleEntry) -> Sample:
        if entry.length >= DIRECT_READ:
            return self._large_sample(file, entry)
        span = memoryview(file.read(entry.offset, entry.length))
        sample: Sample = {"__key__": entry.key}
        for member in entry.members:
            at = member.offset - entry.offset
            if not self.adopted:
                self._check_header(file, entry, member, span[at - tarfmt.BLOCK : at])
            sample[member.ext] = bytes(span[at : at + member.size])
        return sample

    def _large_sample(self, file: ShardFile, entry: SampleEntry) -> Sample:
        """A sample of at least :data:`DIRECT_READ` bytes: each member read where it lies.

        A member of at least :data:`DIRECT_READ` bytes is read straight into the
        ``bytes`` handed out, its header (packed shards) a read of its own; a
        smaller one is read with its header and copied out. Nothing is read twice,
        and no large member is copied.
        """
        sample: Sample = {"__key__": entry.key}
        for member in entry.members:
            if self.adopted:
                sample[member.ext] = file.read(member.offset, member.size)
            elif member.size >= DIRECT_READ:
                header = file.read(member.offset - tarfmt.BLOCK, tarfmt.BLOCK)
                self._check_header(file, entry, member, header)
                sample[member.ext] = file.read(member.offset, member.size)
            else:
                piece = memoryview(
                    file.read(member.offset - tarfmt.BLOCK, tarfmt.BLOCK + member.size)
                )
                self._check_header(file, entry, member, piece[: tarfmt.BLOCK])
                sample[member.ext] = bytes(piece[tarfmt.BLOCK :])
        return sample

    @staticmethod
    def _check_header(
        file: ShardFile, entry: SampleEntry, member: Member, header: bytes | memoryview
    ) -> None:
        """Refuse the sample unless ``header`` is the header of ``member`` (see the module doc)."""
        name = names.member_name(entry.key, member.ext).encode()
        problem = tarfmt.member_mismatch(header, name, member.size)
        if problem is not None:
            raise ShardDamagedError(f"shard {file.name}: {problem}", shard=file.name)
