"""Ranged reads with retries: transient failures retried, then an error naming the bytes.

The reads go to a real local tier through the fault-injection tier; the waits
between tries are recorded instead of slept (``wait=``), so nothing here
depends on time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from mouthguard.data.fetching.ranged import RangeReadError, ShortReadError, get_range, read_ranges
from mouthguard.errors import ObjectNotFoundError, ShardDamagedError
from mouthguard.tiers import Tier
from mouthguard.tiers.faults import FaultPlan, FaultyTier
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.retry import RetryPolicy
from mouthguard.tiers.wrapper import WrappedTier

BLOB = bytes(range(256)) * 64  # 16 KiB


class Truncating(WrappedTier):
    """Its first ``times`` reads return only half the bytes asked for (a truncated body)."""

    def __init__(self, inner: Tier, times: int) -> None:
        super().__init__(inner)
        self.times = times
        self.reads = 0
        self._lock = threading.Lock()

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = self.inner.get(key, start, end)
        with self._lock:
            self.reads += 1
            short = self.reads <= self.times
        return data[: len(data) // 2] if short else data


@pytest.fixture
def local(tmp_path: Path) -> LocalTier:
    tier = LocalTier(tmp_path)
    tier.put("ds/blob", BLOB)
    return tier


def _recorder() -> tuple[list[float], Callable[[float], bool]]:
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        return True

    return waits, wait


def test_transient_failures_are_retried_until_a_try_succeeds(local: LocalTier) -> None:
    # One caller, so the seeded draws fall on the same tries every run: 3 failures, then success.
    tier = FaultyTier(local, FaultPlan(error=0.6), seed=1)
    waits, wait = _recorder()
    got = get_range(tier, "ds/blob", 100, 5000, where="ds", retry=RetryPolicy(10), wait=wait)
    assert got == BLOB[100:5000]
    assert tier.injected["error"] == len(waits) >= 1


def test_the_last_failure_names_the_dataset_shard_and_bytes(local: LocalTier) -> None:
    tier = FaultyTier(local, FaultPlan(error=1.0))
    waits, wait = _recorder()
    with pytest.raises(RangeReadError) as caught:
        get_range(
            tier,
            "ds/blob",
            512,
            1024,
            where="s3://b/ds: shard s-0.tar",
            retry=RetryPolicy(2),
            wait=wait,
        )
    assert str(caught.value).startswith(
        "s3://b/ds: shard s-0.tar: bytes 512 to 1024 of ds/blob could not be read (3 tries; "
        "the last failed with: injected I/O error"
    )
    assert tier.injected["error"] == 3
    assert len(waits) == 2
    assert 0.025 <= waits[0] <= 0.05 and 0.05 <= waits[1] <= 0.1  # doubling, jittered


def test_a_short_read_is_retried(local: LocalTier) -> None:
    tier = Truncating(local, times=2)
    waits, wait = _recorder()
    assert get_range(tier, "ds/blob", 0, 4096, where="ds", wait=wait) == BLOB[:4096]
    assert tier.reads == 3
    assert len(waits) == 2
    always = Truncating(local, times=100)
    with pytest.raises(
        RangeReadError, match=r"\(4 tries; the last failed with: short read"
    ) as caught:
        get_range(always, "ds/blob", 0, 4096, where="ds", wait=wait)
    assert isinstance(caught.value.__cause__, ShortReadError)
    # Short on every try, in a whole read: the object is shorter than the manifest says.
    with pytest.raises(ShardDamagedError, match=r"s-0\.tar: short read at byte 0"):
        list(
            read_ranges(
                Truncating(local, times=100), "ds/blob", 4096, shard="s-0.tar", retry=RetryPolicy(0)
            )
        )


def test_a_missing_object_is_not_retried(local: LocalTier) -> None:
    waits, wait = _recorder()
    with pytest.raises(ObjectNotFoundError):
        get_range(local, "ds/nothing", 0, 10, where="ds", wait=wait)
    assert waits == []


def test_a_wait_that_says_stop_ends_the_retries(local: LocalTier) -> None:
    tier = FaultyTier(local, FaultPlan(error=1.0))
    with pytest.raises(RangeReadError, match=r"\(1 try; "):
        get_range(tier, "ds/blob", 0, 10, where="ds", wait=lambda _: False)
    assert tier.injected["error"] == 1


def test_a_whole_read_survives_transient_failures(local: LocalTier) -> None:
    tier = FaultyTier(local, FaultPlan(error=0.3), seed=5)
    chunks = read_ranges(
        tier,
        "ds/blob",
        len(BLOB),
        shard="s",
        range_size=1024,
        parallel=3,
        retry=RetryPolicy(30, 0.001, 0.001),
    )
    assert b"".join(data for _, data in chunks) == BLOB
    assert tier.injected["error"] >= 1
