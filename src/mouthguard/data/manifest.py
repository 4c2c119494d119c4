"""``dataset.json``: the dataset's manifest, its fingerprint, and the hostile-input parser.

The manifest is a sealed document (:mod:`mouthguard.format.sealed`: pretty JSON
whose last member checksums every byte before it) and, when a manifest key is
configured, signed with HMAC-SHA256 exactly as checkpoint manifests are
(:mod:`mouthguard.format.signing`, ``$MOUTHGUARD_MANIFEST_KEY``)::

    {"format": "mouthguard-dataset", "version": 1, "kind": "webdataset",
     "name": "imagenet", "created": "2026-05-01T12:00:00Z",
     "shards": [{"name": "shard-000000.tar", "size": ..., "sha256": "...", "samples": ...,
                 "index": {"name": "shard-000000.index.json", "size": ..., "sha256": "..."}}, ...],
     "totals": {"shards": ..., "samples": ..., "bytes": ...},
     "extensions": ["jpg", "json"],
     "fingerprint": "sha256:...",
     "manifest_signature": "hmac-sha256:<key id>:<hex>",     # with a key only
     "manifest_checksum": "xxh3-128:..."}

The **fingerprint** names the dataset's content: sha256 over a canonical text of
the shard list (each shard's name, sha256 and sample count, and its index's name
and sha256; see :func:`fingerprint`). It ignores the dataset's name and creation
time, so a copy elsewhere keeps it, and any change to any shard or index changes
it. A loader's saved position carries it, so a resume against another version of
the data is refused.

Parsing trusts nothing: a size cap, the seal, the signature when a key is
configured (required then: an unsigned manifest is refused), exact member sets,
every type, names that are the format's own (``shard-NNNNNN.tar``, numbered from
0 in order, each with its own index name), sha256s that are 64 hex digits,
sample counts a shard of its size can hold (at most ``MAX_SHARD_SAMPLES``),
totals that add up and a fingerprint that matches the shard list.

Residual risks, as for checkpoints: without a key the checksums catch damage,
not forgery; a validly signed older version can be put back (no freshness
counter), and a signed dataset can be copied under another name (the signature
binds the content, which the fingerprint names, not the location).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from mouthguard.data import names
from mouthguard.errors import InvalidKeyError, ManifestError
from mouthguard.format import signing
from mouthguard.format.sealed import SIGNATURE_KEY, SealError, seal, unseal
from mouthguard.format.typed_json import JsonValue
from mouthguard.tiers.key_material import Keyring
from mouthguard.tiers.object_keys import validate_segment

DATASET_FORMAT = "mouthguard-dataset"
DATASET_VERSION = 1
KIND = "webdataset"
#: A million shards' records are about 300 MB; anything larger is refused unread.
MAX_MANIFEST_BYTES = 512 * 1024 * 1024
#: Samples one shard may claim. A sample takes at least one 512-byte tar header, and
#: the loader plans a window of shards in memory from these counts before any index
#: is read: a hostile count must not become an allocation.
MAX_SHARD_SAMPLES = 10_000_000
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FINGERPRINT_DOMAIN = b"mouthguard.dataset.fingerprint.v1\n"


@dataclass(frozen=True, slots=True)
class IndexRecord:
    """A shard's index object, as the manifest records it."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """One shard, as the manifest records it."""

    name: str
    size: int
    sha256: str
    samples: int
    index: IndexRecord


@dataclass(frozen=True)
class DatasetManifest:
    """A parsed, verified manifest.

    Attributes:
        name: the dataset's name (the last segment of where it was written).
        created: when it was committed (UTC).
        kind: ``webdataset``.
        shards: the shards, in order.
        extensions: every member extension found in the dataset, sorted.
        fingerprint: ``sha256:<hex>`` naming the content (see the module docstring).
        signature_key: the key id whose signature was verified; None when no key
            was configured (the signature, if any, was then not checked).
        signed: whether the manifest carries a signature at all.
    """

    name: str
    created: dt.datetime
    kind: str
    shards: tuple[ShardRecord, ...]
    extensions: tuple[str, ...]
    fingerprint: str
    signature_key: str | None = None
    signed: bool = False

    @property
    def samples(self) -> int:
        """Samples in the whole dataset."""
        return sum(s.samples for s in self.shards)

    @property
    def nbytes(self) -> int:
        """Bytes of all shards (indexes not included)."""
        return sum(s.size for s in self.shards)

    def shard(self, name: str) -> ShardRecord:
        """The record of shard ``name`` (KeyError if there is none)."""
        for record in self.shards:
            if record.name == name:
                return record
        raise KeyError(name)


def fingerprint(shards: Sequence[ShardRecord]) -> str:
    """``sha256:<hex>`` over one canonical line per shard: name, sha256, samples, index.

    Every field is ASCII from a fixed alphabet (names are the format's own,
    digests are hex), so the text, hence the fingerprint, is canonical.
    """
    digest = hashlib.sha256(_FINGERPRINT_DOMAIN)
    for s in shards:
        line = f"{s.name}\t{s.sha256}\t{s.samples}\t{s.index.name}\t{s.index.sha256}\n"
        digest.update(line.encode("ascii"))
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
) -> bytes:
    """The manifest's bytes: sealed, and signed with the current key of ``keys`` if given."""
    body: dict[str, JsonValue] = {
        "format": DATASET_FORMAT,
        "version": DATASET_VERSION,
        "kind": KIND,
        "name": name,
        "created": _timestamp(created),
        "shards": [
            {
                "name": s.name,
                "size": s.size,
                "sha256": s.sha256,
                "samples": s.samples,
                "index": {"name": s.index.name, "size": s.index.size, "sha256": s.index.sha256},
            }
            for s in shards
        ],
        "totals": {
            "shards": len(shards),
            "samples": sum(s.samples for s in shards),
            "bytes": sum(s.size for s in shards),
        },
        "extensions": list[JsonValue](sorted(set(extensions))),
        "fingerprint": fingerprint(shards),
    }
    return seal(body, signing.SignFunction(keys) if keys is not None else None)


