"""Regression tests for what the fuzz harness (reliability/fuzz.py) found in rank-file headers."""

from __future__ import annotations

import struct

import pytest
import safetensors.torch

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
    with pytest.raises(Exception):  # noqa: B017 - the reference reader refuses it
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
    with pytest.raises(Exception):  # noqa: B017 - the reference reader refuses it
        safetensors.torch.load(data)
    with pytest.raises(RankFileError, match="range"):
        parse_header(data, len(data))
