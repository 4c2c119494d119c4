"""``KVStore``: a tiered, prefix-addressed store for attention (KV) blocks.

A request's KV state is cut into blocks of ``block_tokens`` tokens; block ``i``
is stored under a key chained over every token of blocks ``0..i``
(:mod:`~mouthguard.kvcache.keys`), so a lookup walks keys until the first miss
and the prefix found is always exact. Blocks live in memory, then on a local
disk (segment files, :mod:`~mouthguard.kvcache.disk`), then on any mouthguard
tier as a third level (S3 included, :mod:`~mouthguard.kvcache.remote`); where
and how they move is :mod:`~mouthguard.kvcache.placement`.

Contracts:

* ``put`` is two-phase: a block is invisible to every lookup until its bytes are
  complete in a tier. ``put(wait=False)`` returns once the blocks are copied into
  the store's own memory; the background mover places them.
* ``get`` returns blocks equal to what was put, or stops: a block that fails its
  checksum is a miss, counted (``stats()[tier]["corrupt"]``) and dropped.
* Capacities are never exceeded, under any number of threads.
* The importance of KV state is ``transient``: nothing is replicated or
  ``fsync``ed. A crash may lose recent blocks, never return wrong ones.
* Thread-safe. One ``KVStore`` per disk directory (a lock file enforces it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy.typing as npt

from mouthguard.errors import KVCacheError
from mouthguard.kvcache.blocks import Block, decode, encode
from mouthguard.kvcache.disk import DiskLevel
from mouthguard.kvcache.keys import KeyChain, KVNamespace
from mouthguard.kvcache.mover import MAINTENANCE, PREFETCH, STORE, Mover
from mouthguard.kvcache.placement import Found, Placement
from mouthguard.kvcache.policy import make_policy
from mouthguard.kvcache.remote import RemoteLevel
from mouthguard.policy.importance import Importance
from mouthguard.tiers.base import Tier

#: What KV state is worth: no replica, no durability (see the importance policy).
IMPORTANCE = Importance.TRANSIENT
TokenIds = Sequence[int] | npt.NDArray[Any]


class KVStore:
    """Tiered KV-block store (see the module docstring).

    Args:
        disk_dir: directory of the disk tier (None: no disk tier).
        memory_bytes: capacity of the memory tier.
        disk_bytes: capacity of the disk tier (segment files on disk).
        block_tokens: tokens per block.
        namespace: model id, or a :class:`~mouthguard.kvcache.keys.KVNamespace`
            with dtype, layout and tensor-parallel rank.
        remote: any mouthguard tier as a third level (None: none).
        remote_bytes: capacity of the remote tier (None: unbounded).
        policy: ``"lru"`` (default) or ``"s3fifo"`` (scan-resistant).
        write_through: write every block to every tier (default: exclusive).
        segment_bytes: size of one disk segment file (default: min(64 MiB, disk/32)).
        direct_io: disk I/O without the page cache where the filesystem allows.
    """

    def __init__(
        self,
        disk_dir: str | Path | None = None,
        *,
        memory_bytes: int = 1 << 30,
        disk_bytes: int = 0,
        block_tokens: int = 16,
        namespace: str | KVNamespace = "default",
        remote: Tier | None = None,
        remote_bytes: int | None = None,
        policy: str = "lru",
        write_through: bool = False,
        segment_bytes: int | None = None,
        direct_io: bool = True,
    ) -> None:
        for name, value in (("memory_bytes", memory_bytes), ("disk_bytes", disk_bytes)):
            if not isinstance(value, int) or value < 0:
                raise KVCacheError(f"{name} must be a non-negative integer, got {value!r}")
        if disk_dir is not None and disk_bytes <= 0:
            raise KVCacheError("a disk_dir needs a positive disk_bytes")
        self.chain = KeyChain(namespace, block_tokens)
        self.block_tokens = block_tokens
        disk = None
        if disk_dir is not None:
            disk = DiskLevel(
                disk_dir,
                disk_bytes,
                make_policy(policy, disk_bytes),
                segment_bytes=segment_bytes,
                direct_io=direct_io,
            )
        level = None
        if remote is not None:
            prefix = f"kvcache/{self.chain.root.hex()[:16]}/"
            order = make_policy(policy, remote_bytes or 0)
            level = RemoteLevel(remote, prefix, remote_bytes, order)
        self._placement = Placement(
            memory_bytes,
            make_policy(policy, memory_bytes),
            disk,
            level,
            write_through=write_through,
        )
        self._closed = False
        if level is not None:
            self._open_remote(level, disk)
        self._mover = Mover("mouthguard-kv-mover")

    def _open_remote(self, level: RemoteLevel, disk: DiskLevel | None) -> None:
        found = level.scan()
        placement = self._placement
        with placement.lock:
            for key, size in found.items():
                if disk is not None and key in disk.index and not placement.write_through:
                    placement.garbage.append(key)  # a move interrupted by a crash: disk wins
                else:
                    level.publish(key, size)
            doomed = []
            while level.capacity is not None and level.used > level.capacity:
                victim = level.policy.pop_victim(lambda k: k in level.index)
                if victim is None:
                    break
                level.forget(victim)
                doomed.append(victim)
        for key in doomed:
            level.delete(key)
        placement.collect_garbage()

    # --- keys and lookups ---

    def keys(self, token_ids: TokenIds) -> list[bytes]:
        """The keys of every full block of ``token_ids``."""
        return self.chain.keys(token_ids)

    def _check_open(self) -> None:
        if self._closed:
            raise KVCacheError("the KVStore is closed")

    def _covered(self, keys: Sequence[bytes]) -> int:
        """Blocks of ``keys`` present (the prefix before the first miss), under the lock."""
        count = 0
        for key in keys:
            if self._placement.where(key) is None:
                break
            count += 1
        return count

    def longest_prefix(self, token_ids: TokenIds) -> int:
        """Tokens of ``token_ids`` covered by stored blocks, across every tier."""
        return self.longest_prefix_many([token_ids])[0]

    def longest_prefix_many(self, requests: Iterable[TokenIds]) -> list[int]:
        """:meth:`longest_prefix` for several requests at once."""
        self._check_open()
        key_lists = [self.keys(t) for t in requests]
        with self._placement.lock:
            return [self._covered(keys) * self.block_tokens for keys in key_lists]

    def contains(self, token_ids: TokenIds) -> bool:
        """Whether every full block of ``token_ids`` is stored."""
        return self.contains_many([token_ids])[0]

    def contains_many(self, requests: Iterable[TokenIds]) -> list[bool]:
        """:meth:`contains` for several requests at once."""
        self._check_open()
        key_lists = [self.keys(t) for t in requests]
        with self._placement.lock:
            return [self._covered(keys) == len(keys) for keys in key_lists]

    # --- put ---

    def put(self, token_ids: TokenIds, blocks: Sequence[Block | None], *, wait: bool = True) -> int:
        """Store one block per full block of ``token_ids``; return how many were new.

        ``blocks[i]`` may be None for a block the caller knows is stored (it is
        skipped). The blocks are copied before this returns; with ``wait=False``
        they become visible once the background mover has placed them.

        Raises:
            KVCacheError: the number of blocks does not match the tokens, or a
                block is empty or of an unsupported type.
        """
        return self.put_many([(token_ids, blocks)], wait=wait)

    def put_many(
        self, requests: Iterable[tuple[TokenIds, Sequence[Block | None]]], *, wait: bool = True
    ) -> int:
        """:meth:`put` for several requests, placed by one background job."""
        self._check_open()
        fresh = []
        for token_ids, blocks in requests:
            keys = self.keys(token_ids)
            if len(blocks) != len(keys):
                raise KVCacheError(
                    f"{len(keys)} full blocks of {self.block_tokens} tokens need "
                    f"{len(keys)} KV blocks, got {len(blocks)}"
                )
            for key, block in zip(keys, blocks, strict=True):
                if block is None:
                    continue
                payload = encode(key, block)
                if payload.nbytes == 0:
                    raise KVCacheError("a KV block must not be empty")
                fresh.append((key, payload))
        placement = self._placement
        with placement.lock:
            todo = []
            for key, payload in fresh:
                tier = placement.where(key)
                if tier is not None:
                    placement.policy_of(tier).hit(key)
                elif key not in placement.pending:
                    placement.pending.add(key)
                    todo.append((key, payload))
        if todo:
            future = self._mover.submit(STORE, lambda: self._store(todo))
            if wait:
                future.result()
        return len(todo)

    def _store(self, todo: Sequence[tuple[bytes, Any]]) -> None:
        placement = self._placement
        try:
            for key, payload in todo:
                try:
                    placement.store(key, payload)
                finally:
                    # A failed placement must not leave the key pending forever:
                    # a pending key is skipped by every later put.
                    with placement.lock:
                        placement.pending.discard(key)
        finally:
            with placement.lock:
                placement.pending.difference_update(key for key, _ in todo)
            self._housekeeping()

    def _housekeeping(self) -> None:
        placement = self._placement
        if placement.disk is not None:
            with placement.lock:
                drops = placement.disk.take_drops()
            placement.disk.flush_drops(drops)
        placement.collect_garbage()

    # --- get ---

    def get(
        self,
        token_ids: TokenIds,
        *,
        out: Sequence[Block] | None = None,
        device: Any = None,
        promote: bool = True,
    ) -> list[Block]:
        """The blocks of the longest stored prefix of ``token_ids``, in order.

        Args:
            token_ids: the request's tokens.
            out: caller buffers to fill (one per block, same byte size); the
                filled buffers are returned.
            device: return torch tensors on this device (e.g. ``"cuda:0"``).
            promote: bring blocks found on disk or remote into memory.

        A block that cannot be read (damaged, or its tier unreachable) ends the
        prefix there: fewer blocks than :meth:`longest_prefix` promised.
        """
        self._check_open()
        result: list[Block] = []
        for index, key in enumerate(self.keys(token_ids)):
            found = self._placement.read(key)
            if found is None:
                break
            target = out[index] if out is not None and index < len(out) else None
            if promote and found.tier != "memory":
                # The caller owns what it gets back and may write to it: the copy
                # placed in memory must not share its bytes.
                private = replace(found, data=found.data.copy()) if target is None else found
                self._promote_later(private, key)
            result.append(decode(found.data, found.desc, out=target, device=device))
        if self._placement.garbage:  # a damaged remote object was dropped: delete it now
            self._placement.collect_garbage()
        return result

    def get_many(self, requests: Iterable[TokenIds], **kwargs: Any) -> list[list[Block]]:
        """:meth:`get` for several requests (``out`` is not accepted here)."""
        return [self.get(t, **kwargs) for t in requests]

    def _promote_later(self, found: Found, key: bytes) -> None:
        def job() -> None:
            try:
                self._placement.promote(found, key)
            finally:
                self._housekeeping()

        self._mover.submit(PREFETCH, job)

    def prefetch(self, token_ids: TokenIds) -> Future[int]:
        """Bring the stored prefix of ``token_ids`` into memory, ahead of a ``get``.

        Runs before any queued store. The future gives the number of blocks promoted.
        """
        self._check_open()
        keys = self.keys(token_ids)

        def job() -> int:
            moved = 0
            try:
                for key in keys:
                    with self._placement.lock:
                        tier = self._placement.where(key)
                    if tier is None:
                        break
                    if tier == "memory":
                        continue
                    found = self._placement.read(key)
                    if found is None:
                        break
                    self._placement.promote(found, key)
                    moved += 1
            finally:
                self._housekeeping()
            return moved

        return self._mover.submit(PREFETCH, job)

    # --- pins and deletion ---

    def pin(self, token_ids: TokenIds) -> int:
        """Keep the stored prefix of ``token_ids`` from eviction; return the tokens pinned.

        For reads in flight (an engine scheduled a load). Every pin needs an
        :meth:`unpin` with the same tokens. A delete still removes a pinned block.
        """
        self._check_open()
        keys = self.keys(token_ids)
        with self._placement.lock:
            covered = keys[: self._covered(keys)]
            self._placement.pins.update(covered)
        return len(covered) * self.block_tokens

    def unpin(self, token_ids: TokenIds, tokens: int | None = None) -> None:
        """Release a :meth:`pin` (``tokens``: what ``pin`` returned; default every full block)."""
        keys = self.keys(token_ids)
        if tokens is not None:
            keys = keys[: tokens // self.block_tokens]
        with self._placement.lock:
            self._placement.pins.subtract(keys)
            for key in keys:
                if self._placement.pins[key] <= 0:
                    del self._placement.pins[key]

    def delete(self, token_ids: TokenIds) -> int:
        """Remove every full block of ``token_ids`` from every tier; return how many existed."""
        self._check_open()
        with self._placement.lock:
            count = sum(self._placement.delete(key) for key in self.keys(token_ids))
        self._placement.collect_garbage()
        return count

    # --- maintenance ---

    def flush(self) -> None:
        """Wait until every queued put, promotion and prefetch has been placed."""
        self._check_open()
        self._mover.drain()

    def compact(self, min_dead_fraction: float = 0.25) -> int:
        """Rewrite disk segments whose dead share is at least ``min_dead_fraction``.

        Live records move to the active segment; emptied segments are unlinked.
        Returns the bytes of segment files reclaimed.
        """
        self._check_open()
        disk = self._placement.disk
        if disk is None:
            return 0

        def job() -> int:
            before = disk.file_bytes
            try:
                with self._placement.lock:
                    chosen = [
                        s
                        for s, info in disk.segments.items()
                        if info.size and (info.size - info.live) >= min_dead_fraction * info.size
                    ]
                for segment in chosen:
                    with self._placement.lock:
                        info = disk.segments.get(segment)
                        if info is None or info.pending:
                            continue
                        if disk.file_bytes + info.live > disk.capacity:
                            continue  # no room to relocate now; eviction will free it later
                        if disk.active == segment:
                            disk.active = None
                        live = disk.live_in(segment)
                    self._placement.compact_segment(segment, live)
            finally:
                self._housekeeping()
            return max(0, before - disk.file_bytes)

        return int(self._mover.submit(MAINTENANCE, job).result())

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per-tier figures and the store's own.

        Each tier: bytes, capacity, blocks, hits, misses, evictions, corrupt,
        promotions, demotions, writes, rejected, get p50/p99 (ms) and read GB/s
        over the recent reads. ``store``: queue, pins, background failures.
        """
        placement = self._placement
        with placement.lock:
            report: dict[str, dict[str, Any]] = {
                "memory": placement.stats["memory"].report(
                    placement.memory_bytes, placement.memory_capacity, len(placement.memory)
                )
            }
            disk = placement.disk
            if disk is not None:
                report["disk"] = placement.stats["disk"].report(
                    disk.file_bytes, disk.capacity, len(disk.index)
                )
                report["disk"]["live_bytes"] = sum(s.live for s in disk.segments.values())
                report["disk"]["segments"] = len(disk.segments)
                report["disk"]["recovered"] = disk.recovered
            remote = placement.remote
            if remote is not None:
                report["remote"] = placement.stats["remote"].report(
                    remote.used, remote.capacity, len(remote.index)
                )
            report["store"] = {
                "block_tokens": self.block_tokens,
                "importance": IMPORTANCE.value,
                "write_through": placement.write_through,
                "pending_blocks": len(placement.pending),
                "queued_jobs": self._mover.pending(),
                "background_failures": self._mover.failures,
                "pinned_blocks": len(placement.pins),
            }
        return report

    def close(self, *, spill: bool = True) -> None:
        """Place everything queued, stop the mover and release the disk directory.

        With ``spill`` (the default) and a disk tier, memory blocks are demoted to
        disk first, so a later process on the same ``disk_dir`` finds them.
        """
        if self._closed:
            return
        if spill and self._placement.disk is not None:
            self._mover.submit(MAINTENANCE, self._placement.spill).result()
        self._mover.close()
        self._housekeeping()
        self._closed = True
        if self._placement.disk is not None:
            self._placement.disk.close()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
