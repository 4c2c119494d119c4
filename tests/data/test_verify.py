"""verify_dataset: every shard and index re-read; damage named, unreachable kept apart."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data import index_dataset, open_dataset, verify_dataset
from mouthguard.data.formats.manifest import (
    IndexRecord,
    ShardRecord,
    encode_manifest,
    parse_manifest,
)
from mouthguard.errors import DatasetNotFoundError, ManifestError, SignatureError, TierError
from mouthguard.tiers.local import LocalTier

from .adopted import parquet_files, wds_tars
from .helpers import (
    as_packed_before_ranges,
    flip_byte,
    index_path,
    rewrite_manifest,
    shard_path,
    truncate,
    write_dataset,
)

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


def test_a_flipped_byte_names_the_range_it_is_in(tmp_path: Path) -> None:
    """A version 2 manifest: the reason says which range's sha256 failed, with its bytes."""
    write_dataset(tmp_path, n=300, shard_size=200 * 1024, range_size=64 * 1024)
    ds = tmp_path / "ds"
    dataset = open_dataset(ds)
    index = dataset.read_index(dataset.manifest.shards[0])
    inside = next(  # a payload byte (not a header) in range 1
        m.offset for e in index.samples for m in e.members if m.offset >= 65536 and m.size
    )
    flip_byte(shard_path(ds, 0), inside)
    status, reason = _verdicts(ds)["shard-000000.tar"]
    assert status == "mismatch"
    assert "range 1 (bytes 65536 to 131072): sha256 does not match" in reason


def test_a_range_table_that_disagrees_with_the_bytes_is_a_mismatch(tmp_path: Path) -> None:
    """Whole-shard sha256 right, one range's wrong: ``verify`` checks both, so it fails."""
    write_dataset(tmp_path, n=300, shard_size=200 * 1024, range_size=64 * 1024)
    ds = tmp_path / "ds"

    def wrong_range_2(s: ShardRecord) -> ShardRecord:
        assert s.ranges is not None
        digests = list(s.ranges.sha256)
        if s.name == "shard-000000.tar":
            digests[2] = "0" * 64
        return replace(s, ranges=replace(s.ranges, sha256=tuple(digests)))

    rewrite_manifest(ds, wrong_range_2)
    verdicts = _verdicts(ds)
    status, reason = verdicts.pop("shard-000000.tar")
    assert status == "mismatch" and "range 2 (bytes 131072 to" in reason
    assert {s for s, _ in verdicts.values()} == {"ok"}


def test_a_dataset_packed_before_range_tables_still_verifies(ds: Path) -> None:
    as_packed_before_ranges(ds)
    assert open_dataset(ds).manifest.shards[0].ranges is None
    assert verify_dataset(ds).ok
    flip_byte(shard_path(ds, 2), 700)
    status, reason = _verdicts(ds)["shard-000002.tar"]
    assert status == "mismatch" and "sha256 does not match" in reason


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


# --- adopted datasets: the user's tars and Parquet files ---------------------------


@pytest.fixture
def mine(tmp_path: Path) -> Path:
    root = tmp_path / "mine"
    wds_tars(root)
    index_dataset(root)
    return root


def test_an_adopted_tar_dataset_verifies_and_damage_is_named(mine: Path) -> None:
    assert verify_dataset(mine).ok
    flip_byte(mine / "train" / "part-001.tar", 3000)
    verdicts = _verdicts(mine)
    status, reason = verdicts.pop("train/part-001.tar")
    assert status == "mismatch" and "train/part-001.tar" in reason
    assert {s for s, _ in verdicts.values()} == {"ok"}


def test_an_adopted_index_that_lies_is_found(mine: Path) -> None:
    """A forged index (and manifest, unsigned): the tar read again says otherwise."""
    index = mine / "mouthguard-index" / "shards" / "train" / "part-000.index.json"
    body = json.loads(index.read_bytes())
    body["samples"][0][3][0][2] -= 1  # a member one byte shorter than it is
    raw = json.dumps(body, separators=(",", ":")).encode() + b"\n"
    index.write_bytes(raw)
    manifest_path = mine / "mouthguard-index" / "dataset.json"
    manifest = parse_manifest(manifest_path.read_bytes(), None)
    first = manifest.shards[0]
    forged = [
        ShardRecord(
            first.name,
            first.size,
            first.sha256,
            first.samples,
            IndexRecord(first.index.name, len(raw), hashlib.sha256(raw).hexdigest()),
        ),
        *manifest.shards[1:],
    ]
    manifest_path.write_bytes(
        encode_manifest(
            manifest.name,
            forged,
            manifest.extensions,
            created=manifest.created,
            keys=None,
            layout="indexed",
        )
    )
    status, reason = _verdicts(mine)["train/part-000.tar"]
    assert status == "mismatch" and "does not list the samples a tar reader finds" in reason


def test_files_added_or_removed_since_indexing_are_reported(mine: Path) -> None:
    extra = mine / "train" / "part-009.tar"
    shutil.copy(mine / "train" / "part-000.tar", extra)
    report = verify_dataset(mine)
    assert report.unlisted == ("train/part-009.tar",) and not report.ok
    assert {c.status for c in report.shards} == {"ok"}
    extra.unlink()
    (mine / "train" / "part-002.tar").unlink()
    report = verify_dataset(mine)
    assert [(c.name, c.status) for c in report.mismatched] == [("train/part-002.tar", "mismatch")]


@pytest.fixture
def text(tmp_path: Path) -> tuple[Path, list[Path]]:
    root = tmp_path / "text"
    paths, _ = parquet_files(root)
    index_dataset(root)
    return root, paths


def test_a_flipped_byte_in_a_row_group_names_the_file_and_the_row_group(
    text: tuple[Path, list[Path]],
) -> None:
    root, paths = text
    group = open_dataset(root).files[1].row_groups[2]
    flip_byte(paths[1], group.offset + 10)
    verdicts = _verdicts(root)
    status, reason = verdicts.pop("data/train-00001-of-00003.parquet")
    assert status == "mismatch"
    assert f"row group 2 (bytes {group.offset} to {group.end})" in reason
    assert "row group 1" not in reason and "footer" not in reason
    assert {s for s, _ in verdicts.values()} == {"ok"}


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda p: flip_byte(p, -12), "footer"),
        (lambda p: flip_byte(p, 1), "outside its row groups"),  # the leading PAR1
        (lambda p: truncate(p, p.stat().st_size // 2), "truncated"),
        (lambda p: p.unlink(), "missing"),
    ],
    ids=["footer", "magic", "truncated", "missing"],
)
def test_parquet_damage_is_a_mismatch(text: tuple[Path, list[Path]], damage: Any, why: str) -> None:
    root, paths = text
    damage(paths[0])
    status, reason = _verdicts(root)["data/train-00000-of-00003.parquet"]
    assert status == "mismatch" and why in reason


def test_a_parquet_file_added_since_indexing_is_unlisted(text: tuple[Path, list[Path]]) -> None:
    root, paths = text
    shutil.copy(paths[0], root / "data" / "new.parquet")
    report = verify_dataset(root)
    assert report.unlisted == ("data/new.parquet",) and not report.ok
