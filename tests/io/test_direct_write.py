"""The aligned, pipelined write path: exact bytes whatever the chunking, errors surface."""

from __future__ import annotations

import errno
import mmap
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mouthguard.errors import TierError
from mouthguard.io import direct_write
from mouthguard.io.direct_write import (
    ALIGN,
    BLOCK_BYTES,
    WriteError,
    address_of,
    enable_direct,
    write_stream,
)
from mouthguard.tiers.base import PutMode, StableChunks
from mouthguard.tiers.local import LocalTier
from tests.fake_clock import FakeClock


def _payload(nbytes: int) -> bytes:
    return (bytes(range(256)) * (nbytes // 256 + 1))[:nbytes]


def _write(
    path: Path, chunks: list[memoryview], *, stable: bool = False, direct: bool = True
) -> direct_write.WriteOutcome:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        return write_stream(fd, iter(chunks), stable=stable, direct=direct)
    finally:
        os.close(fd)


def _aligned_copy(data: bytes) -> memoryview:
    buf = mmap.mmap(-1, max(len(data), 1))
    buf[: len(data)] = data
    return memoryview(buf)[: len(data)]


@pytest.mark.parametrize(
    "sizes",
    [
        [0],
        [1],
        [ALIGN - 1],
        [ALIGN],
        [ALIGN + 1],
        [3, 5, ALIGN * 3 + 17],
        [BLOCK_BYTES - 1, 2],
        [BLOCK_BYTES + ALIGN + 3],
        [BLOCK_BYTES * 2, 1, BLOCK_BYTES - 1],
    ],
    ids=lambda s: "+".join(map(str, s)),
)
@pytest.mark.parametrize("stable", [False, True])
@pytest.mark.parametrize("direct", [False, True])
def test_bytes_are_exact_for_any_chunking(
    tmp_path: Path, sizes: list[int], stable: bool, direct: bool
) -> None:
    data = os.urandom(sum(sizes))
    chunks, at = [], 0
    for size in sizes:
        # Stable chunks are handed over from aligned memory where they start aligned.
        chunks.append(
            _aligned_copy(data[at : at + size]) if stable else memoryview(data)[at : at + size]
        )
        at += size
    path = tmp_path / "f"
    outcome = _write(path, chunks, stable=stable, direct=direct)
    assert outcome.size == len(data)
    assert path.read_bytes() == data
    if not direct:
        assert outcome.direct is False


def test_o_direct_is_used_where_the_filesystem_allows(tmp_path: Path) -> None:
    probe = os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        supported = enable_direct(probe)
    finally:
        os.close(probe)
    outcome = _write(tmp_path / "f", [memoryview(_payload(3 * ALIGN + 5))], direct=True)
    assert outcome.direct is supported


def test_a_write_the_filesystem_refuses_as_misaligned_falls_back_to_buffered(
    tmp_path: Path,
) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if not enable_direct(fd):
            pytest.skip("this filesystem has no O_DIRECT")
        pipeline = direct_write._Pipeline(fd, direct=True)
        # An odd address and length: O_DIRECT refuses it with EINVAL.
        data = bytearray(b"x" * 10_001)
        pipeline.submit(0, memoryview(data)[1:], None)
        pipeline.drain()
        assert pipeline.direct is False
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"x" * 10_000


def test_a_full_disk_is_a_write_error_not_a_partial_success() -> None:
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        with pytest.raises(WriteError) as info:
            write_stream(fd, iter([memoryview(_payload(BLOCK_BYTES + 10))]), direct=False)
    finally:
        os.close(fd)
    assert info.value.cause.errno == errno.ENOSPC


def test_an_error_of_the_stream_itself_propagates_unchanged(tmp_path: Path) -> None:
    def chunks() -> Iterator[memoryview]:
        yield memoryview(_payload(BLOCK_BYTES + 1))
        raise OSError(errno.EIO, "the source failed")

    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError, match="the source failed") as info:
            write_stream(fd, chunks(), direct=True)
    finally:
        os.close(fd)
    assert not isinstance(info.value, WriteError)


def test_address_of_reads_only_and_writable_buffers() -> None:
    buf = mmap.mmap(-1, 2 * ALIGN)
    assert address_of(memoryview(buf)) % ALIGN == 0
    assert address_of(memoryview(buf)[1:]) == address_of(memoryview(buf)) + 1
    frozen = bytes(100)
    assert address_of(memoryview(frozen)) != 0


# --- through LocalTier ---------------------------------------------------------


@pytest.mark.parametrize("direct_io", [True, False])
def test_local_tier_streams_large_objects_through_the_pipeline(
    tmp_path: Path, direct_io: bool
) -> None:
    tier = LocalTier(tmp_path / "t", direct_io=direct_io)
    data = os.urandom(2 * BLOCK_BYTES + 12345)
    view = memoryview(data)
    info = tier.put("a/b", (view[i : i + 999_999] for i in range(0, len(data), 999_999)))
    assert info.size == len(data)
    assert tier.get("a/b") == data
    stable = tier.put("a/c", StableChunks([_aligned_copy(data)]), mode=PutMode.CREATE)
    assert stable.size == len(data)
    assert tier.get("a/c") == data


def test_local_tier_reports_a_full_disk_and_leaves_nothing(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "t")
    # Redirect the temporary file to /dev/full: writes fail with ENOSPC.
    original = tier._open_temp

    def full_temp(key: str, parent: Path) -> tuple[int, Path]:
        fd, tmp = original(key, parent)
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY), tmp

    tier._open_temp = full_temp  # type: ignore[method-assign]
    with pytest.raises(TierError, match="no space left on device"):
        tier.put("a/b", iter([memoryview(_payload(3 * BLOCK_BYTES))]))
    assert not tier.exists("a/b")
    assert list((tmp_path / "t" / "a").iterdir()) == []


def _size_once_landed(path: Path, expected: int) -> int:
    """The file's size once it reaches ``expected``, or what it is after 60 s.

    Submitted writes land asynchronously (the pipeline's threads): this waits for
    writes that must have been submitted, bounded only so that a failure ends.
    With ``expected`` 0 it returns the size at once: exact when nothing was submitted.
    """
    deadline = time.monotonic() + 60
    while (size := path.stat().st_size) < expected and time.monotonic() < deadline:
        time.sleep(0.001)
    return size


@pytest.mark.parametrize(
    ("pause", "pieces_on_disk_before_each"),
    [
        # Slow: once a piece arrives more than FLUSH_AFTER_SECONDS after the block began
        # to fill, what is aligned is written at once (from the second piece on).
        (direct_write.FLUSH_AFTER_SECONDS * 1.5, [0, 0, 2, 3, 4, 5]),
        # Fast: far less than a block, so nothing is written before the stream ends.
        (0.0, [0, 0, 0, 0, 0, 0]),
    ],
    ids=["slow", "fast"],
)
def test_a_slow_producer_reaches_the_disk_steadily(
    tmp_path: Path, pause: float, pieces_on_disk_before_each: list[int]
) -> None:
    path = tmp_path / "f"
    piece = _payload(64 * 1024)
    clock = FakeClock()
    seen: list[int] = []

    def producer() -> Iterator[memoryview]:
        for pieces in pieces_on_disk_before_each:
            seen.append(_size_once_landed(path, pieces * len(piece)) // len(piece))
            yield memoryview(piece)
            clock.advance(pause)

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        outcome = write_stream(fd, producer(), direct=True, clock=clock)
    finally:
        os.close(fd)
    assert seen == pieces_on_disk_before_each
    assert outcome.size == 6 * len(piece)
    assert path.read_bytes() == piece * 6
