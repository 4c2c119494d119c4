"""The shard cache's file primitives: hashes that never accept a wrong size, stamps, locks."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from mouthguard.data.fetching.cachefiles import (
    hash_fd,
    hash_range,
    read_stamp,
    stat_key,
    try_exclusive,
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


def test_try_exclusive_yields_to_a_held_lock(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    holder = _open(path, b"")
    try:
        fcntl.flock(holder, fcntl.LOCK_SH)  # a reader's pin
        assert try_exclusive(path) is None
        fcntl.flock(holder, fcntl.LOCK_UN)
        fd = try_exclusive(path)
        assert fd is not None
        os.close(fd)
    finally:
        os.close(holder)
    assert try_exclusive(tmp_path / "gone") is None
