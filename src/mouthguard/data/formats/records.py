"""What a dataset manifest records per data file, and each record's hostile-input checks.

Two kinds of data file:

* a **tar shard** (:class:`ShardRecord`): name, size, sha256, sample count, and its
  index (:class:`IndexRecord`: name, size, sha256). A packed dataset's shards are
  ours, named ``shard-NNNNNN.tar`` and numbered from 0 in order; an adopted
  dataset's shards are the user's, named by their path relative to the dataset
  (:func:`~mouthguard.data.formats.names.check_data_path`: ``.tar``, or gzip-compressed
  ``.tar.gz`` / ``.tgz``, whose size and sha256 are the compressed file's and
  whose index counts offsets in the tar inside), sorted and unique, each with
  the index named after it;
* a **Parquet file** (:class:`ParquetRecord`): path, size, sha256, the byte range
  and sha256 of its footer (the Thrift metadata, its 4-byte length and ``PAR1``),
  and per row group its byte range, row count and sha256. A row group's range
  runs from its first column chunk to the end of its last (Parquet writes them
  contiguously); the loader fetches only the footer and the row groups it reads,
  each verified against its own sha256.

Every check here runs on hostile input: exact member sets, every type, 64-hex
sha256s, and counts and ranges that a file of the recorded size can hold --
ranges inside the file, sorted, non-overlapping, before the footer, the footer
ending the file. The loader plans its order from sample and row counts before
reading anything else, so a count above :data:`MAX_UNIT_SAMPLES` is refused: a
hostile count must not become an allocation.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from mouthguard.data.formats import names
from mouthguard.errors import InvalidKeyError, ManifestError
from mouthguard.format.typed_json import JsonValue
from mouthguard.tiers.object_keys import is_valid_segment

#: Samples one shard, or rows one row group, may claim (see the module docstring).
MAX_UNIT_SAMPLES = 10_000_000
#: Range sizes a manifest may record: whole tar blocks, from 64 KiB to 1 GiB.
RANGE_ALIGN = 512
MIN_RANGE = 64 * 1024
MAX_RANGE = 1024 * 1024 * 1024
#: What the writer and ``data index`` record: measured by ``python -m benchmarks.data.ranges``
#: (docs/architecture.md, "Streamed shards").
DEFAULT_RANGE = 2 * 1024 * 1024
#: ``PAR1`` + the footer's length + ``PAR1``: no Parquet file is smaller.
MIN_PARQUET_BYTES = 12
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class IndexRecord:
    """A shard's index object, as the manifest records it."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class RangeTable:
    """A shard's per-range sha256s: range ``k`` is bytes ``[k * size, min((k + 1) * size, end))``.

    The offsets are implied by ``size``, so the ranges tile the shard by
    construction: no gap, no overlap, nothing past the end -- the parser only
    has to check that there is one digest per range.
    """

    size: int
    sha256: tuple[str, ...]

    def span(self, k: int, file_size: int) -> tuple[int, int]:
        """``(offset, length)`` of range ``k`` of a file of ``file_size`` bytes."""
        offset = k * self.size
        return offset, min(self.size, file_size - offset)


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """One tar shard, as the manifest records it (``ranges``: None in a version 1 manifest)."""

    name: str
    size: int
    sha256: str
    samples: int
    index: IndexRecord
    ranges: RangeTable | None = None


@dataclass(frozen=True, slots=True)
class ByteRange:
    """``size`` bytes at ``offset`` of a file, and their sha256."""

    offset: int
    size: int
    sha256: str

    @property
    def end(self) -> int:
        """The offset just past the range."""
        return self.offset + self.size


@dataclass(frozen=True, slots=True)
class RowGroupRecord:
    """One row group of a Parquet file: its byte range, rows and sha256."""

    offset: int
    size: int
    rows: int
    sha256: str

    @property
    def end(self) -> int:
        """The offset just past the row group's last column chunk."""
        return self.offset + self.size


@dataclass(frozen=True, slots=True)
class ParquetRecord:
    """One Parquet file, as the manifest records it."""

    name: str
    size: int
    sha256: str
    footer: ByteRange
    row_groups: tuple[RowGroupRecord, ...]

    @property
    def rows(self) -> int:
        """Rows in the file."""
        return sum(g.rows for g in self.row_groups)


def shard_json(s: ShardRecord) -> dict[str, JsonValue]:
    """A shard record as the manifest writes it (``ranges`` only when it has them)."""
    body: dict[str, JsonValue] = {
        "name": s.name,
        "size": s.size,
        "sha256": s.sha256,
        "samples": s.samples,
        "index": {"name": s.index.name, "size": s.index.size, "sha256": s.index.sha256},
    }
    if s.ranges is not None:
        body["ranges"] = {"size": s.ranges.size, "sha256": list[JsonValue](s.ranges.sha256)}
    return body


