"""ShardWriter: deterministic WebDataset shards, committed last, all or nothing."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
import webdataset as wds

from mouthguard.data import ShardWriter, discard_incomplete, open_dataset
from mouthguard.data.formats.index import parse_index
from mouthguard.errors import (
    DatasetError,
    DatasetExistsError,
    DatasetNotFoundError,
    SampleError,
    TierError,
)
from mouthguard.tiers import PutMode
from mouthguard.tiers.base import PutData
from mouthguard.tiers.memory import MemoryTier

from ..helpers import SMALL_SHARD, expected, index_path, sample, shard_path, write_dataset


def _wds_samples(dataset_dir: Path) -> list[dict[str, Any]]:
    urls = sorted(str(p) for p in (dataset_dir / "shards").glob("*.tar"))
    return list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))


def test_webdataset_reads_back_keys_and_bytes(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path, n=40)
    assert len(manifest.shards) > 3, "the test wants several shards"
    read = _wds_samples(tmp_path / "ds")
    got = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in read}
    assert got == expected(40)
    assert [s["__key__"] for s in read] == [f"s{i:05d}" for i in range(40)]  # order kept


def test_tarfile_reads_every_member_with_fixed_metadata(tmp_path: Path) -> None:
    write_dataset(tmp_path, n=5)
    with tarfile.open(shard_path(tmp_path / "ds", 0)) as archive:
        members = archive.getmembers()
    assert [m.name for m in members][:2] == ["s00000.bin", "s00000.txt"]  # sorted by extension
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {
        (0, 0, 0, "", "", 0o644)
    }


def test_same_samples_give_byte_identical_shards(tmp_path: Path) -> None:
    write_dataset(tmp_path / "a", n=40)
    write_dataset(tmp_path / "b", n=40)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("shards/*"))
    assert len(files) > 6
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    assert (
        open_dataset(tmp_path / "a" / "ds").fingerprint
        == open_dataset(tmp_path / "b" / "ds").fingerprint
    )


def test_member_order_in_the_dict_does_not_matter(tmp_path: Path) -> None:
    forward = {"__key__": "k", "a": b"1", "b": b"2"}
    backward = {"b": b"2", "__key__": "k", "a": b"1"}
    write_dataset(tmp_path / "x", samples=[forward])
    write_dataset(tmp_path / "y", samples=[backward])
    assert shard_path(tmp_path / "x" / "ds", 0).read_bytes() == (
        shard_path(tmp_path / "y" / "ds", 0).read_bytes()
    )


def test_index_describes_every_member(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path, n=12)
    for number, shard in enumerate(manifest.shards):
        data = shard_path(tmp_path / "ds", number).read_bytes()
        index = parse_index(
            index_path(tmp_path / "ds", number).read_bytes(),
            shard=shard.name,
            size=shard.size,
            count=shard.samples,
        )
        for entry in index.samples:
            for member in entry.members:
                want = expected(12)[entry.key][member.ext]
                assert data[member.offset : member.offset + member.size] == want


def test_value_types(tmp_path: Path) -> None:
    samples = [
        {
            "__key__": "k",
            "txt": "héllo",
            "bin": bytearray(b"\x00\x01"),
            "view": memoryview(b"mv"),
            "cls": 7,
            "json": {"b": [1, 2], "a": None},
            "__url__": "ignored: WebDataset metadata",
        }
    ]
    write_dataset(tmp_path, samples=samples)
    (got,) = _wds_samples(tmp_path / "ds")
    assert got["txt"] == "héllo".encode()
    assert got["bin"] == b"\x00\x01" and got["view"] == b"mv"
    assert got["cls"] == b"7"
    assert got["json"] == b'{"a":null,"b":[1,2]}'  # sorted keys: deterministic
    assert "url" not in got and got["__url__"] != "ignored: WebDataset metadata"


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"txt": b"x"}, "__key__"),
        ({"__key__": "a.b", "txt": b"x"}, "dot"),
        ({"__key__": "k"}, "no members"),
        ({"__key__": "k", "TXT": b"x"}, "not a valid extension"),
        ({"__key__": "k", "txt": 1.5}, "float"),
        ({"__key__": "k", "txt": True}, "bool"),
        ({"__key__": "k", "json": {"x": object()}}, "JSON"),
        ({"__key__": "x" * 98, "txt": b"x"}, "USTAR"),
    ],
)
def test_refused_samples_leave_the_writer_usable(tmp_path: Path, bad: Any, why: str) -> None:
    with ShardWriter(tmp_path, "ds") as writer:
        writer.write(sample(0))
        with pytest.raises(SampleError, match=why):
            writer.write(bad)
        writer.write(sample(1))
    assert writer.manifest is not None and writer.manifest.samples == 2


def test_duplicate_keys_are_refused_across_shards(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, "ds", shard_size=SMALL_SHARD) as writer:
        for i in range(30):
            writer.write(sample(i))
        with pytest.raises(SampleError, match="already written"):
            writer.write(sample(0))
    assert writer.manifest is not None and len(writer.manifest.shards) > 2


def test_shard_size_bounds_shards(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path, n=60, shard_size=SMALL_SHARD)
    for shard in manifest.shards:
        # A shard ends once the next sample would pass the target (plus the tar trailer).
        assert shard.size <= SMALL_SHARD + 2 * 10240
    big = {"__key__": "big", "bin": b"x" * (3 * SMALL_SHARD)}
    manifest = write_dataset(tmp_path / "big", samples=[sample(0), big, sample(1)])
    assert [s.samples for s in manifest.shards] == [1, 1, 1]  # a large sample gets its own


def _write_all(dest: Any, n: int, *, then_raise: bool = False) -> None:
    with ShardWriter(dest, "ds", shard_size=SMALL_SHARD) as writer:
        for i in range(n):
            writer.write(sample(i))
        if then_raise:
            raise RuntimeError("boom")


def test_an_exception_in_the_with_block_commits_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        _write_all(tmp_path, 30, then_raise=True)
    assert list((tmp_path / "ds").rglob("*.*")) == []
    with pytest.raises(DatasetNotFoundError):
        open_dataset(tmp_path / "ds")


def test_an_empty_dataset_is_not_committed(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path, "ds")
    with pytest.raises(DatasetError, match="no samples"):
        writer.close()
    assert not (tmp_path / "ds" / "dataset.json").exists()


def test_an_existing_dataset_is_refused(tmp_path: Path) -> None:
    write_dataset(tmp_path, n=3)
    with pytest.raises(DatasetExistsError, match="already committed"):
        ShardWriter(tmp_path, "ds")


def test_debris_is_refused_until_discarded(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path, n=30)
    (tmp_path / "ds" / "dataset.json").unlink()  # as if the writer died before its commit
    with pytest.raises(DatasetExistsError, match="uncommitted"):
        ShardWriter(tmp_path, "ds")
    assert discard_incomplete(tmp_path, "ds") == 2 * len(manifest.shards)
    write_dataset(tmp_path, n=3)
    with pytest.raises(DatasetExistsError, match="committed dataset"):
        discard_incomplete(tmp_path, "ds")


class FailingTier(MemoryTier):
    """A memory tier whose N-th put fails after reading its data."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.puts = 0
        self.fail_at = fail_at

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> Any:
        self.puts += 1
        if self.puts == self.fail_at:
            if not isinstance(data, bytes):
                for _ in data:  # type: ignore[union-attr]
                    pass
            raise TierError(f"injected failure writing {key}")
        return super().put(key, data, mode=mode)


