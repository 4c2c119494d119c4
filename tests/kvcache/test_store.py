"""KVStore behaviour across tiers: placement, capacity, lookups, integrity, compaction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mouthguard.errors import KVCacheBusyError, KVCacheError
from mouthguard.kvcache import KVStore
from mouthguard.kvcache.segments import data_path
from mouthguard.tiers.memory import MemoryTier
from tests.kvcache.helpers import BT, assert_within_capacity, blocks_for, tiers_of, tokens

KiB = 1024
BLOCK = 4 * KiB


def store(tmp_path: Path, **kwargs: object) -> KVStore:
    options: dict[str, object] = {
        "disk_dir": tmp_path / "kv",
        "memory_bytes": 4 * BLOCK,
        "disk_bytes": 32 * BLOCK,
        "block_tokens": BT,
        "namespace": "test-model",
        "segment_bytes": 4 * BLOCK,
    }
    options.update(kwargs)
    return KVStore(**options)  # type: ignore[arg-type]


def check_equal(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)


def test_put_get_round_trip_and_prefix_lookup(tmp_path: Path) -> None:
    with store(tmp_path) as kv:
        toks = tokens(1, 3)
        blocks = blocks_for(toks)
        assert kv.put(toks, blocks) == 3
        assert kv.put(toks, blocks) == 0  # already stored
        assert kv.longest_prefix(toks) == 3 * BT
        assert kv.longest_prefix([*toks, 1, 2]) == 3 * BT
        assert kv.longest_prefix(toks[:BT] + [9] * 8) == BT
        assert kv.longest_prefix([7] * 12) == 0
        assert kv.contains(toks)
        assert not kv.contains(toks + tokens(2, 1))
        check_equal(kv.get(toks), blocks)
        check_equal(kv.get(toks[:BT] + [9] * 8), blocks[:1])
        assert kv.get([7] * 12) == []
        assert kv.longest_prefix_many([toks, [7] * 4]) == [3 * BT, 0]
        assert kv.contains_many([toks, [7] * 4]) == [True, False]
        check_equal(kv.get_many([toks])[0], blocks)


def test_put_accepts_none_for_blocks_already_stored(tmp_path: Path) -> None:
    with store(tmp_path) as kv:
        toks = tokens(1, 3)
        blocks = blocks_for(toks)
        kv.put(toks[: 2 * BT], blocks[:2])
        assert kv.put(toks, [None, None, blocks[2]]) == 1
        check_equal(kv.get(toks), blocks)


def test_bad_input_is_a_kvcache_error(tmp_path: Path) -> None:
    with store(tmp_path) as kv:
        toks = tokens(1, 3)
        with pytest.raises(KVCacheError, match="need 3 KV blocks"):
            kv.put(toks, blocks_for(toks)[:2])
        with pytest.raises(KVCacheError):
            kv.put(toks[:BT], [np.zeros(0, dtype=np.float32)])
        with pytest.raises(KVCacheError):
            kv.put(toks[:BT], ["not a block"])
    with pytest.raises(KVCacheError):
        kv.get(toks)  # closed
    with pytest.raises(KVCacheError):
        KVStore(disk_dir=tmp_path / "x", disk_bytes=0)
    with pytest.raises(KVCacheError):
        KVStore(memory_bytes=-1)
    with pytest.raises(KVCacheError):
        store(tmp_path, disk_bytes=BLOCK)  # cannot hold two segments


def test_a_second_store_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    with store(tmp_path), pytest.raises(KVCacheBusyError):
        store(tmp_path)
    with store(tmp_path):  # released on close
        pass


def test_eviction_writes_dirty_blocks_down_and_hits_promote_clean_copies(tmp_path: Path) -> None:
    with store(tmp_path) as kv:
        toks = tokens(3, 10)
        blocks = blocks_for(toks)
        kv.put(toks, blocks)
        placed = tiers_of(kv, toks)
        assert all(len(t) == 1 for t in placed), placed
        assert [t[0] for t in placed] == ["disk"] * 6 + ["memory"] * 4  # LRU: newest in RAM
        stats = kv.stats()
        assert stats["memory"]["evictions"] == 6
        assert stats["memory"]["demotions"] == 6
        assert stats["disk"]["writes"] == 6
        check_equal(kv.get(toks[: 2 * BT]), blocks[:2])
        placed = tiers_of(kv, toks)
        # A hit copies the block up and leaves the disk copy: a clean memory copy.
        assert placed[0] == ["memory", "disk"]
        assert placed[1] == ["memory", "disk"]
        assert kv.stats()["disk"]["promotions"] == 2
        kv.flush()  # the promotion's victims are written down in the background
        assert kv.stats()["disk"]["writes"] == 6 + 2  # the promotion's two dirty victims
        # Evicting a clean copy writes nothing: the disk already holds those bytes.
        more = tokens(4, 4)
        kv.put(more, blocks_for(more))  # evicts blocks 8, 9 (dirty) and 0, 1 (clean)
        stats = kv.stats()
        assert stats["memory"]["evictions"] == 6 + 2 + 4
        assert stats["disk"]["writes"] == 6 + 2 + 2
        assert tiers_of(kv, toks)[0] == ["disk"]
        check_equal(kv.get(toks), blocks)
        assert_within_capacity(kv)


def test_capacity_bounds_hold_after_every_operation(tmp_path: Path) -> None:
    remote = MemoryTier()
    with store(tmp_path, remote=remote, remote_bytes=40 * BLOCK) as kv:
        rng = np.random.default_rng(0)
        requests = [tokens(100 + i, int(rng.integers(1, 6))) for i in range(60)]
        for i, toks in enumerate(requests):
            kv.put(toks, blocks_for(toks))
            assert_within_capacity(kv)
            if i % 3 == 0:
                kv.get(requests[int(rng.integers(0, i + 1))])
                kv.flush()
                assert_within_capacity(kv)
            if i % 7 == 0:
                kv.delete(requests[int(rng.integers(0, i + 1))])
                assert_within_capacity(kv)
        stats = kv.stats()
        assert stats["disk"]["evictions"] > 0
        assert stats["remote"]["evictions"] > 0
        on_disk = sum(p.stat().st_size for p in (tmp_path / "kv").glob("seg-*.kvd"))
        assert on_disk == stats["disk"]["bytes"] <= 32 * BLOCK
        stored = sum(len(remote.get(k)) for k in remote.list("kvcache/"))
        assert stored == stats["remote"]["bytes"] <= 40 * BLOCK
        for toks in requests:  # whatever is still found is exactly what was put
            got = kv.get(toks)
            check_equal(got, blocks_for(toks)[: len(got)])


def test_longest_prefix_spans_memory_disk_and_remote(tmp_path: Path) -> None:
    remote = MemoryTier()
    with store(tmp_path, remote=remote, disk_bytes=8 * BLOCK, segment_bytes=BLOCK) as kv:
        toks = tokens(5, 20)
        blocks = blocks_for(toks)
        kv.put(toks, blocks)
        placed = [t[0] for t in tiers_of(kv, toks)]
        assert set(placed) == {"memory", "disk", "remote"}
        assert placed == sorted(placed, key=["remote", "disk", "memory"].index)
        assert kv.longest_prefix(toks) == 20 * BT
        check_equal(kv.get(toks, promote=False), blocks)
        stats = kv.stats()
        assert stats["remote"]["hits"] == placed.count("remote")
        assert stats["disk"]["hits"] == placed.count("disk")
        assert stats["memory"]["misses"] == placed.count("remote") + placed.count("disk")
        # A block missing in the middle ends the prefix there, whichever tier follows.
        kv.delete(toks[: 10 * BT])  # blocks 0..9; 10..19 stay stored but no prefix reaches them
        assert kv.longest_prefix(toks) == 0


def test_write_through_keeps_copies_and_evicts_without_writing(tmp_path: Path) -> None:
    with store(tmp_path, write_through=True) as kv:
        toks = tokens(6, 6)
        blocks = blocks_for(toks)
        kv.put(toks, blocks)
        placed = tiers_of(kv, toks)
        assert [set(t) for t in placed] == [{"disk"}] * 2 + [{"memory", "disk"}] * 4
        check_equal(kv.get(toks, promote=False), blocks)
        assert kv.prefetch(toks[:BT]).result() == 1  # promoted by copying
        assert {"memory", "disk"} == set(tiers_of(kv, toks)[0])
        assert all("disk" in t for t in tiers_of(kv, toks))


def test_a_corrupt_block_is_a_miss_counted_and_dropped(tmp_path: Path) -> None:
    with store(tmp_path, memory_bytes=0) as kv:
        toks = tokens(7, 4)
        blocks = blocks_for(toks)
        kv.put(toks, blocks)
        location = kv._placement.disk.index[kv.keys(toks)[2]]  # type: ignore[union-attr]
        path = data_path(tmp_path / "kv", location.segment)
        raw = bytearray(path.read_bytes())
        raw[location.offset + 100] ^= 0xFF
        path.write_bytes(bytes(raw))
        got = kv.get(toks)
        check_equal(got, blocks[:2])  # never the damaged block, nor anything after it
        stats = kv.stats()
        assert stats["disk"]["corrupt"] == 1
        assert kv.longest_prefix(toks) == 2 * BT  # dropped
        assert tiers_of(kv, toks)[2] == []


def test_a_corrupt_remote_object_is_a_miss_and_dropped(tmp_path: Path) -> None:
    remote = MemoryTier()
    with KVStore(memory_bytes=0, block_tokens=BT, namespace="m", remote=remote) as kv:
        toks = tokens(8, 2)
        blocks = blocks_for(toks)
        kv.put(toks, blocks)
        names = sorted(remote.list("kvcache/"))
        victim = next(n for n in names if n.endswith(kv.keys(toks)[1].hex()))
        raw = bytearray(remote.get(victim))
        raw[-5] ^= 0x01
        remote.put(victim, bytes(raw))
        check_equal(kv.get(toks), blocks[:1])
        assert kv.stats()["remote"]["corrupt"] == 1
        assert kv.longest_prefix(toks) == BT
        kv.flush()  # the object is deleted by the mover, the tiers' only writer
        assert not remote.exists(victim)


def test_compaction_reclaims_dead_space_and_keeps_live_blocks(tmp_path: Path) -> None:
    with store(tmp_path, memory_bytes=0) as kv:
        requests = [tokens(200 + i, 2) for i in range(8)]
        for toks in requests:
            kv.put(toks, blocks_for(toks))
        before = kv.stats()["disk"]
        for toks in requests[::2]:
            kv.delete(toks)
        kv.flush()
        assert kv.stats()["disk"]["bytes"] == before["bytes"]  # dead, not yet reclaimed
        reclaimed = kv.compact()
        after = kv.stats()["disk"]
        assert reclaimed > 0
        assert after["bytes"] == before["bytes"] - reclaimed
        assert after["bytes"] == after["live_bytes"]
        on_disk = sum(p.stat().st_size for p in (tmp_path / "kv").glob("seg-*.kvd"))
        assert on_disk == after["bytes"]
        for toks in requests[1::2]:
            check_equal(kv.get(toks, promote=False), blocks_for(toks))
        for toks in requests[::2]:
            assert kv.longest_prefix(toks) == 0


def test_pinned_blocks_are_not_evicted(tmp_path: Path) -> None:
    with store(tmp_path) as kv:
        first = tokens(9, 2)
        kv.put(first, blocks_for(first))
        assert kv.pin(first) == 2 * BT
        for i in range(5):
            more = tokens(300 + i, 2)
            kv.put(more, blocks_for(more))
        assert tiers_of(kv, first) == [["memory"], ["memory"]]
        kv.unpin(first)
        for i in range(5):
            more = tokens(400 + i, 2)
            kv.put(more, blocks_for(more))
        assert tiers_of(kv, first) == [["disk"], ["disk"]]


def test_background_puts_become_visible_after_flush(tmp_path: Path) -> None:
    with store(tmp_path) as kv:
        toks = tokens(10, 3)
        block_list = blocks_for(toks)
        kv.put(toks, block_list, wait=False)
        block_list[0][:] = 0  # the caller may reuse its buffers at once
        kv.flush()
        check_equal(kv.get(toks), blocks_for(toks))


def test_prefetch_promotes_ahead_of_get(tmp_path: Path) -> None:
    with store(tmp_path) as kv:
        toks = tokens(11, 8)
        kv.put(toks, blocks_for(toks))
        assert kv.prefetch(toks[: 3 * BT]).result() == 3
        assert [t[0] for t in tiers_of(kv, toks)[:3]] == ["memory"] * 3


def test_torch_blocks_and_device_reads(tmp_path: Path) -> None:
    with store(tmp_path) as kv:
        toks = tokens(12, 2)
        blocks = [torch.randn(2, 4, 8).to(torch.bfloat16) for _ in range(2)]
        kv.put(toks, blocks)
        got = kv.get(toks, device="cpu")
        assert all(torch.equal(a, b) for a, b in zip(got, blocks, strict=True))
        out = [torch.empty(2, 4, 8, dtype=torch.bfloat16) for _ in range(2)]
        filled = kv.get(toks, out=out)
        assert filled[0] is out[0]
        assert torch.equal(out[1], blocks[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_blocks_round_trip_through_disk(tmp_path: Path) -> None:
    with store(tmp_path, memory_bytes=0) as kv:
        toks = tokens(13, 2)
        blocks = [torch.randn(64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        kv.put(toks, blocks)
        got = kv.get(toks, device="cuda")
        assert all(torch.equal(a, b) for a, b in zip(got, blocks, strict=True))


def test_s3fifo_policy_works_end_to_end(tmp_path: Path) -> None:
    with store(tmp_path, policy="s3fifo") as kv:
        for i in range(12):
            toks = tokens(500 + i, 2)
            kv.put(toks, blocks_for(toks))
            assert_within_capacity(kv)
        toks = tokens(500, 2)
        check_equal(kv.get(toks), blocks_for(toks))


def test_the_oldest_segment_is_evicted_whole_and_read_blocks_get_a_second_chance(
    tmp_path: Path,
) -> None:
    # Disk only; each request of 4 blocks fills one 4-block segment exactly.
    with store(tmp_path, memory_bytes=0) as kv:
        requests = [tokens(600 + i, 4) for i in range(7)]  # 28 blocks: the append limit
        for toks in requests:
            kv.put(toks, blocks_for(toks))
        check_equal(kv.get(requests[0][:BT], promote=False), blocks_for(requests[0])[:1])
        writes = kv.stats()["disk"]["writes"]
        newcomer = tokens(700, 3)
        kv.put(newcomer, blocks_for(newcomer))  # needs room: the oldest segment goes
        # Its block read since written was copied forward; the others left the tier.
        assert [bool(t) for t in tiers_of(kv, requests[0])] == [True, False, False, False]
        assert kv.stats()["disk"]["writes"] == writes + 3  # the newcomer; the copy is no put
        assert kv.stats()["disk"]["evictions"] == 3
        for toks in requests[1:]:
            assert kv.longest_prefix(toks) == 4 * BT
        check_equal(kv.get(requests[0], promote=False), blocks_for(requests[0])[:1])
        assert_within_capacity(kv)


def test_writing_to_a_returned_block_does_not_change_the_stored_one(tmp_path: Path) -> None:
    with store(tmp_path, memory_bytes=2 * BLOCK) as kv:
        toks = tokens(800, 4)
        blocks = blocks_for(toks)
        kv.put(toks, blocks)  # blocks 0 and 1 on disk, 2 and 3 in memory
        for got in kv.get(toks):  # disk hits are promoted to memory meanwhile
            got[:] = -1.0
        kv.flush()
        check_equal(kv.get(toks), blocks)
        assert kv.stats()["disk"]["promotions"] >= 2


def test_view_reads_return_the_stored_bytes_from_memory_and_promoted_from_disk(
    tmp_path: Path,
) -> None:
    with store(tmp_path, memory_bytes=2 * BLOCK) as kv:
        toks = tokens(810, 4)
        blocks = blocks_for(toks)
        kv.put(toks, blocks)  # blocks 0 and 1 on disk, 2 and 3 in memory
        kv.flush()  # every evicted block on disk, none left in the outbound queue
        views = kv.get(toks, view=True)
        check_equal(views, blocks)
        assert kv.stats()["disk"]["promotions"] >= 2  # disk blocks came up to memory
        # Reading 4 blocks through a 2-block memory churns it; a 2-block prefix fits.
        # Its first read promotes both (the promoted bytes are what it returns); the
        # second is two memory hits: the store's own bytes, not a copy, so they share.
        head = toks[: 2 * BT]
        kv.flush()
        first = kv.get(head, view=True)
        again = kv.get(head, view=True)
        assert all(np.shares_memory(a, b) for a, b in zip(first, again, strict=True))
        check_equal(kv.get(toks), blocks)  # and still read back whole
        with pytest.raises(KVCacheError, match="view"):
            kv.get(toks, view=True, out=[np.empty_like(b) for b in blocks])
        with pytest.raises(KVCacheError, match="view"):
            kv.get(toks, view=True, device="cpu")
