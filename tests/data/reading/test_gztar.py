"""gunzip and unpack: one gzip member, bounded, inflated exactly to the size the index states."""

from __future__ import annotations

import gzip
import os
import random
from pathlib import Path

import pytest

from mouthguard.data.fetching.cache import ShardFile
from mouthguard.data.reading.gztar import GzipError, gunzip, unpack
from mouthguard.errors import ShardDamagedError

#: Incompressible, then highly compressible: one input chunk inflates to many output steps.
DATA = random.Random(7).randbytes(300_000) + bytes(9_000_000)
PACKED = gzip.compress(DATA, mtime=0)


@pytest.mark.parametrize("chunk", [7, 4096, 1 << 30])
def test_any_chunking_inflates_to_the_same_bytes(chunk: int) -> None:
    pieces = [PACKED[i : i + chunk] for i in range(0, len(PACKED), chunk)]
    assert b"".join(gunzip(pieces)) == DATA
    assert b"".join(gunzip(pieces, limit=len(DATA))) == DATA


@pytest.mark.parametrize(
    ("chunks", "why"),
    [
        ([PACKED[: len(PACKED) // 2]], "cut short"),
        ([PACKED, PACKED], "first gzip member"),
        ([PACKED + b"\0"], "first gzip member"),
        ([b"plain text, not gzip"], "not a readable gzip stream"),
        ([], "empty"),
    ],
    ids=["cut short", "two members", "trailing byte", "not gzip", "empty"],
)
def test_what_is_not_one_whole_gzip_member_is_refused(chunks: list[bytes], why: str) -> None:
    with pytest.raises(GzipError, match=why):
        b"".join(gunzip(chunks))


def test_output_past_the_limit_stops_the_stream() -> None:
    with pytest.raises(GzipError, match="more than 1000 bytes"):
        for _ in gunzip([PACKED], limit=1000):
            pass


def _open(path: Path) -> ShardFile:
    return ShardFile(os.open(path, os.O_RDONLY), path.stat().st_size, "a/x.tgz")


def test_unpack_gives_the_tar_in_a_file_no_one_else_sees(tmp_path: Path) -> None:
    (tmp_path / "x.tgz").write_bytes(PACKED)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    packed = _open(tmp_path / "x.tgz")
    try:
        tar = unpack(packed, len(DATA), str(scratch))
    finally:
        packed.close()
    try:
        assert tar.size == len(DATA) and tar.name == "a/x.tgz"
        assert tar.read(0, 1000) == DATA[:1000]
        assert tar.read(len(DATA) - 10, 10) == DATA[-10:]
        assert not list(scratch.iterdir()), "anonymous: unlinked as it was made"
    finally:
        tar.close()


@pytest.mark.parametrize("stated", [len(DATA) - 1, len(DATA) + 1])
def test_a_stream_that_inflates_to_another_size_than_stated_is_damage(
    tmp_path: Path, stated: int
) -> None:
    (tmp_path / "x.tgz").write_bytes(PACKED)
    packed = _open(tmp_path / "x.tgz")
    try:
        with pytest.raises(ShardDamagedError, match=r"a/x\.tgz: .*(more than|its index says)"):
            unpack(packed, stated, str(tmp_path))
    finally:
        packed.close()
