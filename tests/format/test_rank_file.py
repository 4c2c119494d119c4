"""Tests of rank files: 4 KiB-aligned safetensors files that real readers open.

Files are written exactly as the writer does (``layout.header`` followed by each
tensor's ``byte_view``) and read back with the real ``safetensors`` package, so a
layout bug shows up as a file safetensors rejects or misreads. ``parse_header`` is
fed hostile headers and random bytes: it must only ever raise RankFileError.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mouthguard.errors import RankFileError
from mouthguard.format import dtypes
from mouthguard.format.dtypes import MAX_DIMS, dtype_code, itemsize, torch_dtype
from mouthguard.format.rank_file import (
    HEADER_ALIGN,
    MAX_HEADER_BYTES,
    RankFileLayout,
    TensorEntry,
    build_layout,
    byte_view,
    parse_header,
    read_header_length,
)

ALL_CODES = sorted(dtypes._CODES)
U64_MAX = 2**64 - 1


# --- helpers -----------------------------------------------------------------


def random_tensor(code: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """A tensor of dtype ``code`` holding varied (seeded) values, including negatives."""
    gen = torch.Generator().manual_seed(seed)
    dtype = torch_dtype(code)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    n = math.prod(shape)
    # Random bytes reinterpreted: covers every bit pattern of ints, uints and floats
    # (nan payloads, subnormals, negative zero), which a value round-trip would hide.
    raw = torch.randint(0, 256, (n * itemsize(code),), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def raw_bytes(tensor: torch.Tensor) -> bytes:
    return bytes(byte_view(tensor.contiguous()))


def assert_identical(expected: torch.Tensor, actual: torch.Tensor) -> None:
    """Same dtype, same shape and the very same bytes (nan payloads included)."""
    assert actual.dtype == expected.dtype
    assert tuple(actual.shape) == tuple(expected.shape)
    assert raw_bytes(actual) == raw_bytes(expected)
    if expected.dtype.is_floating_point and expected.dtype.itemsize > 1:
        assert torch.equal(actual, expected) or bool(torch.isnan(expected).any())


def layout_of(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> RankFileLayout:
    return build_layout(
        [(name, dtype_code(t.dtype), tuple(t.shape)) for name, t in tensors.items()], metadata
    )


def file_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """The bytes of a rank file, written the way the checkpoint writer writes it."""
    layout = layout_of(tensors, metadata or {})
    parts = [layout.header, *(raw_bytes(t) for t in tensors.values())]
    data = b"".join(parts)
    assert len(data) == layout.size
    return data


def write_file(
    path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> RankFileLayout:
    layout = layout_of(tensors, metadata)
    with path.open("wb") as f:
        f.write(layout.header)
        for tensor in tensors.values():
            f.write(byte_view(tensor.contiguous()))
    assert path.stat().st_size == layout.size
    return layout


def assert_opens_identically(
    path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> None:
    """Both real safetensors APIs read back exactly ``tensors`` and ``metadata``."""
    loaded = safetensors.torch.load_file(str(path))
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert_identical(tensor, loaded[name])
    with safetensors.safe_open(str(path), framework="pt") as f:
        assert set(f.keys()) == set(tensors)
        assert (f.metadata() or {}) == metadata
        for name, tensor in tensors.items():
            assert_identical(tensor, f.get_tensor(name))
    # The in-memory deserialiser agrees too -- where it knows the dtype: safetensors
    # 0.8's Python ``load(bytes)`` lacks F8_E8M0, which its file readers above handle.
    if all(t.dtype in safetensors.torch._TYPES.values() for t in tensors.values()):
        from_bytes = safetensors.torch.load(path.read_bytes())
        for name, tensor in tensors.items():
            assert_identical(tensor, from_bytes[name])


def padded_file(header: bytes | str | object, data: bytes = b"", *, pad: bool = True) -> bytes:
    """A file with ``header`` (JSON-encoded unless bytes) after its length, then ``data``."""
    if isinstance(header, str):
        text = header.encode()
    elif isinstance(header, bytes):
        text = header
    else:
        text = json.dumps(header).encode()
    if pad:
        total = -(-(8 + len(text)) // HEADER_ALIGN) * HEADER_ALIGN
        text += b" " * (total - 8 - len(text))
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype: str, shape: list[object], start: int, end: int) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [start, end]}


def parse(data: bytes) -> tuple[tuple[TensorEntry, ...], dict[str, str]]:
    return parse_header(data, len(data))


# --- build_layout ------------------------------------------------------------


def test_layout_aligns_data_region_and_size_is_exact() -> None:
    specs = [("a", "F32", (3, 5)), ("b", "I64", ()), ("c", "BF16", (0, 4)), ("d", "U8", (7,))]
    layout = build_layout(specs, {"run": "r"})
    assert layout.data_offset % HEADER_ALIGN == 0
    assert layout.data_offset == len(layout.header) == HEADER_ALIGN
    lengths = [60, 8, 0, 7]
    assert [e.length for e in layout.entries] == lengths
    assert layout.size == HEADER_ALIGN + sum(lengths)
    # Back to back in the given order, starting at the data region.
    assert [e.offset for e in layout.entries] == [4096, 4156, 4164, 4164]
    assert [(e.name, e.dtype, e.shape) for e in layout.entries] == specs
    assert layout.entries[-1].end == layout.size
    # The header is its announced length, JSON followed only by space padding.
    (n,) = struct.unpack("<Q", layout.header[:8])
    assert 8 + n == len(layout.header)
    text = layout.header[8:]
    assert text.rstrip(b" ").endswith(b"}")
    assert json.loads(text)["__metadata__"] == {"run": "r"}


def test_layout_without_tensors_is_one_aligned_page() -> None:
    layout = build_layout([], {})
    assert layout.size == layout.data_offset == HEADER_ALIGN
    assert layout.entries == ()
    assert json.loads(layout.header[8:]) == {}


@pytest.mark.parametrize("count", [1, 50, 400])
def test_layout_header_of_any_size_stays_aligned(count: int) -> None:
    specs = [
        (f"layer.{i}.attention.weight.with.a.long.name", "F16", (i % 3, 2)) for i in range(count)
    ]
    layout = build_layout(specs, {})
    assert layout.data_offset % HEADER_ALIGN == 0
    (n,) = struct.unpack("<Q", layout.header[:8])
    assert 8 + n == layout.data_offset
    # The padding is minimal: less than one alignment unit.
    text_length = len(layout.header[8:].rstrip(b" "))
    assert layout.data_offset - HEADER_ALIGN < 8 + text_length <= layout.data_offset
    assert layout.size == layout.data_offset + sum((i % 3) * 2 * 2 for i in range(count))


@pytest.mark.parametrize("name", ["__metadata__", "dup"])
def test_layout_rejects_reserved_and_duplicate_names(name: str) -> None:
    specs = [("dup", "F32", (1,)), (name, "F32", (1,))]
    with pytest.raises(RankFileError, match="duplicate or reserved"):
        build_layout(specs, {})


# --- real safetensors readers --------------------------------------------------


def test_every_dtype_code_is_a_safetensors_dtype() -> None:
    """safetensors writes each torch dtype under the very code mouthguard maps it to."""
    for code in ALL_CODES:
        written = safetensors.torch.save({"x": torch.zeros(1, dtype=torch_dtype(code))})
        (length,) = struct.unpack("<Q", written[:8])
        assert json.loads(written[8 : 8 + length])["x"]["dtype"] == code
        assert torch_dtype(code).itemsize == itemsize(code)


def test_the_float8_variants_are_all_mapped() -> None:
    """Every float8 dtype safetensors carries (the fnuz ones and e8m0 included)."""
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
        assert torch_dtype(dtypes.dtype_code(getattr(torch, name))) == getattr(torch, name)
    assert dtypes.dtype_code(torch.float8_e8m0fnu) == "F8_E8M0"


@pytest.mark.parametrize("code", ALL_CODES)
def test_every_dtype_opens_with_real_safetensors(tmp_path: Path, code: str) -> None:
    tensors = {
        "matrix": random_tensor(code, (3, 7), seed=1),
        "scalar": random_tensor(code, (), seed=2),
        "empty": random_tensor(code, (0,), seed=3),
        "empty_2d": random_tensor(code, (4, 0), seed=4),
        "cube": random_tensor(code, (2, 3, 5), seed=5),
    }
    layout = write_file(tmp_path / "rank.safetensors", tensors, {"dtype": code})
    assert layout.data_offset % HEADER_ALIGN == 0
    assert_opens_identically(tmp_path / "rank.safetensors", tensors, {"dtype": code})


def test_all_dtypes_mixed_in_one_file(tmp_path: Path) -> None:
    tensors = {f"t.{code}": random_tensor(code, (5,), seed=i) for i, code in enumerate(ALL_CODES)}
    tensors["zero_d"] = torch.tensor(3.5)
    tensors["empty"] = torch.empty(0, 3, dtype=torch.int16)
    write_file(tmp_path / "mixed.safetensors", tensors, {"a": "b"})
    assert_opens_identically(tmp_path / "mixed.safetensors", tensors, {"a": "b"})


def test_many_tensors_header_beyond_one_page(tmp_path: Path) -> None:
    tensors = {
        f"model.layers.{i}.mlp.weight": random_tensor(
            ALL_CODES[i % len(ALL_CODES)], (i % 4, 3), seed=i
        )
        for i in range(300)
    }
    metadata = {f"key{i}": "v" * i for i in range(20)}
    layout = write_file(tmp_path / "big.safetensors", tensors, metadata)
    assert layout.data_offset > HEADER_ALIGN
    assert layout.data_offset % HEADER_ALIGN == 0
    assert_opens_identically(tmp_path / "big.safetensors", tensors, metadata)


def test_unicode_names_and_metadata_open(tmp_path: Path) -> None:
    tensors = {"poids.é": torch.arange(4.0), "权重": torch.ones(2, dtype=torch.int8)}
    metadata = {"note": "ünïcødé ✓", "quote": '"\\'}
    write_file(tmp_path / "u.safetensors", tensors, metadata)
    assert_opens_identically(tmp_path / "u.safetensors", tensors, metadata)
    entries, meta = parse(file_bytes(tensors, metadata))
    assert [e.name for e in entries] == list(tensors)
    assert meta == metadata


def test_non_contiguous_source_written_contiguously(tmp_path: Path) -> None:
    base = torch.arange(24.0).view(4, 6)
    tensors = {"t": base.t(), "step": base[:, ::2]}
    write_file(tmp_path / "nc.safetensors", tensors, {})
    loaded = safetensors.torch.load_file(str(tmp_path / "nc.safetensors"))
    assert torch.equal(loaded["t"], base.t())
    assert torch.equal(loaded["step"], base[:, ::2])


def test_empty_file_opens(tmp_path: Path) -> None:
    write_file(tmp_path / "none.safetensors", {}, {})
    assert safetensors.torch.load_file(str(tmp_path / "none.safetensors")) == {}


# --- parse_header round trip -----------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 3, 300])
def test_parse_header_round_trips_layout(count: int) -> None:
    specs = [
        (f"w{i}", ALL_CODES[i % len(ALL_CODES)], tuple([(i % 3) + 1] * (i % 4)))
        for i in range(count)
    ]
    metadata = {"format": "mouthguard.checkpoint", "step": "7"} if count % 2 else {}
    layout = build_layout(specs, metadata)
    entries, meta = parse_header(layout.header, layout.size)
    assert entries == layout.entries
    assert meta == metadata
    assert read_header_length(layout.header[:8], layout.size) == layout.data_offset


def test_parse_header_round_trips_empty_tensors_at_same_offset() -> None:
    specs = [("a", "F32", (0,)), ("b", "F32", (2, 0)), ("c", "F64", (1,)), ("d", "U8", (0,))]
    layout = build_layout(specs, {})
    entries, _ = parse_header(layout.header, layout.size)
    assert entries == layout.entries


def test_parse_header_ignores_bytes_after_header() -> None:
    data = file_bytes({"a": torch.arange(3.0)})
    entries, _ = parse(data)
    assert [(e.name, e.offset, e.length) for e in entries] == [("a", HEADER_ALIGN, 12)]


def test_parse_header_sorts_entries_by_offset() -> None:
    header = {"b": entry("F32", [1], 4, 8), "a": entry("F32", [1], 0, 4)}
    entries, _ = parse(padded_file(header, b"\0" * 8))
    assert [e.name for e in entries] == ["a", "b"]
    assert [e.offset for e in entries] == [HEADER_ALIGN, HEADER_ALIGN + 4]


# --- parse_header rejections ------------------------------------------------------


def test_rejects_u64_max_header_length() -> None:
    data = struct.pack("<Q", U64_MAX) + b"{}" + b" " * 100
    with pytest.raises(RankFileError, match="absurd"):
        parse(data)
    with pytest.raises(RankFileError, match="absurd"):
        parse_header(data, U64_MAX)  # even if the file claimed to be huge


def test_rejects_header_length_larger_than_file() -> None:
    data = struct.pack("<Q", 1000) + b"{}"
    with pytest.raises(RankFileError, match="absurd"):
        parse(data)


def test_rejects_header_length_over_cap() -> None:
    length = MAX_HEADER_BYTES + 1
    with pytest.raises(RankFileError, match="absurd"):
        read_header_length(struct.pack("<Q", length), 10 * MAX_HEADER_BYTES)


@pytest.mark.parametrize("data", [b"", b"\x00", b"1234567"])
def test_rejects_file_shorter_than_length_prefix(data: bytes) -> None:
    with pytest.raises(RankFileError, match="shorter"):
        parse(data)


def test_rejects_truncated_header() -> None:
    data = file_bytes({"a": torch.arange(3.0)})
    for cut in (8, 9, 100, HEADER_ALIGN - 1):
        with pytest.raises(RankFileError, match="truncated"):
            parse_header(data[:cut], len(data))


@pytest.mark.parametrize(
    "text",
    [
        b"not json",
        b"{",
        b'{"a": }',
        b"\xff\xfe{}",
        b'{"a": 1} trailing',
        b"[" * 100_000,
    ],
    ids=["garbage", "unterminated", "syntax", "not-utf8", "trailing", "deep"],
)
def test_rejects_non_json_header(text: bytes) -> None:
    with pytest.raises(RankFileError, match="not valid JSON"):
        parse(padded_file(text))


@pytest.mark.parametrize("header", [b"[]", b"[1, 2]", b'"string"', b"42", b"null", b"true"])
def test_rejects_header_that_is_not_an_object(header: bytes) -> None:
    with pytest.raises(RankFileError, match="not a JSON object"):
        parse(padded_file(header))


def test_rejects_gap_between_tensors() -> None:
    header = {"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}
    with pytest.raises(RankFileError, match="gap"):
        parse(padded_file(header, b"\0" * 12))


def test_rejects_gap_before_first_tensor() -> None:
    header = {"a": entry("F32", [1], 4, 8)}
    with pytest.raises(RankFileError, match="gap"):
        parse(padded_file(header, b"\0" * 8))


def test_rejects_overlapping_tensors() -> None:
    header = {"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}
    with pytest.raises(RankFileError, match="overlaps"):
        parse(padded_file(header, b"\0" * 12))


def test_rejects_tensors_sharing_bytes() -> None:
    header = {"a": entry("F32", [1], 0, 4), "b": entry("I32", [1], 0, 4)}
    with pytest.raises(RankFileError, match="overlaps"):
        parse(padded_file(header, b"\0" * 4))


@pytest.mark.parametrize("data_len", [0, 3, 5, 4096])
def test_rejects_data_not_covering_file(data_len: int) -> None:
    header = {"a": entry("F32", [1], 0, 4)}
    with pytest.raises(RankFileError, match="covers"):
        parse(padded_file(header, b"\0" * data_len))


def test_rejects_trailing_bytes_after_empty_header() -> None:
    with pytest.raises(RankFileError, match="covers"):
        parse(padded_file({}, b"x"))


@pytest.mark.parametrize(
    ("dtype", "shape", "end"),
    [("F32", [2], 4), ("F32", [2], 12), ("F64", [1], 4), ("U8", [0], 1), ("BF16", [], 4)],
)
def test_rejects_length_not_matching_dtype_and_shape(
    dtype: str, shape: list[int], end: int
) -> None:
    header = {"a": entry(dtype, shape, 0, end)}
    with pytest.raises(RankFileError, match="does not match dtype and shape"):
        parse(padded_file(header, b"\0" * end))


@pytest.mark.parametrize(
    "shape",
    [[-1], [2, -1], [True], [False, 1], [1.0], [2.5], ["2"], [None], [[1]], "2", 2, None, {"a": 1}],
)
def test_rejects_malformed_shape(shape: object) -> None:
    header = {"a": {"dtype": "U8", "shape": shape, "data_offsets": [0, 1]}}
    with pytest.raises(RankFileError, match="malformed shape"):
        parse(padded_file(header, b"\0"))


def test_rejects_more_than_max_dims() -> None:
    header = {"a": entry("U8", [1] * (MAX_DIMS + 1), 0, 1)}
    with pytest.raises(RankFileError, match="malformed shape"):
        parse(padded_file(header, b"\0"))
    ok = {"a": entry("U8", [1] * MAX_DIMS, 0, 1)}
    entries, _ = parse(padded_file(ok, b"\0"))
    assert entries[0].shape == (1,) * MAX_DIMS


@pytest.mark.parametrize(
    "offsets",
    [[0], [0, 1, 2], [-1, 0], [1, 0], [0.0, 1], [True, 1], ["0", "1"], None, "0,1", {"0": 1}],
)
def test_rejects_malformed_data_offsets(offsets: object) -> None:
    header = {"a": {"dtype": "U8", "shape": [1], "data_offsets": offsets}}
    with pytest.raises(RankFileError, match="malformed data_offsets"):
        parse(padded_file(header, b"\0"))


@pytest.mark.parametrize("dtype", ["F128", "f32", "", "F4", "float32"])
def test_rejects_unknown_dtype(dtype: str) -> None:
    header = {"a": entry(dtype, [1], 0, 1)}
    with pytest.raises(RankFileError, match="unknown tensor dtype"):
        parse(padded_file(header, b"\0"))


@pytest.mark.parametrize("dtype", [None, 4, ["F32"], {"F32": 1}])
def test_rejects_non_string_dtype(dtype: object) -> None:
    header = {"a": {"dtype": dtype, "shape": [1], "data_offsets": [0, 4]}}
    with pytest.raises(RankFileError, match="dtype must be a string"):
        parse(padded_file(header, b"\0" * 4))


@pytest.mark.parametrize("info", [None, 1, "F32", [], ["F32", [1], [0, 4]]])
def test_rejects_entry_that_is_not_an_object(info: object) -> None:
    with pytest.raises(RankFileError, match="malformed header entry"):
        parse(padded_file({"a": info}, b"\0" * 4))


@pytest.mark.parametrize(
    "metadata", [{"a": 1}, {"a": None}, {"a": ["b"]}, {"a": {"b": "c"}}, "text", ["a"], None, 3]
)
def test_rejects_non_string_metadata(metadata: object) -> None:
    header = {"__metadata__": metadata, "a": entry("U8", [1], 0, 1)}
    with pytest.raises(RankFileError, match="__metadata__"):
        parse(padded_file(header, b"\0"))


def test_unpadded_header_is_parsed_where_it_ends() -> None:
    # Alignment is build_layout's job; parse_header follows the announced length.
    data = padded_file({"a": entry("U8", [2], 0, 2)}, b"\1\2", pad=False)
    entries, _ = parse(data)
    assert entries[0].offset == len(data) - 2


# --- safetensors agreement on hostile headers --------------------------------------


def _safetensors_accepts(data: bytes) -> bool:
    try:
        safetensors.torch.load(data)
    except Exception:
        return False
    return True


def _we_accept(data: bytes) -> bool:
    try:
        parse(data)
    except RankFileError:
        return False
    return True


@pytest.mark.parametrize(
    "data",
    [
        padded_file({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, b"\0" * 12),
        padded_file({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, b"\0" * 12),
        padded_file({"a": entry("F32", [1], 0, 4)}, b"\0" * 8),
        padded_file({"a": entry("F32", [2], 0, 4)}, b"\0" * 4),
        padded_file({"a": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}}, b"\0" * 4),
        padded_file({"__metadata__": {"a": 1}, "a": entry("U8", [1], 0, 1)}, b"\0"),
        padded_file(b"[]"),
        padded_file(b"nonsense"),
        struct.pack("<Q", U64_MAX) + b"{}",
    ],
)
def test_headers_safetensors_rejects_are_rejected(data: bytes) -> None:
    assert not _safetensors_accepts(data)
    assert not _we_accept(data)


_DIVERGENT = {
    "nan-token": padded_file(
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":NaN}}', b"\0" * 4
    ),
    "dim-beyond-u64": padded_file({"a": entry("F32", [0, 2**70], 0, 0)}),
    "dims-overflow-u64": padded_file({"a": entry("F32", [2**63, 2**63, 0], 0, 0)}),
    "lone-surrogate-name": padded_file(
        b'{"\\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4
    ),
}


@pytest.mark.parametrize("data", list(_DIVERGENT.values()), ids=list(_DIVERGENT))
def test_headers_safetensors_rejects_are_rejected_divergent(data: bytes) -> None:
    assert not _safetensors_accepts(data)
    with pytest.raises(RankFileError):
        parse(data)


# --- property tests -------------------------------------------------------------


def _assert_sound(data: bytes, size: int) -> None:
    """``parse_header(data, size)`` raises only RankFileError; what it accepts is consistent.

    Accepted entries tile the data region, from the header's end to ``size``,
    exactly; when ``data`` is the whole file, safetensors opens it with the same names.
    """
    try:
        entries, metadata = parse_header(data, size)
    except RankFileError:
        return
    cursor = 8 + struct.unpack("<Q", data[:8])[0]
    for entry in entries:
        assert entry.offset == cursor
        cursor = entry.end
    assert cursor == size
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    if size == len(data):
        assert set(safetensors.torch.load(data)) == {e.name for e in entries}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=2**64))
def test_random_bytes_only_raise_rank_file_error(data: bytes, extra: int) -> None:
    for size in (len(data), len(data) + extra):
        _assert_sound(data, size)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120), st.integers(min_value=0, max_value=300))
def test_random_header_text_only_raises_rank_file_error(text: bytes, data_len: int) -> None:
    data = struct.pack("<Q", len(text)) + text + b"\0" * data_len
    _assert_sound(data, len(data))


def test_sound_acceptance_is_what_the_property_tests_check() -> None:
    """The property tests' check does accept a real header (it is not vacuous)."""
    data = padded_file({"w": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}}, b"abc")
    _assert_sound(data, len(data))
    (entry,), _ = parse(data)
    assert entry.name == "w" and entry.end == len(data)


