"""Regression tests for what the fuzz harness (reliability/fuzz.py) found in rank-file headers."""

from __future__ import annotations

import struct

import pytest
import safetensors.torch
from safetensors import SafetensorError

from mouthguard.errors import RankFileError
from mouthguard.format.rank_file import parse_header


def _file(header: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def test_duplicate_tensor_name_in_header_is_rejected() -> None:
    """json.loads keeps the last of two equal keys; safetensors rejects the file.

    Found by ``python -m reliability.fuzz --level ci`` (rank_header, case 1450).
    """
    entry = b'{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
    data = _file(b'{"w":"~","w":' + entry + b"}", bytes(8))
    # The reference reader refuses it too (its parser reads the first "w", a string).
    with pytest.raises(SafetensorError, match='invalid type: string "~"'):
        safetensors.torch.load(data)
    with pytest.raises(RankFileError, match="duplicate"):
        parse_header(data, len(data))


def test_out_of_range_number_in_header_is_rejected() -> None:
    """``1E400`` parses to ``inf`` in Python's json; safetensors says "number out of range".

    Found by ``reliability.fuzz`` (rank_header, seed 7, case 1767): an unknown member of
    a tensor entry carried the number, and only safetensors refused the file.
    """
    entry = b'{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1E400}'
    data = _file(b'{"w":' + entry + b"}", bytes(8))
    # The reference reader refuses it too.
    with pytest.raises(SafetensorError, match="number out of range"):
        safetensors.torch.load(data)
    with pytest.raises(RankFileError, match="range"):
        parse_header(data, len(data))


def test_an_integer_beyond_the_double_range_is_rejected() -> None:
    """A 400-digit integer is fine for Python's json; safetensors says "number out of range".

    Found by the soak level of ``reliability.fuzz`` (rank_header, case 146757).
    """
    entry = b'{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":' + b"9" * 400 + b"}"
    data = _file(b'{"w":' + entry + b"}", bytes(8))
    # The reference reader refuses it too.
    with pytest.raises(SafetensorError, match="number out of range"):
        safetensors.torch.load(data)
    with pytest.raises(RankFileError, match="not valid JSON"):
        parse_header(data, len(data))


def test_nesting_safetensors_refuses_is_rejected() -> None:
    """serde_json stops at 128 levels ("recursion limit exceeded"); Python's json does not.

    Found by the soak level of ``reliability.fuzz`` (rank_header, case 131851).
    """
    deep = b"[" * 200 + b"]" * 200
    entry = b'{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":' + deep + b"}"
    data = _file(b'{"w":' + entry + b"}", bytes(8))
    # The reference reader refuses it too.
    with pytest.raises(SafetensorError, match="recursion limit exceeded"):
        safetensors.torch.load(data)
    with pytest.raises(RankFileError, match="nesting"):
        parse_header(data, len(data))
    shallow = b"[" * 10 + b"]" * 10  # what real headers never need, but is harmless
    ok = _file(
        b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":' + shallow + b"}}", bytes(8)
    )
    (entry,), metadata = parse_header(ok, len(ok))
    assert (entry.name, entry.dtype, entry.shape, entry.length) == ("w", "F32", (2,), 8)
    assert entry.offset == len(ok) - 8 and metadata == {}
