"""The shard cache: one download, atomic insert, bounded LRU, pins, altered entries caught."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mouthguard.data.fetching import cache as cache_module
from mouthguard.data.fetching.cache import ShardCache, ShardFile
from mouthguard.errors import ShardDamagedError

SIZE = 4096


def blob(i: int) -> bytes:
    return bytes([i % 251]) * SIZE


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Fetches:
    """A fetch function per object that counts its calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def of(self, data: bytes, *, deliver: bytes | None = None) -> Callable[[int], str]:
        def fetch(fd: int) -> str:
            self.calls.append(sha(data))
            out = data if deliver is None else deliver
            os.pwrite(fd, out, 0)
            return sha(out)

        return fetch


def get(cache: ShardCache, i: int, fetches: Fetches, *, must: bool = True) -> ShardFile | None:
    data = blob(i)
    return cache.open(sha(data), len(data), fetches.of(data), name=f"shard-{i}", must=must)


def test_a_miss_downloads_once_and_a_hit_reads_the_same_bytes(tmp_path: Path) -> None:
    cache, fetches = ShardCache(tmp_path, None, "stat"), Fetches()
    for _ in range(3):
        file = get(cache, 1, fetches)
        assert file is not None and file.read(0, SIZE) == blob(1)
        file.close()
    assert fetches.calls == [sha(blob(1))]


def test_stat_mode_hashes_once_always_mode_every_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[int] = []
    real = cache_module.hash_fd
    monkeypatch.setattr(cache_module, "hash_fd", lambda fd, n: hashed.append(n) or real(fd, n))
    fetches = Fetches()
    for mode, expected in (("stat", 0), ("always", 3)):
        hashed.clear()
        cache = ShardCache(tmp_path / mode, None, mode)  # type: ignore[arg-type]
        for _ in range(4):  # the first open downloads (hashed inline), three hits follow
            file = get(cache, 2, fetches)
            assert file is not None
            file.close()
        assert len(hashed) == expected, mode


def test_an_altered_entry_is_detected_and_downloaded_again(tmp_path: Path) -> None:
    cache, fetches = ShardCache(tmp_path, None, "stat"), Fetches()
    file = get(cache, 3, fetches)
    assert file is not None
    file.close()
    entry = tmp_path / "blobs" / sha(blob(3))
    with entry.open("r+b") as f:  # same size, one byte changed: a filesystem write
        f.seek(100)
        f.write(b"\xff")
    file = get(cache, 3, fetches)
    assert file is not None and file.read(0, SIZE) == blob(3)
    file.close()
    assert len(fetches.calls) == 2


def test_a_download_that_does_not_match_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    """Downloaded twice (the object may have been read mid-overwrite), then refused."""
    cache = ShardCache(tmp_path, None, "stat")
    fetches = Fetches()
    fetch = fetches.of(blob(4), deliver=blob(5))
    with pytest.raises(ShardDamagedError, match="shard-4") as caught:
        cache.open(sha(blob(4)), SIZE, fetch, name="shard-4", must=True)
    assert caught.value.shard == "shard-4"
    assert len(fetches.calls) == 2
    assert not list((tmp_path / "blobs").iterdir()) and not list((tmp_path / "tmp").iterdir())


def test_a_download_that_matches_the_second_time_is_kept(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, None, "stat")
    sent: list[bytes] = [blob(5), blob(4)]  # damaged on its way once, then intact

    def fetch(fd: int) -> str:
        out = sent.pop(0)
        os.pwrite(fd, out, 0)
        return sha(out)

    file = cache.open(sha(blob(4)), SIZE, fetch, name="shard-4", must=True)
    assert file is not None
    assert file.read(0, SIZE) == blob(4)
    assert not sent
    file.close()


