"""``StreamingDataset``: a torch ``IterableDataset`` over a verified dataset, exactly resumable.

Each iteration yields this process's share of one epoch (see
:mod:`~mouthguard.data.loading.order` for the order and the partitioning across ranks
and DataLoader workers) as dicts ``{"__key__": key, ext: bytes, ...}`` -- for
Parquet, one dict per row, ``{column: value, ...}`` -- or what ``decode`` makes
of them. Shards come verified from the cache or in place
(:mod:`~mouthguard.data.fetching.fetch`): no sample of a shard is yielded before the
whole shard matched the manifest's sha256 -- or, for a shard streamed into the
cache with a range table (a version 2 manifest), before every range the sample
touches matched its own sha256 (:mod:`~mouthguard.data.fetching.streamed`) -- and every
member's tar header is checked against the index as the sample is read
(:mod:`~mouthguard.data.reading.tarread`).
A Parquet dataset is read by row group, the unit of order, caching and resume
in place of a shard: no row is yielded before its row group's bytes and its
file's footer matched their own sha256s (:mod:`~mouthguard.data.reading.pqread`). A
mismatch raises :class:`~mouthguard.errors.ShardDamagedError` naming the file
(and the row group); a sample is never skipped.

Position. Iterated in-process (no DataLoader workers), the dataset counts the
samples it yields; when an epoch ends it moves to the next one. With workers,
the main process cannot see what they yielded: use
:class:`~mouthguard.data.loading.loader.StreamingDataLoader`, which counts delivered
samples and sets the dataset's start position before every iteration.
``state_dict``/``load_state_dict`` carry the position (:mod:`~mouthguard.data.loading.position`).

Processes. The dataset is opened (manifest read and verified) where it is
built; each DataLoader worker opens its own tier for a path or URL source, and
uses the one given otherwise (a tier passed in must work in the workers, as a
local tier does). Without ``cache_dir``, a local dataset is read in place and
any other is cached in the user's shard cache (``~/.cache/mouthguard/shards``,
named in one line with its limit; :mod:`~mouthguard.data.fetching.scratch`), never
silently under the system's temporary directory; a dataset read in place keeps
the record of the parts that hashed right in a per-user directory shared by its
workers and later runs (:mod:`~mouthguard.data.fetching.verified`), so each shard is
hashed once, not once per worker and epoch. Where either per-user directory
cannot be used, a temporary one is, and the building process removes it when
the dataset is garbage-collected or at exit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from mouthguard.data.burst import BurstSignal
from mouthguard.data.dataset import Dataset, open_at, resolve_keys
from mouthguard.data.fetching.cache import ShardCache, Verify
from mouthguard.data.fetching.fetch import (
    NODE_RANGE_REQUESTS,
    IndexMemo,
    ReadSettings,
    ShardSource,
    split_parallel,
)
from mouthguard.data.fetching.prefetch import Closeable, Opener, Prefetcher
from mouthguard.data.fetching.ranged import DEFAULT_RETRY
from mouthguard.data.fetching.scratch import default_shard_dir, default_verified_dir
from mouthguard.data.fetching.verified import VerifiedFiles
from mouthguard.data.formats.arrow import pyarrow_modules
from mouthguard.data.formats.manifest import PARQUET
from mouthguard.data.loading.heap import keep_heap_warm
from mouthguard.data.loading.order import (
    BlockPlan,
    EpochOrder,
    Partition,
    rank_length,
    rank_span,
    worker_plan,
)
from mouthguard.data.loading.position import Position, parse_position, restore
from mouthguard.data.location import Target, locate
from mouthguard.data.reading.tarread import TarUnits
from mouthguard.format.signing import KeySpec
from mouthguard.tiers.local import LocalTier

Sample = dict[str, Any]
#: Samples a block's shuffle draws from once its buffer is full (see ``shuffle_buffer``).
DEFAULT_SHUFFLE_BUFFER = 4096
#: Items of a plan read at once: a Parquet reader converts rows to Python in batches.
_READ_BATCH = 1024


class Units(Opener[Closeable], Protocol):
    """The loader's units of one kind, opened and read.

    Tar shards (:mod:`~mouthguard.data.reading.tarread`) or Parquet row groups
    (:mod:`~mouthguard.data.reading.pqread`).
    """

    def read(
        self, opened: Mapping[int, Any], units: Sequence[int], items: Sequence[int]
    ) -> Iterator[Sample]:
        """Item ``items[i]`` of unit ``units[i]`` for each ``i``, in order; all are open."""

    def warm(self, units: Sequence[int]) -> None:
        """Start what reading ``units`` will need first, in the background (may do nothing)."""

    def close(self) -> None:
        """Release what reading needed (after every unit is closed)."""


def _remove_tree(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked worker inherits the finalizer: only the owner removes
        shutil.rmtree(path, ignore_errors=True)


def _distributed() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class StreamingDataset(IterableDataset[Any]):
    """A verified, cached, exactly resumable stream of a dataset's samples.

    Args:
        source: the dataset's directory, its ``s3://bucket/prefix`` URL, or a tier.
        prefix: the dataset's key prefix inside ``source``.
        shuffle: permute shards and, within blocks of ``shuffle_window`` shards, samples.
        seed: the order's seed (with the epoch, it determines the whole order).
        batch_size: the DataLoader's batch size: workers take whole batches in turn.
        shuffle_window: shards whose samples are shuffled together (all open at once).
        shuffle_buffer: samples the block's shuffle draws each position from, once
            full (:mod:`~mouthguard.data.loading.order`): a buffer shuffle over the block's
            shards read side by side, so the first batch needs only their first
            ranges. 0: a uniform permutation of the whole block (the order of
            version 1 positions, which only a loader with 0 resumes). The default,
            4096, holds a whole 4-shard window of 100 KB samples in 64 MiB shards.
        cache_dir: a local directory for verified shards, shared by the processes
            that name it; None: a local dataset is read in place, an S3 one cached
            in the user's shard cache (see the module docstring).
        cache_limit: bytes the cache may hold (None: half its filesystem's free space).
            Each worker keeps ``shuffle_window`` shards open and ``prefetch`` more
            pinned: give the cache room for that many shards per worker, or readers
            will fetch beyond the limit rather than wait.
        verify_cache: ``stat`` or ``always`` (see :mod:`~mouthguard.data.fetching.cache`); the
            same choice for a local dataset read in place.
        decode: applied to each sample dict before it is yielded.
        prefetch: shards opened ahead of the consumer, per process (0: none).
        burst: a checkpoint-burst signal (``BurstGate``); prefetch yields to it.
        rank: this rank (default: torch.distributed's, else 0).
        world_size: ranks in the job (default: torch.distributed's, else 1).
        signing_key: manifest keys; default ``$MOUTHGUARD_MANIFEST_KEY`` (then required).
        range_size: bytes per range read of a download of a shard without a range
            table (a shard with one is read in the manifest's ranges).
        range_parallel: range reads in flight per process (per DataLoader worker,
            whatever the number of shards open), each holding at most one range
            in memory: a node has at most ``workers * range_parallel`` in flight.
            None (the default): 8 split among the loader's workers, at least 2
            each (:func:`~mouthguard.data.fetching.fetch.split_parallel`): 8 when
            iterated in one process or with one worker, 2 each for 4. 8 in one
            process, and the 2 MiB ranges the writer records, were the fastest
            measured against the Ceph RGW on loopback, with and without 20 ms
            added per request (``python -m benchmarks.data.ranges``); 8 per worker
            with 4 workers made every request, the first batch's among them,
            share the server with 31 others (docs/benchmarks-data.md).
        range_coalesce: adjacent pending ranges of a streamed shard one background
            read may cover (each still verified on its own before any sample
            touching it is handed out; a range the reader waits for, and a
            shard's first range, are read alone): fewer, larger requests.
            Memory held by range reads is at most ``range_parallel *
            range_coalesce`` ranges per process. The default,
            2, measured 29% fewer GETs than 1 and no lower throughput at 20 ms
            per request in one process (with 4 workers this machine could not
            tell them apart); 4 cost throughput and first batch
            (``python -m benchmarks.data.coalesce``, docs/benchmarks-data.md).
        node_requests: range requests in flight across every process using
            ``cache_dir`` (all DataLoader workers and ranks of a node that share
            it), held as slots in ``cache_dir/slots`` (:mod:`~mouthguard.data.fetching.nodeslots`).
            None: no shared bound, so a node has ``workers * range_parallel``.
            Needs a ``cache_dir`` shared on the node (the default one is).
        range_retries: tries after the first of a range read that failed
            transiently (an I/O error, a dropped connection, a 5xx, a timeout, a
            short read), with backoff doubling from 0.05 s; after the last, the
            read's error names the dataset, shard and bytes. On S3 these come on
            top of the S3 client's own retries of each request. A range that
            does not match its sha256 is read once more, then refused.

    Raises:
        DatasetNotFoundError: nothing is committed at ``source``.
        ManifestError: the manifest is damaged, hostile, or (with a key) unsigned.
    """

    def __init__(
        self,
        source: Target,
        *,
        prefix: str = "",
        shuffle: bool = False,
        seed: int = 0,
        batch_size: int = 1,
        shuffle_window: int = 4,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        verify_cache: Verify = "stat",
        decode: Callable[[Sample], Any] | None = None,
        prefetch: int = 2,
        burst: BurstSignal | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        signing_key: KeySpec | None = None,
        range_size: int = 8 * 1024 * 1024,
        range_parallel: int | None = None,
        range_coalesce: int = 2,
        node_requests: int | None = None,
        range_retries: int = DEFAULT_RETRY.retries,
    ) -> None:
        super().__init__()
        if batch_size < 1 or shuffle_window < 1 or min(prefetch, seed, shuffle_buffer) < 0:
            raise ValueError(
                "batch_size and shuffle_window must be >= 1; prefetch, seed, shuffle_buffer >= 0"
            )
        given = (range_parallel, range_coalesce, node_requests)
        if min(1 if n is None else n for n in given) < 1:
            raise ValueError("range_parallel, range_coalesce and node_requests must be >= 1")
        keys = resolve_keys(signing_key)
        self.dataset: Dataset = open_at(locate(source, prefix), keys)
        if self.dataset.manifest.kind == PARQUET:
            pyarrow_modules()  # without pyarrow: one line saying what to install, now
        found_rank, found_world = _distributed()
        self.rank = found_rank if rank is None else rank
        self.world_size = found_world if world_size is None else world_size
        self.batch_size = batch_size
        self.decode = decode
        self.prefetch = prefetch
        self.burst = burst
        #: None: range_parallel split among the workers, as each iteration starts (_units).
        self.range_parallel = range_parallel
        self.settings = ReadSettings(
            range_size,
            NODE_RANGE_REQUESTS if range_parallel is None else range_parallel,
            range_coalesce,
            node_requests,
            replace(DEFAULT_RETRY, retries=range_retries),
        )
        self._live: int | None = None  # see _position
        self._stored: Position = Position(
            fingerprint=self.dataset.fingerprint,
            epoch=0,
            consumed=0,
            seed=seed,
            shuffle=shuffle,
            shuffle_window=shuffle_window,
            shuffle_buffer=shuffle_buffer,
            rank=self.rank,
            world_size=self.world_size,
        )
        Partition(self.rank, self.world_size)  # refuses a rank outside the world now
        self._indexes = IndexMemo()  # parsed indexes, kept across this object's passes
        self._start: Any = None  # a persistent loader's shared start position (attach_start)
        self.verified_dir: str | None = None
        if cache_dir is None and not isinstance(self.dataset.location.tier, LocalTier):
            cache_dir, temporary = default_shard_dir(cache_limit)  # says where, and how much
            if temporary:
                weakref.finalize(self, _remove_tree, cache_dir, os.getpid())
        elif cache_dir is None:
            # Persistent where possible: a new process trusts what an earlier one hashed.
            self.verified_dir = default_verified_dir()
            if self.verified_dir is None:
                self.verified_dir = tempfile.mkdtemp(prefix="mouthguard-verified-")
                weakref.finalize(self, _remove_tree, self.verified_dir, os.getpid())
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.cache_limit = cache_limit
        self.verify_cache: Verify = verify_cache
        if self.cache_dir is not None:  # refuses bad settings, and makes the directory, now
            ShardCache(self.cache_dir, cache_limit, verify_cache)

    # --- position --------------------------------------------------------------------

    @property
    def _position(self) -> Position:
        """Where this rank is: the stored position, with an in-process pass's count applied.

        An in-process pass counts each sample it hands out in ``_live`` (an int set
        per sample, where a new :class:`Position` per sample cost about a tenth of a
        warm 10 KB sample); whoever reads the position gets it with that count as
        ``consumed``, exactly as if it had been stored with each sample. Reading
        changes nothing, so a reader on another thread (a checkpoint taken while
        the pass runs) sees the count of one moment and never loses a later one.
        """
        live = self._live
        return self._stored if live is None else self._stored.at(live)

    @_position.setter
    def _position(self, position: Position) -> None:
        self._stored = position
        self._live = None

    @property
    def fingerprint(self) -> str:
        """The dataset's fingerprint."""
        return self.dataset.fingerprint

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self._position.epoch

    @property
    def consumed(self) -> int:
        """Samples of that epoch this rank has delivered already."""
        return self._position.consumed

    def samples_per_rank(self) -> int:
        """Samples this rank reads in one epoch (the same for every epoch)."""
        start, stop = rank_span(self.dataset.samples, self.rank, self.world_size)
        return stop - start

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next, from its start -- unless it is the epoch in progress.

        Calling it with the current epoch keeps a resumed position, so the usual
        ``for epoch in range(start, n): loader.set_epoch(epoch)`` loop resumes.
        """
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
        if epoch != self._position.epoch:
            self._position = replace(self._position, epoch=epoch, consumed=0)

    def set_position(self, epoch: int, consumed: int) -> None:
        """Start the next iteration at sample ``consumed`` of ``epoch`` (for the loader)."""
        self._position = replace(self._position, epoch=epoch, consumed=consumed)

    def state_dict(self) -> dict[str, object]:
        """The position: epoch, samples consumed on this rank, seed, fingerprint, config."""
        return self._position.to_state()

    def load_state_dict(self, state: object, *, force: bool = False) -> None:
        """Resume from a :meth:`state_dict` (see :mod:`~mouthguard.data.loading.position`).

        Raises:
            DatasetChangedError: saved in another dataset version (names both
                fingerprints); ``force=True`` resumes anyway.
            DataStateError: malformed, or saved under another order or partition.
        """
        saved = parse_position(state)
        self._position = restore(saved, self._position, self.samples_per_rank(), force=force)

    # --- iteration -------------------------------------------------------------------

    def order(self, epoch: int) -> EpochOrder:
        """The global order of ``epoch`` (over shards, or Parquet row groups)."""
        p = self._position
        counts = self.dataset.manifest.counts
        return EpochOrder(counts, p.seed, epoch, p.shuffle, p.shuffle_window, p.shuffle_buffer)

    def attach_start(self, shared: Any) -> None:
        """Read each worker iteration's start from ``shared`` (epoch, consumed); None: don't.

        For a loader with persistent workers, whose copies of the dataset outlive
        an iteration (:mod:`~mouthguard.data.loading.loader`): shared memory the loader
        writes before each iteration.
        """
        self._start = shared

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if info is not None:
            keep_heap_warm()  # a worker process exists to read samples: reuse their pages
        shared = self._start
        if info is not None and shared is not None:  # a persistent worker: the loader's word
            self._position = replace(self._position, epoch=shared[0], consumed=shared[1])
        part = Partition(self.rank, self.world_size, worker, workers, self.batch_size)
        start = self._position
        order = self.order(start.epoch)
        plans = worker_plan(order, part, start.consumed)
        in_process = info is None
        produced = start.consumed
        for sample in self._samples(plans):
            if in_process:
                produced += 1  # counted before the yield: a sample handed out is consumed
                self._live = produced
            yield sample
        if in_process and produced >= rank_length(order, part):
            self._position = replace(self._position, epoch=start.epoch + 1, consumed=0)

    def _units(self) -> Units:
        location = self.dataset.location.reopened()
        dataset = Dataset(location, self.dataset.manifest)
        place: ShardCache | VerifiedFiles
        if self.cache_dir is not None:
            place = ShardCache(self.cache_dir, self.cache_limit, self.verify_cache)
        else:
            assert self.verified_dir is not None  # made with the dataset: read in place
            place = VerifiedFiles(self.verified_dir, self.verify_cache)
        settings = self.settings
        if self.range_parallel is None:
            info = get_worker_info()
            workers = 0 if info is None else info.num_workers
            settings = replace(settings, parallel=split_parallel(workers))
        source = ShardSource(dataset, place, settings, self._indexes)
        if dataset.manifest.kind == PARQUET:
            from mouthguard.data.reading.pqread import RowGroupUnits  # noqa: PLC0415 - pyarrow when used

            return RowGroupUnits(source)
        return TarUnits(source)

    def _samples(self, plans: Iterator[BlockPlan]) -> Iterator[Any]:
        units = self._units()
        prefetcher = Prefetcher(units, depth=self.prefetch, burst=self.burst)
        ahead: deque[BlockPlan] = deque()

        def plan_next() -> bool:
            plan = next(plans, None)
            if plan is None:
                return False
            ahead.append(plan)
            prefetcher.announce(plan.shards)
            units.warm(plan.shards)  # indexes fetched while the shards open
            return True

        def fill() -> None:  # keep enough blocks planned to announce `prefetch` units ahead
            while sum(len(p.shards) for p in ahead) <= self.prefetch and plan_next():
                pass

        opened: dict[int, Closeable] = {}
        try:
            # The blocks after the one being read are planned, announced and their
            # indexes warmed once its first sample is out, not before: that sample
            # needs the block's own indexes parsed and its order drawn, and the next
            # block's would take the interpreter from them (the first of 13,107 10 KB
            # samples in place: 34-43 ms against 57-91 ms). For the iteration's first
            # block, once its first *batch* is out: a loader's start waits for that
            # batch, and the next block's plan (a shuffle of about 8 ms, and four
            # index parses on threads, for 16 MiB shards of 10 KB samples) would
            # delay it the same way. The next block's shards are still opened a whole
            # block ahead of their first sample.
            first_batch = self.batch_size  # samples to hand out before the first batch is out
            plan_next()
            while ahead:
                plan = ahead.popleft()
                for unit in plan.shards:
                    opened[unit] = prefetcher.take(unit)
                planned = False
                for at in range(0, len(plan.shard_of), _READ_BATCH):
                    batch = slice(at, at + _READ_BATCH)
                    for sample in units.read(
                        opened, plan.shard_of[batch].tolist(), plan.sample_of[batch].tolist()
                    ):
                        yield sample if self.decode is None else self.decode(sample)
                        if not planned:
                            first_batch -= 1
                            if first_batch <= 0:
                                planned = True
                                fill()
                if not planned:  # a share smaller than the first batch (or, kept safe, empty)
                    fill()
                for handle in opened.values():
                    handle.close()
                opened.clear()
        finally:
            for handle in opened.values():
                handle.close()
            prefetcher.close()
            units.close()
