"""The shard cache's file primitives: hashes that never accept a wrong size, stamps, locks."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest

from mouthguard.data.fetching import cachefiles
from mouthguard.data.fetching.cachefiles import (
    WRITE_PIECE,
    hash_fd,
    hash_range,
    read_stamp,
    stat_key,
    write_at,
)


def _open(path: Path, data: bytes) -> int:
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def test_hash_fd_is_the_sha256_of_exactly_size_bytes(tmp_path: Path) -> None:
    data = os.urandom(3000)
    fd = _open(tmp_path / "f", data)
    try:
        assert hash_fd(fd, 3000) == hashlib.sha256(data).hexdigest()
        assert hash_fd(fd, 2999) == ""  # a longer file never matches
        assert hash_fd(fd, 3001) == ""  # nor a shorter one
        assert hash_range(fd, 1000, 500) == hashlib.sha256(data[1000:1500]).hexdigest()
        assert hash_range(fd, 2900, 200) == ""
    finally:
        os.close(fd)


def test_a_stamp_is_the_stat_key_it_records(tmp_path: Path) -> None:
    fd = _open(tmp_path / "f", b"x")
    try:
        key = stat_key(fd)
        st = os.fstat(fd)
        assert key == [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    finally:
        os.close(fd)
    (tmp_path / "ok").write_text(str(key))
    assert read_stamp(tmp_path / "ok") == key
    assert read_stamp(tmp_path / "missing") is None
    (tmp_path / "bad").write_text("{not json")
    assert read_stamp(tmp_path / "bad") is None
    (tmp_path / "dict").write_text("{}")
    assert read_stamp(tmp_path / "dict") is None


def test_hash_range_spans_many_reads_of_its_reused_buffer(tmp_path: Path) -> None:
    data = os.urandom(3 * cachefiles._HASH_CHUNK + 4321)  # several reads and a short last one
    fd = _open(tmp_path / "f", data)
    try:
        want = hashlib.sha256(data[777:]).hexdigest()
        assert hash_range(fd, 777, len(data) - 777) == want
        assert hash_range(fd, 777, len(data) - 776) == ""  # one byte past the end
        assert hash_range(fd, 0, 0) == hashlib.sha256(b"").hexdigest()
    finally:
        os.close(fd)


class _Pwrites:
    """os.pwrite, recording each call's size; ``most`` (if set) writes short, as a pipe may."""

    def __init__(self, most: int | None = None) -> None:
        self.sizes: list[int] = []
        self.most = most
        self.real = os.pwrite

    def __call__(self, fd: int, data: memoryview, offset: int) -> int:
        self.sizes.append(len(data))
        return self.real(fd, data if self.most is None else data[: self.most], offset)


def test_write_at_writes_every_byte_in_pieces_of_at_most_one_mib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(4 * WRITE_PIECE + 12345)  # a coalesced read of two ranges and a bit
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    calls = _Pwrites()
    monkeypatch.setattr(cachefiles.os, "pwrite", calls)
    try:
        write_at(fd, memoryview(data)[1:], 7)
        assert os.pread(fd, len(data) + 10, 0) == b"\0" * 7 + data[1:]
    finally:
        os.close(fd)
    assert max(calls.sizes) <= WRITE_PIECE  # 2 MiB writes would take 2 MiB folios
    assert sum(calls.sizes) == len(data) - 1
    assert WRITE_PIECE == 1024 * 1024


def test_write_at_continues_a_short_write_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(100_000)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    calls = _Pwrites(most=30_000)
    monkeypatch.setattr(cachefiles.os, "pwrite", calls)
    try:
        write_at(fd, data, 0)
        assert os.pread(fd, 200_000, 0) == data
    finally:
        os.close(fd)
    assert calls.sizes == [100_000, 70_000, 40_000, 10_000]


def test_write_at_raises_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: memoryview, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    monkeypatch.setattr(cachefiles.os, "pwrite", full)
    try:
        with pytest.raises(OSError, match="No space left"):
            write_at(fd, b"x" * 10, 0)
    finally:
        os.close(fd)
