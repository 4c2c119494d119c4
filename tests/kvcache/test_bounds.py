"""The store's bounds and ownership rules under a slow, racing or failing lower tier.

Each test reproduces a failure seen on an earlier design: RAM growing without
bound behind a slow remote, a stale remote delete removing a newer block, and a
directory lock leaked by a failed open.
"""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mouthguard.errors import KVCacheBusyError, TierError
from mouthguard.kvcache import KVStore
from mouthguard.tiers.base import ObjectInfo, PutData, PutMode, Tier
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.memory import MemoryTier
from mouthguard.tiers.wrapper import WrappedTier
from tests.kvcache.helpers import BT, blocks_for, tokens

MiB = 1 << 20


class SlowTier(WrappedTier):
    """Every put takes ``delay`` seconds (a remote far away)."""

    def __init__(self, inner: Tier, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        time.sleep(self.delay)
        return super().put(key, data, mode=mode)


class GatedDeleteTier(WrappedTier):
    """A delete announces itself, then waits for the test to open the gate."""

    def __init__(self, inner: MemoryTier) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.put_done = threading.Event()

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        info = super().put(key, data, mode=mode)
        self.put_done.set()
        return info

    def delete(self, key: str) -> bool:
        self.entered.set()
        self.gate.wait(timeout=60)
        return super().delete(key)


class BrokenListTier(WrappedTier):
    """A remote whose listing fails (down when the store opens)."""

    def list(self, prefix: str = "") -> Iterator[str]:
        raise TierError("remote unreachable")

    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        raise TierError("remote unreachable")


def one_mib_blocks(count: int) -> list[tuple[list[int], list[np.ndarray]]]:
    rng = np.random.default_rng(0)
    return [
        (tokens(1000 + i, 1), [rng.integers(0, 255, MiB, dtype=np.uint8)]) for i in range(count)
    ]


def test_puts_behind_a_slow_remote_stay_within_memory_plus_staging(tmp_path: Path) -> None:
    # 1 MiB memory, a remote taking 20 ms a put, 120 puts of 1 MiB without waiting:
    # the earlier design queued a private copy of every one (120 MiB and growing).
    staging = 4 * MiB
    requests = one_mib_blocks(120)
    kv = KVStore(
        memory_bytes=MiB,
        block_tokens=BT,
        namespace="bounded",
        remote=SlowTier(LocalTier(tmp_path / "remote", durable=False), 0.02),
        staging_bytes=staging,
    )
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for toks, blocks in requests:
            kv.put(toks, blocks, wait=False)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    stats = kv.stats()["store"]
    assert stats["staging_peak"] <= staging
    assert stats["dropped"] > 0  # the default on_full="drop": the bound won, not the queue
    # Memory tier + staging, plus the block the caller is copying in and the copy
    # the remote tier's put makes of the object it writes (its objects are files).
    assert peak <= MiB + staging + 2 * MiB + MiB // 4, peak
    kv.flush()
    assert kv.stats()["store"]["staging_bytes"] == 0
    kv.close()


def test_on_full_wait_applies_back_pressure_and_loses_nothing() -> None:
    staging = 2 * MiB
    requests = one_mib_blocks(12)
    with KVStore(
        memory_bytes=MiB,
        block_tokens=BT,
        namespace="waiting",
        remote=SlowTier(MemoryTier(), 0.01),
        staging_bytes=staging,
        on_full="wait",
    ) as kv:
        for toks, blocks in requests:
            kv.put(toks, blocks, wait=False)
        stats = kv.stats()["store"]
        assert stats["staging_peak"] <= staging
        assert stats["dropped"] == 0
        kv.flush()
        for toks, blocks in requests:
            got = kv.get(toks, promote=False)
            assert len(got) == 1 and np.array_equal(got[0], blocks[0])


def test_a_delete_racing_a_re_put_never_removes_the_newer_block() -> None:
    remote = GatedDeleteTier(MemoryTier())
    toks = tokens(5, 1)
    blocks = blocks_for(toks)
    kv = KVStore(memory_bytes=0, block_tokens=BT, namespace="race", remote=remote)
    try:
        kv.put(toks, blocks)  # on the remote only (no memory, no disk)
        remote.put_done.clear()
        deleter = threading.Thread(target=kv.delete, args=(toks,))
        deleter.start()
        # The old object's delete is under way (blocked at the gate) while the
        # same key is put again. The earlier design deleted from the caller's
        # thread, wrote the new object meanwhile and then lost it to the delete.
        assert remote.entered.wait(timeout=10)
        kv.put(toks, blocks, wait=False)
        remote.put_done.wait(timeout=2)  # the earlier design writes now; ours waits
        remote.gate.set()
        deleter.join(timeout=10)
        kv.flush()
        got = kv.get(toks, promote=False)
        assert len(got) == 1 and np.array_equal(got[0], blocks[0])
        assert kv.contains(toks)
        placement = kv._placement
        assert placement.remote is not None
        name = placement.remote.object_key(kv.keys(toks)[0])
        assert remote.exists(name)
    finally:
        remote.gate.set()
        kv.close()


def test_a_failed_open_releases_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    for _ in range(2):  # the earlier design failed the retry with KVCacheBusyError
        with pytest.raises(TierError, match="unreachable"):
            KVStore(
                directory,
                disk_bytes=MiB,
                block_tokens=BT,
                remote=BrokenListTier(MemoryTier()),
            )
    with KVStore(directory, disk_bytes=MiB, block_tokens=BT, remote=MemoryTier()) as kv:
        toks = tokens(6, 2)
        kv.put(toks, blocks_for(toks))
        with pytest.raises(KVCacheBusyError):
            KVStore(directory, disk_bytes=MiB, block_tokens=BT)


def test_disk_and_staging_stay_within_bounds_when_writes_fail(tmp_path: Path) -> None:
    # A disk tier whose writes fail (a full disk): blocks are dropped and counted,
    # the staging queue drains, nothing is left counted that is not there.
    kv = KVStore(
        tmp_path / "kv",
        memory_bytes=8 * 4096,
        disk_bytes=MiB,
        block_tokens=BT,
        segment_bytes=64 * 1024,
        staging_bytes=16 * 4096,
    )
    placement = kv._placement
    assert placement.disk is not None

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    placement.disk.write = full  # type: ignore[method-assign]
    for i in range(40):
        toks = tokens(2000 + i, 2)
        kv.put(toks, blocks_for(toks), wait=False)
    kv.flush()
    stats = kv.stats()
    assert stats["store"]["staging_bytes"] == 0
    assert stats["store"]["staging_peak"] <= 16 * 4096
    assert stats["disk"]["rejected"] > 0
    assert stats["disk"]["blocks"] == 0
    assert stats["memory"]["bytes"] <= 8 * 4096
    kv.close(spill=False)


@pytest.mark.parametrize("write_through", [False, True])
def test_threads_waiting_for_staging_room_all_finish_within_bounds(
    tmp_path: Path, write_through: bool
) -> None:
    # Many writers, a staging queue of four blocks and back-pressure: every put
    # finishes (no thread is left waiting for room the mover never makes), and no
    # bound is passed at any moment a writer looks.
    block = 4096
    kv = KVStore(
        tmp_path / "kv",
        memory_bytes=8 * block,
        disk_bytes=64 * block,
        block_tokens=BT,
        segment_bytes=8 * block,
        staging_bytes=4 * block,
        on_full="wait",
        write_through=write_through,
        remote=MemoryTier(),
        remote_bytes=32 * block,
    )
    over: list[dict[str, object]] = []
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        try:
            for i in range(25):
                toks = tokens(10_000 + seed * 100 + i, 2)
                kv.put(toks, blocks_for(toks), wait=False)
                stats = kv.stats()
                if (
                    stats["store"]["staging_bytes"] > 4 * block
                    or stats["memory"]["bytes"] > 8 * block
                ):
                    over.append(stats["store"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a writer is stuck waiting for room"
    assert not errors, errors[0]
    assert not over, over[:3]
    kv.flush()
    stats = kv.stats()
    assert stats["store"]["dropped"] == 0 and stats["store"]["staging_bytes"] == 0
    assert stats["disk"]["bytes"] <= 64 * block and stats["remote"]["bytes"] <= 32 * block
    kv.close()


def test_a_block_larger_than_the_staging_bound_is_still_written_down(tmp_path: Path) -> None:
    # An empty queue takes any one block: waiting for room that can never exist
    # would hang the put forever.
    with KVStore(
        tmp_path / "kv",
        memory_bytes=64 * 1024,
        disk_bytes=4 * MiB,
        block_tokens=BT,
        staging_bytes=16 * 1024,
        on_full="wait",
    ) as kv:
        toks = tokens(40, 1)
        big = [np.ones(128 * 1024, dtype=np.uint8)]  # bigger than memory and staging
        assert kv.put(toks, big) == 1
        assert kv.stats()["disk"]["blocks"] == 1
        got = kv.get(toks, promote=False)
        assert len(got) == 1 and np.array_equal(got[0], big[0])


def test_a_memory_only_store_rejects_what_it_cannot_hold() -> None:
    with KVStore(memory_bytes=8192, block_tokens=BT) as kv:
        toks = tokens(41, 1)
        assert kv.put(toks, [np.ones(16384, dtype=np.uint8)]) == 0
        assert kv.stats()["memory"]["rejected"] == 1
        assert not kv.contains(toks)
