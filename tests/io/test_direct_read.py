"""O_DIRECT ranged reads: exact bytes at any offset and length, clear errors at the end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mouthguard.errors import TierError
from mouthguard.io.direct_read import DIRECT_READ_MIN_BYTES, read_direct
from mouthguard.io.direct_write import ALIGN, BLOCK_BYTES
from mouthguard.tiers.local import LocalTier

SIZE = BLOCK_BYTES + 9 * ALIGN + 123  # more than one bounce buffer, unaligned end


@pytest.fixture(scope="module")
def payload() -> bytes:
    return os.urandom(SIZE)


@pytest.fixture
def tier(tmp_path: Path, payload: bytes) -> LocalTier:
    tier = LocalTier(tmp_path / "t")
    tier.put("obj", payload)
    return tier


@pytest.mark.parametrize(
    ("offset", "length"),
    [
        (0, DIRECT_READ_MIN_BYTES),
        (1, DIRECT_READ_MIN_BYTES + 1),
        (ALIGN - 1, BLOCK_BYTES),
        (ALIGN * 5, BLOCK_BYTES + 2),
        (SIZE - DIRECT_READ_MIN_BYTES - 7, DIRECT_READ_MIN_BYTES + 7),  # to the very end
        (0, SIZE),
    ],
)
def test_any_range_reads_exactly(tier: LocalTier, payload: bytes, offset: int, length: int) -> None:
    out = bytearray(length)
    tier.read_into("obj", offset, memoryview(out))
    assert out == payload[offset : offset + length]


def test_read_direct_into_a_sub_view(tier: LocalTier, payload: bytes) -> None:
    out = bytearray(DIRECT_READ_MIN_BYTES + 10)
    view = memoryview(out)[5:-5]
    fd = os.open(tier.path_of("obj"), os.O_RDONLY)
    try:
        used = read_direct(fd, 777, view)
    finally:
        os.close(fd)
    assert bytes(view) == payload[777 : 777 + view.nbytes]
    assert out[:5] == bytes(5) and out[-5:] == bytes(5)  # nothing written outside
    assert isinstance(used, bool)


def test_a_file_shorter_than_asked_is_an_eof_error(tier: LocalTier) -> None:
    fd = os.open(tier.path_of("obj"), os.O_RDONLY)
    try:
        out = memoryview(bytearray(DIRECT_READ_MIN_BYTES))
        if not read_direct(fd, 0, memoryview(bytearray(ALIGN))):
            pytest.skip("this filesystem has no O_DIRECT")
        with pytest.raises(EOFError):
            read_direct(fd, SIZE - 10, out)
    finally:
        os.close(fd)


def test_the_tier_refuses_a_range_past_the_end(tier: LocalTier) -> None:
    with pytest.raises(TierError):
        tier.read_into("obj", SIZE - 10, memoryview(bytearray(DIRECT_READ_MIN_BYTES)))


def test_without_direct_io_the_same_bytes_come_back(tmp_path: Path, payload: bytes) -> None:
    tier = LocalTier(tmp_path / "b", direct_io=False)
    tier.put("obj", payload)
    out = bytearray(SIZE - 3)
    tier.read_into("obj", 3, memoryview(out))
    assert out == payload[3:]
