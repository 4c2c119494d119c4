"""``verify_dataset``: re-read every data file and index and check them against the manifest.

Per shard, in this order: the index (size, sha256, then parsed as hostile
input against the shard's size and sample count), the shard's size (a
truncated shard is damage, not a failed read), then every byte of the shard
through concurrent ranged reads, hashed in order, with every member's tar
header checked against the index as its bytes go by. So a shard passes only if
its bytes are the manifest's *and* a tar reader finds in it exactly the
samples the index lists -- and, where the manifest has a range table (version
2), every range's sha256 is checked too, each mismatch named by its range and
bytes, so a shard passes only if both the whole-shard and the per-range
sha256s are right. An adopted shard's headers are the user's writer's
(long names, PAX), so instead its index is derived again from the bytes as
they go by (:mod:`~mouthguard.data.indexing.tarscan`, the same one pass that hashes
them) and must equal the stored one.

Per Parquet file: its size, then every byte in one pass, hashing the file, its
footer and each row group; every range whose sha256 differs is named (``row
group 3 (bytes A to B)``), so the reason says which row groups the loader
would refuse. Then the footer is parsed (pyarrow) and must describe exactly the
row groups the manifest lists.

An adopted dataset's directory is also listed: a data file of its kind that the
manifest does not list (added since indexing) is reported in
:attr:`VerifyReport.unlisted` and makes the report not ok -- the loader reads
only what the manifest lists, so the file would silently not be trained on.
A listed file that is gone is a ``mismatch`` like any missing shard.

Each shard gets one verdict:

* ``ok``;
* ``mismatch`` with the reason: the bytes are damaged or were changed (a
  missing object included);
* ``unreachable`` with the reason: the tier could not be read (an I/O error, a
  timeout, a dead endpoint). That proves nothing about the bytes and is never
  reported as damage.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from mouthguard.data.dataset import Dataset, open_dataset
from mouthguard.data.fetching.ranged import DEFAULT_PARALLEL, DEFAULT_RANGE_SIZE, read_ranges
from mouthguard.data.formats import names, tarfmt
from mouthguard.data.formats.index import ShardIndex
from mouthguard.data.formats.manifest import ParquetRecord, ShardRecord
from mouthguard.data.formats.rangehash import FixedRanges, RangeHasher
from mouthguard.data.indexing.adopt import data_paths
from mouthguard.data.indexing.tarscan import scan_tar
from mouthguard.data.location import Target
from mouthguard.data.reading.gztar import GzipError, gunzip
from mouthguard.errors import (
    AdoptionError,
    ObjectNotFoundError,
    ShardDamagedError,
    TierError,
    is_data_damage,
)
from mouthguard.format.signing import KeySpec

Status = Literal["ok", "mismatch", "unreachable"]


@dataclass(frozen=True)
class ShardCheck:
    """The verdict on one shard (see the module docstring)."""

    name: str
    status: Status
    reason: str = ""
    samples: int = 0
    size: int = 0


@dataclass(frozen=True)
class VerifyReport:
    """Every data file's verdict (shards, or Parquet files), in manifest order.

    Attributes:
        unlisted: an adopted dataset's data files that its manifest does not list.
    """

    dataset: Dataset
    shards: tuple[ShardCheck, ...]
    unlisted: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether every file was read and matched, and no data file is unlisted."""
        return all(s.status == "ok" for s in self.shards) and not self.unlisted

    @property
    def mismatched(self) -> list[ShardCheck]:
        """Shards whose bytes are damaged or changed."""
        return [s for s in self.shards if s.status == "mismatch"]

    @property
    def unreachable(self) -> list[ShardCheck]:
        """Shards that could not be read (not damage)."""
        return [s for s in self.shards if s.status == "unreachable"]


def headers_by_offset(index: ShardIndex) -> dict[int, tuple[str, int]]:
    """Header offset -> (member name, data size) for every member of ``index``."""
    return {
        m.offset - tarfmt.BLOCK: (names.member_name(s.key, m.ext), m.size)
        for s in index.samples
        for m in s.members
    }


def check_shard_bytes(
    dataset: Dataset,
    shard: ShardRecord,
    index: ShardIndex,
    *,
    range_size: int = DEFAULT_RANGE_SIZE,
    parallel: int = DEFAULT_PARALLEL,
) -> None:
    """Read all of ``shard``; check its size, sha256 and every tar header against ``index``.

    Raises:
        ShardDamagedError: a mismatch (the message names the shard and what differs).
        TierError: the shard could not be read (ObjectNotFoundError: it is missing).
    """
    key = dataset.shard_key(shard)
    size = dataset.location.tier.head(key).size
    if size != shard.size:
        raise ShardDamagedError(
            f"shard {shard.name} is {size} bytes, the manifest says {shard.size}"
            + (" (truncated)" if size < shard.size else ""),
            shard=shard.name,
        )
    expected = headers_by_offset(index)
    digest = hashlib.sha256()
    ranges = _range_hasher(shard)
    for start, data in read_ranges(
        dataset.location.tier, key, size, shard=shard.name, range_size=range_size, parallel=parallel
    ):
        digest.update(data)
        if ranges is not None:
            ranges.feed(data)
        # Ranges are whole 512-byte blocks, so every header lies inside one range.
        view = memoryview(data)
        for at in range(start, start + len(data), tarfmt.BLOCK):
            member = expected.get(at)
            if member is not None:
                block = view[at - start : at - start + tarfmt.BLOCK]
                problem = tarfmt.header_problem(block, *member)
                if problem is not None:
                    raise ShardDamagedError(
                        f"shard {shard.name}: at byte {at}: {problem}", shard=shard.name
                    )
    check_ranges(shard, ranges)
    if digest.hexdigest() != shard.sha256:
        raise ShardDamagedError(
            f"shard {shard.name}: sha256 does not match the manifest", shard=shard.name
        )


