"""``dataset.json``: the dataset's manifest, its fingerprint, and the hostile-input parser.

The manifest is a sealed document (:mod:`mouthguard.format.sealed`: pretty JSON
whose last member checksums every byte before it) and, when a manifest key is
configured, signed with HMAC-SHA256 exactly as checkpoint manifests are
(:mod:`mouthguard.format.signing`, ``$MOUTHGUARD_MANIFEST_KEY``)::

    {"format": "mouthguard-dataset", "version": 2, "kind": "webdataset",
     "name": "imagenet", "created": "2026-05-01T12:00:00Z",
     "shards": [{"name": "shard-000000.tar", "size": ..., "sha256": "...", "samples": ...,
                 "index": {"name": "shard-000000.index.json", "size": ..., "sha256": "..."},
                 "ranges": {"size": 2097152, "sha256": ["...", ...]}}, ...],
     "totals": {"shards": ..., "samples": ..., "bytes": ...},
     "extensions": ["jpg", "json"],
     "fingerprint": "sha256:...",
     "manifest_signature": "hmac-sha256:<key id>:<hex>",     # with a key only
     "manifest_checksum": "xxh3-128:..."}

**Versions.** Version 2 (written since per-range verification) adds
``ranges`` to a tar shard: the sha256 of each ``size``-byte range of the shard,
in order (the last one shorter), so a reader can hand out a range's samples
as soon as that range has arrived and matched, instead of after the whole
shard. The offsets are implied, so the ranges tile the shard by construction;
the parser checks the size (a multiple of 512 in [64 KiB, 1 GiB]) and that
there is exactly one sha256 per range. A manifest whose shards have no ranges
is written as version 1, byte for byte what it always was, and version 1 is
read as before: its shards are verified whole. The ranges are not part of the
fingerprint -- they are derived from the bytes the shard's sha256 already
names -- so a dataset packed again with ranges keeps its fingerprint and
saved positions.

Adopted datasets (``mouthguard data index``: the user's files stay where they are)
say so with ``"layout": "indexed"`` -- a packed manifest has no ``layout`` member
at all, so it is byte for byte what it was before adoption existed. An adopted
WebDataset manifest is the packed one plus that member, its shards named by
their paths relative to the dataset. An adopted Parquet dataset (``"kind":
"parquet"``, always indexed) lists ``files`` instead of ``shards`` (per file its
footer and row groups: :mod:`~mouthguard.data.formats.records`), ``columns`` instead of
``extensions``, and totals of files, row groups, rows and bytes.

The **fingerprint** names the dataset's content: sha256 over a canonical text of
the shard list (each shard's name, sha256 and sample count, and its index's name
and sha256; see :func:`fingerprint`; for Parquet, each file's path, size and
sha256, its footer's and every row group's range, rows and sha256), under a
domain string per kind and layout. It ignores the dataset's name and creation
time, so a copy elsewhere keeps it, and any change to any shard or index changes
it. A loader's saved position carries it, so a resume against another version of
the data is refused.

Parsing trusts nothing: a size cap, the seal, the signature when a key is
configured (required then: an unsigned manifest is refused), exact member sets,
every type, names that are the format's own (``shard-NNNNNN.tar``, numbered from
0 in order, each with its own index name) or, adopted, safe relative paths,
sorted and unique; sha256s that are 64 hex digits, sample counts a shard of its
size can hold and byte ranges a file of its size can hold
(:mod:`~mouthguard.data.formats.records`), totals that add up and a fingerprint that
matches the file list.

Residual risks, as for checkpoints: without a key the checksums catch damage,
not forgery; a validly signed older version can be put back (no freshness
counter), and a signed dataset can be copied under another name (the signature
binds the content, which the fingerprint names, not the location).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from mouthguard.data.formats import names
from mouthguard.data.formats.records import (
    MAX_UNIT_SAMPLES,
    ByteRange,
    Checker,
    IndexRecord,
    ParquetRecord,
    RangeTable,
    RowGroupRecord,
    ShardRecord,
    parquet_json,
    parquet_lines,
    shard_json,
    shard_line,
)
from mouthguard.errors import ManifestError
from mouthguard.format import signing
from mouthguard.format.sealed import SIGNATURE_KEY, SealError, seal, unseal
from mouthguard.format.typed_json import JsonValue
from mouthguard.tiers.key_material import Keyring

DATASET_FORMAT = "mouthguard-dataset"
#: Version 2 adds per-range sha256s to tar shards; 1 (no ranges) is still read and
#: still written for a dataset whose shards have none (an adopted one, Parquet).
DATASET_VERSION = 2
READABLE_VERSIONS = (1, 2)
#: What the data files are.
KIND = "webdataset"
PARQUET = "parquet"
#: Who owns them: ``packed`` (ours, written by the writer) or ``indexed`` (the user's).
PACKED = "packed"
INDEXED = "indexed"
#: A million shards' records are about 300 MB; anything larger is refused unread.
MAX_MANIFEST_BYTES = 512 * 1024 * 1024
#: Samples one shard may claim (:data:`~mouthguard.data.formats.records.MAX_UNIT_SAMPLES`).
MAX_SHARD_SAMPLES = MAX_UNIT_SAMPLES
_DOMAIN = "mouthguard.dataset.fingerprint.v1"
#: One domain per (kind, layout); the packed one is what it has always been.
_FINGERPRINT_DOMAINS = {
    (KIND, PACKED): f"{_DOMAIN}\n".encode(),
    (KIND, INDEXED): f"{_DOMAIN} webdataset indexed\n".encode(),
    (PARQUET, INDEXED): f"{_DOMAIN} parquet indexed\n".encode(),
}

__all__ = [
    "ByteRange",
    "DatasetManifest",
    "IndexRecord",
    "ParquetRecord",
    "RangeTable",
    "RowGroupRecord",
    "ShardRecord",
    "encode_manifest",
    "encode_parquet_manifest",
    "fingerprint",
    "parquet_fingerprint",
    "parse_manifest",
]


@dataclass(frozen=True)
class DatasetManifest:
    """A parsed, verified manifest.

    Attributes:
        name: the dataset's name (the last segment of where it was written).
        created: when it was committed (UTC).
        kind: ``webdataset`` or ``parquet``.
        shards: the tar shards, in order (empty for Parquet).
        extensions: every member extension found in the dataset, sorted.
        fingerprint: ``sha256:<hex>`` naming the content (see the module docstring).
        signature_key: the key id whose signature was verified; None when no key
            was configured (the signature, if any, was then not checked).
        signed: whether the manifest carries a signature at all.
        layout: ``packed`` (our shards) or ``indexed`` (the user's files, adopted).
        files: the Parquet files, in order (empty for WebDataset).
        columns: every top-level column name of the Parquet files, sorted.
    """

    name: str
    created: dt.datetime
    kind: str
    shards: tuple[ShardRecord, ...]
    extensions: tuple[str, ...]
    fingerprint: str
    signature_key: str | None = None
    signed: bool = False
    layout: str = PACKED
    files: tuple[ParquetRecord, ...] = ()
    columns: tuple[str, ...] = ()

    @property
    def counts(self) -> tuple[int, ...]:
        """Samples per unit of reading, in order: per shard, or per row group of each file.

        A unit is what the loader fetches, verifies, caches and shuffles by.
        """
        if self.kind == PARQUET:
            return tuple(g.rows for f in self.files for g in f.row_groups)
        return tuple(s.samples for s in self.shards)

    @property
    def samples(self) -> int:
        """Samples (rows, for Parquet) in the whole dataset."""
        return sum(self.counts)

    @property
    def nbytes(self) -> int:
        """Bytes of all data files (indexes not included)."""
        return sum(s.size for s in self.shards) + sum(f.size for f in self.files)

    @property
    def adopted(self) -> bool:
        """Whether the data files are the user's, indexed in place."""
        return self.layout == INDEXED

    def shard(self, name: str) -> ShardRecord:
        """The record of shard ``name`` (KeyError if there is none)."""
        for record in self.shards:
            if record.name == name:
                return record
        raise KeyError(name)


def fingerprint(shards: Sequence[ShardRecord], *, layout: str = PACKED) -> str:
    """``sha256:<hex>`` over one canonical line per shard: name, sha256, samples, index.

    Every field is ASCII from a fixed alphabet (names are the format's own or
    valid tier keys, digests are hex), so the text, hence the fingerprint, is
    canonical.
    """
    digest = hashlib.sha256(_FINGERPRINT_DOMAINS[KIND, layout])
    for s in shards:
        digest.update(shard_line(s).encode("ascii"))
    return f"sha256:{digest.hexdigest()}"


def parquet_fingerprint(files: Sequence[ParquetRecord]) -> str:
    """``sha256:<hex>`` over each file's canonical lines (path, sha256, footer, row groups)."""
    digest = hashlib.sha256(_FINGERPRINT_DOMAINS[PARQUET, INDEXED])
    for f in files:
        digest.update(parquet_lines(f).encode("ascii"))
    return f"sha256:{digest.hexdigest()}"


def _timestamp(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def encode_manifest(
    name: str,
    shards: Sequence[ShardRecord],
    extensions: Sequence[str],
    *,
    created: dt.datetime,
    keys: Keyring | None,
    layout: str = PACKED,
) -> bytes:
    """A WebDataset manifest's bytes: sealed, and signed with the current key of ``keys``.

    ``layout`` is ``packed`` (no ``layout`` member: the format as it always was)
    or ``indexed`` (adopted shards, named by their paths).
    """
    if layout not in (PACKED, INDEXED):
        raise ValueError(f"layout must be {PACKED!r} or {INDEXED!r}, not {layout!r}")
    ranged = any(s.ranges is not None for s in shards)
    body: dict[str, JsonValue] = {
        "format": DATASET_FORMAT,
        "version": DATASET_VERSION if ranged else 1,
        "kind": KIND,
        **({"layout": INDEXED} if layout == INDEXED else {}),
        "name": name,
        "created": _timestamp(created),
        "shards": [shard_json(s) for s in shards],
        "totals": {
            "shards": len(shards),
            "samples": sum(s.samples for s in shards),
            "bytes": sum(s.size for s in shards),
        },
        "extensions": list[JsonValue](sorted(set(extensions))),
        "fingerprint": fingerprint(shards, layout=layout),
    }
    return seal(body, signing.SignFunction(keys) if keys is not None else None)


def encode_parquet_manifest(
    name: str,
    files: Sequence[ParquetRecord],
    columns: Sequence[str],
    *,
    created: dt.datetime,
    keys: Keyring | None,
) -> bytes:
    """An adopted Parquet dataset's manifest bytes: sealed, signed with ``keys`` if given."""
    body: dict[str, JsonValue] = {
        "format": DATASET_FORMAT,
        "version": 1,
        "kind": PARQUET,
        "layout": INDEXED,
        "name": name,
        "created": _timestamp(created),
        "files": [parquet_json(f) for f in files],
        "totals": _parquet_totals(files),
        "columns": list[JsonValue](sorted(set(columns))),
        "fingerprint": parquet_fingerprint(files),
    }
    return seal(body, signing.SignFunction(keys) if keys is not None else None)


def _parquet_totals(files: Sequence[ParquetRecord]) -> dict[str, JsonValue]:
    return {
        "files": len(files),
        "row_groups": sum(len(f.row_groups) for f in files),
        "rows": sum(f.rows for f in files),
        "bytes": sum(f.size for f in files),
    }


_COMMON = {"format", "version", "kind", "name", "created", "totals", "fingerprint"}
_TOP = _COMMON | {"shards", "extensions"}
_TOP_PARQUET = _COMMON | {"layout", "files", "columns"}


def parse_manifest(raw: bytes, keys: Keyring | None) -> DatasetManifest:
    """Parse and verify a dataset manifest; see the module docstring for every check.

    Args:
        raw: the manifest's bytes, as read. Hostile until proven otherwise.
        keys: the manifest keys; when given, a valid signature is required.

    Raises:
        ManifestError: too large, not sealed, corrupt or inconsistent.
        SignatureError: a key is configured and the signature is missing or wrong.
    """
    check = Checker()
    if len(raw) > MAX_MANIFEST_BYTES:
        raise check.fail(f"is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        body = unseal(raw, "dataset manifest")
    except SealError as exc:  # one error type for every manifest problem
        raise ManifestError(str(exc)) from None
    signed = SIGNATURE_KEY in body
    kid = signing.verify(raw, body, keys) if keys is not None else None
    body.pop(SIGNATURE_KEY, None)
    kind = body.get("kind")
    if kind == PARQUET:
        obj = check.members(body, _TOP_PARQUET, "the top level")
    else:
        obj = check.members(body, _TOP | ({"layout"} & set(body)), "the top level")
    version = obj["version"]
    if obj["format"] != DATASET_FORMAT or type(version) is not int:
        raise check.fail(f"is not a {DATASET_FORMAT}")
    if version not in READABLE_VERSIONS:
        raise check.fail(f"is version {version}; this mouthguard reads {READABLE_VERSIONS}")
    if kind not in (KIND, PARQUET):
        raise check.fail(f"kind {kind!r:.40} is neither {KIND!r} nor {PARQUET!r}")
    layout = obj.get("layout", PACKED)
    if "layout" in obj and layout != INDEXED:  # packed is said by saying nothing
        raise check.fail(f"layout {layout!r:.40} is not {INDEXED!r}")
    common = _Common(check.segment(obj["name"], "name"), check.time(obj["created"]), kid, signed)
    if kind == PARQUET:
        return _parse_parquet(obj, check, common)
    return _parse_webdataset(obj, check, common, str(layout), ranged=version >= 2)


@dataclass(frozen=True)
class _Common:
    """What every manifest has, parsed."""

    name: str
    created: dt.datetime
    signature_key: str | None
    signed: bool


def _parse_webdataset(
    obj: dict[str, JsonValue], check: Checker, common: _Common, layout: str, *, ranged: bool
) -> DatasetManifest:
    raw_shards = obj["shards"]
    if type(raw_shards) is not list or not raw_shards:
        raise check.fail("lists no shards")
    adopted = layout == INDEXED
    shards: list[ShardRecord] = []
    for i, item in enumerate(raw_shards):
        previous = shards[-1].name if shards else None
        shards.append(check.shard(item, i, previous, adopted, ranged))
    totals = check.members(obj["totals"], {"shards", "samples", "bytes"}, "totals")
    expected = {
        "shards": len(shards),
        "samples": sum(s.samples for s in shards),
        "bytes": sum(s.size for s in shards),
    }
    if totals != expected:
        raise check.fail(f"totals {totals} do not add up to {expected}")
    extensions = check.strings(obj["extensions"], "extensions")
    for ext in extensions:
        valid = names.adopted_ext_problem(ext) is None if adopted else names.is_valid_ext(ext)
        if not valid:
            raise check.fail(f"extension {ext!r:.40} is not valid")
    if obj["fingerprint"] != fingerprint(shards, layout=layout):
        raise check.fail("fingerprint does not match its shard list")
    return DatasetManifest(
        name=common.name,
        created=common.created,
        kind=KIND,
        shards=tuple(shards),
        extensions=extensions,
        fingerprint=fingerprint(shards, layout=layout),
        signature_key=common.signature_key,
        signed=common.signed,
        layout=layout,
    )


def _parse_parquet(obj: dict[str, JsonValue], check: Checker, common: _Common) -> DatasetManifest:
    raw_files = obj["files"]
    if type(raw_files) is not list or not raw_files:
        raise check.fail("lists no files")
    files: list[ParquetRecord] = []
    for i, item in enumerate(raw_files):
        files.append(check.parquet(item, i, files[-1].name if files else None))
    totals = check.members(obj["totals"], {"files", "row_groups", "rows", "bytes"}, "totals")
    if totals != _parquet_totals(files):
        raise check.fail(f"totals {totals} do not add up to {_parquet_totals(files)}")
    if not any(f.rows for f in files):
        raise check.fail("lists no rows")
    columns = check.strings(obj["columns"], "columns")
    if obj["fingerprint"] != parquet_fingerprint(files):
        raise check.fail("fingerprint does not match its file list")
    return DatasetManifest(
        name=common.name,
        created=common.created,
        kind=PARQUET,
        shards=(),
        extensions=(),
        fingerprint=parquet_fingerprint(files),
        signature_key=common.signature_key,
        signed=common.signed,
        layout=INDEXED,
        files=tuple(files),
        columns=columns,
    )
