"""Every write and delete of the disk and remote tiers: the mover thread's jobs.

:class:`WriteDown` runs only in the store's single mover thread
(:mod:`~mouthguard.kvcache.mover`). That one owner is what makes the tiers'
bounds and the absence of stale deletes hold: a capacity check and the write
that fills it never race another writer, and a remote object is deleted only
after checking, in the same thread that writes objects, that no newer copy of
its key was published.

Jobs:

* :meth:`WriteDown.write_down` takes the outbound queue in batches of up to
  :data:`BATCH_BYTES`, plans their disk records (making room: unlink empty
  segments, compact, evict to the remote tier), writes each batch with one
  large write per segment and one index append, then publishes each record only
  if its outbound entry is still the same payload (a delete or a re-put
  meanwhile abandons it). Blocks the disk cannot take go to the remote tier.
* :meth:`WriteDown.collect_garbage` deletes remote objects whose keys are no
  longer indexed there.
* :meth:`WriteDown.compact` and :meth:`WriteDown.spill` (before close).

Every move follows one rule: write the copy at the destination first,
invisibly, then publish it under the lock only if the source still holds the
same block, so a block is never lost or duplicated by a race with a caller.
"""

from __future__ import annotations

import logging

from mouthguard.errors import MouthguardError
from mouthguard.kvcache.blocks import Payload, padded
from mouthguard.kvcache.disk import DiskLevel
from mouthguard.kvcache.placement import Placement
from mouthguard.kvcache.remote import RemoteLevel, object_size
from mouthguard.kvcache.segments import SegmentEntry

log = logging.getLogger(__name__)

#: Bytes of outbound blocks written per batch: large writes, short lock holds.
BATCH_BYTES = 8 * 1024 * 1024
#: Records published per lock hold.
PUBLISH_SLICE = 64


