"""The snapshot cache: requests never wait for the tiers after the first read."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.dashboard import snapshot_cache as cache_module
from mouthguard.dashboard.snapshot_cache import SnapshotCache
from mouthguard.errors import TierError


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> mouthguard.Store:
    store = mouthguard.open_store(tmp_path / "store")
    mouthguard.Checkpointer(store, "r", background=False).save(1, {"w": torch.ones(4)})
    return store


def _save(store: mouthguard.Store, step: int) -> None:
    mouthguard.Checkpointer(store, "r", background=False).save(step, {"w": torch.ones(4)})


def test_fresh_snapshots_are_reused_stale_ones_replaced(store: mouthguard.Store) -> None:
    clock = Clock()
    cache = SnapshotCache(store, max_age=10.0, monotonic=clock, background=False)
    first = cache.latest()
    assert [r["step"] for r in first.rows] == [1]
    _save(store, 2)
    clock.now += 9.9
    assert cache.latest() is first  # younger than max_age: not read again
    clock.now += 0.1
    assert [r["step"] for r in cache.latest().rows] == [1, 2]


def test_a_stale_snapshot_is_served_while_a_thread_reads_again(
    store: mouthguard.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    cache = SnapshotCache(store, max_age=1.0, monotonic=clock)
    first = cache.latest()
    _save(store, 2)
    started: list[object] = []

    class Recorder:
        def __init__(self, target: object, daemon: bool) -> None:
            assert daemon
            started.append(target)

        def start(self) -> None:
            pass  # the test runs the refresh itself, below

    # Only the cache's own threads (nothing else runs during the next three calls).
    monkeypatch.setattr(cache_module.threading, "Thread", Recorder)
    clock.now += 5
    assert cache.latest() is first  # stale, but served at once
    assert cache.latest() is first and len(started) == 1  # one refresh at a time
    monkeypatch.undo()
    refresh = started[0]
    assert callable(refresh)
    refresh()
    assert [r["step"] for r in cache.latest().rows] == [1, 2]


def test_a_failed_refresh_keeps_the_previous_snapshot(
    store: mouthguard.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    cache = SnapshotCache(store, max_age=1.0, monotonic=clock, background=False)
    first = cache.latest()

    def fail(*_args: object, **_kwargs: object) -> object:
        raise TierError("the durable tier is down")

    monkeypatch.setattr(cache_module, "take_snapshot", fail)
    clock.now += 5
    assert cache.latest() is first
    monkeypatch.undo()
    clock.now += 5
    assert cache.latest() is not first


def test_the_policy_judges_at_the_injected_time(store: mouthguard.Store) -> None:
    when = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    cache = SnapshotCache(store, now=lambda: when, background=False)
    assert cache.latest().taken_at == when


def test_max_age_must_not_be_negative(store: mouthguard.Store) -> None:
    with pytest.raises(ValueError, match="max_age"):
        SnapshotCache(store, max_age=-1)
