"""The remote tier: one object per block on any mouthguard tier (S3, a shared FS, RAM).

Objects live under ``kvcache/<namespace>/<key hex>`` where ``<namespace>`` is
the first 16 hex digits of the chain's root key, so caches of different models
never list each other. An object is self-describing and checked on every read::

    b"MGKVOBJ1" | u32 desc length | desc | checksum[16] | payload

The checksum (xxh3-128 over the block key and the payload) catches damage, not
malice: anyone who can write the prefix can compute it for bytes of their own.
A store given a key (``auth_key=``, or ``$MOUTHGUARD_MANIFEST_KEY``) writes
authenticated objects instead, under ``kvcache/<namespace>.k/``::

    b"MGKVOBJ2" | u32 desc length | desc | checksum[16] | u8 key-id length |
    key id | mac[32] | payload

where ``mac`` is keyed BLAKE2b-256 over the object's name, the description,
the checksum and the payload, with the key named by the key id (a keyring
rotates: the current key writes, every key reads). An object that fails its MAC
-- planted or altered by someone without the key, or unkeyed -- is damaged: a
miss, dropped.

Like :class:`~mouthguard.kvcache.disk.DiskLevel`, metadata methods run under the
store's lock and I/O methods outside it. The index (key -> object size) is the
listing taken when the store opens plus this process's own writes; a block
another process adds to a shared remote later is not seen (a ``head`` per block
on the lookup path would put a network round trip on every prefix walk).
"""

from __future__ import annotations

import hashlib
import hmac
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
from mouthguard.tiers.key_material import Keyring

log = logging.getLogger(__name__)

OBJ_MAGIC = b"MGKVOBJ1"
KEYED_MAGIC = b"MGKVOBJ2"
_HEAD = struct.Struct("<8sI")
_MAC_BYTES = 32
_MAC_PERSON = b"mg-kv-obj-v2"


def remote_prefix(root: bytes, keys: Keyring | None) -> str:
    """The namespace's prefix: keyed stores never list (or delete) unkeyed objects."""
    return f"kvcache/{root.hex()[:16]}{'.k' if keys is not None else ''}/"


def _mac(secret: bytes, name: str, desc: bytes, checksum: bytes, data: memoryview) -> bytes:
    mac = hashlib.blake2b(key=secret, digest_size=_MAC_BYTES, person=_MAC_PERSON)
    name_bytes = name.encode()
    mac.update(struct.pack("<II", len(name_bytes), len(desc)) + name_bytes + desc + checksum)
    mac.update(data)
    return mac.digest()


def encode_object(
    payload: Payload, name: str = "", keys: Keyring | None = None
) -> list[bytes | memoryview]:
    """The object's bytes as chunks (the payload is not copied); keyed when ``keys``."""
    desc = payload.desc.encode()
    data = memoryview(payload.data.data).cast("B")
    if keys is None:
        return [_HEAD.pack(OBJ_MAGIC, len(desc)) + desc + payload.checksum, data]
    kid = keys.current.encode()
    mac = _mac(keys.current_key, name, desc, payload.checksum, data)
    head = _HEAD.pack(KEYED_MAGIC, len(desc)) + desc + payload.checksum
    return [head + bytes([len(kid)]) + kid + mac, data]


def object_size(payload: Payload, keys: Keyring | None = None) -> int:
    """Bytes of the block's object."""
    size = _HEAD.size + len(payload.desc.encode()) + 16 + payload.nbytes
    return size if keys is None else size + 1 + len(keys.current.encode()) + _MAC_BYTES


