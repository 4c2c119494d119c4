"""index_dataset: a user's WebDataset tars or Parquet files adopted in place, all or nothing."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from mouthguard.data import (
    StreamingDataset,
    discard_incomplete,
    index_dataset,
    open_dataset,
    verify_dataset,
)
from mouthguard.errors import (
    AdoptionError,
    DatasetExistsError,
    DatasetNotFoundError,
    ShardDamagedError,
)

from ..adopted import gzipped, odd_tar, parquet_files, wds_tars, webdataset_samples
from ..helpers import write_dataset

KEY = "hex:" + bytes(range(32)).hex()


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root`` outside the index directory: its sha256 and mtime."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and "mouthguard-index" not in p.parts
    }


@pytest.fixture
def tars(tmp_path: Path) -> tuple[Path, list[Path]]:
    root = tmp_path / "mine"
    return root, [*wds_tars(root), odd_tar(root / "zz" / "odd.tar")]


def test_webdataset_tars_are_indexed_in_place_and_read_as_webdataset_reads_them(
    tars: tuple[Path, list[Path]],
) -> None:
    root, paths = tars
    before = _snapshot(root)
    manifest = index_dataset(root)
    assert _snapshot(root) == before, "the user's files are untouched"
    assert manifest.kind == "webdataset" and manifest.layout == "indexed"
    assert manifest.name == "mine"
    assert [s.name for s in manifest.shards] == [
        "train/part-000.tar",
        "train/part-001.tar",
        "train/part-002.tar",
        "zz/odd.tar",
    ]
    assert (root / "mouthguard-index" / "dataset.json").is_file()
    assert (root / "mouthguard-index" / "shards" / "train" / "part-000.index.json").is_file()
    reference = webdataset_samples(paths)
    assert list(StreamingDataset(root)) == reference
    assert list(StreamingDataset(root, cache_dir=root.parent / "cache")) == reference
    assert open_dataset(root).samples == len(reference) == manifest.samples
    assert verify_dataset(root).ok


def test_the_fingerprint_names_the_content(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    wds_tars(first)
    wds_tars(second)
    assert index_dataset(first).fingerprint == index_dataset(second, name="x").fingerprint


def test_a_signed_adoption(tars: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = tars
    monkeypatch.setenv("MOUTHGUARD_MANIFEST_KEY", KEY)
    manifest = index_dataset(root)
    assert manifest.signed and manifest.signature_key is not None
    assert len(list(StreamingDataset(root))) == manifest.samples


def test_an_indexed_or_packed_dataset_is_not_adopted_again(
    tars: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    root, _ = tars
    index_dataset(root)
    with pytest.raises(
        DatasetExistsError, match=r"already indexed .*mouthguard data index --again .*mine"
    ):
        index_dataset(root)
    write_dataset(tmp_path, "packed", n=3)
    with pytest.raises(DatasetExistsError, match="packed dataset"):
        index_dataset(tmp_path / "packed")
    with pytest.raises(DatasetExistsError, match="packed dataset"):
        index_dataset(tmp_path / "packed", again=True)
    assert open_dataset(tmp_path / "packed").samples == 3  # again never touches a packed one


def test_index_again_takes_in_added_and_changed_files(tars: tuple[Path, list[Path]]) -> None:
    root, paths = tars
    first = index_dataset(root)
    paths[0].write_bytes(paths[1].read_bytes())  # changed
    (root / "train" / "part-009.tar").write_bytes(paths[2].read_bytes())  # added
    assert not verify_dataset(root).ok
    with pytest.raises(
        ShardDamagedError, match=r"changed on purpose: mouthguard data index --again"
    ):
        list(StreamingDataset(root))
    before = _snapshot(root)
    again = index_dataset(root, again=True)
    assert _snapshot(root) == before, "only mouthguard-index/ is rewritten"
    assert again.samples == first.samples + 7 and again.fingerprint != first.fingerprint
    assert verify_dataset(root).ok
    assert [s["__key__"] for s in StreamingDataset(root)][:1] == ["deep/" * 30 + "s1_0000"]


def test_a_failure_leaves_nothing_and_debris_is_refused_until_discarded(
    tars: tuple[Path, list[Path]],
) -> None:
    root, _ = tars
    bad = root / "train" / "part-001.tar"
    good = bad.read_bytes()
    with tarfile.open(bad, "w") as tar:
        info = tarfile.TarInfo("../../outside.jpg")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(AdoptionError, match=r"train/part-001\.tar: .*path traversal"):
        index_dataset(root, workers=1)  # part-000 was indexed before part-001 failed
    assert not [p for p in (root / "mouthguard-index").rglob("*") if p.is_file()]
    debris = root / "mouthguard-index" / "shards" / "train" / "part-000.index.json"
    debris.parent.mkdir(parents=True, exist_ok=True)
    debris.write_bytes(b"{}")  # what a run killed after its first index leaves
    bad.write_bytes(good)
    with pytest.raises(DatasetExistsError, match=r"index --again .*discard_incomplete"):
        index_dataset(root)
    assert discard_incomplete(root, "mouthguard-index") == 1
    assert index_dataset(root).samples == sum(1 for _ in StreamingDataset(root))
    stale = root / "mouthguard-index" / "shards" / "gone" / "old.index.json"
    stale.parent.mkdir()
    stale.write_bytes(b"{}")  # beside a committed index: --again clears both
    assert index_dataset(root, again=True).samples == sum(1 for _ in StreamingDataset(root))
    assert not stale.exists()


def test_what_to_index(tmp_path: Path) -> None:
    root = tmp_path / "both"
    wds_tars(root, shards=1)
    parquet_files(root, files=1)
    with pytest.raises(ValueError, match=r"both \.tar and \.parquet"):
        index_dataset(root)
    assert index_dataset(root, kind="parquet").kind == "parquet"
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match=r"no \.tar files"):
        index_dataset(tmp_path / "empty", kind="webdataset")
    with pytest.raises(DatasetNotFoundError):
        index_dataset(tmp_path / "nothing-here")


def test_files_the_tier_cannot_see_are_named_not_skipped(tmp_path: Path) -> None:
    root = tmp_path / "odd names"
    [path] = wds_tars(root, shards=1)
    with pytest.raises(AdoptionError, match="cannot name a dataset"):
        index_dataset(root)  # the directory's own name has a space
    (root / "train" / "my part.tar").write_bytes(path.read_bytes())
    with pytest.raises(AdoptionError, match=r"my part\.tar"):
        index_dataset(root, name="odd")
    (root / "train" / "my part.tar").unlink()
    (root / "train" / "link.tar").symlink_to(path)
    with pytest.raises(AdoptionError, match=r"link\.tar.*symbolic links"):
        index_dataset(root, name="odd")
    (root / "train" / "link.tar").unlink()
    (root / ".cache").mkdir()
    (root / ".cache" / "x.tar").write_bytes(b"hidden: skipped, as pack skips it")
    assert index_dataset(root, name="odd").samples == 7


def test_parquet_files_are_indexed_by_row_group(tmp_path: Path) -> None:
    import pyarrow.parquet as pq  # noqa: PLC0415

    root = tmp_path / "text"
    paths, rows = parquet_files(root)
    before = _snapshot(root)
    manifest = index_dataset(root)
    assert _snapshot(root) == before
    assert manifest.kind == "parquet" and manifest.samples == rows
    assert manifest.columns == ("flag", "id", "meta", "score", "text", "tokens")
    for path, record in zip(paths, manifest.files, strict=True):
        raw = path.read_bytes()
        meta = pq.read_metadata(path)
        assert record.name == str(path.relative_to(root))
        assert record.sha256 == hashlib.sha256(raw).hexdigest()
        assert [g.rows for g in record.row_groups] == [
            meta.row_group(i).num_rows for i in range(meta.num_row_groups)
        ]
        for group in record.row_groups:
            assert hashlib.sha256(raw[group.offset : group.end]).hexdigest() == group.sha256
        assert raw[record.footer.end - 4 : record.footer.end] == b"PAR1"
        footer = raw[record.footer.offset : record.footer.end]
        assert hashlib.sha256(footer).hexdigest() == record.footer.sha256
    assert verify_dataset(root).ok


def test_a_file_that_is_not_parquet_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "text"
    parquet_files(root, files=1)
    (root / "data" / "broken.parquet").write_bytes(b"PAR1" + b"\x00" * 100 + b"PAR1")
    with pytest.raises(AdoptionError, match=r"data/broken\.parquet: claims a footer"):
        index_dataset(root)
    (root / "data" / "broken.parquet").write_bytes(b"not parquet at all, no magic")
    with pytest.raises(AdoptionError, match=r"broken\.parquet: does not end with PAR1"):
        index_dataset(root)
    assert not list(root.rglob("*.json"))


def test_gzip_compressed_tars_are_indexed_read_and_verified_whole(tmp_path: Path) -> None:
    root = tmp_path / "gz"
    plain = [*wds_tars(root, shards=2, per=6), odd_tar(root / "zz" / "odd.tar")]
    reference = webdataset_samples(plain)
    paths = [*gzipped(plain[:1]), *gzipped(plain[1:2], ".tgz"), plain[2]]  # mixed with a .tar
    assert webdataset_samples(paths) == reference  # what WebDataset makes of the same files
    before = _snapshot(root)
    manifest = index_dataset(root)
    assert _snapshot(root) == before, "the user's files are untouched"
    assert [s.name for s in manifest.shards] == [
        "train/part-000.tar.gz",
        "train/part-001.tgz",
        "zz/odd.tar",
    ]
    first = manifest.shards[0]
    assert first.size == paths[0].stat().st_size  # the compressed file's size and sha256
    assert first.sha256 == hashlib.sha256(paths[0].read_bytes()).hexdigest()
    assert first.ranges is None  # gzip cannot be range-read: verified whole
    assert (root / "mouthguard-index" / "shards" / "train" / "part-000.index.json").is_file()
    assert list(StreamingDataset(root)) == reference
    cached = StreamingDataset(root, cache_dir=tmp_path / "cache", shuffle=True, seed=3)
    assert sorted(s["__key__"] for s in cached) == sorted(s["__key__"] for s in reference)
    assert verify_dataset(root).ok


def test_a_damaged_gzip_shard_is_found_by_verify_and_the_reader(tmp_path: Path) -> None:
    root = tmp_path / "gz"
    [path] = gzipped(wds_tars(root, shards=1, per=6))
    index_dataset(root)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    [bad] = verify_dataset(root).mismatched
    assert bad.name == "train/part-000.tar.gz"
    with pytest.raises(ShardDamagedError, match=r"part-000\.tar\.gz"):
        list(StreamingDataset(root))


def test_gzip_files_webdataset_cannot_read_as_indexed_are_refused_by_name(
    tmp_path: Path,
) -> None:
    root = tmp_path / "gz"
    [tar] = wds_tars(root, shards=1, per=3)
    whole = gzip.compress(tar.read_bytes(), mtime=0)
    tar.unlink()
    bad = root / "train" / "part-000.tar.gz"
    bad.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(AdoptionError, match=r"part-000\.tar\.gz: .*cut short"):
        index_dataset(root)
    bad.write_bytes(whole + whole)  # two members: tarfile's stream mode stops after the first
    with pytest.raises(AdoptionError, match=r"part-000\.tar\.gz: .*first gzip member"):
        index_dataset(root)
    bad.write_bytes(whole)
    (root / "train" / "part-000.tar").write_bytes(gzip.decompress(whole))
    with pytest.raises(AdoptionError, match=r"part-000\.tar and train/part-000\.tar\.gz"):
        index_dataset(root)  # both would be indexed as part-000.index.json
    (root / "train" / "part-000.tar").unlink()
    assert index_dataset(root).samples == 3
