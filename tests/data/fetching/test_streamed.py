"""Shards streamed range by range: never a sample from an unverified range, bounded reads.

A version 2 manifest's range table lets a reader hand out a shard's samples as
its ranges arrive and match. These tests read through a real local cache
directory from a local tier wrapped in the fault-injection tier (delays, read
errors, flipped bits), so the ranges arrive slowly, fail, or are damaged.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from pathlib import Path

import pytest

from mouthguard.data import StreamingDataset, open_dataset
from mouthguard.data.fetching.cache import ShardCache
from mouthguard.data.fetching.fetch import ReadSettings, ShardSource
from mouthguard.data.fetching.follow import FollowedShard
from mouthguard.data.fetching.streamed import StreamedShard
from mouthguard.data.reading.tarread import TarUnits
from mouthguard.errors import ShardDamagedError, TierError
from mouthguard.tiers import ObjectInfo, Tier
from mouthguard.tiers.faults import FaultPlan, FaultyTier
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.retry import RetryPolicy
from mouthguard.tiers.wrapper import WrappedTier

from ..helpers import as_packed_before_ranges, expected, flip_byte, shard_path, write_dataset

RANGE = 64 * 1024
N = 300  # about 450 KB: shards of 200 KB, 4 ranges each
#: Seed of the flips in the one-read-damaged test: some ranges flipped on one read, none on two.
FLIP_SEED = 3


class CountingTier(WrappedTier):
    """Counts ranged reads of shard files (not indexes, not the manifest)."""

    def __init__(self, inner: Tier) -> None:
        super().__init__(inner)
        self.gets: Counter[str] = Counter()
        self._lock = threading.Lock()

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if key.endswith(".tar"):
            with self._lock:
                self.gets[key] += 1
        return self.inner.get(key, start, end)


@pytest.fixture
def ds(tmp_path: Path) -> Path:
    write_dataset(tmp_path, n=N, shard_size=200 * 1024, range_size=RANGE)
    return tmp_path / "ds"


def _tier(ds: Path, plan: FaultPlan | None = None) -> FaultyTier:
    return FaultyTier(LocalTier(ds.parent), plan or FaultPlan(), seed=3)


def _payload_offset_in(ds: Path, shard: int, k: int) -> int:
    """A payload byte (not a tar header) of ``shard`` inside range ``k``."""
    dataset = open_dataset(ds)
    index = dataset.read_index(dataset.manifest.shards[shard])
    return next(
        m.offset
        for e in index.samples
        for m in e.members
        if m.size and k * RANGE <= m.offset < (k + 1) * RANGE
    )


def test_a_streamed_dataset_reads_back_exactly(ds: Path, tmp_path: Path) -> None:
    tier = _tier(ds)
    for shuffle in (False, True):
        dataset = StreamingDataset(
            tier, prefix="ds", cache_dir=tmp_path / f"cache-{shuffle}", shuffle=shuffle
        )
        got = {s["__key__"]: {k: v for k, v in s.items() if k != "__key__"} for s in dataset}
        assert got == {k: {"txt": v["txt"], "bin": v["bin"]} for k, v in expected(N).items()}
        # The second pass finds every shard complete in the cache: same samples.
        assert sorted(s["__key__"] for s in dataset) == sorted(got)


@pytest.mark.parametrize("coalesce", [1, 4])
def test_a_damaged_range_is_refused_before_any_of_its_samples(
    ds: Path, tmp_path: Path, coalesce: int
) -> None:
    """Sequential order: exactly the samples that end before range 2 come out, then the error.

    Also when one read covers ranges 1-4 (``coalesce=4``; range 0 is read alone): each
    range is verified on its own, so range 1 of that read is served and range 2 refused.
    """
    dataset = open_dataset(ds)
    index = dataset.read_index(dataset.manifest.shards[0])
    flip_byte(shard_path(ds, 0), _payload_offset_in(ds, 0, 2))
    before = [e.key for e in index.samples if e.offset + e.length <= 2 * RANGE]
    stream = StreamingDataset(
        _tier(ds), prefix="ds", cache_dir=tmp_path / "cache", range_coalesce=coalesce
    )
    yielded: list[str] = []

    def drain() -> None:
        yielded.extend(sample["__key__"] for sample in stream)

    with pytest.raises(ShardDamagedError, match=r"shard-000000.tar: range 2 \(bytes 131072 to"):
        drain()
    assert yielded == before
    # Nothing unverified was kept: the cache holds no entry of the shard.
    assert not (tmp_path / "cache" / "blobs" / dataset.manifest.shards[0].sha256).exists()


def test_a_bit_flipped_on_the_wire_is_refused(ds: Path, tmp_path: Path) -> None:
    """Every shard read comes back with one bit flipped: with one range per read, no
    sample is ever yielded; with two (coalesced, after each shard's first range), one
    range of each read is damaged and refused, the other verified on its own -- what is
    yielded is exact, then the error."""
    plan = FaultPlan(flip=1.0, ops=frozenset({"get"}), keys=".tar")
    stream = StreamingDataset(
        _tier(ds, plan), prefix="ds", cache_dir=tmp_path / "cache", range_coalesce=1
    )
    with pytest.raises(ShardDamagedError, match="sha256 does not match the manifest"):
        next(iter(stream))
    coalesced = StreamingDataset(
        _tier(ds, plan), prefix="ds", cache_dir=tmp_path / "cache2", range_coalesce=2
    )
    yielded: list[dict[str, bytes]] = []
    with pytest.raises(ShardDamagedError, match="sha256 does not match the manifest"):
        yielded.extend(coalesced)
    want = expected(N)
    assert len(yielded) < N
    for got in yielded:
        assert {k: v for k, v in got.items() if k != "__key__"} == want[str(got["__key__"])]


def test_a_dataset_packed_before_range_tables_is_verified_whole(ds: Path, tmp_path: Path) -> None:
    as_packed_before_ranges(ds)
    assert open_dataset(ds).manifest.shards[0].ranges is None
    stream = StreamingDataset(_tier(ds), prefix="ds", cache_dir=tmp_path / "cache")
    assert sorted(s["__key__"] for s in stream) == sorted(expected(N))
    flip_byte(shard_path(ds, 1), _payload_offset_in(ds, 1, 1))
    fresh = StreamingDataset(_tier(ds), prefix="ds", cache_dir=tmp_path / "cache2")
    with pytest.raises(ShardDamagedError, match="sha256 of the downloaded shard does not match"):
        list(fresh)


def _source(
    ds: Path,
    tier: Tier,
    cache: Path,
    parallel: int,
    coalesce: int = 1,
    retry: RetryPolicy | None = None,
) -> tuple[ShardSource, TarUnits]:
    dataset = open_dataset(tier, prefix="ds")
    settings = ReadSettings(parallel=parallel, coalesce=coalesce, retry=retry or RetryPolicy())
    source = ShardSource(dataset, ShardCache(cache, None, "stat"), settings)
    return source, TarUnits(source)


@pytest.mark.parametrize(("parallel", "coalesce"), [(1, 1), (3, 1), (2, 3)])
def test_reads_in_flight_and_bytes_held_stay_within_the_bound(
    ds: Path, tmp_path: Path, parallel: int, coalesce: int
) -> None:
    """Every shard open at once on a slow tier: at most `parallel` reads of at most
    `coalesce` ranges each."""
    slow = FaultPlan(delay=1.0, delay_seconds=0.01, ops=frozenset({"get"}))
    counting = CountingTier(_tier(ds, slow))
    source, units = _source(ds, counting, tmp_path / "cache", parallel, coalesce)
    shards = range(len(source.dataset.shards))
    opened = {u: units.open_unit(u, must=True) for u in shards}
    assert all(isinstance(f, StreamedShard) for f in opened.values())
    for u, f in opened.items():
        assert f is not None
        samples = source.dataset.shards[u].samples
        list(units.read(opened, [u] * samples, list(range(samples))))
    fetcher = source.fetcher
    assert fetcher is not None
    assert 1 <= fetcher.peak_in_flight <= parallel
    assert fetcher.peak_bytes <= parallel * coalesce * RANGE
    ranges = sum(-(-s.size // RANGE) for s in source.dataset.manifest.shards)
    reads = sum(counting.gets.values())
    assert reads == fetcher.requests
    assert -(-ranges // coalesce) <= reads <= ranges  # runs of adjacent ranges: fewer reads
    if coalesce > 1:
        assert reads < ranges
    for f in opened.values():
        assert f is not None
        f.close()
    units.close()


def test_a_failing_tier_keeps_the_bound_and_leaves_nothing_behind(ds: Path, tmp_path: Path) -> None:
    """Reads fail at random, not retried: the error reaches the reader, no partial entry or
    lock remains."""
    failing = FaultPlan(error=0.5, delay=1.0, delay_seconds=0.005, ops=frozenset({"get"}))
    cache = tmp_path / "cache"
    source, units = _source(ds, _tier(ds, failing), cache, 2, retry=RetryPolicy(retries=0))
    opened = {u: units.open_unit(u, must=True) for u in range(len(source.dataset.shards))}

    def read_all() -> None:
        for u in opened:
            samples = source.dataset.shards[u].samples
            list(units.read(opened, [u] * samples, list(range(samples))))

    with pytest.raises(TierError):
        read_all()
    fetcher = source.fetcher
    assert fetcher is not None
    assert fetcher.peak_in_flight <= 2
    assert fetcher.peak_bytes <= 2 * RANGE
    for f in opened.values():
        assert f is not None
        f.close()
    units.close()
    assert not list((cache / "tmp").iterdir())  # incomplete downloads were dropped
    # The download locks were released: a healthy reader now gets every sample.
    stream = StreamingDataset(_tier(ds), prefix="ds", cache_dir=cache)
    assert sorted(s["__key__"] for s in stream) == sorted(expected(N))


def test_a_shuffled_block_yields_its_first_sample_after_a_few_ranges(tmp_path: Path) -> None:
    """The ranges the block's order needs first are fetched first, not whole shards.

    Three shards of 16 ranges each in one shuffle window, shard reads slowed to
    50 ms, one read at a time: the first sample comes after the range it needs
    (and the few background reads already under way), not after 48 reads.
    """
    n = 2000  # about 3 MB: shards of 1 MiB
    write_dataset(tmp_path, n=n, shard_size=1024 * 1024, range_size=RANGE)
    slow = FaultPlan(delay=1.0, delay_seconds=0.05, ops=frozenset({"get"}), keys=".tar")
    counting = CountingTier(_tier(tmp_path / "ds", slow))
    stream = StreamingDataset(
        counting,
        prefix="ds",
        cache_dir=tmp_path / "cache",
        shuffle=True,
        shuffle_window=3,
        prefetch=0,
        range_parallel=1,
    )
    window = sum(-(-s.size // RANGE) for s in stream.dataset.manifest.shards[:3])
    it = iter(stream)
    next(it)
    assert window >= 48
    assert sum(counting.gets.values()) <= 4
    assert len(list(it)) == n - 1


def test_the_first_batch_of_a_buffered_shuffle_needs_only_the_first_ranges(
    tmp_path: Path,
) -> None:
    """With the shuffle buffer (the default), a block's first batch draws from the
    front of each of its shards: counted, the range reads before the batch is out
    are the first one or two ranges of each shard, where the uniform block
    permutation (``shuffle_buffer=0``) reads most of the window's ranges first."""
    n = 2000  # about 3 MB: shards of 1 MiB, 16 ranges each, about 42 samples a range
    write_dataset(tmp_path, n=n, shard_size=1024 * 1024, range_size=RANGE)
    slow = FaultPlan(delay=1.0, delay_seconds=0.05, ops=frozenset({"get"}), keys=".tar")
    reads: dict[int, int] = {}
    for buffer in (64, 0):
        counting = CountingTier(_tier(tmp_path / "ds", slow))
        stream = StreamingDataset(
            counting,
            prefix="ds",
            cache_dir=tmp_path / f"cache-{buffer}",
            shuffle=True,
            shuffle_window=3,
            shuffle_buffer=buffer,
            prefetch=0,
            range_parallel=1,  # one 50 ms read at a time: the reads the batch waited for
        )
        it = iter(stream)
        for _ in range(32):
            next(it)
        reads[buffer] = sum(counting.gets.values())
        assert len(list(it)) == n - 32
    # 32 positions use at most 64 + 31 + 31 arrivals, about 42 per shard: ranges 0-1
    # of each of 3 shards, plus the one read in flight when the batch was out.
    assert reads[64] <= 3 * 2 + 1
    assert reads[0] >= 15  # 32 uniform draws over 48 ranges touch about 24


def test_another_reader_follows_a_stream_in_progress_and_falls_back_when_it_stops(
    tmp_path: Path,
) -> None:
    """Two readers of one cache (as DataLoader workers are): the second reads the ranges
    the first has verified instead of waiting for the whole shard, and reads the shard
    itself once the first gives up."""
    write_dataset(tmp_path, n=2000, shard_size=1024 * 1024, range_size=RANGE)
    ds, cache = tmp_path / "ds", tmp_path / "cache"
    slow = FaultPlan(delay=1.0, delay_seconds=0.05, ops=frozenset({"get"}), keys=".tar")
    _, units_a = _source(ds, _tier(ds, slow), cache, 1)
    source_b, units_b = _source(ds, _tier(ds), cache, 2)
    first = units_a.open_unit(0, must=True)
    assert isinstance(first, StreamedShard)
    second = units_b.open_unit(0, must=True)  # does not wait for the first one's lock
    assert isinstance(second, FollowedShard)
    index = source_b.index(0)
    got = list(units_b.read({0: second}, [0], [0]))
    assert [s["__key__"] for s in got] == [index.samples[0].key]
    assert not first.complete  # 16 ranges at 50 ms each, one at a time: far from done
    first.close()  # the streamer gives up part-way: the follower reads it itself
    count = source_b.dataset.shards[0].samples
    keys = [s["__key__"] for s in units_b.read({0: second}, [0] * count, list(range(count)))]
    assert keys == [e.key for e in index.samples]
    second.close()
    units_a.close()
    units_b.close()
    assert not [p for p in (cache / "tmp").iterdir() if p.name.endswith(".progress")]


# --- retries: transient failures survive, a mismatch is read once more, then refused ---------


def _one_shard(tmp_path: Path) -> Path:
    write_dataset(tmp_path / "one", n=N, shard_size=1024 * 1024, range_size=RANGE)
    return tmp_path / "one" / "ds"


def _read_shard_0(units: TarUnits, source: ShardSource) -> list[dict[str, bytes]]:
    opened = units.open_unit(0, must=True)
    assert isinstance(opened, StreamedShard)
    samples = source.dataset.shards[0].samples
    try:
        return list(units.read({0: opened}, [0] * samples, list(range(samples))))
    finally:
        opened.close()
        units.close()


def test_transient_read_failures_are_retried_and_resume_stays_exact(
    ds: Path, tmp_path: Path
) -> None:
    """A third of the shard reads fail (before reaching the disk): every sample still comes,
    in the same order as without faults, and a position saved mid-epoch resumes exactly."""
    plan = FaultPlan(error=0.3, ops=frozenset({"get"}), keys=".tar")

    def stream(cache: str, tier: Tier) -> StreamingDataset:
        # 30 retries: a range failing 31 times in a row (0.3**31) does not happen.
        return StreamingDataset(
            tier, prefix="ds", cache_dir=tmp_path / cache, shuffle=True, seed=4, range_retries=30
        )

    reference = [dict(s) for s in stream("clean", _tier(ds))]
    faulty = _tier(ds, plan)
    first = stream("faulty", faulty)
    head: list[dict[str, bytes]] = []
    for sample in first:
        head.append(dict(sample))
        if len(head) == 111:
            break
    state = first.state_dict()
    resumed = stream("faulty-resumed", faulty)
    resumed.load_state_dict(state)
    tail = [dict(s) for s in resumed]
    assert head + tail == reference  # bitwise: every sample's bytes, in the same order
    assert faulty.injected["error"] >= 1


def test_a_read_failing_on_every_try_names_the_dataset_shard_and_bytes(
    ds: Path, tmp_path: Path
) -> None:
    plan = FaultPlan(error=1.0, ops=frozenset({"get"}), keys=".tar")
    stream = StreamingDataset(
        _tier(ds, plan), prefix="ds", cache_dir=tmp_path / "cache", range_retries=2
    )
    with pytest.raises(TierError) as caught:
        next(iter(stream))
    where = LocalTier(ds.parent).location("ds")
    assert re.fullmatch(
        rf"{re.escape(where)}: shard shard-000000\.tar: bytes 0 to \d+ "
        r"of ds/shards/shard-000000\.tar could not be read "
        r"\(3 tries; the last failed with: injected I/O error .*\)",
        str(caught.value),
    )


def test_a_mismatched_range_is_read_once_more_then_refused(tmp_path: Path) -> None:
    """Every read flips a bit: range 0 is read exactly twice, then refused; nothing is served."""
    one = _one_shard(tmp_path)
    plan = FaultPlan(flip=1.0, ops=frozenset({"get"}), keys=".tar")
    counting = CountingTier(_tier(one, plan))
    source, units = _source(one, counting, tmp_path / "cache", parallel=1)
    with pytest.raises(ShardDamagedError, match=r"range 0 \(bytes 0 to 65536\): .* \(read twice\)"):
        _read_shard_0(units, source)
    assert sum(counting.gets.values()) == 2


def test_a_range_damaged_on_one_read_only_is_served_from_the_second(tmp_path: Path) -> None:
    """Reads flip a bit at random (seeded; one reader thread, so the same reads every run):
    each flipped read costs one more read of that range, and every sample is exact."""
    one = _one_shard(tmp_path)
    plan = FaultPlan(flip=0.3, ops=frozenset({"get"}), keys=".tar")
    faulty = FaultyTier(LocalTier(one.parent), plan, seed=FLIP_SEED)
    counting = CountingTier(faulty)
    source, units = _source(one, counting, tmp_path / "cache", parallel=1)
    got = _read_shard_0(units, source)
    want = expected(N)
    assert len(got) == source.dataset.shards[0].samples
    for sample in got:
        assert {k: v for k, v in sample.items() if k != "__key__"} == want[str(sample["__key__"])]
    ranges = -(-source.dataset.shards[0].size // RANGE)
    assert faulty.injected["flip"] >= 1
    assert sum(counting.gets.values()) == ranges + faulty.injected["flip"]


def test_retries_keep_the_bound_on_reads_and_bytes(ds: Path, tmp_path: Path) -> None:
    failing = FaultPlan(error=0.4, ops=frozenset({"get"}), keys=".tar")
    retry = RetryPolicy(retries=40, backoff_initial=0.001, backoff_max=0.001)
    source, units = _source(ds, _tier(ds, failing), tmp_path / "cache", 2, 2, retry)
    opened = {u: units.open_unit(u, must=True) for u in range(len(source.dataset.shards))}
    for u in opened:
        samples = source.dataset.shards[u].samples
        assert len(list(units.read(opened, [u] * samples, list(range(samples))))) == samples
    fetcher = source.fetcher
    assert fetcher is not None
    assert fetcher.peak_in_flight <= 2
    assert fetcher.peak_bytes <= 2 * 2 * RANGE
    for f in opened.values():
        assert f is not None
        f.close()
    units.close()


# --- the size check: beside the first ranges, never after a sample -----------------------------


class HeadAfterGetTier(WrappedTier):
    """Its size lookups of shards wait until a shard range read has started (10 s at most)."""

    def __init__(self, inner: Tier) -> None:
        super().__init__(inner)
        self.got = threading.Event()
        self.head_waited = False

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if key.endswith(".tar"):
            self.got.set()
        return self.inner.get(key, start, end)

    def head(self, key: str) -> ObjectInfo:
        if key.endswith(".tar"):
            self.head_waited = self.got.wait(timeout=10)
        return self.inner.head(key)


def test_the_first_ranges_are_on_their_way_while_the_size_is_checked(
    ds: Path, tmp_path: Path
) -> None:
    """A round trip for the size no longer delays the shard's first ranges or its record."""
    tier = HeadAfterGetTier(_tier(ds))
    source, units = _source(ds, tier, tmp_path / "cache", 2)
    opened = units.open_unit(0, must=True)
    assert isinstance(opened, StreamedShard)
    assert tier.head_waited  # a range read had started before the size came back
    samples = source.dataset.shards[0].samples
    got = list(units.read({0: opened}, [0] * samples, list(range(samples))))
    assert [s["__key__"] for s in got] == [e.key for e in source.index(0).samples]
    opened.close()
    units.close()


@pytest.mark.parametrize("change", ["longer", "shorter"])
def test_a_shard_of_the_wrong_size_is_refused_at_open_and_leaves_nothing(
    ds: Path, tmp_path: Path, change: str
) -> None:
    path = shard_path(ds, 1)
    data = path.read_bytes()
    path.write_bytes(data + b"\0" * 512 if change == "longer" else data[: RANGE + 512])
    cache = tmp_path / "cache"
    source, units = _source(ds, _tier(ds), cache, 2, retry=RetryPolicy(retries=0))
    with pytest.raises(ShardDamagedError, match=r"shard-000001\.tar.*the manifest says") as caught:
        units.open_unit(1, must=True)
    assert caught.value.shard == "shard-000001.tar"
    assert ("truncated" in str(caught.value)) == (change == "shorter")
    units.close()
    assert not list((cache / "tmp").iterdir())  # no partial download, no record
    assert not any(p.name.startswith(source.dataset.shards[1].sha256) for p in cache.rglob("*"))
    path.write_bytes(data)  # repaired: the lock was released, the shard reads again
    stream = StreamingDataset(_tier(ds), prefix="ds", cache_dir=cache)
    assert sorted(s["__key__"] for s in stream) == sorted(expected(N))


def test_a_shard_whose_ranges_all_match_waits_for_the_size_check_before_the_cache_keeps_it(
    ds: Path, tmp_path: Path
) -> None:
    """Every range of a longer object matches, and lands before the slow size check fails:
    the shard is refused, and refused again on the next open (never kept in the cache)."""
    path = shard_path(ds, 1)
    path.write_bytes(path.read_bytes() + b"\0" * 512)
    tier = SlowHeadTier(_tier(ds), seconds=1.0)
    cache = tmp_path / "cache"
    for _ in range(2):
        source, units = _source(ds, tier, cache, 4)
        with pytest.raises(ShardDamagedError, match="the manifest says"):
            units.open_unit(1, must=True)
        units.close()
        assert not list((cache / "tmp").iterdir())
        assert not (cache / "blobs" / source.dataset.shards[1].sha256).exists()
    assert tier.ranges_done_before_head  # the race this test is about did happen


class SlowHeadTier(WrappedTier):
    """Its size lookups of shards take ``seconds``; notes whether ranges were read meanwhile."""

    def __init__(self, inner: Tier, seconds: float) -> None:
        super().__init__(inner)
        self.seconds = seconds
        self.gets = 0
        self.ranges_done_before_head = False

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = self.inner.get(key, start, end)
        if key.endswith(".tar"):
            self.gets += 1
        return data

    def head(self, key: str) -> ObjectInfo:
        if key.endswith(".tar"):
            before = self.gets
            threading.Event().wait(self.seconds)  # the ranges (4 of 64 KiB) land meanwhile
            self.ranges_done_before_head = self.gets - before >= 4
        return self.inner.head(key)
