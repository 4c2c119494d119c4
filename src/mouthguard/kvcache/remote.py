"""The remote tier: one object per block on any mouthguard tier (S3, a shared FS, RAM).

Objects live under ``kvcache/<namespace>/<key hex>`` where ``<namespace>`` is
the first 16 hex digits of the chain's root key, so caches of different models
never list each other. An object is self-describing and checked on every read::

    b"MGKVOBJ1" | u32 desc length | desc | checksum[16] | payload

Like :class:`~mouthguard.kvcache.disk.DiskLevel`, metadata methods run under the
store's lock and I/O methods outside it. The index (key -> object size) is the
listing taken when the store opens plus this process's own writes; a block
another process adds to a shared remote later is not seen (a ``head`` per block
on the lookup path would put a network round trip on every prefix walk).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from mouthguard.errors import FormatError, MouthguardError
from mouthguard.kvcache.blocks import BlockDesc, Payload, block_checksum, parse_desc
from mouthguard.kvcache.policy import EvictionPolicy
from mouthguard.tiers.base import Tier

log = logging.getLogger(__name__)

OBJ_MAGIC = b"MGKVOBJ1"
_HEAD = struct.Struct("<8sI")


def encode_object(payload: Payload) -> list[bytes | memoryview]:
    """The object's bytes as chunks (the payload is not copied)."""
    desc = payload.desc.encode()
    head = _HEAD.pack(OBJ_MAGIC, len(desc)) + desc + payload.checksum
    return [head, memoryview(payload.data.data)]


def object_size(payload: Payload) -> int:
    """Bytes of the block's object."""
    return _HEAD.size + len(payload.desc.encode()) + 16 + payload.nbytes


def decode_object(key: bytes, raw: bytes) -> tuple[npt.NDArray[Any], BlockDesc, bytes]:
    """Payload bytes (a private copy), description and checksum of an object.

    Raises:
        FormatError: not a block object, or its bytes fail the checksum.
    """
    if len(raw) < _HEAD.size:
        raise FormatError("KV object shorter than its header")
    magic, desc_len = _HEAD.unpack_from(raw)
    start = _HEAD.size + desc_len + 16
    if magic != OBJ_MAGIC or start > len(raw):
        raise FormatError("not a KV block object")
    checksum = raw[_HEAD.size + desc_len : start]
    data = np.frombuffer(raw, dtype=np.uint8, offset=start).copy()
    desc = parse_desc(raw[_HEAD.size : _HEAD.size + desc_len], data.nbytes)
    if block_checksum(key, data) != checksum:
        raise FormatError("KV block object fails its checksum")
    return data, desc, checksum


class RemoteLevel:
    """Blocks as objects on ``tier`` under ``prefix``, at most ``capacity`` bytes (None: no cap).

    Args:
        tier: any mouthguard tier.
        prefix: ``kvcache/<namespace>/`` (see the module docstring).
        capacity: bytes of objects allowed, or None.
        policy: eviction order.
    """

    def __init__(
        self, tier: Tier, prefix: str, capacity: int | None, policy: EvictionPolicy
    ) -> None:
        self.tier = tier
        self.prefix = prefix
        self.capacity = capacity
        self.policy = policy
        self.index: dict[bytes, int] = {}
        self._bytes = 0
        #: Bytes of objects being written now (counted before they exist).
        self.reserved = 0

    def object_key(self, key: bytes) -> str:
        """The tier key of block ``key``."""
        return f"{self.prefix}{key.hex()}"

    def scan(self) -> dict[bytes, int]:
        """List the namespace's objects and their sizes (I/O, at open)."""
        found: dict[bytes, int] = {}
        for name in self.tier.list(self.prefix):
            try:
                key = bytes.fromhex(name[len(self.prefix) :])
            except ValueError:
                continue
            if len(key) == 16:
                try:
                    found[key] = self.tier.head(name).size
                except MouthguardError:
                    continue
        return found

    # --- metadata (under the store's lock) ---

    @property
    def used(self) -> int:
        """Bytes of the indexed objects and of those being written."""
        return self._bytes + self.reserved

    def publish(self, key: bytes, size: int) -> None:
        """Record an object that exists on the tier."""
        self.forget(key)
        self.index[key] = size
        self._bytes += size
        self.policy.insert(key, size)

    def forget(self, key: bytes) -> bool:
        """Stop counting ``key`` (its object is deleted next, outside the lock)."""
        size = self.index.pop(key, None)
        if size is None:
            return False
        self._bytes -= size
        self.policy.remove(key)
        return True

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes stay within the capacity."""
        return self.capacity is None or self.used + size <= self.capacity

    def eligible(self, pinned: Callable[[bytes], bool]) -> Callable[[bytes], bool]:
        """Eviction filter: not pinned and still remote."""
        return lambda key: key in self.index and not pinned(key)

    # --- I/O (no lock) ---

    def write(self, key: bytes, payload: Payload) -> None:
        """Put the block's object (:func:`object_size` bytes).

        Raises:
            MouthguardError: the tier failed.
        """
        self.tier.put(self.object_key(key), encode_object(payload))

    def read(self, key: bytes) -> tuple[npt.NDArray[Any], BlockDesc, bytes] | None:
        """The block's bytes, description and checksum, or None if it cannot be read now.

        Raises:
            FormatError: the object is damaged (the caller drops it).
        """
        try:
            raw = self.tier.get(self.object_key(key))
        except MouthguardError as exc:
            log.debug("kv block %s unreadable on %s: %s", key.hex(), self.tier.name, exc)
            return None
        return decode_object(key, raw)

    def delete(self, key: bytes) -> None:
        """Delete the block's object (errors are logged: the index no longer counts it)."""
        try:
            self.tier.delete(self.object_key(key))
        except MouthguardError as exc:
            log.warning("could not delete kv block %s on %s: %s", key.hex(), self.tier.name, exc)
