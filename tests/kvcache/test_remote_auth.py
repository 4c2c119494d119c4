"""Keyed remote objects: a block planted without the key is a miss, never data."""

from __future__ import annotations

import numpy as np
import pytest

from mouthguard.kvcache import KVStore
from mouthguard.kvcache.blocks import encode
from mouthguard.kvcache.remote import encode_object
from mouthguard.tiers.memory import MemoryTier
from tests.kvcache.helpers import BT, blocks_for, tokens

KEY = bytes(range(32))


def keyed(remote: MemoryTier, key: bytes | None = KEY) -> KVStore:
    return KVStore(memory_bytes=0, block_tokens=BT, namespace="tenant", remote=remote, auth_key=key)


def test_a_keyed_store_reads_what_a_keyed_store_wrote() -> None:
    remote = MemoryTier()
    toks = tokens(1, 3)
    blocks = blocks_for(toks)
    with keyed(remote) as kv:
        kv.put(toks, blocks)
    with keyed(remote) as kv:  # a new process with the same key: found at open
        got = kv.get(toks, promote=False)
        assert len(got) == 3
        assert all(np.array_equal(g, b) for g, b in zip(got, blocks, strict=True))


def test_a_planted_block_with_a_valid_checksum_is_a_miss() -> None:
    remote = MemoryTier()
    toks = tokens(2, 2)
    with keyed(remote) as kv:
        kv.put(toks, blocks_for(toks))
        names = sorted(remote.list("kvcache/"))
        assert names and all(".k/" in n for n in names)
        victim = next(n for n in names if n.endswith(kv.keys(toks)[1].hex()))
    # Someone who can write the prefix but lacks the key plants other bytes with
    # a correct (unkeyed) checksum: the object format of a store without a key.
    planted = np.full(1024, 7.0, dtype=np.float32)
    with keyed(remote) as kv:
        forged = encode_object(encode(kv.keys(toks)[1], planted))
        remote.put(victim, b"".join(bytes(c) for c in forged))
        got = kv.get(toks, promote=False)
        assert len(got) == 1  # the planted block ends the prefix: a miss
        assert kv.stats()["remote"]["corrupt"] == 1


def test_a_store_with_another_key_or_none_does_not_see_keyed_blocks() -> None:
    remote = MemoryTier()
    toks = tokens(3, 2)
    with keyed(remote) as kv:
        kv.put(toks, blocks_for(toks))
    with keyed(remote, None) as kv:  # unkeyed: another prefix, nothing listed
        assert kv.longest_prefix(toks) == 0
    with keyed(remote, bytes(32)) as kv:  # another key id? same id "default", wrong key
        assert kv.get(toks, promote=False) == []
        assert kv.stats()["remote"]["corrupt"] >= 1


def test_the_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    remote = MemoryTier()
    monkeypatch.setenv("MOUTHGUARD_MANIFEST_KEY", "hex:" + KEY.hex())
    toks = tokens(4, 1)
    with KVStore(memory_bytes=0, block_tokens=BT, namespace="tenant", remote=remote) as kv:
        kv.put(toks, blocks_for(toks))
    assert all(".k/" in n for n in remote.list("kvcache/"))
