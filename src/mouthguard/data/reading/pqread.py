"""The loader's reader of Parquet row groups: rows out of verified byte ranges, by pyarrow.

A row group is the loader's unit: shuffled, cached, prefetched and resumed by,
as a tar shard is. To read one, the loader fetches two verified byte ranges of
the user's file (:class:`~mouthguard.data.fetching.fetch.ShardSource`, each checked
against its own sha256 in the manifest before use): the footer, parsed once
per file per process, and the row group. pyarrow then decodes the row group
from those bytes only: it is handed the parsed footer (so it never reads the
file's tail) and a read-only file object (:class:`_RangeFile`) that serves the
row group's range and refuses any read outside it. Nothing unverified can
reach the decoder; a pyarrow that wanted other bytes fails loudly instead of
reading around the check.

The footer's row groups must be the manifest's (offsets, sizes, rows): its
sha256 matched, so they are unless the manifest was forged without a key.

Rows come out as dicts (column name -> Python value, ``pyarrow``'s
``to_pylist``), converted in batches of the loader's read order: a decoded row
group is kept, columnar, while its block is read.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mouthguard.data.fetching.cache import ShardFile
from mouthguard.data.fetching.fetch import ShardSource
from mouthguard.data.formats.arrow import pyarrow_modules
from mouthguard.data.formats.part import Part
from mouthguard.data.formats.pqfooter import FooterError, parse_footer, row_group_ranges
from mouthguard.data.formats.records import ParquetRecord
from mouthguard.errors import DatasetError, ShardDamagedError

Row = dict[str, Any]
#: Parsed footers kept per process.
_FOOTER_MEMO = 16


class _RangeFile(io.RawIOBase):
    """A ``size``-byte read-only file of which only ``data`` at ``offset`` may be read."""

    def __init__(self, size: int, offset: int, data: bytes, what: str) -> None:
        super().__init__()
        self._size = size
        self._offset = offset
        self._data = memoryview(data)
        self._what = what
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = base + offset
        return self._position

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        out = memoryview(buffer).cast("B")
        n = min(len(out), max(0, self._size - self._position))
        lo = self._position - self._offset
        if lo < 0 or lo + n > len(self._data):
            raise DatasetError(
                f"pyarrow asked for bytes {self._position} to {self._position + n} to decode "
                f"{self._what}, outside its verified range: refused"
            )
        out[:n] = self._data[lo : lo + n]
        self._position += n
        return n


class RowGroup:
    """An opened row group: its verified bytes, decoded on first use; close to release."""

    def __init__(self, file: ShardFile, meta: Any, record: ParquetRecord, number: int) -> None:
        self.file = file
        self.meta = meta
        self.record = record
        self.number = number
        self._table: Any = None

    def _decode(self) -> Any:
        if self._table is None:
            _, pq = pyarrow_modules()
            group = self.record.row_groups[self.number]
            what = f"{self.record.name} row group {self.number}"
            source = _RangeFile(self.record.size, group.offset, self.file.read(0, group.size), what)
            try:
                parquet = pq.ParquetFile(source, metadata=self.meta, pre_buffer=False)
                self._table = parquet.read_row_group(self.number)
            except DatasetError:
                raise
            except Exception as exc:  # noqa: BLE001 - pyarrow's decoding errors are many kinds
                raise DatasetError(
                    f"{what}: pyarrow cannot decode it from its verified bytes ({exc})"
                ) from None
        return self._table

    def rows(self, items: Sequence[int]) -> list[Row]:
        """Rows ``items`` of the row group, as dicts."""
        table = self._decode()
        first = items[0]
        if list(items) == list(range(first, first + len(items))):  # in order: a slice, no copy
            picked = table.slice(first, len(items))
        else:
            picked = table.take(list(items))
        rows: list[Row] = picked.to_pylist()
        return rows

    def close(self) -> None:
        """Release the file (its cache pin) and the decoded rows."""
        self.file.close()
        self._table = None


class RowGroupUnits:
    """Row groups as the loader's units, numbered in manifest order across files."""

    def __init__(self, source: ShardSource) -> None:
        pyarrow_modules()  # fails now, with what to install, rather than in a worker
        self.source = source
        self.files = source.dataset.manifest.files
        self.units = [
            (f, g) for f, file in enumerate(self.files) for g in range(len(file.row_groups))
        ]
        self._footers: OrderedDict[int, Any] = OrderedDict()
        self._lock = threading.Lock()

    def warm(self, units: Sequence[int]) -> None:
        """Nothing to start ahead: a row group's footer is read with its first unit."""
        del units

    def close(self) -> None:
        """Release the source (row groups are fetched whole: nothing streams)."""
        self.source.close()

    def _footer(self, number: int) -> Any:
        with self._lock:
            meta = self._footers.get(number)
            if meta is not None:
                self._footers.move_to_end(number)
                return meta
        record = self.files[number]
        footer = record.footer
        part = Part(record.name, "footer", record.size, footer.offset, footer.size, footer.sha256)
        handle = self.source.open_part(self.source.dataset.file_key(record), part, must=True)
        assert handle is not None  # must=True never gives up
        try:
            raw = handle.read(0, footer.size)
        finally:
            handle.close()
        try:
            meta = parse_footer(raw)
            ranges = row_group_ranges(meta, footer.offset)
        except FooterError as exc:
            raise ShardDamagedError(f"{record.name}: {exc}", shard=record.name) from None
        listed = [(g.offset, g.size, g.rows) for g in record.row_groups]
        if [(r.offset, r.size, r.rows) for r in ranges] != listed:
            raise ShardDamagedError(
                f"{record.name}: its footer does not describe the row groups the manifest lists",
                shard=record.name,
            )
        with self._lock:
            self._footers[number] = meta
            while len(self._footers) > _FOOTER_MEMO:
                self._footers.popitem(last=False)
        return meta

    def open_unit(self, number: int, *, must: bool) -> RowGroup | None:
        """Row group ``number``: footer and bytes verified (None: no room for a prefetch)."""
        f, g = self.units[number]
        record = self.files[f]
        meta = self._footer(f)
        group = record.row_groups[g]
        part = Part(
            record.name, f"row group {g}", record.size, group.offset, group.size, group.sha256
        )
        file = self.source.open_part(self.source.dataset.file_key(record), part, must=must)
        return None if file is None else RowGroup(file, meta, record, g)

    def read(
        self, opened: Mapping[int, RowGroup], units: Sequence[int], items: Sequence[int]
    ) -> Iterator[Row]:
        """Row ``items[i]`` of row group ``units[i]`` for each ``i``, converted per row group."""
        wanted: dict[int, list[int]] = {}
        for unit, item in zip(units, items, strict=True):
            wanted.setdefault(unit, []).append(item)
        converted = {unit: iter(opened[unit].rows(rows)) for unit, rows in wanted.items()}
        for unit in units:
            yield next(converted[unit])