@pytest.mark.parametrize("fail_at", [1, 2, 3, 5])
def test_a_failing_tier_commits_nothing_and_leaves_nothing(fail_at: int) -> None:
    tier = FailingTier(fail_at)
    with pytest.raises(TierError, match="injected"):
        _write_all(tier, 40)
    assert list(tier.list("")) == []


def test_an_abandoned_writer_is_invisible(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path, "ds", shard_size=SMALL_SHARD)
    for i in range(30):
        writer.write(sample(i))
    writer.abort()
    assert not list((tmp_path / "ds").rglob("*.*"))
    with pytest.raises(DatasetError, match="aborted"):
        writer.close()


def test_memory_tier_and_prefix() -> None:
    tier = MemoryTier()
    write_dataset(tier, n=10, prefix="team/datasets")
    dataset = open_dataset(tier, prefix="team/datasets/ds")
    assert dataset.samples == 10
    assert all(k.startswith("team/datasets/ds/") for k in tier.list(""))


def test_large_members_stream_through(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB: sent uncopied, past the gather buffer
    samples = [{"__key__": "a", "bin": payload}, {"__key__": "b", "txt": "x"}]
    write_dataset(tmp_path, samples=samples, shard_size=8 * 1024 * 1024)
    got = _wds_samples(tmp_path / "ds")
    assert got[0]["bin"] == payload and got[1]["txt"] == b"x"
