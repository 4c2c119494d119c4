"""Helpers for checkpoint tests: locate files on disk, damage them, compare states."""

from __future__ import annotations

import math
from pathlib import Path

import torch

import mouthguard


def step_path(store: mouthguard.Store, run: str, step: int) -> Path:
    """Directory of a committed checkpoint on the fast (local) tier."""
    return Path(store.fast.location(f"{run}/{step:012d}/"))


def flip_byte(path: Path, offset: int, mask: int = 0xFF) -> None:
    """XOR one byte of a file in place (offset may be negative: from the end)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def assert_same(a: object, b: object) -> None:
    """Deep equality with exact types; tensors compared bitwise incl. dtype and shape."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.numel():
            raw_a = a.contiguous().reshape(-1).view(torch.uint8)
            raw_b = b.contiguous().reshape(-1).view(torch.uint8)
            assert torch.equal(raw_a, raw_b)
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b)
    else:
        assert a == b
