"""Threads putting, getting and deleting at random: every block returned is the one put,
and no tier is ever over its capacity (measured after every operation)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from mouthguard.kvcache import KVStore
from mouthguard.tiers.memory import MemoryTier
from tests.kvcache.helpers import BT, blocks_for, tokens

BLOCK = 4096
THREADS = 6
OPS = 150


def test_random_concurrent_puts_gets_and_deletes(tmp_path: Path) -> None:
    # Shared prefixes: requests are drawn from a few conversations, so threads
    # race on the same keys, not only on capacity.
    conversations = [tokens(i, 8) for i in range(10)]
    capacities = {"memory": 6 * BLOCK, "disk": 24 * BLOCK, "remote": 20 * BLOCK}
    errors: list[BaseException] = []
    over: list[tuple[str, int]] = []
    remote_tier = MemoryTier()
    kv = KVStore(
        disk_dir=tmp_path / "kv",
        memory_bytes=capacities["memory"],
        disk_bytes=capacities["disk"],
        block_tokens=BT,
        namespace="concurrent",
        remote=remote_tier,
        remote_bytes=capacities["remote"],
        segment_bytes=4 * BLOCK,
    )

    def check_capacity() -> None:
        stats = kv.stats()
        for tier, capacity in capacities.items():
            if stats[tier]["bytes"] > capacity:
                over.append((tier, stats[tier]["bytes"]))

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(OPS):
                toks = conversations[int(rng.integers(len(conversations)))]
                toks = toks[: BT * int(rng.integers(1, 9))]
                op = rng.random()
                if op < 0.45:
                    kv.put(toks, blocks_for(toks), wait=bool(rng.random() < 0.7))
                elif op < 0.9:
                    got = kv.get(toks, promote=bool(rng.random() < 0.8))
                    want = blocks_for(toks)
                    for i, block in enumerate(got):
                        assert np.array_equal(block, want[i]), f"block {i} differs"
                elif op < 0.95:
                    kv.delete(toks)
                else:
                    kv.longest_prefix(toks)
                check_capacity()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kv.flush()
    check_capacity()
    assert not errors, errors[0]
    assert not over, over[:5]
    stats = kv.stats()
    assert stats["store"]["background_failures"] == 0
    assert stats["memory"]["evictions"] > 0
    # After the dust settles: nothing left in flight, and every block the remote
    # index promises has its object (no delete removed a newer copy).
    placement = kv._placement
    with placement.lock:
        assert placement.remote is not None
        assert not placement.moving and not placement.outbound
        assert placement.outbound_bytes == 0
        for key in placement.remote.index:
            assert remote_tier.exists(placement.remote.object_key(key))
    for toks in conversations:
        got = kv.get(toks)
        want = blocks_for(toks)
        assert all(np.array_equal(g, want[i]) for i, g in enumerate(got))
    kv.close()
