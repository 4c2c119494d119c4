"""Restart: a new KVStore on the same directory finds the blocks; torn tails are discarded."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mouthguard.kvcache import KVStore, segments
from mouthguard.kvcache.segments import data_path, index_path, segment_ids
from mouthguard.tiers.base import ObjectInfo
from mouthguard.tiers.memory import MemoryTier
from mouthguard.tiers.wrapper import WrappedTier
from tests.kvcache.helpers import BT, blocks_for, tokens

BLOCK = 4096


def open_store(directory: Path) -> KVStore:
    return KVStore(
        disk_dir=directory,
        memory_bytes=0,
        disk_bytes=64 * BLOCK,
        block_tokens=BT,
        namespace="restart",
        segment_bytes=8 * BLOCK,
    )


def test_a_new_store_finds_the_blocks_of_the_last_one(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    toks = tokens(1, 12)
    with open_store(directory) as kv:
        kv.put(toks, blocks_for(toks))
    with open_store(directory) as kv:
        assert kv.stats()["disk"]["recovered"] == 12
        assert kv.longest_prefix(toks) == 12 * BT
        got = kv.get(toks)
        assert all(np.array_equal(a, b) for a, b in zip(got, blocks_for(toks), strict=True))


def test_memory_blocks_are_spilled_to_disk_on_close(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    toks = tokens(2, 3)
    options = {"memory_bytes": 1 << 20, "disk_bytes": 1 << 20, "block_tokens": BT}
    with KVStore(disk_dir=directory, **options) as kv:
        kv.put(toks, blocks_for(toks))
        assert kv.stats()["disk"]["blocks"] == 0
    with KVStore(disk_dir=directory, **options) as kv:
        assert kv.longest_prefix(toks) == 3 * BT


def test_deleted_and_evicted_blocks_stay_gone_after_restart(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    keep, drop = tokens(3, 2), tokens(4, 2)
    with open_store(directory) as kv:
        kv.put(keep, blocks_for(keep))
        kv.put(drop, blocks_for(drop))
        kv.delete(drop)
    with open_store(directory) as kv:
        assert kv.longest_prefix(keep) == 2 * BT
        assert kv.longest_prefix(drop) == 0


def test_a_torn_index_record_is_discarded_and_cut(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    toks = tokens(5, 3)
    with open_store(directory) as kv:
        kv.put(toks, blocks_for(toks))
    (segment,) = segment_ids(directory)
    log = index_path(directory, segment)
    raw = log.read_bytes()
    log.write_bytes(raw[:-7])  # the last put record lost its tail
    with open_store(directory) as kv:
        assert kv.longest_prefix(toks) == 2 * BT
        got = kv.get(toks)
        assert len(got) == 2
        assert all(np.array_equal(a, b) for a, b in zip(got, blocks_for(toks), strict=False))
        more = tokens(6, 1)
        kv.put(more, blocks_for(more))
    assert open_store(directory).longest_prefix(more) == BT  # appends after the cut still parse


def test_garbage_after_the_last_record_is_ignored(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    toks = tokens(7, 2)
    with open_store(directory) as kv:
        kv.put(toks, blocks_for(toks))
    (segment,) = segment_ids(directory)
    with index_path(directory, segment).open("ab") as f:
        f.write(b"\x40\x00\x00\x00" + bytes(range(64)) + b"\x00" * 8)  # bad checksum
    with open_store(directory) as kv:
        assert kv.longest_prefix(toks) == 2 * BT


def test_a_half_written_segment_tail_is_discarded(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    toks = tokens(8, 3)
    with open_store(directory) as kv:
        kv.put(toks, blocks_for(toks))
    (segment,) = segment_ids(directory)
    data = data_path(directory, segment)
    size = data.stat().st_size
    with data.open("r+b") as f:
        f.truncate(size - BLOCK // 2)  # the last payload never fully reached the file
    with open_store(directory) as kv:
        assert kv.stats()["disk"]["recovered"] == 2
        assert kv.longest_prefix(toks) == 2 * BT
        assert len(kv.get(toks)) == 2


def test_a_payload_lost_in_a_crash_is_a_miss_not_data(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    toks = tokens(9, 2)
    with open_store(directory) as kv:
        kv.put(toks, blocks_for(toks))
    (segment,) = segment_ids(directory)
    data = data_path(directory, segment)
    raw = bytearray(data.read_bytes())
    raw[BLOCK : 2 * BLOCK] = bytes(BLOCK)  # the index survived, the page did not
    data.write_bytes(bytes(raw))
    with open_store(directory) as kv:
        assert kv.longest_prefix(toks) == 2 * BT  # the index still lists it...
        assert len(kv.get(toks)) == 1  # ...but it is never returned
        assert kv.stats()["disk"]["corrupt"] == 1
        assert kv.longest_prefix(toks) == BT


def test_orphan_files_and_foreign_logs_are_removed(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    directory.mkdir()
    data_path(directory, 5).write_bytes(b"x" * BLOCK)  # data without a log
    index_path(directory, 6).write_bytes(b"not a log")
    data_path(directory, 6).write_bytes(b"")
    (directory / "notes.txt").write_text("not ours")
    with open_store(directory) as kv:
        assert kv.stats()["disk"]["bytes"] == 0
    assert segment_ids(directory) == set()
    assert (directory / "notes.txt").exists()


def test_a_killed_writer_leaves_a_recoverable_directory(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    script = f"""
import os, numpy as np
from mouthguard.kvcache import KVStore
kv = KVStore(disk_dir={str(directory)!r}, memory_bytes=0, disk_bytes=64 * 4096,
             block_tokens=4, namespace="restart", segment_bytes=8 * 4096)
