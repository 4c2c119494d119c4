"""Helpers for checkpoint tests: locate files on disk, damage them, compare states."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
from typing_extensions import override

import mouthguard
from mouthguard.checkpoint.listeners import CheckpointListener
from mouthguard.errors import TierError
from mouthguard.tiers.base import ObjectInfo, PutData, PutMode, TierCapabilities
from mouthguard.tiers.memory import MemoryTier
from mouthguard.tiers.throttle import ThrottledTier


class NoRenameTier(ThrottledTier):
    """A memory tier that behaves like an object store: no rename; can fail the manifest."""

    def __init__(self) -> None:
        super().__init__(MemoryTier("objects", "region-a"), write_bytes_per_second=1e12)
        self.fail_manifest = False

    @property
    def capabilities(self) -> TierCapabilities:
        return dataclasses.replace(self.inner.capabilities, atomic_rename=False)

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        if self.fail_manifest and key.endswith("manifest.json"):
            raise TierError("injected: the object store is down")
        return super().put(key, data, mode=mode)


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


class RecordingListener(CheckpointListener):
    """A store listener that records every event, in order; idle at once."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    @override
    def save_started(self) -> None:
        self.events.append(("started",))

    @override
    def save_finished(self) -> None:
        self.events.append(("finished",))

    @override
    def announce(self, seconds_until_save: float, nbytes: int) -> None:
        self.events.append(("announce", seconds_until_save, nbytes))

    @override
    def notify_commit(self, run: str, step: int) -> None:
        self.events.append(("commit", run, step))

    @override
    def request_repair(self, run: str, step: int) -> None:
        self.events.append(("repair", run, step))

    @override
    def wait_idle(self, timeout: float) -> bool:
        self.events.append(("wait", timeout))
        return True
