"""pack: a tree of small files -> deterministic shards that WebDataset reads back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import webdataset as wds

from mouthguard.data import open_dataset, pack
from mouthguard.data.writing.pack import iter_groups, source_bytes
from mouthguard.errors import DatasetNotFoundError, SampleError


def make_tree(root: Path, n: int = 30) -> dict[str, dict[str, bytes]]:
    """``n`` image+label pairs in two class directories, a top-level file; returns the samples."""
    samples: dict[str, dict[str, bytes]] = {}
    for i in range(n):
        key = f"class{i % 2}/img{i:03d}"
        members = {"jpg": os.urandom(100 + 37 * i), "json": f'{{"label": {i % 2}}}'.encode()}
        for ext, data in members.items():
            path = root / f"{key}.{ext}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        samples[key] = members
    (root / "readme.txt").write_bytes(b"top")
    samples["readme"] = {"txt": b"top"}
    (root / ".DS_Store").write_bytes(b"hidden")
    (root / ".cache").mkdir()
    (root / ".cache" / "x.bin").write_bytes(b"hidden")
    return samples


def test_groups_by_key_in_sorted_order(tmp_path: Path) -> None:
    for name in ["b.txt", "a.jpg", "a.json", "a.seg.png", "a-1.txt", "a/z.txt", "a/b/c.txt"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    got = [(key, [ext for ext, _ in files]) for key, files in iter_groups(tmp_path)]
    assert got == [
        ("a", ["jpg", "json", "seg.png"]),
        ("a-1", ["txt"]),
        ("a/b/c", ["txt"]),
        ("a/z", ["txt"]),
        ("b", ["txt"]),
    ]
    assert [k for k, _ in got] == sorted(k for k, _ in got)


def test_webdataset_reads_the_packed_tree(tmp_path: Path) -> None:
    samples = make_tree(tmp_path / "src")
    manifest = pack(tmp_path / "src", tmp_path / "out", "photos", shard_size=20 * 1024)
    assert len(manifest.shards) > 2 and manifest.samples == len(samples)
    urls = sorted(str(p) for p in (tmp_path / "out" / "photos" / "shards").glob("*.tar"))
    read = {
        s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
        for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    }
    assert read == samples  # hidden files skipped, nothing else lost


def test_pack_is_byte_identical_across_runs(tmp_path: Path) -> None:
    make_tree(tmp_path / "src")
    first = pack(tmp_path / "src", tmp_path / "one", "ds", shard_size=20 * 1024)
    second = pack(tmp_path / "src", tmp_path / "two", "ds", shard_size=20 * 1024)
    assert first.fingerprint == second.fingerprint
    for path in sorted((tmp_path / "one" / "ds" / "shards").iterdir()):
        twin = tmp_path / "two" / "ds" / "shards" / path.name
        assert path.read_bytes() == twin.read_bytes(), path.name


def test_progress_reports_every_byte(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", n=10)
    seen: list[int] = []
    pack(tmp_path / "src", tmp_path / "out", "ds", progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == source_bytes(tmp_path / "src")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("class1/noext", "no extension"),
        ("class1/x.JPG", "not a valid extension"),
        ("_m.txt", "'_'"),
    ],
)
def test_unpackable_files_fail_the_pack_and_commit_nothing(
    tmp_path: Path, name: str, why: str
) -> None:
    make_tree(tmp_path / "src", n=4)
    (tmp_path / "src" / name).write_bytes(b"x")
    with pytest.raises(SampleError, match=why):
        pack(tmp_path / "src", tmp_path / "out", "ds")
    with pytest.raises(DatasetNotFoundError):
        open_dataset(tmp_path / "out" / "ds")
    assert not list((tmp_path / "out").rglob("*.tar"))


def test_a_symlinked_directory_is_refused_not_skipped(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", n=2)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "src" / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SampleError, match="not a regular file"):
        pack(tmp_path / "src", tmp_path / "out", "ds")


def test_source_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(SampleError, match="not a directory"):
        pack(tmp_path / "missing", tmp_path / "out", "ds")


def camera(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A folder of files as a camera names them."""
    src = tmp_path / "camera"
    src.mkdir()
    for name, data in files.items():
        (src / name).write_bytes(data)
    return src


def test_uppercase_extensions_are_packed_lowercased_when_asked(tmp_path: Path) -> None:
    src = camera(tmp_path, {"IMG_0001.JPG": b"jpeg bytes", "IMG_0001.json": b"{}"})
    with pytest.raises(SampleError, match="--lowercase-extensions"):
        pack(src, tmp_path / "out", "refused")
    manifest = pack(src, tmp_path / "out", "ds", lowercase_extensions=True)
    assert manifest.samples == 1
    (shard,) = (tmp_path / "out" / "ds" / "shards").glob("*.tar")
    samples = list(wds.WebDataset(str(shard), shardshuffle=False, empty_check=False))
    assert samples[0]["jpg"] == b"jpeg bytes" and samples[0]["json"] == b"{}"


def test_members_that_collide_once_lowercased_are_refused(tmp_path: Path) -> None:
    src = camera(tmp_path, {"x.JPG": b"upper", "x.jpg": b"lower"})
    with pytest.raises(SampleError, match="both member 'jpg'"):
        pack(src, tmp_path / "out", "ds", lowercase_extensions=True)


def test_the_survey_refuses_what_pack_would_before_anything_is_written(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", n=3)
    (tmp_path / "src" / "class1" / "z.JPG").write_bytes(b"x")
    with pytest.raises(SampleError, match=r"z\.\*: .*--lowercase-extensions"):
        source_bytes(tmp_path / "src")
    assert source_bytes(tmp_path / "src", lowercase_extensions=True) > 0
