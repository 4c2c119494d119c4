"""Readers sharing a cache hand a streamed shard over without ever waiting on each other for good.

The shape of the deadlock these tests hold (seen once with 4 DataLoader workers
on S3): worker A streams a shard and holds its download lock; one of its range
reads fails; A's own reader would meet that error only when it reaches the
range, but A is not asking (its next batch is not due while the batch before it
waits in worker B), and B waits for the shard A holds. Everything here runs on
a real cache directory, real locks, a local tier wrapped to be slow or to fail
one range, and in the last test two real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import mouthguard
import mouthguard.data.fetching.fetch as fetch_module
import mouthguard.data.fetching.follow as follow_module
from mouthguard.data import open_dataset
from mouthguard.data.fetching.cache import Reservation, ShardCache, ShardFile
from mouthguard.data.fetching.fetch import ReadSettings, ShardSource
from mouthguard.data.fetching.follow import FollowedShard
from mouthguard.data.fetching.rangefetch import RangeFetcher
from mouthguard.data.fetching.streamed import StreamedShard
from mouthguard.data.reading.tarread import TarUnits
from mouthguard.errors import TierError
from mouthguard.tiers import Tier
from mouthguard.tiers.faults import FaultPlan, FaultyTier
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.wrapper import WrappedTier

from ..helpers import expected, write_dataset

RANGE = 64 * 1024
N = 2000  # about 3 MB: shards of 1 MiB, 16 ranges each (the last one shorter)
SRC = Path(mouthguard.__file__).resolve().parents[1]
#: Longest a reader may take here; only reached when it hangs (then the test fails).
HANG = 120


class FailingTail(WrappedTier):
    """Every read of ``key`` that reaches byte ``start`` or later fails (the last range)."""

    def __init__(self, inner: Tier, key: str, start: int) -> None:
        super().__init__(inner)
        self.key, self.start = key, start
        self.failed = threading.Event()

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if key == self.key and (end is None or end > self.start):
            self.failed.set()
            raise TierError(f"{key}: injected failure at byte {self.start}")
        return self.inner.get(key, start, end)


def _last_needed(ds: Path) -> int:
    """The last range of shard 0 a sample touches (later ones hold only the tar's end)."""
    dataset = open_dataset(LocalTier(ds.parent), prefix="ds")
    index = dataset.read_index(dataset.shards[0])
    return (max(e.offset + e.length for e in index.samples) - 1) // RANGE


@pytest.fixture
def ds(tmp_path: Path) -> Path:
    write_dataset(tmp_path, n=N, shard_size=1024 * 1024, range_size=RANGE)
    return tmp_path / "ds"


def _slow(ds: Path) -> Tier:
    plan = FaultPlan(delay=1.0, delay_seconds=0.02, ops=frozenset({"get"}), keys=".tar")
    return FaultyTier(LocalTier(ds.parent), plan, seed=3)


def _source(tier: Tier, cache: Path, parallel: int = 1) -> tuple[ShardSource, TarUnits]:
    dataset = open_dataset(tier, prefix="ds")
    source = ShardSource(dataset, ShardCache(cache, None, "stat"), ReadSettings(parallel=parallel))
    return source, TarUnits(source)


def _read_all_in_thread(units: TarUnits, opened: ShardFile, count: int) -> list[str]:
    """Every sample of shard 0 through ``opened``, read on a thread that must end in time."""
    keys: list[str] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            got = units.read({0: opened}, [0] * count, list(range(count)))
            keys.extend(str(s["__key__"]) for s in got)
        except BaseException as exc:  # re-raised below, in the test
            errors.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=HANG)
    assert not thread.is_alive(), "the reader hung waiting on another reader's shard"
    if errors:
        raise errors[0]
    return keys


def test_a_failed_range_is_handed_over_while_its_reader_is_not_asking(
    ds: Path, tmp_path: Path
) -> None:
    """A streams shard 0 and its read of the last range fails; A's reader never asks.
    B, following A's stream, reads the ranges A verified and the rest itself."""
    cache = tmp_path / "cache"
    dataset = open_dataset(LocalTier(ds.parent), prefix="ds")
    record = dataset.shards[0]
    assert record.ranges is not None
    failing = FailingTail(_slow(ds), dataset.shard_key(record), _last_needed(ds) * RANGE)
    _, units_a = _source(failing, cache)
    source_b, units_b = _source(LocalTier(ds.parent), cache, parallel=2)
    first = units_a.open_unit(0, must=True)
    assert isinstance(first, StreamedShard)
    second = units_b.open_unit(0, must=True)
    assert isinstance(second, FollowedShard)  # A's record was there: B follows it
    keys = _read_all_in_thread(units_b, second, record.samples)
    assert keys == [e.key for e in source_b.index(0).samples]
    assert failing.failed.is_set()
    # The samples need no more; the tar's end and any range still on its way in the
    # background are read too, so that B's download is whole before it is closed (a
    # shard closed before it is whole is dropped, by design; a loaded machine showed it).
    assert len(second.read(0, record.size)) == record.size
    # A's own reader still gets the samples before the failed range, then its error.
    with pytest.raises(TierError, match="injected failure"):
        list(units_a.read({0: first}, [0] * record.samples, list(range(record.samples))))
    for handle in (first, second):
        handle.close()
    units_a.close()
    units_b.close()
    assert not list((cache / "tmp").iterdir())
    assert (cache / "blobs" / record.sha256).exists()  # B's download became the entry