class WriteDown:
    """The mover's side of :class:`~mouthguard.kvcache.placement.Placement`."""

    def __init__(self, placement: Placement) -> None:
        self.p = placement

    # --- the outbound queue ---

    def write_down(self) -> int:
        """Write every outbound block down; return how many were published."""
        placed = 0
        while True:
            batch = self._take_batch()
            if not batch:
                return placed
            placed += self._write_batch(batch)  # consumes the batch

    def _take_batch(self) -> list[tuple[bytes, Payload]]:
        p = self.p
        batch: list[tuple[bytes, Payload]] = []
        total = 0
        with p.lock:
            for key, payload in p.outbound.items():
                batch.append((key, payload))
                total += payload.nbytes
                if total >= BATCH_BYTES:
                    break
        return batch

    def _write_batch(self, batch: list[tuple[bytes, Payload]]) -> int:
        """Place ``batch``, consuming it: a payload is let go of as its entry is released.

        Holding released payloads would let RAM pass the staging bound (new
        blocks are admitted into the room a release makes).
        """
        p = self.p
        disk = p.disk
        placed = 0
        to_remote: list[tuple[bytes, Payload]] = []
        batch.reverse()  # pop() from the end, in queue order
        if disk is None:
            to_remote, batch = batch, []
        records: list[tuple[bytes, SegmentEntry, Payload]] = []
        while disk is not None and batch:
            key, payload = batch.pop()
            with p.lock:
                full = disk.file_bytes + padded(payload.nbytes) > disk.append_limit
            if full and records:
                # Write what is planned first: a segment with records being
                # written cannot be evicted to make room.
                placed += self._write_records(disk, records)
            location = self._plan_on_disk(disk, payload)
            if location is None:
                to_remote.append((key, payload))
            else:
                records.append((key, location, payload))
            del payload
        if disk is not None:
            placed += self._write_records(disk, records)
        while to_remote:
            key, payload = to_remote.pop()
            if self._into_remote(key, payload, lambda k=key, pl=payload: p.outbound.get(k) is pl):
                with p.lock:
                    if p.release_outbound(key, payload):
                        placed += 1
            else:
                with p.lock:  # nowhere to put it: the block is dropped
                    if p.release_outbound(key, payload):
                        p.stats["disk" if disk is not None else "remote"].rejected += 1
            del payload
        return placed

    def _write_records(
        self, disk: DiskLevel, records: list[tuple[bytes, SegmentEntry, Payload]]
    ) -> int:
        """Write planned records, publish them, and empty ``records``."""
        if not records:
            return 0
        p = self.p
        try:
            disk.write(records)
        except OSError as exc:
            log.warning("kv disk write failed (%d blocks dropped): %s", len(records), exc)
            with p.lock:
                for key, location, payload in records:
                    disk.abandon(key, location)
                    if p.release_outbound(key, payload):
                        p.stats["disk"].rejected += 1
            records.clear()
            return 0
        if p.write_through and p.remote is not None:
            for key, _, payload in records:  # the remote gets a copy too, before release
                self._into_remote(key, payload, lambda k=key: p.where(k) is not None)
        placed = 0
        # Published in slices, so readers waiting for the lock wait for a slice,
        # not for a whole batch of hundreds of blocks.
        for start in range(0, len(records), PUBLISH_SLICE):
            with p.lock:
                stats = p.stats["disk"]
                for key, location, payload in records[start : start + PUBLISH_SLICE]:
                    if p.release_outbound(key, payload, wake=False):
                        disk.publish(key, location)
                        stats.writes += 1
                        stats.written_bytes += payload.nbytes
                        placed += 1
                    else:
                        disk.abandon(key, location)  # deleted or re-put meanwhile
                p.room.notify_all()
        records.clear()
        return placed

    # --- making room on disk ---

    def _plan_on_disk(self, disk: DiskLevel, payload: Payload) -> SegmentEntry | None:
        """Make room (unlink a dead segment, evict the oldest) and plan a record.

        None when the block cannot go to disk (bigger than a segment's room, or
        nothing can be freed): the caller sends it to the remote tier.
        """
        p = self.p
        span = padded(payload.nbytes)
        if span > disk.append_limit:
            return None
        while True:
            live: list[tuple[bytes, SegmentEntry]] = []
            with p.lock:
                before = disk.file_bytes
                if disk.file_bytes + span <= disk.append_limit:
                    return disk.plan(payload)
                segment = disk.dead_segment()
                if segment is None:
                    segment = disk.oldest_segment()
                    if segment is None:
                        p.stats["disk"].rejected += 1
                        return None
                    live = disk.live_in(segment)
            if live:
                self.evict_segment(disk, segment, live)
            else:
                self._remove_segment(disk, segment)
            with p.lock:
                if disk.file_bytes >= before:  # a write error kept it: do not loop
                    p.stats["disk"].rejected += 1
                    return None

    def evict_segment(
        self, disk: DiskLevel, segment: int, live: list[tuple[bytes, SegmentEntry]]
    ) -> None:
        """Evict ``segment``: relocate its second-chance blocks, demote the rest, unlink it.

        Second chance: read since written, or pinned.
        """
        p = self.p
        with p.lock:
            kept = [(k, loc) for k, loc in live if k in disk.referenced or p.busy(k)]
            leaving = [(k, loc) for k, loc in live if not (k in disk.referenced or p.busy(k))]
            for key, _ in leaving:
                p.moving.add(key)
        for key, location in leaving:
            self._evict_from_disk(disk, key, location)
        self.compact_segment(segment, kept)

    def _remove_segment(self, disk: DiskLevel, segment: int) -> None:
        """Unlink a segment without live or pending records, then stop counting it.

        In this order the counted bytes never fall below the files' real size.
        """
        disk.unlink(segment)
        with self.p.lock:
            disk.detach(segment)

    def _evict_from_disk(self, disk: DiskLevel, key: bytes, location: SegmentEntry) -> None:
        """Demote a disk victim to the remote tier (or drop it), then forget the disk copy."""
        p = self.p
        try:
            with p.lock:
                keep = p.remote is None or key in p.remote.index
            frame = None if keep else disk.read_frame(key, location)
            if frame is not None:
                payload = Payload(frame[: location.nbytes], location.desc, location.checksum, frame)
                if self._into_remote(key, payload, lambda: disk.index.get(key) == location):
                    with p.lock:
                        p.stats["disk"].demotions += 1
            elif not keep:
                with p.lock:
                    p.stats["disk"].corrupt += 1
        finally:
            with p.lock:
                p.moving.discard(key)
                if disk.index.get(key) == location:
                    disk.forget(key)
                p.stats["disk"].evictions += 1

    def compact_segment(self, segment: int, live: list[tuple[bytes, SegmentEntry]]) -> None:
        """Relocate ``segment``'s live records into the active segment, then unlink it."""
        p = self.p
        disk = p.disk
        assert disk is not None
        copies: list[tuple[bytes, SegmentEntry, SegmentEntry, Payload]] = []
        for key, old in live:
            frame = disk.read_frame(key, old)
            with p.lock:
                if disk.index.get(key) != old:
                    continue
                if frame is None:
                    disk.forget(key)
                    p.stats["disk"].corrupt += 1
                    continue
                payload = Payload(frame[: old.nbytes], old.desc, old.checksum, frame)
                copies.append((key, old, disk.plan(payload), payload))
        if copies:
            try:
                disk.write([(key, new, payload) for key, _, new, payload in copies])
            except OSError as exc:
                log.warning("kv compaction write failed: %s", exc)
                with p.lock:
                    for key, _, new, _ in copies:
                        disk.abandon(key, new)
                return
            with p.lock:
                for key, old, new, _ in copies:
                    disk.relocated(key, old, new)
        with p.lock:
            info = disk.segments.get(segment)
            if info is None or info.live or info.pending:
                return
            if disk.active == segment:
                disk.active = None
        self._remove_segment(disk, segment)

    def compact(self, min_dead_fraction: float) -> int:
        """Compact every segment at least ``min_dead_fraction`` dead; return bytes reclaimed."""
        p = self.p
        disk = p.disk
        if disk is None:
            return 0
        before = disk.file_bytes
        with p.lock:
            chosen = [
                s
                for s, info in disk.segments.items()
                if info.size and (info.size - info.live) >= min_dead_fraction * info.size
            ]
        for segment in chosen:
            with p.lock:
                info = disk.segments.get(segment)
                if info is None or info.pending:
                    continue
                if disk.file_bytes + info.live > disk.capacity:
                    continue  # no room to relocate now; eviction will free it later
                if disk.active == segment:
                    disk.active = None
                live = disk.live_in(segment)
            self.compact_segment(segment, live)
        return max(0, before - disk.file_bytes)

    # --- the remote tier ---

    def _into_remote(self, key: bytes, payload: Payload, still_wanted: object) -> bool:
        """Write ``key``'s object and publish it if ``still_wanted()`` under the lock.

        Returns whether the block ended up placed (or was no longer wanted).
        """
        p = self.p
        remote = p.remote
        if remote is None or (remote.capacity is not None and payload.nbytes > remote.capacity):
            return False
        self._collect(remote, [key])  # an old object of this key must not outlive the new one
        size = object_size(payload, remote.keys)
        while True:
            with p.lock:
                if remote.fits(size):
                    remote.reserved += size  # counted before the object exists
                    break
                victim = remote.policy.pop_victim(remote.eligible(p.busy))
                if victim is None:
                    p.stats["remote"].rejected += 1
                    return False
                p.moving.add(victim)
            # Deleted before it stops counting, so the counted bytes never fall
            # below what the tier really holds.
            remote.delete(victim)
            with p.lock:
                remote.forget(victim)
                p.moving.discard(victim)
                p.stats["remote"].evictions += 1
        try:
            remote.write(key, payload)
        except MouthguardError as exc:
            log.debug("kv remote write of %s failed: %s", key.hex(), exc)
            with p.lock:
                remote.reserved -= size
                p.stats["remote"].rejected += 1
            return False
        except BaseException:
            with p.lock:
                remote.reserved -= size
            raise
        with p.lock:
            wanted = bool(still_wanted()) if callable(still_wanted) else True
            remote.reserved -= size
            if wanted:
                remote.publish(key, size)
                p.stats["remote"].writes += 1
                p.stats["remote"].written_bytes += size
                p.garbage.discard(key)
        if not wanted:
            remote.delete(key)
        return True

    def collect_garbage(self) -> None:
        """Delete remote objects of keys no longer indexed there."""
        remote = self.p.remote
        if remote is None:
            return
        with self.p.lock:
            doomed = list(self.p.garbage)
        self._collect(remote, doomed)

    def _collect(self, remote: RemoteLevel, keys: list[bytes]) -> None:
        p = self.p
        with p.lock:
            doomed = [k for k in keys if k in p.garbage and k not in remote.index]
            p.garbage.difference_update(keys)
        # Safe outside the lock: only this thread writes objects, so none of these
        # keys can be re-published between the check above and the delete.
        for key in doomed:
            remote.delete(key)

    # --- close ---

    def spill(self) -> int:
        """Write every dirty memory block down (oldest first), e.g. before the process exits."""
        p = self.p
        with p.lock:
            dirty = [k for k in p.memory if k not in p.outbound and not p.below(k)]
        moved = 0
        while dirty:
            taken = 0
            with p.lock:
                while dirty:
                    payload = p.memory.get(dirty[-1])
                    if payload is None or dirty[-1] in p.outbound or p.below(dirty[-1]):
                        dirty.pop()  # deleted, queued or written meanwhile
                        continue
                    if taken and taken + payload.nbytes > p.staging_capacity:
                        break
                    # Stays in memory too: written, then clean.
                    p.outbound[dirty.pop()] = payload
                    p.outbound_bytes += payload.nbytes
                    taken += payload.nbytes
            moved += self.write_down()
        return moved
