"""Indexing a user's Parquet file: its footer, each row group's byte range, every sha256, one read.

:func:`scan_parquet` reads the file's last 8 bytes and its footer with two
ranged reads, derives the row groups' byte ranges from the footer
(:mod:`~mouthguard.data.formats.pqfooter`, all checked), then reads the whole file once,
front to back, hashing the file, the footer and every row group in the same
pass (:class:`~mouthguard.data.formats.rangehash.RangeHasher`). The footer hashed in
that pass must be the one parsed: a file that changed while it was being
indexed is refused rather than recorded half old, half new.

The result is the file's :class:`~mouthguard.data.formats.records.ParquetRecord` and its
column names. Anything wrong raises :class:`~mouthguard.errors.AdoptionError`
naming the file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from mouthguard.data.fetching.ranged import read_ranges
from mouthguard.data.formats.pqfooter import (
    FooterError,
    column_names,
    footer_range,
    parse_footer,
    row_group_ranges,
)
from mouthguard.data.formats.rangehash import RangeHasher
from mouthguard.data.formats.records import (
    MAX_UNIT_SAMPLES,
    MIN_PARQUET_BYTES,
    ByteRange,
    ParquetRecord,
    RowGroupRecord,
)
from mouthguard.errors import AdoptionError
from mouthguard.tiers import Tier


@dataclass(frozen=True)
class ParquetScan:
    """What one read of a Parquet file found."""

    record: ParquetRecord
    columns: tuple[str, ...]


def scan_parquet(
    tier: Tier,
    key: str,
    size: int,
    name: str,
    *,
    range_size: int,
    parallel: int,
    on_bytes: Callable[[int], None] | None = None,
) -> ParquetScan:
    """Index the Parquet file ``key`` (``size`` bytes, ``name`` relative to the dataset).

    Raises:
        AdoptionError: not a Parquet file that can be read by row group (names it and why).
        MissingDependencyError: pyarrow is not installed.
        TierError: the file could not be read.
    """
    if size < MIN_PARQUET_BYTES:
        raise AdoptionError(f"{name}: {size} bytes is too short to be a Parquet file")
    try:
        offset, length = footer_range(tier.get(key, size - 8, size), size)
        footer = tier.get(key, offset, size)
        meta = parse_footer(footer)
        groups = row_group_ranges(meta, offset)
    except FooterError as exc:
        raise AdoptionError(f"{name}: {exc}") from None
    for i, group in enumerate(groups):
        if group.rows > MAX_UNIT_SAMPLES:
            raise AdoptionError(
                f"{name}: row group {i} holds {group.rows} rows, more than the loader takes "
                f"in one row group ({MAX_UNIT_SAMPLES}); rewrite it with smaller row groups"
            )
    hasher = RangeHasher([(g.offset, g.size) for g in groups] + [(offset, length)])
    for start, data in read_ranges(
        tier, key, size, shard=name, range_size=range_size, parallel=parallel
    ):
        hasher.feed(start, data)
        if on_bytes is not None:
            on_bytes(len(data))
    *digests, footer_sha = hasher.digests()
    if footer_sha != hashlib.sha256(footer).hexdigest():
        raise AdoptionError(f"{name}: changed while it was being indexed (its footer differs)")
    record = ParquetRecord(
        name,
        size,
        hasher.whole.hexdigest(),
        ByteRange(offset, length, footer_sha),
        tuple(
            RowGroupRecord(g.offset, g.size, g.rows, sha)
            for g, sha in zip(groups, digests, strict=True)
        ),
    )
    return ParquetScan(record, tuple(column_names(meta)))