def test_the_limit_evicts_least_recently_used_first(tmp_path: Path) -> None:
    cache, fetches = ShardCache(tmp_path, 3 * SIZE, "stat"), Fetches()
    for i in range(3):
        file = get(cache, i, fetches)
        assert file is not None
        file.close()
        time.sleep(0.01)  # distinct last-use times
    file = get(cache, 0, fetches)  # 0 becomes the most recently used
    assert file is not None
    file.close()
    file = get(cache, 3, fetches)  # evicts 1, the least recently used
    assert file is not None
    file.close()
    present = {p.name for p in (tmp_path / "blobs").iterdir() if not p.name.endswith(".ok")}
    assert present == {sha(blob(i)) for i in (0, 2, 3)}
    assert cache.held_bytes() <= 3 * SIZE


def test_pinned_entries_survive_and_a_prefetch_never_overshoots(tmp_path: Path) -> None:
    cache, fetches = ShardCache(tmp_path, 2 * SIZE, "stat"), Fetches()
    pinned = [get(cache, i, fetches) for i in range(2)]
    assert get(cache, 2, fetches, must=False) is None  # no room: a prefetch gives up
    assert cache.held_bytes() == 2 * SIZE
    extra = get(cache, 2, fetches)  # needed now: over the limit by this one shard
    assert extra is not None and cache.held_bytes() == 3 * SIZE
    for file in pinned:
        assert file is not None and file.read(0, SIZE)  # still readable
        file.close()
    extra.close()
    file = get(cache, 3, fetches)  # now everything is unpinned: back under the limit
    assert file is not None
    file.close()
    assert cache.held_bytes() <= 2 * SIZE


def test_a_dead_download_is_collected(tmp_path: Path) -> None:
    cache, fetches = ShardCache(tmp_path, 2 * SIZE, "stat"), Fetches()
    (tmp_path / "tmp" / "abc.12345.deadbeef").write_bytes(bytes(SIZE))  # nobody holds its lock
    file = get(cache, 1, fetches)
    assert file is not None
    file.close()
    assert not (tmp_path / "tmp" / "abc.12345.deadbeef").exists()


def _open_in_child(root: str, log: str, barrier: object) -> None:
    def fetch(fd: int) -> str:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.2)  # a slow download: the others must wait for it, not start their own
        os.pwrite(fd, blob(9), 0)
        return sha(blob(9))

    barrier.wait()  # type: ignore[attr-defined]
    file = ShardCache(root, None, "stat").open(sha(blob(9)), SIZE, fetch, name="s", must=True)
    assert file is not None and file.read(0, SIZE) == blob(9)
    file.close()


def test_processes_sharing_the_cache_download_once(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(4)
    log = tmp_path / "fetches.log"
    procs = [
        ctx.Process(target=_open_in_child, args=(str(tmp_path / "c"), str(log), barrier))
        for _ in range(4)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert len(log.read_text().split()) == 1


def test_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="verify_cache"):
        ShardCache(tmp_path, None, "never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cache_limit"):
        ShardCache(tmp_path, -1, "stat")


def _live_until(ready: object, release: object) -> None:
    ready.set()  # type: ignore[attr-defined]
    release.wait(30)  # type: ignore[attr-defined]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads running
def test_a_worker_forked_during_a_download_does_not_keep_its_lock(tmp_path: Path) -> None:
    """A DataLoader worker forked while a download holds the entry's lock must not pin it."""
    cache = ShardCache(tmp_path, None, "stat")
    data = blob(5)
    reservation = cache.open_or_reserve(sha(data), SIZE, name="s", must=True)
    assert isinstance(reservation, cache_module.Reservation)
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_live_until, args=(ready, release))
    child.start()
    try:
        assert ready.wait(30)  # the child runs: its fork handlers have run
        reservation.abandon()  # the download gave up: the lock is free again
        got: list[object] = []
        again = threading.Thread(
            target=lambda: got.append(cache.open_or_reserve(sha(data), SIZE, name="s", must=True))
        )
        again.start()
        again.join(timeout=10)
        assert not again.is_alive(), "the forked child still holds the download lock"
        (second,) = got
        assert isinstance(second, cache_module.Reservation)
        second.abandon()
    finally:
        release.set()
        child.join(30)
    assert child.exitcode == 0
