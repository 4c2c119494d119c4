"""A Parquet footer: found from the file's end, parsed alone, its row groups' ranges checked."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data.formats.pqfooter import (
    FooterError,
    footer_range,
    parse_footer,
    row_group_ranges,
)

from ..adopted import parquet_files


@pytest.fixture
def file(tmp_path: Path) -> bytes:
    paths, _ = parquet_files(tmp_path, files=1)
    return paths[0].read_bytes()


def test_the_ranges_are_the_row_groups_column_chunks(file: bytes) -> None:
    import pyarrow.parquet as pq  # noqa: PLC0415

    offset, size = footer_range(file[-8:], len(file))
    assert offset + size == len(file)
    meta = parse_footer(file[offset:])
    groups = row_group_ranges(meta, offset)
    assert [g.rows for g in groups] == [60, 60, 60, 50]
    assert groups[0].offset == 4 and groups[-1].offset + groups[-1].size <= offset
    assert all(a.offset + a.size <= b.offset for a, b in itertools.pairwise(groups))
    assert meta.num_rows == pq.ParquetFile(pa_reader(file)).metadata.num_rows


def pa_reader(data: bytes) -> Any:
    import pyarrow as pa  # noqa: PLC0415

    return pa.BufferReader(data)


@pytest.mark.parametrize(
    ("tail", "size", "why"),
    [
        (b"\x10\x00\x00\x00PARE", 1000, "encrypted"),
        (b"\x10\x00\x00\x00PAR2", 1000, "does not end with PAR1"),
        (b"\xff\xff\xff\x00PAR1", 1000, "cannot hold"),
        (b"\x00\x00\x00\x00PAR1", 1000, "cannot hold"),
        (b"PAR1", 1000, "too short"),
    ],
)
def test_a_tail_that_is_no_footer(tail: bytes, size: int, why: str) -> None:
    with pytest.raises(FooterError, match=why):
        footer_range(tail, size)


def test_a_footer_pyarrow_cannot_parse(file: bytes) -> None:
    with pytest.raises(FooterError, match="cannot parse"):
        parse_footer(b"\x01" * 50 + (50).to_bytes(4, "little") + b"PAR1")


class _Chunk:
    def __init__(self, start: int, size: int, path: str = "") -> None:
        self.file_path = path
        self.dictionary_page_offset = None
        self.has_dictionary_page = False
        self.data_page_offset = start
        self.total_compressed_size = size


class _Group:
    def __init__(self, rows: int, *chunks: _Chunk) -> None:
        self.num_rows = rows
        self.num_columns = len(chunks)
        self._chunks = chunks

    def column(self, i: int) -> _Chunk:
        return self._chunks[i]


class _Meta:
    def __init__(self, *groups: _Group, created_by: str = "parquet-cpp-arrow version 26") -> None:
        self.created_by = created_by
        self.num_row_groups = len(groups)
        self.num_rows = sum(g.num_rows for g in groups)
        self._groups = groups

    def row_group(self, i: int) -> _Group:
        return self._groups[i]


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        (_Meta(_Group(5, _Chunk(4, 100)), _Group(5, _Chunk(50, 100))), "overlaps"),
        (_Meta(_Group(5, _Chunk(4, 1000))), "overlaps the one before it or the footer"),
        (_Meta(_Group(5, _Chunk(0, 10))), "invalid offset"),
        (_Meta(_Group(5, _Chunk(4, 0))), "invalid offset"),
        (_Meta(_Group(5)), "no column chunks"),
        (_Meta(_Group(5, _Chunk(4, 10, "other.parquet"))), "another file"),
        (_Meta(_Group(5, _Chunk(4, 10)), created_by="parquet-mr version 1.2.8 (b)"), "PARQUET-816"),
    ],
)
def test_hostile_or_unreadable_row_groups_are_refused(meta: _Meta, why: str) -> None:
    with pytest.raises(FooterError, match=why):
        row_group_ranges(meta, 500)


def test_row_counts_must_add_up() -> None:
    meta = _Meta(_Group(5, _Chunk(4, 10)))
    meta.num_rows = 6
    with pytest.raises(FooterError, match="the file says 6"):
        row_group_ranges(meta, 500)


def test_a_newer_parquet_mr_is_fine() -> None:
    meta = _Meta(_Group(5, _Chunk(4, 10)), created_by="parquet-mr version 1.12.3 (build x)")
    assert row_group_ranges(meta, 500)[0].rows == 5