def test_a_reader_that_finds_the_lock_taken_before_the_record_follows_once_it_appears(
    ds: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window between taking the download lock and writing the record: B, arriving
    in it, keeps looking for the record and follows it, instead of waiting on the lock
    for the whole shard."""
    cache = tmp_path / "cache"
    source_b, units_b = _source(LocalTier(ds.parent), cache)
    record = source_b.dataset.shards[0]
    assert record.ranges is not None
    looked = threading.Semaphore(0)
    real_follow = follow_module.follow

    def counted(*args: object, **kwargs: object) -> FollowedShard | None:
        found = real_follow(*args, **kwargs)  # type: ignore[arg-type]
        looked.release()
        return found

    monkeypatch.setattr(fetch_module, "follow", counted)
    # A takes the lock; its record does not exist yet.
    reservation = ShardCache(cache, None, "stat").open_or_reserve(
        record.sha256, record.size, name=record.name, must=True
    )
    assert isinstance(reservation, Reservation)
    opened: list[ShardFile | None] = []
    thread = threading.Thread(
        target=lambda: opened.append(units_b.open_unit(0, must=True)), daemon=True
    )
    thread.start()
    for _ in range(2):  # B looked once, found the lock taken and looked again
        assert looked.acquire(timeout=HANG)
    fetcher = RangeFetcher(1)
    key = source_b.dataset.shard_key(record)
    streaming = StreamedShard(reservation, record.ranges, fetcher, _slow(ds), key)
    thread.join(timeout=HANG)
    assert not thread.is_alive(), "B waited on the lock instead of following"
    second = opened[0]
    assert isinstance(second, FollowedShard)
    keys = _read_all_in_thread(units_b, second, record.samples)
    assert keys == [e.key for e in source_b.index(0).samples]
    # The tar's end holds no sample: A reads it too, so that its download is whole
    # before it is closed (a shard closed before it is whole is dropped, by design).
    assert len(streaming.read(0, record.size)) == record.size
    second.close()
    streaming.close()
    fetcher.close()
    units_b.close()
    assert (cache / "blobs" / record.sha256).exists()


#: Process A: streams the dataset, takes one sample, then stops asking (stays alive,
#: holding its shard) until its stdin closes. argv: dataset root, cache, failing key
#: ("" for none), first failing byte.
STOPPED_CONSUMER = """
import sys
from mouthguard.data import StreamingDataset
from mouthguard.errors import TierError
from mouthguard.tiers.faults import FaultPlan, FaultyTier
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.wrapper import WrappedTier

root, cache, failing, at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

class FailingTail(WrappedTier):
    def get(self, key, start=0, end=None):
        if key == failing and (end is None or end > at):
            raise TierError(f"{key}: injected failure at byte {at}")
        return self.inner.get(key, start, end)

plan = FaultPlan(delay=1.0, delay_seconds=0.02, ops=frozenset({"get"}), keys=".tar")
tier = FailingTail(FaultyTier(LocalTier(root), plan, seed=3))
stream = StreamingDataset(tier, prefix="ds", cache_dir=cache, range_parallel=1, prefetch=0)
it = iter(stream)
next(it)
print("streaming", flush=True)
sys.stdin.read()
"""

#: Process B: every sample of the dataset through the same cache; prints their keys.
WHOLE_READER = """
import sys
from mouthguard.data import StreamingDataset
from mouthguard.tiers.local import LocalTier

stream = StreamingDataset(LocalTier(sys.argv[1]), prefix="ds", cache_dir=sys.argv[2])
for sample in stream:
    print(sample["__key__"])
"""


def _env() -> dict[str, str]:
    # The child imports this checkout, whatever the terminal running the tests set.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(SRC)}


@pytest.mark.parametrize("fail_last_range", [False, True])
def test_a_process_that_stops_consuming_never_starves_another(
    ds: Path, tmp_path: Path, fail_last_range: bool
) -> None:
    """Two processes, one cache: A streams shard 0 and stops asking for samples (alive);
    B needs every sample, shard 0's included, and gets them all -- also when A's read
    of shard 0's last range fails (the deadlock seen with DataLoader workers)."""
    cache = tmp_path / "cache"
    dataset = open_dataset(LocalTier(ds.parent), prefix="ds")
    record = dataset.shards[0]
    assert record.ranges is not None
    last = _last_needed(ds) * RANGE
    failing = dataset.shard_key(record) if fail_last_range else ""
    root = str(ds.parent)
    a = subprocess.Popen(
        [sys.executable, "-c", STOPPED_CONSUMER, root, str(cache), failing, str(last)],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert a.stdout is not None
        assert a.stdout.readline().strip() == "streaming"
        try:
            b = subprocess.run(
                [sys.executable, "-c", WHOLE_READER, root, str(cache)],
                env=_env(),
                capture_output=True,
                text=True,
                timeout=HANG,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail("B hung waiting on the shard A streams and stopped consuming")
        assert b.returncode == 0, b.stderr
        assert sorted(b.stdout.split()) == sorted(expected(N))
        assert a.poll() is None  # A was alive (and not asking) all along
    finally:
        a.kill()
        a.wait(timeout=60)
