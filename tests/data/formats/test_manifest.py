"""dataset.json: sealed, optionally signed, its fingerprint, and hostile manifests refused.

Packed, adopted (``"layout": "indexed"``) and Parquet manifests alike.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data import open_dataset
from mouthguard.data.formats.manifest import (
    MAX_MANIFEST_BYTES,
    ByteRange,
    IndexRecord,
    ParquetRecord,
    RangeTable,
    RowGroupRecord,
    ShardRecord,
    encode_manifest,
    encode_parquet_manifest,
    fingerprint,
    parquet_fingerprint,
    parse_manifest,
)
from mouthguard.data.formats.names import adopted_index_name
from mouthguard.errors import ManifestError, SignatureError
from mouthguard.format.sealed import seal, unseal
from mouthguard.format.signing import manifest_keys

from ..helpers import write_dataset

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
Body = dict[str, Any]


def _record(number: int, sha: str = "a", samples: int = 3) -> ShardRecord:
    name = f"shard-{number:06d}.tar"
    return ShardRecord(
        name,
        10240 * (number + 1),
        sha * 64,
        samples,
        IndexRecord(f"shard-{number:06d}.index.json", 100, "b" * 64),
    )


def _raw(shards: list[ShardRecord] | None = None, keys: Any = None) -> bytes:
    return encode_manifest(
        "ds",
        shards or [_record(0), _record(1, "c")],
        ["jpg", "txt"],
        created=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        keys=keys,
    )


def test_round_trip() -> None:
    manifest = parse_manifest(_raw(), None)
    assert manifest.name == "ds"
    assert manifest.created == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert [s.name for s in manifest.shards] == ["shard-000000.tar", "shard-000001.tar"]
    assert manifest.samples == 6 and manifest.nbytes == 10240 * 3
    assert manifest.extensions == ("jpg", "txt")
    assert manifest.fingerprint == fingerprint(manifest.shards)
    assert not manifest.signed and manifest.signature_key is None


def test_fingerprint_names_the_content_only() -> None:
    base = [_record(0), _record(1, "c")]
    assert fingerprint(base) == fingerprint(list(base))
    changed_sha = [_record(0), _record(1, "d")]
    changed_count = [_record(0), _record(1, "c", samples=4)]
    one = base[1]
    changed_index = [
        _record(0),
        ShardRecord(
            one.name, one.size, one.sha256, one.samples, IndexRecord(one.index.name, 1, "e" * 64)
        ),
    ]
    prints = {fingerprint(s) for s in (base, changed_sha, changed_count, changed_index)}
    assert len(prints) == 4
    # Name and creation time are not content: a copy elsewhere keeps its fingerprint.
    other = encode_manifest("other", base, ["x"], created=dt.datetime.now(dt.UTC), keys=None)
    assert parse_manifest(other, None).fingerprint == fingerprint(base)


def test_any_changed_byte_is_detected() -> None:
    raw = _raw()
    for offset in range(0, len(raw), 37):
        damaged = bytearray(raw)
        damaged[offset] ^= 0x20
        with pytest.raises(ManifestError):
            parse_manifest(bytes(damaged), None)


def test_signed_manifest_verifies_with_the_key() -> None:
    keys = manifest_keys(KEY)
    manifest = parse_manifest(_raw(keys=keys), keys)
    assert manifest.signed and manifest.signature_key is not None
    # A reader without a key still accepts it (checksums only).
    assert parse_manifest(_raw(keys=keys), None).signature_key is None


def test_unsigned_manifest_is_refused_when_a_key_is_set() -> None:
    with pytest.raises(SignatureError, match="not signed"):
        parse_manifest(_raw(), manifest_keys(KEY))


def test_wrong_key_is_refused() -> None:
    with pytest.raises(SignatureError):
        parse_manifest(_raw(keys=manifest_keys(KEY)), manifest_keys(OTHER_KEY))


def test_tampered_and_resealed_signed_manifest_is_refused() -> None:
    """Someone without the key changes a shard's sha256 and reseals: the signature catches it."""
    keys = manifest_keys(KEY)
    body = unseal(_raw(keys=keys))
    signature = body.pop("manifest_signature")
    body["shards"][0]["sha256"] = "f" * 64  # type: ignore[index, call-overload]
    body["fingerprint"] = fingerprint(  # keep it self-consistent: only the signature knows
        [_record(0, "f"), _record(1, "c")]
    )
    forged = seal(body, lambda _: str(signature))
    with pytest.raises(SignatureError, match="does not verify"):
        parse_manifest(forged, keys)


