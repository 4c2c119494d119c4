"""``KVStore``: a tiered, prefix-addressed store for attention (KV) blocks.

A request's KV state is cut into blocks of ``block_tokens`` tokens; block ``i``
is stored under a key chained over every token of blocks ``0..i``
(:mod:`~mouthguard.kvcache.keys`), so a lookup walks keys until the first miss
and the prefix found is always exact. Blocks live in memory, then on a local
disk (segment files, :mod:`~mouthguard.kvcache.disk`), then on any mouthguard
tier as a third level (S3 included, :mod:`~mouthguard.kvcache.remote`); where
and how they move is :mod:`~mouthguard.kvcache.placement`.

Contracts:

* ``put`` copies each new block into the store's memory (device blocks to host)
  and it is visible to every lookup when ``put`` returns; writing it down to disk
  or remote happens in the background mover (:mod:`~mouthguard.kvcache.writedown`).
* ``get`` returns blocks equal to what was put, or stops: a block that fails its
  checksum is a miss, counted (``stats()[tier]["corrupt"]``) and dropped.
* Capacities are never exceeded, under any number of threads, and RAM is
  bounded: the memory tier plus ``staging_bytes`` of blocks waiting to be
  written down, whatever a slow or failing lower tier does (over it a put drops
  its block and counts it, or waits, by ``on_full``).
* The importance of KV state is ``transient``: nothing is replicated or
  ``fsync``ed. A crash may lose recent blocks, never return wrong ones.
* Thread-safe. One ``KVStore`` per disk directory (a lock file enforces it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy.typing as npt

from mouthguard.errors import KVCacheError
from mouthguard.format.signing import KeySpec, keys_from_env, manifest_keys
from mouthguard.kvcache.blocks import Block, encode
from mouthguard.kvcache.disk import DiskLevel
from mouthguard.kvcache.keys import KeyChain, KVNamespace
from mouthguard.kvcache.mover import MAINTENANCE, PREFETCH, STORE, Mover
from mouthguard.kvcache.placement import ON_FULL, Placement
from mouthguard.kvcache.policy import make_policy
from mouthguard.kvcache.reading import read_prefix
from mouthguard.kvcache.remote import RemoteLevel, remote_prefix
from mouthguard.kvcache.writedown import WriteDown
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
        policy: ``"lru"`` (default) or ``"s3fifo"`` (scan-resistant): the order
            of the memory and remote tiers (the disk evicts whole segments,
            oldest first, with a second chance for blocks read since written).
        write_through: write every put down to disk (and remote) at once, so
            memory evictions never wait for a write (default: write a block
            down only when memory evicts it).
        segment_bytes: size of one disk segment file (default: min(64 MiB, disk/32)).
        direct_io: disk I/O without the page cache where the filesystem allows.
        staging_bytes: bound on the RAM of blocks waiting to be written down
            (default: a quarter of ``memory_bytes``, at least 16 MiB).
        on_full: what a ``put(wait=False)`` does when that bound is reached:
            ``"drop"`` the block (counted in ``stats()["store"]["dropped"]``) or
            ``"wait"`` until the mover makes room. ``put(wait=True)`` always waits.
        auth_key: key for the remote objects' MAC (bytes, a keyring, or the
            ``MOUTHGUARD_MANIFEST_KEY`` syntax); default: that variable, if set.
            With a key, a remote object without a valid MAC is a miss.

    Raises:
        KVCacheError: bad sizes or options.
        KVCacheBusyError: another store holds ``disk_dir``.
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
        staging_bytes: int | None = None,
        on_full: str = "drop",
        auth_key: KeySpec | None = None,
    ) -> None:
        if on_full not in ON_FULL:
            raise KVCacheError(f"on_full must be one of {ON_FULL}, got {on_full!r}")
        if staging_bytes is None:
            staging_bytes = max(memory_bytes // 4, 16 << 20)
        for name, value in (
            ("memory_bytes", memory_bytes),
            ("disk_bytes", disk_bytes),
            ("staging_bytes", staging_bytes),
        ):
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
                segment_bytes=segment_bytes,
                direct_io=direct_io,
            )
        self.on_full = on_full
        try:
            level = None
            if remote is not None:
                keys = manifest_keys(auth_key) if auth_key is not None else keys_from_env()
                prefix = remote_prefix(self.chain.root, keys)
                order = make_policy(policy, remote_bytes or 0)
                level = RemoteLevel(remote, prefix, remote_bytes, order, keys=keys)
            self._placement = Placement(
                memory_bytes,
                make_policy(policy, memory_bytes),
                disk,
                level,
                staging_bytes=staging_bytes,
                write_through=write_through,
            )
            if level is not None:
                level.load_index()  # single-threaded: no mover yet
        except BaseException:
            if disk is not None:
                disk.close()  # a failed open must not keep the directory locked
            raise
        self._closed = False
        self._writer = WriteDown(self._placement)
        self._mover = Mover("mouthguard-kv-mover")
        self._write_queued = False
        self._placement.kick = self._kick

    def _kick(self) -> None:
        """Queue one write-down job if none is queued (called under the lock)."""
        if self._write_queued or self._closed:
            return
        try:
            self._mover.submit(STORE, self._write_down)
        except RuntimeError:  # closing: close() writes down what is left
            return
        self._write_queued = True

    def _write_down(self) -> int:
        with self._placement.lock:
            self._write_queued = False  # blocks queued from now on need another job
        try:
            return self._writer.write_down()
        finally:
            self._housekeeping()

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
        skipped). The blocks are copied and visible before this returns. With
        ``wait=True`` it also waits until the mover has written down what the
        put evicted; with ``wait=False`` a block that would pass the staging
        bound is dropped (``on_full="drop"``) and not counted as new.

        Raises:
            KVCacheError: the number of blocks does not match the tokens, or a
                block is empty or of an unsupported type.
        """
        return self.put_many([(token_ids, blocks)], wait=wait)

    def put_many(
        self, requests: Iterable[tuple[TokenIds, Sequence[Block | None]]], *, wait: bool = True
    ) -> int:
        """:meth:`put` for several requests."""
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
        blocking = wait or self.on_full == "wait"
        stored = 0
        with placement.lock:
            for key, payload in fresh:
                tier = placement.where(key)
                if tier is not None:
                    placement.touch(tier, key)
                elif placement.admit(key, payload, wait=blocking):
                    stored += 1
        if wait:
            self._mover.drain()
        return stored

    def _housekeeping(self) -> None:
        placement = self._placement
        if placement.disk is not None:
            with placement.lock:
                drops = placement.disk.take_drops()
            placement.disk.flush_drops(drops)
        self._writer.collect_garbage()

    # --- get ---

    def get(
        self,
        token_ids: TokenIds,
        *,
        out: Sequence[Block] | None = None,
        device: Any = None,
        promote: bool = True,
        view: bool = False,
    ) -> list[Block]:
        """The blocks of the longest stored prefix of ``token_ids``, in order.

        Args:
            token_ids: the request's tokens.
            out: caller buffers to fill (one per block, same byte size); the
                filled buffers are returned.
            device: return torch tensors on this device (e.g. ``"cuda:0"``).
            promote: bring blocks found on disk or remote into memory.
            view: return the store's own bytes instead of a copy: no copy at all
                for a memory hit, and a disk or remote block is promoted without a
                second one. The caller must only read them (the store never writes
                a block's bytes after creating it, and a view keeps them alive, so
                an eviction does not pull them away); a block held past its use
                keeps its memory beyond ``memory_bytes``, so copy and drop them.

        A block that cannot be read (damaged, or its tier unreachable) ends the
        prefix there: fewer blocks than :meth:`longest_prefix` promised.

        Raises:
            KVCacheError: ``view`` with ``out`` or ``device`` (those copy by definition).
        """
        self._check_open()
        if view and (out is not None or device is not None):
            raise KVCacheError("get(view=True) returns the store's bytes: not with out or device")
        keys = self.keys(token_ids)
        placement = self._placement
        return read_prefix(placement, keys, out=out, device=device, promote=promote, view=view)

    def get_many(self, requests: Iterable[TokenIds], **kwargs: Any) -> list[list[Block]]:
        """:meth:`get` for several requests (``out`` is not accepted here)."""
        return [self.get(t, **kwargs) for t in requests]

    def prefetch(self, token_ids: TokenIds) -> Future[int]:
        """Bring the stored prefix of ``token_ids`` into memory, ahead of a ``get``.

        Runs before any queued store. The future gives the number of blocks promoted.
        """
        self._check_open()
        keys = self.keys(token_ids)

        def job() -> int:
            moved = 0
            for key in keys:
                found = self._placement.read(key)
                if found is None:
                    break
                if not found.shared:
                    with self._placement.lock:
                        moved += self._placement.promote(key, found.data, found)
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
            return sum(self._placement.delete(key) for key in self.keys(token_ids))

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
            try:
                return self._writer.compact(min_dead_fraction)
            finally:
                self._housekeeping()

        return int(self._mover.submit(MAINTENANCE, job).result())

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per-tier figures and the store's own.

        Each tier: bytes, capacity, blocks, hits, misses, evictions, corrupt,
        promotions, demotions, writes, rejected, get p50/p99 (ms) and read GB/s
        over the recent reads. ``store``: queue, pins, background failures.
        """
        placement = self._placement
        with placement.lock:
            report = placement.tier_reports()
            report["store"] = {
                "block_tokens": self.block_tokens,
                "importance": IMPORTANCE.value,
                "write_through": placement.write_through,
                "on_full": self.on_full,
                "staging_bytes": placement.outbound_bytes,
                "staging_capacity": placement.staging_capacity,
                "staging_peak": placement.staging_peak,
                "staging_blocks": len(placement.outbound),
                "dropped": placement.dropped,
                "queued_jobs": self._mover.pending(),
                "background_failures": self._mover.failures,
                "pinned_blocks": len(placement.pins),
            }
        return report

    def close(self, *, spill: bool = True) -> None:
        """Write down everything queued, stop the mover and release the disk directory.

        With ``spill`` (the default) and a disk tier, the dirty memory blocks are
        written to disk first (clean ones are there already), so a later process
        on the same ``disk_dir`` finds every block.
        """
        if self._closed:
            return
        if spill and self._placement.disk is not None:
            self._mover.submit(MAINTENANCE, self._writer.spill).result()
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