def _range_hasher(shard: ShardRecord) -> FixedRanges | None:
    return None if shard.ranges is None else FixedRanges(shard.ranges.size)


def check_ranges(shard: ShardRecord, hashed: FixedRanges | None) -> None:
    """ShardDamagedError naming every range whose sha256 is not the manifest's.

    A shard with no range table (a version 1 manifest) has nothing to check here.
    """
    if shard.ranges is None or hashed is None:
        return
    table = shard.ranges
    bad = [k for k, sha in enumerate(hashed.digests()) if sha != table.sha256[k]]
    if bad:
        spans = [(k, *table.span(k, shard.size)) for k in bad[:5]]
        shown = ", ".join(f"range {k} (bytes {o} to {o + n})" for k, o, n in spans)
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ShardDamagedError(
            f"shard {shard.name}: {shown}{more}: sha256 does not match the manifest",
            shard=shard.name,
        )


def _check_size(dataset: Dataset, key: str, name: str, expected: int) -> None:
    size = dataset.location.tier.head(key).size
    if size != expected:
        raise ShardDamagedError(
            f"{name} is {size} bytes, the manifest says {expected}"
            + (" (truncated)" if size < expected else ""),
            shard=name,
        )


def _sizes(read: dict[str, int]) -> tuple[int, int]:
    """``(range_size, parallel)`` of a ``**read`` (their defaults where not given)."""
    return read.get("range_size", DEFAULT_RANGE_SIZE), read.get("parallel", DEFAULT_PARALLEL)


def check_adopted_bytes(
    dataset: Dataset, shard: ShardRecord, index: ShardIndex, **read: int
) -> None:
    """Read all of an adopted shard; its sha256, and its index derived again, must match.

    Raises:
        ShardDamagedError: a mismatch (the message names the shard and what differs).
        TierError: the shard could not be read (ObjectNotFoundError: it is missing).
    """
    key = dataset.shard_key(shard)
    _check_size(dataset, key, shard.name, shard.size)
    size, parallel = _sizes(read)
    chunks = read_ranges(
        dataset.location.tier, key, shard.size, shard=shard.name, range_size=size, parallel=parallel
    )
    ranges = _range_hasher(shard)
    digest = hashlib.sha256()  # the file's bytes as stored (compressed or not)

    def fed() -> Iterator[bytes]:  # the range sha256s of exactly the bytes the scan hashes
        for _, data in chunks:
            digest.update(data)
            if ranges is not None:
                ranges.feed(data)
            yield data

    gzipped = names.is_gzip_tar(shard.name)
    try:
        tar = gunzip(fed(), limit=index.size) if gzipped else fed()
        scan = scan_tar(tar, None if gzipped else shard.size, shard.name)
    except AdoptionError as exc:  # names the shard itself
        raise ShardDamagedError(str(exc), shard=shard.name) from None
    except GzipError as exc:
        raise ShardDamagedError(f"{shard.name}: {exc}", shard=shard.name) from None
    check_ranges(shard, ranges)
    if digest.hexdigest() != shard.sha256:
        raise ShardDamagedError(
            f"{shard.name}: sha256 does not match the manifest", shard=shard.name
        )
    if scan.samples != index.samples or scan.size != index.size:
        raise ShardDamagedError(
            f"{shard.name}: its index does not list the samples a tar reader finds",
            shard=shard.name,
        )


def verify_shard(dataset: Dataset, shard: ShardRecord, **read: int) -> ShardCheck:
    """The verdict on one shard (never raises for damage or an unreachable tier)."""
    try:
        index = dataset.read_index(shard)
        if dataset.manifest.adopted:
            check_adopted_bytes(dataset, shard, index, **read)
        else:
            check_shard_bytes(dataset, shard, index, **read)
    except ObjectNotFoundError:
        return ShardCheck(shard.name, "mismatch", f"shard {shard.name} is missing")
    except (ShardDamagedError, TierError) as exc:
        status: Status = "mismatch" if is_data_damage(exc) else "unreachable"
        return ShardCheck(shard.name, status, str(exc))
    return ShardCheck(shard.name, "ok", samples=shard.samples, size=shard.size)


