"""Where each block lives -- memory, the outbound queue, disk, remote -- and RAM admission.

:class:`Placement` holds the tiers' indexes under one lock. It does the work
that touches only RAM and runs in the callers' threads: lookups, reads, putting
a block in memory, promoting a copy of a lower tier's block into memory, and
evicting memory blocks to make room. Every byte written to or deleted from the
disk or the remote tier is written by the store's single mover thread
(:mod:`~mouthguard.kvcache.writedown`), which is what keeps those tiers within
their capacity and makes a stale delete impossible.

**Clean copies.** Memory holds a hot subset; the disk (then the remote) holds
the rest and, for blocks that were promoted, the same bytes again. A memory
block is *clean* when a lower tier holds its key (keys name content: the same
key is the same bytes), *dirty* otherwise. Promoting a block copies it into
memory and leaves the lower copy in place; evicting a clean block from memory
costs nothing; only a dirty victim is written down. So a hit never writes, and
a block is written to disk at most once while it lives there.

**Bounded memory.** A dirty victim leaves memory for :attr:`Placement.outbound`,
where it stays readable until the mover has written it down. The outbound bytes
never exceed ``staging_bytes`` (an empty queue takes any one block, so a block
larger than the bound is not stuck): a put that would need more either drops its
block (counted in ``stats()["store"]["dropped"]``, as LMCache skips a put its
allocator cannot place) or waits for the mover, by the store's ``on_full``
option; a promotion that would need more is skipped (the get still returns the
block). So RAM held by the store is at most ``memory_bytes + staging_bytes``,
plus the one block each caller thread is copying.

Invariants (under the lock): ``memory_bytes`` is the sum of memory payloads and
<= ``memory_capacity``; ``outbound_bytes`` is the sum of outbound payloads and
<= ``staging_capacity`` (or is one block); a key is in memory or outbound, not
both, unless the store writes through or spills (then an outbound entry shares
the memory payload).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from mouthguard.errors import FormatError
from mouthguard.kvcache.blocks import BlockDesc, Payload
from mouthguard.kvcache.disk import DiskLevel
from mouthguard.kvcache.policy import EvictionPolicy
from mouthguard.kvcache.remote import RemoteLevel
from mouthguard.kvcache.segments import SegmentEntry
from mouthguard.kvcache.stats import TierStats

TIERS = ("memory", "disk", "remote")
#: What a put does when the outbound queue is full: drop the block, or wait for room.
ON_FULL = ("drop", "wait")


@dataclass(frozen=True)
class Found:
    """A block read from a tier.

    ``data`` is the store's own memory when ``shared`` (a memory hit: copy before
    handing it out); otherwise it is a fresh buffer the caller may keep.
    """

    tier: str
    data: npt.NDArray[Any]
    desc: BlockDesc
    checksum: bytes
    source: SegmentEntry | None  # the disk location read, else None
    shared: bool


class Placement:
    """The tiers' indexes and RAM admission (see the module docstring).

    Args:
        memory_bytes: capacity of the memory tier.
        memory_policy: eviction order of memory blocks.
        disk: the disk tier, or None.
        remote: the remote tier, or None.
        staging_bytes: bound on the bytes waiting in :attr:`outbound`.
        write_through: queue every put for the lower tiers at once (eager cleaning).
    """

    def __init__(
        self,
        memory_bytes: int,
        memory_policy: EvictionPolicy,
        disk: DiskLevel | None,
        remote: RemoteLevel | None,
        *,
        staging_bytes: int,
        write_through: bool = False,
    ) -> None:
        self.lock = threading.RLock()
        #: Notified whenever outbound bytes fall (waiting puts re-check).
        self.room = threading.Condition(self.lock)
        self.memory: dict[bytes, Payload] = {}
        self.memory_bytes = 0
        self.memory_capacity = memory_bytes
        self.memory_policy = memory_policy
        self.outbound: dict[bytes, Payload] = {}
        self.outbound_bytes = 0
        self.staging_capacity = staging_bytes
        self.staging_peak = 0
        self.disk = disk
        self.remote = remote
        self.write_through = write_through
        self.pins: Counter[bytes] = Counter()
        #: Keys the mover is moving between disk and remote (not evictable meanwhile).
        self.moving: set[bytes] = set()
        #: Keys whose remote object may be stale (deleted by the mover only).
        self.garbage: set[bytes] = set()
        self.dropped = 0
        self.stats = {name: TierStats() for name in TIERS}
        #: Set by the store: schedules a write-down job in the mover (under the lock).
        self.kick: Callable[[], None] = lambda: None

    # --- lookups (under the lock) ---

    def where(self, key: bytes) -> str | None:
        """The top tier holding ``key`` (outbound counts as memory), or None."""
        if key in self.memory or key in self.outbound:
            return "memory"
        if self.disk is not None and key in self.disk.index:
            return "disk"
        if self.remote is not None and key in self.remote.index:
            return "remote"
        return None

    def below(self, key: bytes) -> bool:
        """Whether a lower tier holds ``key`` (a memory copy of it is clean)."""
        if self.disk is not None and key in self.disk.index:
            return True
        return self.remote is not None and key in self.remote.index

    def busy(self, key: bytes) -> bool:
        """Pinned, or being moved by the mover: not evictable."""
        return key in self.moving or self.pins[key] > 0

    def touch(self, tier: str, key: bytes) -> None:
        """Note a use of ``key`` on ``tier`` for its eviction order."""
        if tier == "memory":
            self.memory_policy.hit(key)
        elif tier == "disk":
            assert self.disk is not None
            self.disk.touch(key)
        else:
            assert self.remote is not None
            self.remote.policy.hit(key)

    def configured(self) -> list[str]:
        """The tiers this store has, top first."""
        present = {"memory": True, "disk": self.disk is not None, "remote": self.remote is not None}
        return [name for name in TIERS if present[name]]

    # --- reads (any thread) ---

    def tier_reports(self) -> dict[str, dict[str, Any]]:
        """Each configured tier's figures (:meth:`TierStats.report` plus the disk's own).

        The caller holds :attr:`lock`, so the figures are one consistent snapshot.
        """
        report: dict[str, dict[str, Any]] = {
            "memory": self.stats["memory"].report(
                self.memory_bytes, self.memory_capacity, len(self.memory)
            )
        }
        disk = self.disk
        if disk is not None:
            report["disk"] = self.stats["disk"].report(
                disk.file_bytes, disk.capacity, len(disk.index)
            )
            report["disk"]["live_bytes"] = sum(s.live for s in disk.segments.values())
            report["disk"]["segments"] = len(disk.segments)
            report["disk"]["recovered"] = disk.recovered
        remote = self.remote
        if remote is not None:
            report["remote"] = self.stats["remote"].report(
                remote.used, remote.capacity, len(remote.index)
            )
        return report

    def read(self, key: bytes) -> Found | None:
        """Read ``key`` from the top tier holding it; None on a miss.

        A memory hit returns the store's own bytes (``shared``): the caller
        copies them and records the hit with :meth:`record_memory_hits`.

        A damaged disk copy is dropped here (RAM only); a damaged remote object
        is unindexed and its deletion left to the mover.
        """
        for _ in range(3):  # a block moved between lookup and read is looked up again
            with self.lock:
                payload = self.memory.get(key)
                if payload is not None:
                    self.memory_policy.hit(key)
                else:
                    payload = self.outbound.get(key)
                if payload is not None:  # the caller copies it and records the hit
                    return Found("memory", payload.data, payload.desc, payload.checksum, None, True)
                tier = self.where(key)
                location = self.disk.index.get(key) if tier == "disk" and self.disk else None
            if tier is None:
                break
            started = time.perf_counter()
            found, damaged = self._read_lower(tier, key, location)
            elapsed = time.perf_counter() - started
            with self.lock:
                if found is not None:
                    self.stats["memory"].misses += 1
                    if tier == "remote" and self.disk is not None:
                        self.stats["disk"].misses += 1
                    self.stats[tier].read(elapsed, found.data.nbytes)
                    self.touch(tier, key)
                    return found
                if not damaged:
                    break  # unreachable now (a remote outage): a miss, the block stays
                if self.where(key) == tier and self._drop_damaged(tier, key, location):
                    break
        with self.lock:
            for name in self.configured():
                self.stats[name].misses += 1
        return None

    def memory_run(self, keys: list[bytes]) -> list[Payload]:
        """The payloads of the leading keys held in RAM (memory or outbound), in order.

        The caller copies them (see :class:`Found`) and records the hits with
        :meth:`record_memory_hits`.
        """
        run: list[Payload] = []
        with self.lock:
            memory, outbound, policy = self.memory, self.outbound, self.memory_policy
            for key in keys:
                payload = memory.get(key)
                if payload is not None:
                    policy.hit(key)
                else:
                    payload = outbound.get(key)
                    if payload is None:
                        break
                run.append(payload)
        return run

    def record_memory_hits(self, seconds: list[float], nbytes: int) -> None:
        """Count memory hits that took ``seconds`` each (lookup and copy)."""
        with self.lock:
            stats = self.stats["memory"]
            for elapsed in seconds:
                stats.read(elapsed, nbytes)

    def _read_lower(
        self, tier: str, key: bytes, location: SegmentEntry | None
    ) -> tuple[Found | None, bool]:
        """The block from disk or remote, or (None, whether the copy is damaged)."""
        if tier == "disk":
            assert self.disk is not None
            assert location is not None
            data = self.disk.read(key, location)
            if data is None:
                return None, True
            return Found("disk", data, location.desc, location.checksum, location, False), False
        assert self.remote is not None
        try:
            got = self.remote.read(key)
        except FormatError:
            return None, True
        if got is None:
            return None, False
        return Found("remote", got[0], got[1], got[2], None, False), False

    def _drop_damaged(self, tier: str, key: bytes, location: SegmentEntry | None) -> bool:
        """After a failed read of a block still in place: unindex it (under the lock)."""
        if tier == "disk":
            assert self.disk is not None
            if self.disk.index.get(key) != location:
                return False  # relocated meanwhile: read it again
            self.disk.forget(key)
        elif tier == "remote":
            assert self.remote is not None
            self.remote.forget(key)
            self.garbage.add(key)
            self.kick()
        self.stats[tier].corrupt += 1
        return True

    # --- admission into memory (under the lock, any thread) ---

    def admit(self, key: bytes, payload: Payload, *, wait: bool) -> bool:
        """Put a new (dirty) block in memory, evicting to make room; False if dropped.

        Dirty victims go to :attr:`outbound`. When that would pass the staging
        bound, ``wait`` blocks until the mover makes room; otherwise the block is
        dropped and counted. Call with the lock held (the wait releases it).
        """
        n = payload.nbytes
        while True:
            if n <= self.memory_capacity and self._outbound_fits(n) and self._make_room(n):
                break
            if self.lower_tiers() and self._outbound_fits(n):
                # Too big for memory, or memory is pinned full: straight to the lower tiers.
                self._queue_outbound(key, payload)
                return True
            if not self.lower_tiers():
                self.stats["memory"].rejected += 1  # memory alone, and no room in it
                return False
            if not wait:
                self.dropped += 1
                return False
            self.kick()  # make sure the mover is at work on what we wait for
            self.room.wait(timeout=1.0)
            if self.where(key) is not None:
                return True  # another thread stored it meanwhile
        self._insert(key, payload)
        if self.write_through and self.lower_tiers() and self._outbound_fits(n):
            self.outbound[key] = payload  # shares the memory payload: written, then clean
            self.outbound_bytes += n
            self._note_peak()
            self.kick()
        return True

    def promote(self, key: bytes, data: npt.NDArray[Any], found: Found) -> bool:
        """Copy a block read from a lower tier into memory (the lower copy stays).

        ``data`` becomes the memory copy and must not be handed out. Skipped
        (False) when the block is gone or moved, or when making room would pass
        the staging bound: a promotion never blocks a read.
        """
        n = data.nbytes
        if key in self.memory or key in self.outbound or n > self.memory_capacity:
            return False
        if found.tier == "disk":
            if self.disk is None or self.disk.index.get(key) != found.source:
                return False
        elif self.remote is None or key not in self.remote.index:
            return False
        if not self._outbound_fits(n) or not self._make_room(n):
            return False
        self._insert(key, Payload(data, found.desc, found.checksum))
        self.stats[found.tier].promotions += 1
        return True

    def lower_tiers(self) -> bool:
        """Whether blocks can be written down at all."""
        return self.disk is not None or self.remote is not None

    def _outbound_fits(self, n: int) -> bool:
        # An empty queue takes any one block, so a block larger than the staging
        # bound can still be written down (the bound is then that block).
        if not self.lower_tiers() or self.outbound_bytes == 0:
            return True
        return self.outbound_bytes + n <= self.staging_capacity

    def _insert(self, key: bytes, payload: Payload) -> None:
        self.memory[key] = payload
        self.memory_bytes += payload.nbytes
        self.memory_policy.insert(key, payload.nbytes)
        stats = self.stats["memory"]
        stats.writes += 1
        stats.written_bytes += payload.nbytes

    def _make_room(self, n: int) -> bool:
        """Evict memory blocks until ``n`` more bytes fit; False if too much is pinned."""
        while self.memory_bytes + n > self.memory_capacity:
            victim = self.memory_policy.pop_victim(lambda k: k in self.memory and not self.busy(k))
            if victim is None:
                return False
            payload = self.memory[victim]
            dirty = victim not in self.outbound and not self.below(victim)
            if dirty and self.lower_tiers() and not self._outbound_fits(payload.nbytes):
                # No staging room for this victim: keep it (as most recent) and give up.
                self.memory_policy.insert(victim, payload.nbytes)
                return False
            del self.memory[victim]
            self.memory_bytes -= payload.nbytes
            self.stats["memory"].evictions += 1
            if dirty and self.lower_tiers():
                self._queue_outbound(victim, payload)
                self.stats["memory"].demotions += 1
        return True

    def _queue_outbound(self, key: bytes, payload: Payload) -> None:
        self.outbound[key] = payload
        self.outbound_bytes += payload.nbytes
        self._note_peak()
        self.kick()

    def _note_peak(self) -> None:
        self.staging_peak = max(self.staging_peak, self.outbound_bytes)

    def release_outbound(self, key: bytes, payload: Payload, *, wake: bool = True) -> bool:
        """Drop ``key``'s outbound entry if it is still ``payload``; wake waiting puts.

        ``wake=False`` leaves the wake-up to the caller (one per batch, under the lock).
        """
        if self.outbound.get(key) is not payload:
            return False
        del self.outbound[key]
        self.outbound_bytes -= payload.nbytes
        if wake:
            self.room.notify_all()
        return True

    # --- deletion (under the lock, any thread) ---

    def delete(self, key: bytes) -> bool:
        """Remove ``key`` from every tier; the remote object is deleted later by the mover."""
        found = False
        payload = self.memory.pop(key, None)
        if payload is not None:
            self.memory_bytes -= payload.nbytes
            self.memory_policy.remove(key)
            found = True
        queued = self.outbound.get(key)
        if queued is not None:
            self.release_outbound(key, queued)
            found = True
        if self.disk is not None and self.disk.forget(key) is not None:
            found = True
        if self.remote is not None and self.remote.forget(key):
            self.garbage.add(key)
            self.kick()
            found = True
        return found
