"""InPlaceShard: a shard read where it lies, each range handed out once it matched."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mouthguard.data import StreamingDataset, open_dataset
from mouthguard.data.fetching import inplace
from mouthguard.data.fetching.cache import ShardFile
from mouthguard.data.fetching.inplace import InPlaceShard
from mouthguard.data.fetching.verified import VerifiedFiles
from mouthguard.data.formats.part import Part
from mouthguard.data.formats.records import RangeTable
from mouthguard.errors import ShardDamagedError

from ..helpers import expected, flip_byte, shard_path, write_dataset

RANGE = 4096
RANGES = 5  # the last one shorter


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "shard.tar"
    path.write_bytes(bytes(i * 7 % 251 for i in range(RANGE * (RANGES - 1) + 1000)))
    return path


def table_of(data: bytes) -> RangeTable:
    digests = tuple(
        hashlib.sha256(data[k : k + RANGE]).hexdigest() for k in range(0, len(data), RANGE)
    )
    return RangeTable(RANGE, digests)


def part_of(path: Path, data: bytes) -> Part:
    return Part(path.name, "shard", len(data), 0, len(data), hashlib.sha256(data).hexdigest())


class Gate:
    """Holds the hashing of ranges from ``held`` on until :meth:`open` (a patched hash_range)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, held: int) -> None:
        self.released = threading.Event()
        self.waiting = threading.Event()  # a held range is waiting for the gate
        self.hashed: list[int] = []
        real = inplace.hash_range

        def gated(fd: int, start: int, size: int) -> str:
            if start // RANGE >= held:
                self.waiting.set()
                self.released.wait(timeout=30)
            self.hashed.append(start // RANGE)
            return real(fd, start, size)

        monkeypatch.setattr(inplace, "hash_range", gated)

    def open(self) -> None:
        self.released.set()


@pytest.fixture
def opened(shard: Path) -> Iterator[tuple[InPlaceShard, list[bool]]]:
    data = shard.read_bytes()
    results: list[bool] = []
    fd = os.open(shard, os.O_RDONLY)
    handle = InPlaceShard(fd, len(data), shard.name, table_of(data), results.append)
    yield handle, results
    handle.close()


def test_every_byte_comes_back_and_the_end_is_reported_once(
    shard: Path, opened: tuple[InPlaceShard, list[bool]]
) -> None:
    handle, results = opened
    data = shard.read_bytes()
    for start, length in [(len(data) - 10, 10), (0, 100), (RANGE - 3, 6), (0, len(data))]:
        assert handle.read(start, length) == data[start : start + length]
    handle.close()  # joins the thread: the report has been made
    assert handle.complete
    assert results == [True]


def test_no_byte_of_a_range_comes_before_that_range_matched(
    shard: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch, held=2)
    data = shard.read_bytes()
    fd = os.open(shard, os.O_RDONLY)
    handle = InPlaceShard(fd, len(data), shard.name, table_of(data), lambda matched: None)
    try:
        assert handle.read(RANGE + 10, 20) == data[RANGE + 10 : RANGE + 30]  # range 1: free
        got: list[bytes] = []
        # The last byte of range 1 and the first of range 2: it needs range 2.
        reader = threading.Thread(target=lambda: got.append(handle.read(2 * RANGE - 1, 2)))
        reader.start()
        reader.join(timeout=0.3)
        assert reader.is_alive() and not got  # waiting for range 2
        assert 2 not in gate.hashed
        gate.open()
        reader.join(timeout=10)
        assert got == [data[2 * RANGE - 1 : 2 * RANGE + 1]]
    finally:
        gate.open()
        handle.close()


def test_a_damaged_range_keeps_the_earlier_ones_and_refuses_the_rest(
    shard: Path, tmp_path: Path
) -> None:
    data = shard.read_bytes()
    table = table_of(data)
    damaged = bytearray(data)
    damaged[3 * RANGE + 5] ^= 1
    shard.write_bytes(bytes(damaged))
    results: list[bool] = []
    fd = os.open(shard, os.O_RDONLY)
    handle = InPlaceShard(fd, len(data), shard.name, table, results.append)
    try:
        assert handle.read(0, 3 * RANGE) == data[: 3 * RANGE]
        for start in (3 * RANGE, 3 * RANGE - 1, 4 * RANGE + 1):
            with pytest.raises(ShardDamagedError, match=r"shard\.tar: range 3 .* does not match"):
                handle.read(start, 2)
    finally:
        handle.close()
    assert results == [False]
    assert not handle.complete


def test_closed_before_the_end_it_stops_hashing_and_reports_no_match(
    shard: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch, held=1)
    data = shard.read_bytes()
    results: list[bool] = []
    fd = os.open(shard, os.O_RDONLY)
    handle = InPlaceShard(fd, len(data), shard.name, table_of(data), results.append)
    assert handle.read(0, 10) == data[:10]
    assert gate.waiting.wait(timeout=10)  # range 1 is being hashed
    closer = threading.Thread(target=handle.close)
    closer.start()
    gate.open()  # the range in progress is finished, then no other is started
    closer.join(timeout=10)
    assert not closer.is_alive()
    assert results == [False]
    assert sorted(gate.hashed) == [0, 1]
    with pytest.raises(OSError):
        os.fstat(fd)  # closed


# -- VerifiedFiles.open_ranges: the record shared by processes ----------------------------


def open_ranges(files: VerifiedFiles, path: Path, table: RangeTable) -> ShardFile | None:
    data = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    handle = files.open_ranges(fd, str(path), part_of(path, data), table)
    if handle is None:
        os.close(fd)
    return handle


def test_a_shard_whose_ranges_all_matched_is_trusted_by_the_next_open(
    shard: Path, tmp_path: Path
) -> None:
    files = VerifiedFiles(tmp_path / "record", "stat")
    table = table_of(shard.read_bytes())
    handle = open_ranges(files, shard, table)
    assert handle is not None
    handle.read(0, shard.stat().st_size)
    handle.close()
    assert open_ranges(files, shard, table) is None  # the record says it matched
    # The same record serves the whole-file check: it is not hashed again.
    fd = os.open(shard, os.O_RDONLY)
    try:
        files.check(fd, str(shard), part_of(shard, shard.read_bytes()))
    finally:
        os.close(fd)


def test_a_shard_closed_early_or_damaged_leaves_no_record(shard: Path, tmp_path: Path) -> None:
    files = VerifiedFiles(tmp_path / "record", "stat")
    data = shard.read_bytes()
    table = table_of(data)
    damaged = bytearray(data)
    damaged[-1] ^= 1
    shard.write_bytes(bytes(damaged))
    handle = open_ranges(files, shard, table)
    assert handle is not None
    with pytest.raises(ShardDamagedError, match="range 4"):
        handle.read(len(data) - 1, 1)
    handle.close()
    assert not list((tmp_path / "record").glob("*.ok"))
    shard.write_bytes(data)  # repaired: verified again, from the start
    handle = open_ranges(files, shard, table)
    assert handle is not None
    assert handle.read(0, len(data)) == data
    handle.close()
    assert len(list((tmp_path / "record").glob("*.ok"))) == 1


def test_while_another_holder_verifies_the_shard_this_one_waits_and_trusts_its_word(
    shard: Path, tmp_path: Path
) -> None:
    files = VerifiedFiles(tmp_path / "record", "stat")
    table = table_of(shard.read_bytes())
    _, lock_path = files.paths(str(shard), part_of(shard, shard.read_bytes()))
    held = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # another process verifying it
    got: list[InPlaceShard | None] = []
    opener = threading.Thread(target=lambda: got.append(open_ranges(files, shard, table)))
    opener.start()
    opener.join(timeout=0.3)
    assert opener.is_alive()  # it waits for the holder
    os.close(held)  # the holder went away without a record: this one hashes it whole
    opener.join(timeout=10)
    assert got == [None]
    assert len(list(files.root.glob("*.ok"))) == 1


def test_always_verifies_every_open_and_keeps_no_record(shard: Path, tmp_path: Path) -> None:
    files = VerifiedFiles(tmp_path / "record", "always")
    table = table_of(shard.read_bytes())
    for _ in range(2):
        handle = open_ranges(files, shard, table)
        assert handle is not None
        handle.read(0, 1)
        handle.close()
    assert not list(files.root.glob("*.ok"))


def test_a_file_of_another_size_is_refused_at_once(shard: Path, tmp_path: Path) -> None:
    files = VerifiedFiles(tmp_path / "record", "stat")
    data = shard.read_bytes()
    table = table_of(data)
    with shard.open("ab") as f:
        f.write(b"more")
    fd = os.open(shard, os.O_RDONLY)
    try:
        with pytest.raises(ShardDamagedError, match="size does not match"):
            files.open_ranges(fd, str(shard), part_of(shard, data), table)
    finally:
        os.close(fd)


# -- A local dataset read in place ---------------------------------------------------------

DS_RANGE = 64 * 1024
DS_SAMPLES = 300  # about 450 KB: shards of 200 KB, 4 ranges each


def test_a_dataset_read_in_place_hands_out_the_samples_before_a_damaged_range_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sequential order, no cache: exactly the samples that end before the damaged range
    come out, then the error naming the shard and the range; repaired, everything does."""
    write_dataset(tmp_path, n=DS_SAMPLES, shard_size=200 * 1024, range_size=DS_RANGE)
    ds = tmp_path / "ds"
    dataset = open_dataset(ds)
    index = dataset.read_index(dataset.manifest.shards[0])
    payload = next(
        m.offset
        for e in index.samples
        for m in e.members
        if m.size and 2 * DS_RANGE <= m.offset < 3 * DS_RANGE
    )
    path = shard_path(ds, 0)
    flip_byte(path, payload)
    before = [e.key for e in index.samples if e.offset + e.length <= 2 * DS_RANGE]
    record = tmp_path / "record"
    monkeypatch.setenv("MOUTHGUARD_VERIFIED_DIR", str(record))
    stream = StreamingDataset(ds)
    yielded: list[str] = []
    with pytest.raises(ShardDamagedError, match=r"shard-000000\.tar: range 2 \(bytes 131072 to"):
        yielded.extend(sample["__key__"] for sample in stream)
    assert yielded == before
    first = dataset.manifest.shards[0]
    damaged_record, _ = VerifiedFiles(record, "stat").paths(
        str(path), Part(first.name, "shard", first.size, 0, first.size, first.sha256)
    )
    assert not damaged_record.exists()  # the shards read ahead may be recorded; not this one
    flip_byte(path, payload)  # repaired (a new pass: the old one would resume where it stopped)
    got = {
        s["__key__"]: {k: v for k, v in s.items() if k != "__key__"} for s in StreamingDataset(ds)
    }
    assert got == expected(DS_SAMPLES)
    assert len(list(record.glob("*.ok"))) == len(dataset.manifest.shards)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_hashing_thread_that_fails_unexpectedly_leaves_no_reader_waiting(
    shard: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = inplace.hash_range

    def failing(fd: int, start: int, size: int) -> str:
        if start >= RANGE:
            raise RuntimeError("out of something")
        return real(fd, start, size)

    monkeypatch.setattr(inplace, "hash_range", failing)
    data = shard.read_bytes()
    results: list[bool] = []
    fd = os.open(shard, os.O_RDONLY)
    handle = InPlaceShard(fd, len(data), shard.name, table_of(data), results.append)
    try:
        assert handle.read(0, RANGE) == data[:RANGE]
        with pytest.raises(ShardDamagedError, match=r"range 1 could not be verified: .*out of"):
            handle.read(RANGE, 1)
    finally:
        handle.close()
    assert results == [False]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads running
def test_a_process_forked_while_a_shard_is_verified_does_not_keep_its_lock(
    shard: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DataLoader worker forked meanwhile shares the locked file: it must not pin it."""
    gate = Gate(monkeypatch, held=1)
    files = VerifiedFiles(tmp_path / "record", "stat")
    table = table_of(shard.read_bytes())
    flip_byte(shard, 3 * RANGE)  # the hashing ends at range 3: no record, ever
    handle = open_ranges(files, shard, table)
    assert handle is not None
    assert gate.waiting.wait(timeout=10)  # the lock is held while range 1 waits
    go_on, child_done = os.pipe()
    started, ready = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: says it runs, then only waits, holding what it inherited
        try:
            os.close(child_done)
            os.write(ready, b"!")
            os.read(go_on, 1)
        finally:
            os._exit(0)
    os.close(go_on)
    os.close(ready)
    try:
        assert os.read(started, 1) == b"!"  # the child runs: its fork handlers have run
        gate.open()
        handle.close()  # the hashing stopped at range 3: no record, the lock released
        assert not list(files.root.glob("*.ok"))
        got: list[InPlaceShard | None] = []
        opener = threading.Thread(target=lambda: got.append(open_ranges(files, shard, table)))
        opener.start()
        opener.join(timeout=10)
        assert not opener.is_alive(), "the forked child still holds the shard's lock"
        (again,) = got
        assert again is not None  # this process took the lock and verifies it itself
        again.close()
    finally:
        os.close(started)
        os.close(child_done)  # the child reads end-of-file and exits
        os.waitpid(pid, 0)