def check_parquet_bytes(dataset: Dataset, record: ParquetRecord, **read: int) -> None:
    """Read all of a Parquet file: its sha256, its footer's and every row group's must match.

    Raises:
        ShardDamagedError: a mismatch, naming the file and every row group that differs.
        TierError: the file could not be read (ObjectNotFoundError: it is missing).
        MissingDependencyError: pyarrow is not installed (to parse the footer).
    """
    from mouthguard.data.formats.pqfooter import FooterError, parse_footer, row_group_ranges  # noqa: PLC0415

    key = dataset.file_key(record)
    _check_size(dataset, key, record.name, record.size)
    footer = record.footer
    hasher = RangeHasher(
        [(g.offset, g.size) for g in record.row_groups] + [(footer.offset, footer.size)]
    )
    size, parallel = _sizes(read)
    for start, data in read_ranges(
        dataset.location.tier,
        key,
        record.size,
        shard=record.name,
        range_size=size,
        parallel=parallel,
    ):
        hasher.feed(start, data)
    *digests, footer_sha = hasher.digests()
    bad = [
        f"row group {i} (bytes {g.offset} to {g.end})"
        for i, (g, sha) in enumerate(zip(record.row_groups, digests, strict=True))
        if sha != g.sha256
    ]
    if footer_sha != footer.sha256:
        bad.append(f"footer (bytes {footer.offset} to {footer.end})")
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        raise ShardDamagedError(
            f"{record.name}: {shown}: sha256 does not match the manifest", shard=record.name
        )
    if hasher.whole.hexdigest() != record.sha256:
        raise ShardDamagedError(
            f"{record.name}: sha256 does not match the manifest (outside its row groups and "
            "footer)",
            shard=record.name,
        )
    raw = dataset.location.tier.get(key, footer.offset, footer.end)
    try:
        ranges = row_group_ranges(parse_footer(raw), footer.offset)
    except FooterError as exc:
        raise ShardDamagedError(f"{record.name}: {exc}", shard=record.name) from None
    if [(r.offset, r.size, r.rows) for r in ranges] != [
        (g.offset, g.size, g.rows) for g in record.row_groups
    ]:
        raise ShardDamagedError(
            f"{record.name}: its footer does not describe the row groups the manifest lists",
            shard=record.name,
        )


def verify_file(dataset: Dataset, record: ParquetRecord, **read: int) -> ShardCheck:
    """The verdict on one Parquet file (never raises for damage or an unreachable tier)."""
    try:
        check_parquet_bytes(dataset, record, **read)
    except ObjectNotFoundError:
        return ShardCheck(record.name, "mismatch", f"{record.name} is missing")
    except (ShardDamagedError, TierError) as exc:
        status: Status = "mismatch" if is_data_damage(exc) else "unreachable"
        return ShardCheck(record.name, status, str(exc))
    return ShardCheck(record.name, "ok", samples=record.rows, size=record.size)


def unlisted_files(dataset: Dataset) -> tuple[str, ...]:
    """An adopted dataset's data files of its kind that the manifest does not list."""
    if not dataset.manifest.adopted:
        return ()
    kind = dataset.manifest.kind
    listed = {s.name for s in dataset.shards} | {f.name for f in dataset.files}
    return tuple(p for p in data_paths(dataset.location, kind) if p not in listed)


def verify_dataset(
    source: Target | Dataset,
    *,
    prefix: str = "",
    signing_key: KeySpec | None = None,
    workers: int = 2,
    on_shard: Callable[[ShardCheck], None] | None = None,
) -> VerifyReport:
    """Re-read every data file and index of a dataset against its manifest.

    Args:
        source: an opened :class:`Dataset`, or where one is (see :func:`open_dataset`).
        prefix: the dataset's key prefix inside ``source``.
        signing_key: manifest keys; default ``$MOUTHGUARD_MANIFEST_KEY`` (with a key,
            an unsigned or wrongly signed manifest raises before any shard is read).
        workers: shards verified at once (each with its own concurrent ranged reads).
        on_shard: called with each verdict (a shard's, or a Parquet file's) as it is
            reached (progress), in any order.

    Returns:
        The verdicts in manifest order.

    Raises:
        DatasetNotFoundError: nothing is committed there.
        ManifestError: the manifest itself is damaged, hostile or wrongly signed.
    """
    dataset = (
        source
        if isinstance(source, Dataset)
        else open_dataset(source, prefix=prefix, signing_key=signing_key)
    )

    def one(item: ShardRecord | ParquetRecord) -> ShardCheck:
        if isinstance(item, ParquetRecord):
            check = verify_file(dataset, item)
        else:
            check = verify_shard(dataset, item)
        if on_shard is not None:
            on_shard(check)
        return check

    # Not io.pool.SHARED: a job is a whole shard (its ranged reads, on data.ranged's
    # threads, and its hash); on SHARED it would hold a thread that checkpoint writes
    # and loads need for as long as that takes.
    items: tuple[ShardRecord | ParquetRecord, ...] = (*dataset.shards, *dataset.files)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="verify") as pool:
        checks = tuple(pool.map(one, items))
    return VerifyReport(dataset, checks, unlisted_files(dataset))