for i in range(20):
    toks = list(range(i * 100, i * 100 + 8))
    kv.put(toks, [np.full(1024, i, dtype=np.float32)] * 2)
os._exit(0)  # no close(): as if killed
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    with open_store(directory) as kv:
        for i in range(20):
            toks = list(range(i * 100, i * 100 + 8))
            got = kv.get(toks)
            assert all(np.array_equal(g, np.full(1024, i, dtype=np.float32)) for g in got)
        assert kv.stats()["disk"]["recovered"] > 0


def test_an_append_cut_short_is_taken_back_so_later_records_survive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full disk: the index append writes part of its records, then fails. The
    # torn records must not stay in the log, or recovery would stop there and
    # lose every record appended after them.
    directory = tmp_path / "kv"
    first, second, third = tokens(20, 1), tokens(21, 1), tokens(22, 1)
    real_write = os.write
    calls = {"n": 0}

    def short_then_full(fd: int, data: bytes | memoryview) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:5])
        raise OSError(errno.ENOSPC, "No space left on device")

    with open_store(directory) as kv:
        kv.put(first, blocks_for(first))
        monkeypatch.setattr(segments.os, "write", short_then_full)
        kv.put(second, blocks_for(second))  # dropped: its record could not be logged
        monkeypatch.setattr(segments.os, "write", real_write)
        assert kv.stats()["disk"]["rejected"] == 1
        kv.put(third, blocks_for(third))
    with open_store(directory) as kv:
        assert kv.longest_prefix(first) == BT
        assert kv.longest_prefix(second) == 0
        assert kv.longest_prefix(third) == BT  # appended after the failed one: kept


def test_opening_over_a_remote_sizes_its_blocks_from_the_listing_alone(tmp_path: Path) -> None:
    class CountingHeads(WrappedTier):
        heads = 0

        def head(self, key: str) -> ObjectInfo:
            self.heads += 1
            return super().head(key)

    remote = CountingHeads(MemoryTier())
    toks = tokens(30, 4)
    with KVStore(memory_bytes=0, block_tokens=BT, namespace="sized", remote=remote) as kv:
        kv.put(toks, blocks_for(toks))
        written = kv.stats()["remote"]
    remote.heads = 0
    with KVStore(memory_bytes=0, block_tokens=BT, namespace="sized", remote=remote) as kv:
        assert remote.heads == 0  # no request per object: the sizes came with the listing
        reopened = kv.stats()["remote"]
        assert (reopened["blocks"], reopened["bytes"]) == (written["blocks"], written["bytes"])
        assert kv.longest_prefix(toks) == len(toks) // BT * BT
