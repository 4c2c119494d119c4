"""Following another opener's range-by-range verification of a shard read in place."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data.fetching.cache import ShardFile
from mouthguard.data.fetching.cachefiles import stat_key
from mouthguard.data.fetching.follow import FollowedShard
from mouthguard.data.fetching.inplace import InPlaceShard
from mouthguard.data.fetching.inplacefollow import RangeProgress, progress_path
from mouthguard.data.fetching.verified import VerifiedFiles
from mouthguard.errors import ShardDamagedError
from mouthguard.io.forklocks import close_lock_file, try_lock

from .test_inplace import RANGE, RANGES, Gate, open_ranges, part_of, shard, table_of

__all__ = ["shard"]  # the fixture, shared with test_inplace


def read_in_thread(
    handle: ShardFile, offset: int, length: int
) -> tuple[threading.Thread, list[Any]]:
    """Start ``handle.read`` on a thread; its result (or error) lands in the list."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(handle.read(offset, length))
        except ShardDamagedError as exc:
            got.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


def open_as(files: VerifiedFiles, path: Path, data: bytes) -> ShardFile | None:
    """``path`` opened as the shard whose manifest records ``data`` (its sha256 and ranges)."""
    fd = os.open(path, os.O_RDONLY)
    handle = files.open_ranges(fd, str(path), part_of(path, data), table_of(data))
    if handle is None:
        os.close(fd)
    return handle


def verifier_and_follower(
    files: VerifiedFiles, shard: Path, data: bytes, gate: Gate
) -> tuple[InPlaceShard, FollowedShard]:
    """A verifier held by ``gate``, and a second opener of the same shard following it."""
    verifier = open_as(files, shard, data)
    assert isinstance(verifier, InPlaceShard)
    assert gate.waiting.wait(timeout=10)  # the ranges before the gate matched
    follower = open_as(files, shard, data)
    assert isinstance(follower, FollowedShard)  # it does not wait for the whole shard
    return verifier, follower


def leftovers(files: VerifiedFiles) -> list[str]:
    return sorted(p.name for p in files.root.glob("*.progress*"))


def test_a_follower_reads_each_range_once_the_verifier_matched_it(
    shard: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = VerifiedFiles(tmp_path / "record", "stat")
    data = shard.read_bytes()
    gate = Gate(monkeypatch, held=2)  # ranges 0 and 1 match; 2 is held
    verifier, follower = verifier_and_follower(files, shard, data, gate)
    assert follower.read(0, 2 * RANGE) == data[: 2 * RANGE]
    thread, got = read_in_thread(follower, 2 * RANGE, 10)
    thread.join(timeout=0.3)
    assert thread.is_alive() and not got  # range 2 has not matched yet
    gate.open()
    thread.join(timeout=10)
    assert got == [data[2 * RANGE : 2 * RANGE + 10]]
    assert follower.read(0, len(data)) == data
    verifier.read(0, len(data))
    verifier.close()
    follower.close()
    assert sorted(gate.hashed) == list(range(RANGES))  # each range hashed once, by the verifier
    assert len(list(files.root.glob("*.ok"))) == 1
    assert leftovers(files) == []  # the progress record goes with the verification


def test_a_follower_meets_a_damaged_range_as_the_verifier_does(
    shard: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = VerifiedFiles(tmp_path / "record", "stat")
    data = shard.read_bytes()
    damaged = bytearray(data)
    damaged[3 * RANGE + 5] ^= 1
    shard.write_bytes(bytes(damaged))
    gate = Gate(monkeypatch, held=1)
    verifier, follower = verifier_and_follower(files, shard, data, gate)
    assert follower.read(0, 10) == data[:10]  # range 0 matched
    thread, got = read_in_thread(follower, 3 * RANGE, 10)
    gate.open()  # the verifier meets range 3, gives up and lets go of the lock
    thread.join(timeout=10)
    # The follower then checks the file itself: the whole file's sha256 does not match.
    assert len(got) == 1 and isinstance(got[0], ShardDamagedError)
    assert got[0].shard == shard.name
    with pytest.raises(ShardDamagedError, match="range 3"):
        verifier.read(3 * RANGE, 10)
    verifier.close()
    follower.close()
    assert not list(files.root.glob("*.ok")) and leftovers(files) == []


def _verifying_by_hand(files: VerifiedFiles, shard: Path) -> tuple[int, RangeProgress]:
    """Another process's verification, by hand: its lock taken, range 0 marked matched."""
    data = shard.read_bytes()
    record, lock_path = files.paths(str(shard), part_of(shard, data))
    lock = try_lock(lock_path)
    assert lock is not None
    fd = os.open(shard, os.O_RDONLY)
    key = stat_key(fd)
    os.close(fd)
    progress = RangeProgress(progress_path(record), len(table_of(data).sha256), key)
    progress.matched(0)
    return lock, progress


def test_a_follower_whose_verifier_died_verifies_the_shard_itself(
    shard: Path, tmp_path: Path
) -> None:
    files = VerifiedFiles(tmp_path / "record", "stat")
    data = shard.read_bytes()
    lock, _ = _verifying_by_hand(files, shard)
    follower = open_ranges(files, shard, table_of(data))
    assert isinstance(follower, FollowedShard)
    assert follower.read(0, 10) == data[:10]
    thread, got = read_in_thread(follower, RANGE, 10)
    thread.join(timeout=0.3)
    assert thread.is_alive()
    close_lock_file(lock)  # killed: the lock goes, the record stays half written
    thread.join(timeout=10)
    assert got == [data[RANGE : RANGE + 10]]
    follower.close()
    assert len(list(files.root.glob("*.ok"))) == 1  # it hashed the file and said so
    assert leftovers(files) == []  # and removed the killed verifier's record


def test_the_record_of_a_file_since_changed_is_not_followed(shard: Path, tmp_path: Path) -> None:
    files = VerifiedFiles(tmp_path / "record", "stat")
    data = shard.read_bytes()
    lock, _ = _verifying_by_hand(files, shard)
    shard.write_bytes(data)  # the same bytes, written again: another stat key
    got: list[ShardFile | None] = []
    opener = threading.Thread(target=lambda: got.append(open_ranges(files, shard, table_of(data))))
    opener.start()
    opener.join(timeout=0.3)
    assert opener.is_alive()  # no record of this file's state: it waits for the lock
    close_lock_file(lock)
    opener.join(timeout=10)
    assert got == [None]  # hashed whole by the opener, then trusted
    assert leftovers(files) == []  # the record of the earlier state went with it


def test_a_follower_stops_looking_at_the_record_once_its_ranges_matched(
    shard: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verified range never changes: reads within the verified prefix cost no look."""
    files = VerifiedFiles(tmp_path / "record", "stat")
    data = shard.read_bytes()
    gate = Gate(monkeypatch, held=RANGES - 1)  # all but the last range match
    verifier, follower = verifier_and_follower(files, shard, data, gate)
    looks: list[int] = []
    real = os.pread

    def counting(fd: int, size: int, offset: int) -> bytes:
        if size == RANGES and offset == 0:  # a look at the whole record
            looks.append(fd)
        return real(fd, size, offset)

    monkeypatch.setattr(os, "pread", counting)
    for offset in range(0, (RANGES - 1) * RANGE, 1000):  # 17 reads within ranges 0-3
        assert follower.read(offset, 10) == data[offset : offset + 10]
    assert len(looks) == 1
    gate.open()
    assert follower.read(len(data) - 10, 10) == data[-10:]  # the last range, once it matched
    verifier.close()
    follower.close()
