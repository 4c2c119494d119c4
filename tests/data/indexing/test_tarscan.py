"""Indexing a user's tar with tarfile: what WebDataset reads, and hostile tars refused by name."""

from __future__ import annotations

import bz2
import gzip
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from mouthguard.data.indexing.tarscan import scan_tar
from mouthguard.errors import AdoptionError

from ..adopted import odd_tar, wds_tars, webdataset_samples

BLOCK = 512


def _scan(raw: bytes, chunk: int = 1000) -> object:
    chunks = [raw[i : i + chunk] for i in range(0, len(raw), chunk)]
    return scan_tar(chunks, len(raw), "x.tar")


def _tar(*members: tuple[str, bytes], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _with_size_field(raw: bytes, field: bytes, header: int = 0) -> bytes:
    """``raw`` with the size field of the header at ``header`` replaced (checksum redone)."""
    data = bytearray(raw)
    block = data[header : header + BLOCK]
    block[124:136] = field
    block[148:156] = b" " * 8
    block[148:156] = f"{sum(block):06o}\x00 ".encode()
    data[header : header + BLOCK] = block
    return bytes(data)


@pytest.mark.parametrize("chunk", [1, 512, 777, 1 << 20])
def test_the_index_is_what_webdataset_reads_whatever_the_chunking(
    tmp_path: Path, chunk: int
) -> None:
    path = odd_tar(tmp_path / "odd.tar")
    raw = path.read_bytes()
    scan = _scan(raw, chunk)
    samples = webdataset_samples([path])
    assert [s.key for s in scan.samples] == [s["__key__"] for s in samples]  # type: ignore[attr-defined]
    for entry, sample in zip(scan.samples, samples, strict=True):  # type: ignore[attr-defined]
        got = {m.ext: raw[m.offset : m.offset + m.size] for m in entry.members}
        assert got == {k: v for k, v in sample.items() if k != "__key__"}
        assert raw[entry.offset : entry.offset + entry.length]  # the span lies in the file


@pytest.mark.parametrize("fmt", ["GNU_FORMAT", "PAX_FORMAT"])
def test_long_names_of_either_format(tmp_path: Path, fmt: str) -> None:
    [path] = wds_tars(tmp_path, shards=1, per=3, fmt=fmt)
    scan = _scan(path.read_bytes())
    assert [s.key for s in scan.samples] == [s["__key__"] for s in webdataset_samples([path])]  # type: ignore[attr-defined]


HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    "size past the end": (
        lambda: _with_size_field(_tar(("a.jpg", b"x" * 100)), b"00000077777\x00"),
        "runs past the end of the file",
    ),
    "truncated member": (lambda: _tar(("a.jpg", b"x" * 3000))[:1600], "runs past the end"),
    "negative size": (
        lambda: _with_size_field(_tar(("a.jpg", b"x" * 100)), b"\xff" * 12),
        "negative size",
    ),
    "absurd size": (
        lambda: _with_size_field(_tar(("a.jpg", b"x" * 100)), b"\x80" + b"\xff" * 11),
        "runs past the end",
    ),
    "parent traversal": (lambda: _tar(("../../etc/x.jpg", b"x")), "path traversal"),
    "absolute path": (lambda: _tar(("/etc/passwd.txt", b"x")), "absolute path"),
    "traversal in a skipped member": (
        lambda: _tar(("a.jpg", b"x"), ("../README", b"y")),
        "traversal",
    ),
    "control character": (lambda: _tar(("a\x01b.jpg", b"x")), "control character"),
    "garbage after the last member": (
        lambda: _tar(("a.jpg", b"x" * 10))[:1024] + b"garbage!" * 1216,
        "unreadable tar data from byte 1024",
    ),
    "gzip-compressed": (lambda: gzip.compress(_tar(("a.jpg", b"x"))), "name it .tar.gz"),
    "bzip2-compressed": (lambda: bz2.compress(_tar(("a.jpg", b"x"))), "recompress it with gzip"),
    "not a tar at all": (lambda: b"hello world" * 100, "not a readable tar"),
    "only zeros": (lambda: bytes(10240), "no sample"),  # an empty archive
    "the same member twice": (lambda: _tar(("a.jpg", b"1"), ("a.jpg", b"2")), "twice"),
    "an empty extension": (
        lambda: _tar(
            ("a.", b"1"),
        ),
        "empty extension",
    ),
    "no samples": (lambda: _tar(("README", b"1"), ("__meta__", b"2")), "no sample"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_tars_are_refused_naming_the_file(case: str) -> None:
    make, why = HOSTILE[case]
    with pytest.raises(AdoptionError, match=r"x\.tar") as caught:
        _scan(make())
    assert why in str(caught.value)


def test_a_sparse_member_is_refused() -> None:
    info = tarfile.TarInfo("a.bin")
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = 0
    raw = info.tobuf(format=tarfile.GNU_FORMAT) + bytes(2 * BLOCK)
    with pytest.raises(AdoptionError, match="sparse"):
        _scan(raw)


def test_the_sha256_is_of_every_byte(tmp_path: Path) -> None:
    import hashlib  # noqa: PLC0415

    raw = odd_tar(tmp_path / "odd.tar").read_bytes()
    assert _scan(raw).sha256 == hashlib.sha256(raw).hexdigest()  # type: ignore[attr-defined]
