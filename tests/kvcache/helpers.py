"""Shared helpers of the KV-cache tests: deterministic blocks, tier checks."""

from __future__ import annotations

import numpy as np

from mouthguard.kvcache import KVStore

BT = 4  # tokens per block in these tests
BLOCK_FLOATS = 1024  # 4 KiB blocks: one disk page each


def tokens(seed: int, n_blocks: int, *, prefix: list[int] | None = None) -> list[int]:
    """``prefix`` followed by random tokens, ``n_blocks`` full blocks in all."""
    rng = np.random.default_rng(seed)
    head = list(prefix or [])
    return head + rng.integers(0, 50_000, BT * n_blocks - len(head)).tolist()


def blocks_for(token_ids: list[int], floats: int = BLOCK_FLOATS) -> list[np.ndarray]:
    """One block per full block, whose values derive from the tokens (so a wrong
    block returned for a prefix is visible)."""
    out = []
    for i in range(len(token_ids) // BT):
        seed = hash(tuple(token_ids[: (i + 1) * BT])) & 0xFFFFFFFF
        out.append(np.random.default_rng(seed).standard_normal(floats).astype(np.float32))
    return out


def tiers_of(store: KVStore, token_ids: list[int]) -> list[list[str]]:
    """For each full block, every tier that holds it (exclusive: exactly one)."""
    placement = store._placement
    result = []
    with placement.lock:
        for key in store.keys(token_ids):
            held = []
            if key in placement.memory:
                held.append("memory")
            if placement.disk is not None and key in placement.disk.index:
                held.append("disk")
            if placement.remote is not None and key in placement.remote.index:
                held.append("remote")
            result.append(held)
    return result


def assert_within_capacity(store: KVStore) -> None:
    """Every tier's bytes within its capacity, and disk bytes equal to the files' sizes."""
    stats = store.stats()
    for tier in ("memory", "disk", "remote"):
        if tier in stats and stats[tier]["capacity"] is not None:
            assert stats[tier]["bytes"] <= stats[tier]["capacity"], (tier, stats[tier])