_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**15), max_value=2**15)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["F32", "U8", "BOOL", "F128", "", "__metadata__"])
    | st.text(max_size=5)
)
_json = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
_plausible_entry = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "U8", "I16", "F64", "BOOL"]) | _json,
        "shape": st.lists(st.integers(min_value=-1, max_value=4), max_size=3) | _json,
        "data_offsets": st.lists(st.integers(min_value=-1, max_value=40), min_size=2, max_size=2)
        | _json,
    }
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.text(max_size=6), _plausible_entry | _json, max_size=4),
    st.integers(min_value=0, max_value=64),
)
def test_random_json_headers_only_raise_rank_file_error(
    header: dict[str, object], data_len: int
) -> None:
    data = padded_file(header, b"\0" * data_len)
    try:
        entries, metadata = parse(data)
    except RankFileError:
        return
    # Whatever is accepted tiles the data region exactly and opens with safetensors.
    cursor = len(data) - data_len
    for e in entries:
        assert e.offset == cursor
        cursor = e.end
    assert cursor == len(data)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    loaded = safetensors.torch.load(data)
    assert set(loaded) == {e.name for e in entries}


def test_a_header_that_is_not_utf8_is_named_in_our_words() -> None:
    """Not Python's codec text ("'utf-8' codec can't decode byte 0xa0"): where, and what."""
    with pytest.raises(RankFileError) as exc:
        parse(padded_file(b'{"a\xa0": 1}'))
    assert str(exc.value) == "rank file header is not valid JSON: not UTF-8 (byte 11 of the file)"
    with pytest.raises(RankFileError, match="lone surrogate") as exc:
        parse(padded_file(b'{"\\ud800": 1}'))
    assert "codec" not in str(exc.value)