def decode_object(
    key: bytes, raw: bytes, name: str = "", keys: Keyring | None = None
) -> tuple[npt.NDArray[Any], BlockDesc, bytes]:
    """Payload bytes (a private copy), description and checksum of an object.

    Raises:
        FormatError: not a block object (of the kind ``keys`` asks for), its MAC
            is wrong or made with an unknown key, or its bytes fail the checksum.
    """
    if len(raw) < _HEAD.size:
        raise FormatError("KV object shorter than its header")
    magic, desc_len = _HEAD.unpack_from(raw)
    wanted = OBJ_MAGIC if keys is None else KEYED_MAGIC
    start = _HEAD.size + desc_len + 16
    if magic != wanted or start > len(raw):
        raise FormatError("not a KV block object" + ("" if keys is None else " with a MAC"))
    desc_raw = raw[_HEAD.size : _HEAD.size + desc_len]
    checksum = raw[_HEAD.size + desc_len : start]
    if keys is not None:
        kid_len = raw[start] if start < len(raw) else 0
        kid = raw[start + 1 : start + 1 + kid_len].decode("ascii", "replace")
        mac_at = start + 1 + kid_len
        secret = keys.keys.get(kid)
        if secret is None or mac_at + _MAC_BYTES > len(raw):
            raise FormatError(f"KV object signed with an unknown key id {kid!r}")
        body = memoryview(raw)[mac_at + _MAC_BYTES :]
        expected = _mac(secret, name, desc_raw, checksum, body)
        if not hmac.compare_digest(expected, raw[mac_at : mac_at + _MAC_BYTES]):
            raise FormatError("KV object fails its MAC: not written with this store's key")
        start = mac_at + _MAC_BYTES
    data = np.frombuffer(raw, dtype=np.uint8, offset=start).copy()
    desc = parse_desc(desc_raw, data.nbytes)
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
        keys: MAC keys (None: unkeyed objects; see the module docstring).
    """

    def __init__(
        self,
        tier: Tier,
        prefix: str,
        capacity: int | None,
        policy: EvictionPolicy,
        *,
        keys: Keyring | None = None,
    ) -> None:
        self.tier = tier
        self.keys = keys
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
        """The namespace's objects with their sizes, from one listing of the tier.

        Sizes come with the listing (:meth:`~mouthguard.tiers.base.Tier.list_info`:
        S3's ListObjectsV2 carries them), so opening a store over a remote of N
        blocks costs N / 1000 list requests, not N ``head`` requests. Names that
        are not a block key are ignored (they are not this cache's).

        Raises:
            MouthguardError: the listing failed (the remote is down).
        """
        found: dict[bytes, int] = {}
        for info in self.tier.list_info(self.prefix):
            try:
                key = bytes.fromhex(info.key[len(self.prefix) :])
            except ValueError:
                continue
            if len(key) == 16:
                found[key] = info.size
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

    def load_index(self) -> None:
        """Index what the namespace already holds, deleting the excess over capacity.

        Run once at open, before any other thread uses the level.
        """
        found = self.scan()
        doomed: list[bytes] = []
        for key, size in found.items():
            self.publish(key, size)
        while self.capacity is not None and self.used > self.capacity:
            victim = self.policy.pop_victim(lambda k: k in self.index)
            if victim is None:
                break
            self.forget(victim)
            doomed.append(victim)
        for key in doomed:
            self.delete(key)

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
        name = self.object_key(key)
        self.tier.put(name, encode_object(payload, name, self.keys))

    def read(self, key: bytes) -> tuple[npt.NDArray[Any], BlockDesc, bytes] | None:
        """The block's bytes, description and checksum, or None if it cannot be read now.

        Raises:
            FormatError: the object is damaged (the caller drops it).
        """
        name = self.object_key(key)
        try:
            raw = self.tier.get(name)
        except MouthguardError as exc:
            log.debug("kv block %s unreadable on %s: %s", key.hex(), self.tier.name, exc)
            return None
        return decode_object(key, raw, name, self.keys)

    def delete(self, key: bytes) -> None:
        """Delete the block's object (errors are logged: the index no longer counts it)."""
        try:
            self.tier.delete(self.object_key(key))
        except MouthguardError as exc:
            log.warning("could not delete kv block %s on %s: %s", key.hex(), self.tier.name, exc)
