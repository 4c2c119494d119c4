"""ThrottledTier: a transparent decorator (conformance suite) that really paces writes."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mouthguard.testing.conformance import MiB, TierConformance, payload
from mouthguard.tiers.base import ObjectInfo, PutData, PutMode, Tier, iter_buffers
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.memory import MemoryTier
from mouthguard.tiers.throttle import MAX_PIECE_BYTES, ThrottledTier
from tests.fake_clock import FakeClock

# Fast enough that the conformance suite (5 MiB at most per put) is not slowed down.
FAST = 1e10


class TestThrottledMemoryTier(TierConformance):
    @pytest.fixture
    def make_tier(self) -> Callable[[], Tier]:
        return lambda: ThrottledTier(MemoryTier(), FAST)


class TestThrottledLocalTier(TierConformance):
    @pytest.fixture
    def make_tier(self, tmp_path: Path) -> Callable[[], Tier]:
        return lambda: ThrottledTier(LocalTier(tmp_path / "root"), FAST)


class RecordingTier(MemoryTier):
    """Remembers the size of every piece a put received."""

    def __init__(self) -> None:
        super().__init__(name="rec", domain="rack-7")
        self.pieces: list[int] = []

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        chunks = [bytes(c) for c in iter_buffers(data)]
        self.pieces.extend(len(c) for c in chunks)
        return super().put(key, chunks, mode=mode)


def test_paces_writes() -> None:
    clock = FakeClock()
    tier = ThrottledTier(MemoryTier(), 10e6, clock=clock)
    started = clock.monotonic()
    tier.put("blob", payload(2_000_000))
    # 2 MB at 10 MB/s: 0.2 s, slept one piece (at most 1 MiB) at a time.
    assert math.isclose(clock.monotonic() - started, 0.2)
    assert len(clock.slept) == math.ceil(2_000_000 / MAX_PIECE_BYTES)
    assert max(clock.slept) <= MAX_PIECE_BYTES / 10e6


def test_paced_stream_of_many_chunks() -> None:
    data = payload(3 * MiB + 5, seed=3)
    clock = FakeClock()
    tier = ThrottledTier(MemoryTier(), 30 * MiB, clock=clock)
    started = clock.monotonic()
    tier.put("blob", (data[i : i + 100_000] for i in range(0, len(data), 100_000)))
    assert math.isclose(clock.monotonic() - started, len(data) / (30 * MiB))  # ~0.1 s
    assert tier.get("blob") == data


class _DiskOnClock(MemoryTier):
    """A memory tier that takes ``nbytes / rate`` seconds of ``clock`` to store each chunk."""

    def __init__(self, clock: FakeClock, rate: float) -> None:
        super().__init__()
        self.clock, self.rate = clock, rate

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        def written() -> Iterator[memoryview]:
            for chunk in iter_buffers(data):
                yield chunk
                self.clock.advance(chunk.nbytes / self.rate)

        return super().put(key, written(), mode=mode)


def test_time_spent_by_the_inner_tier_counts_towards_the_budget() -> None:
    """A slow disk is not slowed down twice: pacing sleeps only what is left."""
    clock = FakeClock()
    tier = ThrottledTier(_DiskOnClock(clock, 20e6), 10e6, clock=clock)
    started = clock.monotonic()
    tier.put("blob", payload(2_000_000))
    # 0.1 s writing plus 0.1 s asleep: 10 MB/s overall, not 0.1 s + 0.2 s.
    assert math.isclose(clock.monotonic() - started, 0.2)
    assert math.isclose(sum(clock.slept), 0.1)


def test_a_tier_slower_than_the_rate_is_never_slept_on() -> None:
    clock = FakeClock()
    ThrottledTier(_DiskOnClock(clock, 5e6), 10e6, clock=clock).put("blob", payload(2_000_000))
    assert clock.slept == []


def test_splits_large_chunks_into_pieces() -> None:
    inner = RecordingTier()
    data = payload(3 * MiB + 17, seed=1)
    ThrottledTier(inner, FAST).put("big", data)
    assert max(inner.pieces) <= MAX_PIECE_BYTES
    assert len(inner.pieces) == 4
    assert sum(inner.pieces) == len(data)
    assert inner.get("big") == data


def test_presents_the_inner_tier() -> None:
    inner = RecordingTier()
    tier = ThrottledTier(inner, 1e6)
    assert (tier.name, tier.domain) == ("rec", "rack-7")
    assert tier.capabilities == inner.capabilities
    assert tier.location("a/b/") == inner.location("a/b/")
    assert tier.inner is inner
    assert "ThrottledTier" in repr(tier)
    assert "rec" in repr(tier)


def test_delegates_reads_and_metadata_unpaced() -> None:
    inner = MemoryTier()
    inner.put("run/x", payload(4 * MiB))
    tier = ThrottledTier(inner, 1.0)  # 1 B/s: any paced read would never finish
    assert tier.get("run/x", 0, 4) == inner.get("run/x", 0, 4)
    out = bytearray(8)
    tier.read_into("run/x", 10, memoryview(out))
    assert bytes(out) == inner.get("run/x", 10, 18)
    assert tier.head("run/x").size == 4 * MiB
    assert tier.exists("run/x")
    assert list(tier.list("run/")) == ["run/x"]
    assert tier.list_dirs("") == ["run"]
    tier.rename_prefix("run", "moved")
    assert inner.exists("moved/x")
    assert tier.delete_prefix("moved/") == 1
    assert not tier.delete("moved/x")


@pytest.mark.parametrize("rate", [0, -1.0, math.inf, math.nan])
def test_rejects_bad_rates(rate: float) -> None:
    with pytest.raises(ValueError, match="write_bytes_per_second"):
        ThrottledTier(MemoryTier(), rate)


def test_the_wrapper_forwards_hints_and_debris_collection(tmp_path: Path) -> None:
    inner = LocalTier(tmp_path / "root")
    tier = ThrottledTier(inner, FAST)
    tier.put("a/b", b"x")
    stored = tier.annotate("a/b", {"importance": "critical"})
    # Whatever the filesystem can keep, the wrapper reports exactly what the inner tier does.
    assert stored == bool(inner.annotations("a/b"))
    assert tier.annotations("a/b") == inner.annotations("a/b")
    assert tier.set_legal_hold("a/b", True) is inner.set_legal_hold("a/b", True)
    assert tier.collect_incomplete("a/", 0.0) == 0