def _resealed(change: Callable[[Body], None]) -> bytes:
    body = unseal(_raw())
    change(body)
    return seal(body)


def _shard(field: str, value: Any) -> Callable[[Body], None]:
    return lambda b: b["shards"][0].__setitem__(field, value)


HOSTILE: dict[str, Callable[[Body], None]] = {
    "another format": lambda b: b.__setitem__("format", "mouthguard-checkpoint"),
    "a newer version": lambda b: b.__setitem__("version", 3),
    "a version that is a string": lambda b: b.__setitem__("version", "2"),
    "ranges in a version 1 manifest": _shard("ranges", {"size": 65536, "sha256": ["a" * 64]}),
    "another kind": lambda b: b.__setitem__("kind", "parquet"),
    "an unknown member": lambda b: b.__setitem__("extra", 1),
    "a member missing": lambda b: b.pop("totals"),
    "a name with a slash": lambda b: b.__setitem__("name", "a/b"),
    "a dot name": lambda b: b.__setitem__("name", ".hidden"),
    "no shards": lambda b: b.__setitem__("shards", []),
    "shard traversal": _shard("name", "../../etc/passwd"),
    "shards out of order": lambda b: b["shards"].reverse(),
    "index of another shard": lambda b: b["shards"][0]["index"].__setitem__(
        "name", "shard-000001.index.json"
    ),
    "sha256 not hex": _shard("sha256", "z" * 64),
    "sha256 upper case": _shard("sha256", "A" * 64),
    "size a bool": _shard("size", True),
    "size not whole records": _shard("size", 10241),
    "zero samples": _shard("samples", 0),
    "more samples than bytes": _shard("samples", 21),  # 10240 bytes hold at most 20
    "a billion samples": lambda b: b["shards"][0].update(size=10240 * 10**6, samples=10**9),
    "totals that do not add up": lambda b: b["totals"].__setitem__("samples", 999),
    "a fingerprint of other shards": lambda b: b.__setitem__("fingerprint", "sha256:" + "0" * 64),
    "a bad time": lambda b: b.__setitem__("created", "yesterday"),
    "a bad extension": lambda b: b.__setitem__("extensions", ["../x"]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_manifest_with_a_valid_seal_is_refused(case: str) -> None:
    with pytest.raises(ManifestError, match="dataset manifest"):
        parse_manifest(_resealed(HOSTILE[case]), None)


def _ranged(number: int, size: int, range_size: int = 65536) -> ShardRecord:
    base = _record(number)
    count = -(-size // range_size)
    table = RangeTable(range_size, tuple(f"{k % 10}" * 64 for k in range(count)))
    return replace(base, size=size, ranges=table)


def test_ranged_manifest_is_version_2_and_round_trips() -> None:
    shards = [_ranged(0, 10240 * 20), _ranged(1, 10240 * 7)]  # 4 ranges, then 2 (last short)
    raw = _raw(shards)
    assert unseal(raw)["version"] == 2
    manifest = parse_manifest(raw, None)
    assert manifest.shards == tuple(shards)
    table = manifest.shards[0].ranges
    assert table is not None and table.span(3, shards[0].size) == (3 * 65536, 204800 - 3 * 65536)
    # Ranges are derived from the bytes the shard's sha256 names: the fingerprint ignores them.
    plain = [replace(s, ranges=None) for s in shards]
    assert manifest.fingerprint == fingerprint(plain)


def test_manifest_without_ranges_is_still_written_and_read_as_version_1() -> None:
    """A dataset packed before ranges existed: same bytes, same parse, whole-shard checks."""
    raw = _raw()
    assert unseal(raw)["version"] == 1
    assert all(s.ranges is None for s in parse_manifest(raw, None).shards)


def _ranged_resealed(change: Callable[[Body], None]) -> bytes:
    body = unseal(_raw([_ranged(0, 10240 * 20), _ranged(1, 10240 * 7)]))
    change(body)
    return seal(body)


def _ranges(field: str, value: Any) -> Callable[[Body], None]:
    return lambda b: b["shards"][0]["ranges"].__setitem__(field, value)


HOSTILE_RANGES: dict[str, tuple[Callable[[Body], None], str]] = {
    "one range short of the shard": (
        lambda b: b["shards"][0]["ranges"]["sha256"].pop(),
        "do not cover the shard: 3 sha256s for 204800 bytes in ranges of 65536",
    ),
    "a range past the end": (
        lambda b: b["shards"][0]["ranges"]["sha256"].append("a" * 64),
        "do not cover the shard: 5 sha256s",
    ),
    "a range size the table does not fit (overlap)": (
        _ranges("size", 2 * 65536),
        "do not cover the shard: 4 sha256s for 204800 bytes in ranges of 131072",
    ),
    "a range size not a whole block": (_ranges("size", 65536 + 1), "not a multiple of 512"),
    "a zero range size": (_ranges("size", 0), "not a multiple of 512"),
    "a tiny range size": (_ranges("size", 512), "not a multiple of 512 in"),
    "a range size that is a bool": (_ranges("size", True), "range size"),
    "a range sha256 not hex": (
        lambda b: b["shards"][0]["ranges"]["sha256"].__setitem__(1, "z" * 64),
        "range sha256",
    ),
    "ranges not a list": (_ranges("sha256", "a" * 64), "do not cover the shard"),
    "an unknown range member": (_ranges("offsets", [0]), "ranges must be an object"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RANGES))
def test_hostile_range_table_is_refused(case: str) -> None:
    """Offsets are implied by the size, so a table either tiles the shard or is refused."""
    change, message = HOSTILE_RANGES[case]
    with pytest.raises(ManifestError, match=re.escape(message)):
        parse_manifest(_ranged_resealed(change), None)


def test_oversized_manifest_is_refused_unread(tmp_path: Path) -> None:
    write_dataset(tmp_path, n=3)
    path = tmp_path / "ds" / "dataset.json"
    with path.open("r+b") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: no real disk use
    with pytest.raises(ManifestError, match="over the limit"):
        open_dataset(path.parent)


# --- layouts: packed manifests unchanged, adopted ones say so ---------------------


def test_a_packed_manifest_is_byte_for_byte_what_it_was() -> None:
    """Pinned: the sha256 of these bytes as the format wrote them before layouts existed."""
    shards = [
        ShardRecord(
            f"shard-{i:06d}.tar",
            10240 * (i + 1),
            "ab"[i] * 64,
            3 + i,
            IndexRecord(f"shard-{i:06d}.index.json", 100 + i, "cd"[i] * 64),
        )
        for i in range(2)
    ]
    raw = encode_manifest(
        "ds",
        shards,
        ["txt", "jpg"],
        created=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        keys=None,
    )
    assert hashlib.sha256(raw).hexdigest() == (
        "48e07e3b49a97dd80011e0aded8a56316b767bd88a3c076c0a3fa2459e257223"
    )
    assert "layout" not in unseal(raw)
    assert parse_manifest(raw, None).layout == "packed"


def _adopted(number: int, path: str, sha: str = "a") -> ShardRecord:
    return ShardRecord(
        path, 1536 * (number + 1), sha * 64, 2, IndexRecord(adopted_index_name(path), 90, "b" * 64)
    )


def _adopted_raw(shards: list[ShardRecord], keys: Any = None) -> bytes:
    return encode_manifest(
        "mine",
        shards,
        ["jpg", "seg.png"],
        created=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
        keys=keys,
        layout="indexed",
    )


def test_an_adopted_webdataset_manifest_round_trips() -> None:
    shards = [_adopted(0, "a/x-0.tar"), _adopted(1, "a/x-1.tar", "c"), _adopted(2, "b.tar")]
    manifest = parse_manifest(_adopted_raw(shards), None)
    assert manifest.layout == "indexed" and manifest.adopted and manifest.kind == "webdataset"
    assert [s.name for s in manifest.shards] == ["a/x-0.tar", "a/x-1.tar", "b.tar"]
    assert manifest.shards[0].index.name == "a/x-0.index.json"
    assert manifest.counts == (2, 2, 2)
    # The same shard list packed and adopted names different datasets.
    assert manifest.fingerprint == fingerprint(shards, layout="indexed")
    assert manifest.fingerprint != fingerprint(shards)


def test_gzip_tars_may_hold_more_samples_than_their_bytes_but_no_range_table() -> None:
    """A ``.tgz``'s size is the compressed file's: 1536 bytes may hold 40 tiny samples."""
    small = ShardRecord("a/x.tgz", 1536, "a" * 64, 40, IndexRecord("a/x.index.json", 90, "b" * 64))
    manifest = parse_manifest(_adopted_raw([small, _adopted(1, "b.tar.gz", "c")]), None)
    assert [s.name for s in manifest.shards] == ["a/x.tgz", "b.tar.gz"]
    assert manifest.counts == (40, 2)
    ranged = replace(small, ranges=RangeTable(65536, ("c" * 64,)))
    with pytest.raises(ManifestError, match="gzip-compressed: it has no range table"):
        parse_manifest(_adopted_raw([ranged]), None)


def _adopted_body(change: Callable[[Body], None]) -> bytes:
    body = unseal(_adopted_raw([_adopted(0, "a/x-0.tar"), _adopted(1, "a/x-1.tar", "c")]))
    change(body)
    return seal(body)


ADOPTED_HOSTILE: dict[str, Callable[[Body], None]] = {
    "layout packed said aloud": lambda b: b.__setitem__("layout", "packed"),
    "an unknown layout": lambda b: b.__setitem__("layout", "borrowed"),
    "traversal": lambda b: b["shards"][0].__setitem__("name", "../x.tar"),
    "absolute": lambda b: b["shards"][0].__setitem__("name", "/etc/x.tar"),
    "a dot segment": lambda b: b["shards"][0].__setitem__("name", "a/.x.tar"),
    "not a tar": lambda b: b["shards"][0].__setitem__("name", "a/x-0.zip"),
    "ours, not the user's": lambda b: b["shards"][0].__setitem__("name", "mouthguard-index/x.tar"),
    "unsorted": lambda b: b["shards"].reverse(),
    "twice": lambda b: b["shards"].__setitem__(1, b["shards"][0]),
    "index of another shard": lambda b: b["shards"][0]["index"].__setitem__(
        "name", "a/x-1.index.json"
    ),
    "more samples than bytes": lambda b: b["shards"][0].__setitem__("samples", 4),
    "an extension WebDataset would lowercase": lambda b: b.__setitem__("extensions", ["JPG"]),
}


@pytest.mark.parametrize("case", sorted(ADOPTED_HOSTILE))
def test_hostile_adopted_manifest_is_refused(case: str) -> None:
    with pytest.raises(ManifestError, match="dataset manifest"):
        parse_manifest(_adopted_body(ADOPTED_HOSTILE[case]), None)


def _file(path: str, sha: str = "a") -> ParquetRecord:
    groups = (RowGroupRecord(4, 1000, 100, "1" * 64), RowGroupRecord(1004, 500, 50, "2" * 64))
    return ParquetRecord(path, 1804, sha * 64, ByteRange(1504, 300, "3" * 64), groups)


def _parquet_raw(files: list[ParquetRecord] | None = None, keys: Any = None) -> bytes:
    return encode_parquet_manifest(
        "text",
        files or [_file("data/a.parquet"), _file("data/b.parquet", "c")],
        ["text", "id"],
        created=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
        keys=keys,
    )


def test_a_parquet_manifest_round_trips_and_counts_rows_per_row_group() -> None:
    manifest = parse_manifest(_parquet_raw(), None)
    assert manifest.kind == "parquet" and manifest.adopted and manifest.shards == ()
    assert [f.name for f in manifest.files] == ["data/a.parquet", "data/b.parquet"]
    assert manifest.counts == (100, 50, 100, 50)  # the loader's units: row groups
    assert manifest.samples == 300 and manifest.nbytes == 2 * 1804
    assert manifest.columns == ("id", "text")
    assert manifest.fingerprint == parquet_fingerprint(manifest.files)
    body = unseal(_parquet_raw())
    assert body["totals"] == {"files": 2, "row_groups": 4, "rows": 300, "bytes": 3608}


def test_the_parquet_fingerprint_covers_every_row_group() -> None:
    base = _file("a.parquet")
    moved = ParquetRecord(
        base.name,
        base.size,
        base.sha256,
        base.footer,
        (base.row_groups[0], RowGroupRecord(1004, 500, 49, "2" * 64)),
    )
    assert parquet_fingerprint([base]) != parquet_fingerprint([moved])


def test_a_signed_parquet_manifest_verifies() -> None:
    keys = manifest_keys(KEY)
    assert parse_manifest(_parquet_raw(keys=keys), keys).signature_key is not None
    with pytest.raises(SignatureError):
        parse_manifest(_parquet_raw(), keys)


def _parquet_body(change: Callable[[Body], None]) -> bytes:
    body = unseal(_parquet_raw())
    change(body)
    return seal(body)


def _group(i: int, field: str, value: Any) -> Callable[[Body], None]:
    return lambda b: b["files"][0]["row_groups"][i].__setitem__(field, value)


PARQUET_HOSTILE: dict[str, Callable[[Body], None]] = {
    "no layout": lambda b: b.pop("layout"),
    "shards, not files": lambda b: b.__setitem__("shards", b.pop("files")),
    "no files": lambda b: b.__setitem__("files", []),
    "traversal": lambda b: b["files"][0].__setitem__("name", "../a.parquet"),
    "not parquet": lambda b: b["files"][0].__setitem__("name", "a.tar"),
    "unsorted": lambda b: b["files"].reverse(),
    "footer not at the end": lambda b: b["files"][0]["footer"].__setitem__("offset", 1500),
    "footer inside the leading magic": lambda b: b["files"][0]["footer"].update(
        offset=0, size=1804
    ),
    "row group before the magic": _group(0, "offset", 0),
    "row groups overlapping": _group(1, "offset", 1000),
    "row group into the footer": _group(1, "size", 501),
    "empty row group range": _group(0, "size", 0),
    "negative rows": _group(0, "rows", -1),
    "a billion rows": _group(0, "rows", 10**9),
    "row group sha not hex": _group(0, "sha256", "x" * 64),
    "row groups not a list": lambda b: b["files"][0].__setitem__("row_groups", {}),
    "a file too small": lambda b: b["files"][0].__setitem__("size", 11),
    "totals that do not add up": lambda b: b["totals"].__setitem__("rows", 301),
    "no rows at all": lambda b: [
        g.__setitem__("rows", 0) for f in b["files"] for g in f["row_groups"]
    ],
    "columns not strings": lambda b: b.__setitem__("columns", [1]),
    "a fingerprint of other files": lambda b: b.__setitem__("fingerprint", "sha256:" + "0" * 64),
}


@pytest.mark.parametrize("case", sorted(PARQUET_HOSTILE))
def test_hostile_parquet_manifest_is_refused(case: str) -> None:
    with pytest.raises(ManifestError, match="dataset manifest"):
        parse_manifest(_parquet_body(PARQUET_HOSTILE[case]), None)
