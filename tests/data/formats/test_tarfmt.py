"""Shard bytes are exactly what tarfile writes, and headers are checked against the index."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mouthguard.data.formats import tarfmt
from mouthguard.errors import SampleError


def _ours(members: list[tuple[str, bytes]]) -> bytes:
    out = bytearray()
    for name, data in members:
        out += (
            tarfmt.member_header(name, len(data)) + data + tarfmt.zeros(tarfmt.padding(len(data)))
        )
    return bytes(out + tarfmt.zeros(tarfmt.archive_end(len(out))))


def _tarfile(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uname = info.gname = ""
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(st.sampled_from("abc/é1"), min_size=1, max_size=40).filter(
                lambda n: not n.startswith("/") and "//" not in n and not n.endswith("/")
            ),
            st.binary(max_size=2000),
        ),
        max_size=6,
    )
)
def test_members_are_byte_identical_to_tarfile(members: list[tuple[str, bytes]]) -> None:
    names = [f"{name}.bin" for name, _ in members]
    items = [(n, d) for n, (_, d) in zip(names, members, strict=True)]
    assert _ours(items) == _tarfile(items)
    assert len(_ours(items)) % tarfmt.RECORD == 0


@pytest.mark.parametrize("size", [0, 1, 9216, 9217, 10240 - 1024, 10240 - 512, 20480])
def test_every_end_padding_is_byte_identical_to_tarfile(size: int) -> None:
    # 9216 bytes of data leave the archive 512 bytes short of a record: its end is then
    # two zero blocks plus almost a whole record of padding (more than one record).
    items = [("x.bin", bytes(range(256)) * (size // 256) + bytes(size % 256))]
    assert _ours(items) == _tarfile(items)


def test_header_problem_accepts_its_own_header() -> None:
    header = tarfmt.member_header("a/b/x.jpg", 1234)
    assert tarfmt.header_problem(header, "a/b/x.jpg", 1234) is None


def test_long_names_use_the_ustar_prefix_field() -> None:
    name = "d" * 150 + "/x.jpg"
    assert tarfmt.header_problem(tarfmt.member_header(name, 1), name, 1) is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda h: h.__setitem__(0, h[0] ^ 1), "checksum"),
        (lambda h: h.__setitem__(slice(257, 263), b"xxxxx\x00"), "no USTAR header"),
        (lambda h: h.__setitem__(slice(0, 512), bytes(512)), "no USTAR header"),
    ],
)
def test_header_problem_finds_damage(change: object, why: str) -> None:
    header = bytearray(tarfmt.member_header("x.jpg", 10))
    change(header)  # type: ignore[operator]
    problem = tarfmt.header_problem(header, "x.jpg", 10)
    assert problem is not None and why in problem


def test_header_problem_finds_another_member() -> None:
    header = tarfmt.member_header("x.jpg", 10)
    assert "names" in (tarfmt.header_problem(header, "y.jpg", 10) or "")
    assert "size" in (tarfmt.header_problem(header, "x.jpg", 11) or "")


def test_names_too_long_for_ustar_are_refused() -> None:
    with pytest.raises(SampleError, match="USTAR"):
        tarfmt.member_header("x" * 120 + ".jpg", 1)


@pytest.mark.parametrize("name", ["a/b/x.jpg", "d" * 150 + "/x.jpg"])
@pytest.mark.parametrize("size", [0, 1, 1234, 8 * 1024**3 - 1])
def test_member_mismatch_accepts_the_writers_headers(name: str, size: int) -> None:
    assert tarfmt.member_mismatch(tarfmt.member_header(name, size), name.encode(), size) is None


def test_member_mismatch_catches_an_index_that_points_elsewhere() -> None:
    header = bytearray(tarfmt.member_header("x.jpg", 10))
    assert "names" in (tarfmt.member_mismatch(header, b"y.jpg", 10) or "")
    assert "size" in (tarfmt.member_mismatch(header, b"x.jpg", 11) or "")
    assert "no USTAR header" in (tarfmt.member_mismatch(bytes(512), b"x.jpg", 10) or "")
    header[156:157] = b"5"  # a directory entry
    assert "not a regular file" in (tarfmt.member_mismatch(header, b"x.jpg", 10) or "")


def test_member_mismatch_reads_a_size_spelled_another_way() -> None:
    header = bytearray(tarfmt.member_header("x.jpg", 10))
    header[124:136] = b"     12 \x00\x00\x00\x00"  # octal 12 = 10, space-padded
    assert tarfmt.member_mismatch(header, b"x.jpg", 10) is None
    assert tarfmt.member_mismatch(header, b"x.jpg", 12) is not None
