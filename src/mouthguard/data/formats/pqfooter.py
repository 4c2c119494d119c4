"""A Parquet file's footer: where it is, what it says, and the byte range of each row group.

A Parquet file is ``PAR1``, the column chunks of its row groups, the footer (the
Thrift ``FileMetaData``), the footer's length (4 bytes, little-endian) and
``PAR1``. :func:`footer_range` finds the footer from the file's last 8 bytes;
:func:`parse_footer` hands the footer's bytes alone to pyarrow (as the tail of
a tiny stand-in file, ``PAR1`` + footer, since pyarrow parses metadata from a
file's end); :func:`row_group_ranges` turns the metadata into one byte range
per row group: from its first column chunk (the dictionary page when there is
one, else the first data page) to the end of its last (``total_compressed_size``
past each chunk's start).

The footer is hostile input: pyarrow parses the Thrift with its own size limits,
and every range is then checked here -- inside the file, after the leading
``PAR1``, before the footer, row groups in order and non-overlapping, row
counts that add up, no column chunk stored in another file (``file_path``) --
and files pyarrow could not read from those ranges alone are refused:
encrypted footers (``PARE``) and files written by parquet-mr 1.2.8 or older,
whose chunk sizes leave out the dictionary page header, so readers read past
them (PARQUET-816).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mouthguard.data.formats.arrow import pyarrow_modules

MAGIC = b"PAR1"
_ENCRYPTED = b"PARE"
_OLD_PARQUET_MR = re.compile(r"parquet-mr version (\d+)\.(\d+)\.(\d+)")


class FooterError(ValueError):
    """Why a footer or its row groups cannot be used (the caller names the file)."""


@dataclass(frozen=True)
class RowGroupRange:
    """One row group's bytes and rows, as the footer describes them."""

    offset: int
    size: int
    rows: int


def footer_range(tail: bytes, size: int) -> tuple[int, int]:
    """``(offset, size)`` of the footer of a ``size``-byte file whose last 8 bytes are ``tail``.

    The range covers the metadata, its length and the trailing ``PAR1``: the file's end.

    Raises:
        FooterError: not a Parquet file, encrypted, or a length that does not fit.
    """
    if len(tail) != 8:
        raise FooterError("is too short to be a Parquet file")
    if tail[4:] == _ENCRYPTED:
        raise FooterError("has an encrypted footer (encrypted Parquet is not supported)")
    if tail[4:] != MAGIC:
        raise FooterError("does not end with PAR1: not a Parquet file")
    length = int.from_bytes(tail[:4], "little")
    if length < 1 or length + 8 > size - len(MAGIC):
        raise FooterError(
            f"claims a footer of {length} bytes, which a {size}-byte file cannot hold"
        )
    return size - 8 - length, length + 8


def parse_footer(footer: bytes) -> Any:
    """The ``pyarrow.parquet.FileMetaData`` of ``footer`` (metadata, length, ``PAR1``).

    Raises:
        FooterError: pyarrow cannot parse it.
        MissingDependencyError: pyarrow is not installed.
    """
    pa, pq = pyarrow_modules()
    try:
        return pq.read_metadata(pa.BufferReader(MAGIC + footer))
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise FooterError(f"has a footer pyarrow cannot parse ({exc})") from None


def _chunk_range(chunk: Any, where: str) -> tuple[int, int]:
    if chunk.file_path:
        raise FooterError(f"{where} is stored in another file ({chunk.file_path!r:.80})")
    dictionary = chunk.dictionary_page_offset
    start = dictionary if chunk.has_dictionary_page and dictionary else chunk.data_page_offset
    size = chunk.total_compressed_size
    if type(start) is not int or type(size) is not int or start < len(MAGIC) or size < 1:
        raise FooterError(f"{where} has an invalid offset or size ({start}, {size})")
    return start, start + size


def _old_parquet_mr(created_by: str | None) -> bool:
    match = _OLD_PARQUET_MR.search(created_by or "")
    return match is not None and tuple(int(g) for g in match.groups()) < (1, 2, 9)


def row_group_ranges(meta: Any, footer_offset: int) -> list[RowGroupRange]:
    """Each row group's byte range and rows, checked (see the module docstring).

    Raises:
        FooterError: a range or count the file cannot hold, or a file pyarrow
            would not read from these ranges alone.
    """
    if _old_parquet_mr(meta.created_by):
        raise FooterError(
            f"was written by {meta.created_by!r:.80}, whose column chunk sizes are short "
            "(PARQUET-816): readers read past them, so its row groups cannot be fetched "
            "alone; rewrite it with a current writer"
        )
    groups: list[RowGroupRange] = []
    cursor = len(MAGIC)
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        if group.num_columns < 1:
            raise FooterError(f"row group {i} has no column chunks")
        spans = [
            _chunk_range(group.column(j), f"row group {i} column {j}")
            for j in range(group.num_columns)
        ]
        start, end = min(s for s, _ in spans), max(e for _, e in spans)
        if start < cursor or end > footer_offset:
            raise FooterError(
                f"row group {i} (bytes {start} to {end}) overlaps the one before it or the footer"
            )
        if group.num_rows < 0:
            raise FooterError(f"row group {i} has {group.num_rows} rows")
        groups.append(RowGroupRange(start, end - start, group.num_rows))
        cursor = end
    if sum(g.rows for g in groups) != meta.num_rows:
        raise FooterError(
            f"row groups hold {sum(g.rows for g in groups)} rows, the file says {meta.num_rows}"
        )
    return groups


def column_names(meta: Any) -> list[str]:
    """The file's top-level column names, in schema order."""
    return [str(n) for n in meta.schema.to_arrow_schema().names]