def parquet_json(f: ParquetRecord) -> dict[str, JsonValue]:
    """A Parquet file record as the manifest writes it."""
    return {
        "name": f.name,
        "size": f.size,
        "sha256": f.sha256,
        "footer": {"offset": f.footer.offset, "size": f.footer.size, "sha256": f.footer.sha256},
        "row_groups": [
            {"offset": g.offset, "size": g.size, "rows": g.rows, "sha256": g.sha256}
            for g in f.row_groups
        ],
    }


def shard_line(s: ShardRecord) -> str:
    """A shard's canonical fingerprint line (every field ASCII from a fixed alphabet)."""
    return f"{s.name}\t{s.sha256}\t{s.samples}\t{s.index.name}\t{s.index.sha256}\n"


def parquet_lines(f: ParquetRecord) -> str:
    """A Parquet file's canonical fingerprint lines: the file, its footer, its row groups."""
    lines = [f"{f.name}\t{f.size}\t{f.sha256}\tfooter\t{f.footer.offset}\t{f.footer.sha256}\n"]
    lines += [f"\t{g.offset}\t{g.size}\t{g.rows}\t{g.sha256}\n" for g in f.row_groups]
    return "".join(lines)


class Checker:
    """Field checks of a manifest; every failure is a :class:`ManifestError`."""

    def fail(self, why: str) -> ManifestError:
        """The error for ``why``."""
        return ManifestError(f"dataset manifest {why}")

    def members(self, obj: JsonValue, expected: set[str], what: str) -> dict[str, JsonValue]:
        """``obj`` if it is an object with exactly the members ``expected``."""
        if type(obj) is not dict or set(obj) != expected:
            raise self.fail(f"{what} must be an object with exactly {sorted(expected)}")
        return obj

    def count(self, value: JsonValue, what: str, low: int = 0) -> int:
        """``value`` if it is an integer >= ``low``."""
        if type(value) is not int or value < low:
            raise self.fail(f"{what} must be an integer >= {low}, got {value!r:.40}")
        return value

    def sha(self, value: JsonValue, what: str) -> str:
        """``value`` if it is 64 lowercase hex digits."""
        if type(value) is not str or not _SHA256.fullmatch(value):
            raise self.fail(f"{what} must be 64 lowercase hex digits")
        return value

    def segment(self, value: JsonValue, what: str) -> str:
        """``value`` if it is a valid single path segment (a dataset's name)."""
        if type(value) is not str or not is_valid_segment(value):
            raise self.fail(f"{what} {value!r:.80} is not a valid single path segment")
        return value

    def time(self, value: JsonValue) -> dt.datetime:
        """``value`` as a UTC time written ``YYYY-MM-DDTHH:MM:SSZ``."""
        if type(value) is str and len(value) == 20 and value.endswith("Z"):
            try:
                return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
            except ValueError:
                pass
        raise self.fail(f"created {value!r:.40} is not a UTC time YYYY-MM-DDTHH:MM:SSZ")

    def strings(self, value: JsonValue, what: str) -> tuple[str, ...]:
        """``value`` if it is a list of strings of at most 1024 characters."""
        if type(value) is not list or not all(type(v) is str and len(v) <= 1024 for v in value):
            raise self.fail(f"{what} must be a list of strings (at most 1024 characters each)")
        return tuple(str(v) for v in value)

    def path(
        self, value: JsonValue, suffix: str | tuple[str, ...], previous: str | None, what: str
    ) -> str:
        """``value`` if it is a data file path (see names) sorting after ``previous``."""
        try:
            path = names.check_data_path(value, suffix)
        except InvalidKeyError as exc:
            raise self.fail(f"{what}: {exc}") from None
        if previous is not None and path <= previous:
            raise self.fail(f"{what} {path!r:.80} is not after {previous!r:.80}: unsorted or twice")
        return path

    def shard(
        self,
        raw: JsonValue,
        number: int,
        previous: str | None,
        adopted: bool,
        ranged: bool = False,
    ) -> ShardRecord:
        """Shard ``number`` of a packed dataset, or of an adopted one (after ``previous``).

        ``ranged``: the manifest's version allows a ``ranges`` member (2 and later).
        """
        allowed = {"name", "size", "sha256", "samples", "index"}
        if ranged and type(raw) is dict and "ranges" in raw:
            allowed.add("ranges")
        obj = self.members(raw, allowed, f"shard {number}")
        if adopted:
            name = self.path(obj["name"], names.TAR_SUFFIXES, previous, f"shard {number}")
            index_name = names.adopted_index_name(name)
        else:
            name = names.shard_name(number)
            if obj["name"] != name:
                raise self.fail(f"shard {number} is named {obj['name']!r:.80}, not {name}")
            index_name = names.index_name(name)
        where = f"shard {name}"
        index = self.members(obj["index"], {"name", "size", "sha256"}, f"{where} index")
        if index["name"] != index_name:
            raise self.fail(f"{where} has index {index['name']!r:.80}, not its own")
        size = self.count(obj["size"], f"{where} size", 1)
        if not adopted and size % 10240:  # tarfile pads every archive to whole records
            raise self.fail(f"{where} size {size} is not a whole number of tar records")
        samples = self.count(obj["samples"], f"{where} samples", 1)
        # A sample takes a header at least -- of the tar, which a gzip-compressed
        # shard holds in fewer bytes than its own.
        room = MAX_UNIT_SAMPLES if names.is_gzip_tar(name) else min(MAX_UNIT_SAMPLES, size // 512)
        if samples > room:
            raise self.fail(f"{where} claims {samples} samples: more than {size} bytes can hold")
        return ShardRecord(
            name,
            size,
            self.sha(obj["sha256"], f"{where} sha256"),
            samples,
            IndexRecord(
                index_name,
                self.count(index["size"], f"{where} index size", 1),
                self.sha(index["sha256"], f"{where} index sha256"),
            ),
            self._ranges_of(obj, name, size, where),
        )

    def _ranges_of(
        self, obj: dict[str, JsonValue], name: str, size: int, where: str
    ) -> RangeTable | None:
        """The shard's range table, or None; a gzip stream has none (it cannot be range-read)."""
        if "ranges" not in obj:
            return None
        if names.is_gzip_tar(name):
            raise self.fail(f"{where} is gzip-compressed: it has no range table")
        return self.ranges(obj["ranges"], size, where)

    def ranges(self, raw: JsonValue, file_size: int, where: str) -> RangeTable:
        """A range table that tiles a file of ``file_size`` bytes (see :class:`RangeTable`)."""
        obj = self.members(raw, {"size", "sha256"}, f"{where} ranges")
        size = obj["size"]
        if type(size) is not int or not MIN_RANGE <= size <= MAX_RANGE or size % RANGE_ALIGN:
            raise self.fail(
                f"{where} range size {size!r:.40} is not a multiple of {RANGE_ALIGN} "
                f"in [{MIN_RANGE}, {MAX_RANGE}]"
            )
        digests = obj["sha256"]
        expected = -(-file_size // size)
        if type(digests) is not list or len(digests) != expected:
            got = len(digests) if type(digests) is list else "no list of"
            raise self.fail(
                f"{where} ranges do not cover the shard: {got} sha256s for "
                f"{file_size} bytes in ranges of {size} ({expected} needed)"
            )
        return RangeTable(size, tuple(self.sha(d, f"{where} range sha256") for d in digests))

    def parquet(self, raw: JsonValue, number: int, previous: str | None) -> ParquetRecord:
        """Parquet file ``number`` (after ``previous``): ranges inside it, sorted, footer last."""
        obj = self.members(
            raw, {"name", "size", "sha256", "footer", "row_groups"}, f"parquet file {number}"
        )
        name = self.path(obj["name"], ".parquet", previous, f"parquet file {number}")
        size = self.count(obj["size"], f"{name} size", MIN_PARQUET_BYTES)
        foot = self.members(obj["footer"], {"offset", "size", "sha256"}, f"{name} footer")
        footer = ByteRange(
            self.count(foot["offset"], f"{name} footer offset", 4),
            self.count(foot["size"], f"{name} footer size", 8),
            self.sha(foot["sha256"], f"{name} footer sha256"),
        )
        if footer.end != size:
            raise self.fail(f"{name} footer does not end the file ({footer.end} != {size})")
        raw_groups = obj["row_groups"]
        if type(raw_groups) is not list:
            raise self.fail(f"{name} row_groups must be a list")
        groups: list[RowGroupRecord] = []
        cursor = 4  # after the leading PAR1
        for i, item in enumerate(raw_groups):
            where = f"{name} row group {i}"
            g = self.members(item, {"offset", "size", "rows", "sha256"}, where)
            group = RowGroupRecord(
                self.count(g["offset"], f"{where} offset", cursor),
                self.count(g["size"], f"{where} size", 1),
                self.count(g["rows"], f"{where} rows"),
                self.sha(g["sha256"], f"{where} sha256"),
            )
            if group.end > footer.offset:
                raise self.fail(f"{where} runs into the footer or past the end of the file")
            if group.rows > MAX_UNIT_SAMPLES:
                raise self.fail(f"{where} claims {group.rows} rows: over {MAX_UNIT_SAMPLES}")
            groups.append(group)
            cursor = group.end
        return ParquetRecord(
            name, size, self.sha(obj["sha256"], f"{name} sha256"), footer, tuple(groups)
        )
