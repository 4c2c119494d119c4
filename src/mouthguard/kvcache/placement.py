"""Where each block lives: memory, disk, remote -- and the moves between them.

:class:`Placement` holds the three tiers' indexes under one lock and performs
every move. Reads (:meth:`Placement.lookup`, :meth:`Placement.read`) run in the
callers' threads; every write (a put, a demotion on eviction, a promotion on a
hit, a compaction) runs in the store's single mover thread
(:mod:`~mouthguard.kvcache.mover`), which is what keeps each tier within its
capacity under concurrency: only one thread ever adds bytes.

**Exclusive placement** (the default): every time the lock is released a block
is in exactly one tier. A move writes the copy at the destination first
(invisible), then, under the lock, publishes it *only if the source still holds
the block* and removes it from the source in the same critical section; if the
block was deleted meanwhile the copy is discarded. **Write-through** instead
writes every put to every tier and promotes by copying, so eviction from an
upper tier needs no write.

Capacity rules, each checked under the lock before the bytes are counted:
memory holds ``memory_bytes`` of payloads; disk holds ``disk_bytes`` of segment
files (dead records included, see :mod:`~mouthguard.kvcache.disk`); remote holds
``remote_bytes`` of objects. A block bigger than a tier skips it. Pinned blocks
and blocks being moved are never chosen for eviction; if nothing can be evicted
the block goes to the next tier down, or is rejected (counted, not an error).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from mouthguard.errors import FormatError, MouthguardError
from mouthguard.kvcache.blocks import BlockDesc, Payload
from mouthguard.kvcache.disk import DiskLevel
from mouthguard.kvcache.policy import EvictionPolicy
from mouthguard.kvcache.remote import RemoteLevel, object_size
from mouthguard.kvcache.segments import Location, padded
from mouthguard.kvcache.stats import TierStats

#: Called under the lock just before a copy is published: False if the source lost the block.
Release = Callable[[], bool] | None
TIERS = ("memory", "disk", "remote")


@dataclass(frozen=True)
class Found:
    """A block read from a tier: its bytes (the caller's to keep) and where it was."""

    tier: str
    data: npt.NDArray[Any]
    desc: BlockDesc
    checksum: bytes
    source: Location | int | None  # disk location, remote size, or None for memory


class Placement:
    """The tiers, their indexes and every move between them (see the module docstring)."""

    def __init__(
        self,
        memory_bytes: int,
        memory_policy: EvictionPolicy,
        disk: DiskLevel | None,
        remote: RemoteLevel | None,
        *,
        write_through: bool = False,
    ) -> None:
        self.lock = threading.RLock()
        self.memory: dict[bytes, Payload] = {}
        self.memory_bytes = 0
        self.memory_capacity = memory_bytes
        self.memory_policy = memory_policy
        self.disk = disk
        self.remote = remote
        self.write_through = write_through
        self.pins: Counter[bytes] = Counter()
        self.moving: set[bytes] = set()
        self.pending: set[bytes] = set()
        self.garbage: list[bytes] = []
        self.stats = {name: TierStats() for name in TIERS}

    # --- lookups and reads (any thread) ---

    def where(self, key: bytes) -> str | None:
        """The top tier holding ``key`` (under the lock), or None."""
        if key in self.memory:
            return "memory"
        if self.disk is not None and key in self.disk.index:
            return "disk"
        if self.remote is not None and key in self.remote.index:
            return "remote"
        return None

    def _busy(self, key: bytes) -> bool:
        return self.pins[key] > 0 or key in self.moving

    def read(self, key: bytes) -> Found | None:
        """Read ``key`` from the tier holding it; None on a miss (a damaged copy is dropped)."""
        for _ in range(3):  # a block moved between lookup and read is looked up again
            with self.lock:
                tier = self.where(key)
                payload = self.memory.get(key)
                location = self.disk.index.get(key) if tier == "disk" and self.disk else None
            if tier is None:
                break
            started = time.perf_counter()
            found, damaged = self._read_from(tier, key, payload, location)
            elapsed = time.perf_counter() - started
            with self.lock:
                if found is not None:
                    for above in self._configured()[: self._configured().index(tier)]:
                        self.stats[above].misses += 1
                    self.stats[tier].read(elapsed, found.data.nbytes)
                    self.policy_of(tier).hit(key)
                    return found
                if not damaged:
                    break  # unreachable now (a remote outage): a miss, the block stays
                if self.where(key) == tier and self._drop_damaged(tier, key, location):
                    break
        with self.lock:
            for name in self._configured():
                self.stats[name].misses += 1
        return None

    def _configured(self) -> list[str]:
        present = {"memory": True, "disk": self.disk is not None, "remote": self.remote is not None}
        return [name for name in TIERS if present[name]]

    def _read_from(
        self, tier: str, key: bytes, payload: Payload | None, location: Location | None
    ) -> tuple[Found | None, bool]:
        """The block, or (None, whether the copy is damaged)."""
        if tier == "memory":
            assert payload is not None
            return Found("memory", payload.data.copy(), payload.desc, payload.checksum, None), False
        if tier == "disk":
            assert self.disk is not None
            assert location is not None
            data = self.disk.read(key, location)
            if data is None:
                return None, True
            return Found("disk", data, location.desc, location.checksum, location), False
        assert self.remote is not None
        try:
            got = self.remote.read(key)
        except FormatError:
            return None, True
        if got is None:
            return None, False
        return Found("remote", got[0], got[1], got[2], got[0].nbytes), False

    def _drop_damaged(self, tier: str, key: bytes, location: Location | None) -> bool:
        """After a failed read of a block still in place: drop it (under the lock)."""
        if tier == "disk":
            assert self.disk is not None
            if self.disk.index.get(key) != location:
                return False  # relocated meanwhile: read it again
            self.disk.forget(key)
        elif tier == "remote":
            assert self.remote is not None
            self.remote.forget(key)
            self.garbage.append(key)
        self.stats[tier].corrupt += 1
        return True

    def policy_of(self, tier: str) -> EvictionPolicy:
        """The eviction policy of ``tier``."""
        if tier == "memory":
            return self.memory_policy
        level = self.disk if tier == "disk" else self.remote
        assert level is not None
        return level.policy

    # --- deletion (any thread) ---

    def delete(self, key: bytes) -> bool:
        """Remove ``key`` from every tier (under the lock); the remote object follows later."""
        found = key in self.pending
        self.pending.discard(key)
        payload = self.memory.pop(key, None)
        if payload is not None:
            self.memory_bytes -= payload.nbytes
            self.memory_policy.remove(key)
            found = True
        if self.disk is not None and self.disk.forget(key) is not None:
            found = True
        if self.remote is not None and self.remote.forget(key):
            self.garbage.append(key)
            found = True
        return found

    # --- moves (the mover thread only) ---

    def store(self, key: bytes, payload: Payload) -> None:
        """Place a new block (in ``pending`` since ``put``; a delete meanwhile cancels it)."""

        def wanted() -> bool:
            return key in self.pending

        def release() -> bool:
            if key not in self.pending:
                return False
            self.pending.discard(key)
            return True

        if self.write_through:
            self._into_remote(key, payload, wanted)
            if self.disk is not None:
                self._into_disk(key, payload, wanted)
        placed = self._into_memory(key, payload, release, only_memory=self.write_through)
        with self.lock:
            self.pending.discard(key)
            if not placed and self.where(key) is None:
                self.stats["memory"].rejected += 1

    def promote(self, found: Found, key: bytes) -> None:
        """Bring a block read from disk or remote into memory (copy or move)."""
        with self.lock:
            if key in self.memory or self.where(key) != found.tier or key in self.moving:
                return
            if found.tier == "disk" and self.disk and self.disk.index.get(key) != found.source:
                return
            self.moving.add(key)
        payload = Payload(found.data, found.desc, found.checksum)

        def release() -> bool:
            if found.tier == "disk":
                assert self.disk is not None
                if self.disk.index.get(key) != found.source:
                    return False
                if not self.write_through:
                    self.disk.forget(key)
            else:
                assert self.remote is not None
                if key not in self.remote.index:
                    return False
                if not self.write_through:
                    self.remote.forget(key)
                    self.garbage.append(key)
            self.stats[found.tier].promotions += 1
            return True

        try:
            self._into_memory(key, payload, release, only_memory=True)
        finally:
            with self.lock:
                self.moving.discard(key)

    def _into_memory(
        self, key: bytes, payload: Payload, release: Release, *, only_memory: bool = False
    ) -> bool:
        """Place in memory, demoting victims; else (too big, all pinned) one tier down."""
        n = payload.nbytes
        while n <= self.memory_capacity:
            with self.lock:
                if self.memory_bytes + n <= self.memory_capacity:
                    if release is not None and not release():
                        return True  # the block went away meanwhile: nothing to place
                    self.memory[key] = payload
                    self.memory_bytes += n
                    self.memory_policy.insert(key, n)
                    self.stats["memory"].writes += 1
                    self.stats["memory"].written_bytes += n
                    return True
                victim = self.memory_policy.pop_victim(
                    lambda k: k in self.memory and not self._busy(k)
                )
                if victim is None:
                    break
                self.moving.add(victim)
                victim_payload = self.memory[victim]
            self._demote_from_memory(victim, victim_payload)
        if only_memory:
            return False
        return self._into_disk(key, payload, release)

    def spill(self) -> int:
        """Demote every unpinned memory block (oldest first), e.g. before the process exits."""
        moved = 0
        while True:
            with self.lock:
                victim = self.memory_policy.pop_victim(
                    lambda k: k in self.memory and not self._busy(k)
                )
                if victim is None:
                    return moved
                self.moving.add(victim)
                payload = self.memory[victim]
            self._demote_from_memory(victim, payload)
            moved += 1

    def _demote_from_memory(self, key: bytes, payload: Payload) -> None:
        def release() -> bool:
            if self.memory.get(key) is not payload:
                return False
            del self.memory[key]
            self.memory_bytes -= payload.nbytes
            self.stats["memory"].demotions += 1
            return True

        try:
            with self.lock:
                below = self.disk is not None and key in self.disk.index
                below = below or (self.remote is not None and key in self.remote.index)
            if not (below and self.write_through):
                self._into_disk(key, payload, release)
        finally:
            with self.lock:
                self.moving.discard(key)
                if self.memory.get(key) is payload:  # no copy below: evicted for good
                    del self.memory[key]
                    self.memory_bytes -= payload.nbytes
                self.stats["memory"].evictions += 1

    def _into_disk(self, key: bytes, payload: Payload, release: Release) -> bool:
        disk = self.disk
        if disk is None or padded(payload.nbytes) > disk.append_limit:
            return self._into_remote(key, payload, release)
        location = self._plan_on_disk(key, payload)
        if location is None:
            return self._into_remote(key, payload, release)
        try:
            disk.write([(key, location, payload)])
        except OSError:
            with self.lock:
                disk.abandon(key, location)
                self.stats["disk"].rejected += 1
            return False
        with self.lock:
            if release is not None and not release():
                disk.abandon(key, location)
                return True
            disk.publish(key, location)
            self.stats["disk"].writes += 1
            self.stats["disk"].written_bytes += payload.nbytes
        return True

    def _plan_on_disk(self, key: bytes, payload: Payload) -> Location | None:
        """Make room (unlink, compact, evict) and plan the record; None if impossible."""
        disk = self.disk
        assert disk is not None
        span = padded(payload.nbytes)
        compaction_helps = True
        while True:
            victim: tuple[bytes, Location] | None = None
            live: list[tuple[bytes, Location]] = []
            with self.lock:
                before = disk.file_bytes
                if disk.file_bytes + span <= disk.append_limit:
                    return disk.plan(key, payload)
                segment = disk.dead_segment()
                if segment is None:
                    segment = disk.compaction_candidate() if compaction_helps else None
                    if segment is not None:
                        live = disk.live_in(segment)
                    else:
                        evicted = disk.policy.pop_victim(disk.eligible(self._busy))
                        if evicted is None:
                            self.stats["disk"].rejected += 1
                            return None
                        self.moving.add(evicted)
                        victim = (evicted, disk.index[evicted])
            if victim is not None:
                self._evict_from_disk(*victim)
            elif live:
                assert segment is not None
                self.compact_segment(segment, live)
                with self.lock:  # a failed compaction (a write error) must not loop
                    compaction_helps = disk.file_bytes < before
            elif segment is not None:
                self._remove_segment(segment)

    def _remove_segment(self, segment: int) -> None:
        """Unlink a segment without live or pending records, then stop counting it.

        In this order the counted bytes never fall below the files' real size.
        Only the mover plans records, so none can enter the segment meanwhile.
        """
        assert self.disk is not None
        self.disk.unlink(segment)
        with self.lock:
            self.disk.detach(segment)

    def _evict_from_disk(self, key: bytes, location: Location) -> None:
        disk = self.disk
        assert disk is not None

        def release() -> bool:
            if disk.index.get(key) != location:
                return False
            disk.forget(key)
            self.stats["disk"].demotions += 1
            return True

        try:
            with self.lock:
                keep = self.remote is None or (self.write_through and key in self.remote.index)
            data = None if keep else disk.read(key, location)
            if data is not None:
                self._into_remote(key, Payload(data, location.desc, location.checksum), release)
            elif not keep:
                with self.lock:
                    self.stats["disk"].corrupt += 1
        finally:
            with self.lock:
                self.moving.discard(key)
                if disk.index.get(key) == location:
                    disk.forget(key)
                self.stats["disk"].evictions += 1

    def compact_segment(self, segment: int, live: list[tuple[bytes, Location]]) -> None:
        """Relocate ``segment``'s live records into the active segment, then unlink it."""
        disk = self.disk
        assert disk is not None
        for key, old in live:
            data = disk.read(key, old)
            with self.lock:
                if disk.index.get(key) != old:
                    continue
                if data is None:
                    disk.forget(key)
                    self.stats["disk"].corrupt += 1
                    continue
                payload = Payload(data, old.desc, old.checksum)
                new = disk.plan(key, payload)
            try:
                disk.write([(key, new, payload)])
            except OSError:
                with self.lock:
                    disk.abandon(key, new)
                return
            with self.lock:
                disk.relocated(key, old, new)
        with self.lock:
            info = disk.segments.get(segment)
            if info is None or info.live or info.pending:
                return
            if disk.active == segment:
                disk.active = None
        self._remove_segment(segment)

    def _into_remote(self, key: bytes, payload: Payload, release: Release) -> bool:
        remote = self.remote
        if remote is None or (remote.capacity is not None and payload.nbytes > remote.capacity):
            return False
        self.collect_garbage(only=key)  # an old object of this key must not delete the new one
        size = object_size(payload)
        while True:
            with self.lock:
                if remote.fits(size):
                    remote.reserved += size  # counted before the object exists
                    break
                victim = remote.policy.pop_victim(remote.eligible(self._busy))
                if victim is None:
                    self.stats["remote"].rejected += 1
                    return False
                self.moving.add(victim)
            # Deleted before it stops counting, so the counted bytes never fall
            # below what the tier really holds.
            remote.delete(victim)
            with self.lock:
                remote.forget(victim)
                self.moving.discard(victim)
                self.stats["remote"].evictions += 1
        try:
            remote.write(key, payload)
        except MouthguardError:
            with self.lock:
                remote.reserved -= size
                self.stats["remote"].rejected += 1
            return False
        except BaseException:
            with self.lock:
                remote.reserved -= size
            raise
        with self.lock:
            published = release is None or release()
            if published:
                # The reservation becomes the object in one step: never counted twice.
                remote.reserved -= size
                remote.publish(key, size)  # our bytes, as the capacity check counted them
                self.stats["remote"].writes += 1
                self.stats["remote"].written_bytes += size
        if not published:
            remote.delete(key)
            with self.lock:
                remote.reserved -= size
        return True

    def collect_garbage(self, only: bytes | None = None) -> None:
        """Delete remote objects of blocks no longer indexed there (I/O outside the lock)."""
        if self.remote is None:
            return
        with self.lock:
            if only is None:
                doomed, self.garbage = self.garbage, []
            elif only in self.garbage:
                self.garbage = [k for k in self.garbage if k != only]
                doomed = [only]
            else:
                return
            doomed = [k for k in doomed if k not in self.remote.index]
        for key in doomed:
            self.remote.delete(key)