class _Checker:
    def fail(self, why: str) -> ManifestError:
        return ManifestError(f"dataset manifest {why}")

    def members(self, obj: JsonValue, expected: set[str], what: str) -> dict[str, JsonValue]:
        if type(obj) is not dict or set(obj) != expected:
            raise self.fail(f"{what} must be an object with exactly {sorted(expected)}")
        return obj

    def count(self, value: JsonValue, what: str, low: int = 0) -> int:
        if type(value) is not int or value < low:
            raise self.fail(f"{what} must be an integer >= {low}, got {value!r:.40}")
        return value

    def sha(self, value: JsonValue, what: str) -> str:
        if type(value) is not str or not _SHA256.fullmatch(value):
            raise self.fail(f"{what} must be 64 lowercase hex digits")
        return value

    def shard(self, raw: JsonValue, number: int) -> ShardRecord:
        obj = self.members(raw, {"name", "size", "sha256", "samples", "index"}, f"shard {number}")
        name = obj["name"]
        if name != names.shard_name(number):
            raise self.fail(f"shard {number} is named {name!r:.80}, not {names.shard_name(number)}")
        where = f"shard {name}"
        index = self.members(obj["index"], {"name", "size", "sha256"}, f"{where} index")
        if index["name"] != names.index_name(name):
            raise self.fail(f"{where} has index {index['name']!r:.80}, not its own")
        size = self.count(obj["size"], f"{where} size", 1)
        if size % 10240:  # tarfile pads every archive to whole 10240-byte records
            raise self.fail(f"{where} size {size} is not a whole number of tar records")
        samples = self.count(obj["samples"], f"{where} samples", 1)
        if samples > min(MAX_SHARD_SAMPLES, size // 512):
            raise self.fail(f"{where} claims {samples} samples: more than {size} bytes can hold")
        return ShardRecord(
            name,
            size,
            self.sha(obj["sha256"], f"{where} sha256"),
            samples,
            IndexRecord(
                names.index_name(name),
                self.count(index["size"], f"{where} index size", 1),
                self.sha(index["sha256"], f"{where} index sha256"),
            ),
        )


_TOP = {
    "format",
    "version",
    "kind",
    "name",
    "created",
    "shards",
    "totals",
    "extensions",
    "fingerprint",
}


def parse_manifest(raw: bytes, keys: Keyring | None) -> DatasetManifest:
    """Parse and verify a dataset manifest; see the module docstring for every check.

    Args:
        raw: the manifest's bytes, as read. Hostile until proven otherwise.
        keys: the manifest keys; when given, a valid signature is required.

    Raises:
        ManifestError: too large, not sealed, corrupt or inconsistent.
        SignatureError: a key is configured and the signature is missing or wrong.
    """
    check = _Checker()
    if len(raw) > MAX_MANIFEST_BYTES:
        raise check.fail(f"is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        body = unseal(raw, "dataset manifest")
    except SealError as exc:  # one error type for every manifest problem
        raise ManifestError(str(exc)) from None
    signed = SIGNATURE_KEY in body
    kid = signing.verify(raw, body, keys) if keys is not None else None
    body.pop(SIGNATURE_KEY, None)
    obj = check.members(body, _TOP, "the top level")
    if obj["format"] != DATASET_FORMAT or obj["version"] != DATASET_VERSION:
        raise check.fail(f"is not a {DATASET_FORMAT} version {DATASET_VERSION}")
    if obj["kind"] != KIND:
        raise check.fail(f"kind {obj['kind']!r:.40} is not {KIND!r}")
    name = obj["name"]
    if type(name) is not str or not _is_segment(name):
        raise check.fail(f"name {name!r:.80} is not a valid single path segment")
    created = _parse_time(obj["created"], check)
    raw_shards = obj["shards"]
    if type(raw_shards) is not list or not raw_shards:
        raise check.fail("lists no shards")
    shards = tuple(check.shard(item, i) for i, item in enumerate(raw_shards))
    totals = check.members(obj["totals"], {"shards", "samples", "bytes"}, "totals")
    expected = {
        "shards": len(shards),
        "samples": sum(s.samples for s in shards),
        "bytes": sum(s.size for s in shards),
    }
    if totals != expected:
        raise check.fail(f"totals {totals} do not add up to {expected}")
    extensions = obj["extensions"]
    if type(extensions) is not list or not all(type(e) is str for e in extensions):
        raise check.fail("extensions must be a list of strings")
    for ext in extensions:
        if not isinstance(ext, str) or not names.is_valid_ext(ext):
            raise check.fail(f"extension {ext!r:.40} is not valid")
    if obj["fingerprint"] != fingerprint(shards):
        raise check.fail("fingerprint does not match its shard list")
    return DatasetManifest(
        name=name,
        created=created,
        kind=KIND,
        shards=shards,
        extensions=tuple(str(e) for e in extensions),
        fingerprint=fingerprint(shards),
        signature_key=kid,
        signed=signed,
    )


def _is_segment(name: str) -> bool:
    try:
        validate_segment(name)
    except InvalidKeyError:
        return False
    return True


def _parse_time(value: JsonValue, check: _Checker) -> dt.datetime:
    if type(value) is str and len(value) == 20 and value.endswith("Z"):
        try:
            return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
        except ValueError:
            pass
    raise check.fail(f"created {value!r:.40} is not a UTC time YYYY-MM-DDTHH:MM:SSZ")
