"""verify_dataset: every shard and index re-read; damage named, unreachable kept apart."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data import open_dataset, verify_dataset
from mouthguard.data.manifest import IndexRecord, ShardRecord, encode_manifest, parse_manifest
from mouthguard.errors import DatasetNotFoundError, ManifestError, SignatureError, TierError
from mouthguard.tiers.local import LocalTier

from .helpers import flip_byte, index_path, shard_path, truncate, write_dataset

KEY = bytes(range(32))


@pytest.fixture
def ds(tmp_path: Path) -> Path:
    write_dataset(tmp_path, n=40)
    return tmp_path / "ds"


def _verdicts(path: Path, **kwargs: Any) -> dict[str, tuple[str, str]]:
    report = verify_dataset(path, **kwargs)
    return {c.name: (c.status, c.reason) for c in report.shards}


def test_a_clean_dataset_verifies(ds: Path) -> None:
    report = verify_dataset(ds)
    assert report.ok and len(report.shards) > 3
    assert {c.status for c in report.shards} == {"ok"}
    assert sum(c.samples for c in report.shards) == 40


@pytest.mark.parametrize("where", [0, 700, -1])
def test_a_flipped_byte_is_a_mismatch_naming_the_shard(ds: Path, where: int) -> None:
    flip_byte(shard_path(ds, 2), where)
    verdicts = _verdicts(ds)
    status, reason = verdicts.pop("shard-000002.tar")
    assert status == "mismatch" and "shard-000002.tar" in reason
    assert {s for s, _ in verdicts.values()} == {"ok"}


def test_a_truncated_shard_is_a_mismatch(ds: Path) -> None:
    truncate(shard_path(ds, 1), 1000)
    status, reason = _verdicts(ds)["shard-000001.tar"]
    assert status == "mismatch" and "truncated" in reason


def test_a_missing_shard_is_a_mismatch(ds: Path) -> None:
    shard_path(ds, 0).unlink()
    status, reason = _verdicts(ds)["shard-000000.tar"]
    assert status == "mismatch" and "missing" in reason


def test_a_tampered_index_is_a_mismatch(ds: Path) -> None:
    flip_byte(index_path(ds, 3), 20)
    status, reason = _verdicts(ds)["shard-000003.tar"]
    assert status == "mismatch" and "index" in reason


def test_an_index_rewritten_consistently_is_caught_by_the_tar_headers(ds: Path) -> None:
    """Without a key, someone rewrites an index and the manifest to match it: the shard's own
    tar headers still disagree with the index, so verify refuses."""
    path = index_path(ds, 0)
    body = json.loads(path.read_bytes())
    body["samples"][0][0] = "renamed"  # a key the shard does not hold
    raw = (json.dumps(body, separators=(",", ":")) + "\n").encode()
    path.write_bytes(raw)
    manifest = open_dataset(ds).manifest
    first = manifest.shards[0]
    forged_first = ShardRecord(
        first.name,
        first.size,
        first.sha256,
        first.samples,
        IndexRecord(first.index.name, len(raw), hashlib.sha256(raw).hexdigest()),
    )
    forged = encode_manifest(
        manifest.name,
        [forged_first, *manifest.shards[1:]],
        manifest.extensions,
        created=manifest.created,
        keys=None,
    )
    parse_manifest(forged, None)  # a valid manifest: only the bytes can tell
    (ds / "dataset.json").write_bytes(forged)
    status, reason = _verdicts(ds)["shard-000000.tar"]
    assert status == "mismatch" and "renamed" in reason


class FlakyTier(LocalTier):
    """A local tier whose reads of one shard fail like a dead network."""

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if key.endswith("shard-000001.tar"):
            raise TierError(f"timed out reading {key}")
        return super().get(key, start, end)


def test_an_unreachable_shard_is_not_called_damaged(ds: Path) -> None:
    report = verify_dataset(FlakyTier(ds))
    (unreachable,) = report.unreachable
    assert unreachable.name == "shard-000001.tar" and "timed out" in unreachable.reason
    assert not report.mismatched and not report.ok


def test_a_tampered_manifest_is_refused(ds: Path) -> None:
    flip_byte(ds / "dataset.json", 40)
    with pytest.raises(ManifestError):
        verify_dataset(ds)


def test_a_key_requires_a_signed_manifest(
    tmp_path: Path, ds: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOUTHGUARD_MANIFEST_KEY", "hex:" + KEY.hex())
    with pytest.raises(SignatureError, match="not signed"):
        verify_dataset(ds)
    write_dataset(tmp_path / "signed", n=5)  # signed: the key is in the environment
    assert verify_dataset(tmp_path / "signed" / "ds").ok
    monkeypatch.delenv("MOUTHGUARD_MANIFEST_KEY")
    assert open_dataset(tmp_path / "signed" / "ds").manifest.signed


def test_no_dataset_there(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="no dataset"):
        verify_dataset(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match=r"no dataset\.json"):
        verify_dataset(tmp_path / "empty")
    assert not (tmp_path / "nothing").exists(), "reading never creates anything"
