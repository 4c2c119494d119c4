"""dataset.json: sealed, optionally signed, its fingerprint, and hostile manifests refused."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data import open_dataset
from mouthguard.data.manifest import (
    MAX_MANIFEST_BYTES,
    IndexRecord,
    ShardRecord,
    encode_manifest,
    fingerprint,
    parse_manifest,
)
from mouthguard.errors import ManifestError, SignatureError
from mouthguard.format.sealed import seal, unseal
from mouthguard.format.signing import manifest_keys

from .helpers import write_dataset

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
    "a newer version": lambda b: b.__setitem__("version", 2),
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


def test_oversized_manifest_is_refused_unread(tmp_path: Path) -> None:
    write_dataset(tmp_path, n=3)
    path = tmp_path / "ds" / "dataset.json"
    with path.open("r+b") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: no real disk use
    with pytest.raises(ManifestError, match="over the limit"):
        open_dataset(path.parent)
