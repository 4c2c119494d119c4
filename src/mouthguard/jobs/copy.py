"""Copying one committed checkpoint from one tier to another, verified both ways.

Order of operations (the commit protocol of the destination tier is the same as
for a save, so a copy interrupted at any point is invisible there)::

    manifest = read_manifest(src)                      # validated, hostile-safe
    for each file: stream src -> dst staging           # hashed inline: the SOURCE is
                                                       # verified by the same pass
    commit_bytes(dst, manifest bytes)                  # byte-identical manifest, last
    verify_and_record(dst)                             # read-back: every byte again
    receipt on the source; copy facts (importance, holds); pass hints down

Between chunks the copier yields to checkpoint saves (:class:`BurstGate`), in
the copy and in its read-back alike.
A destination that already holds a committed copy is verified first: a valid
one stops the copy, one whose damage a second read confirms is set aside
(:mod:`mouthguard.checkpoint.quarantine`), one that cannot be read now (a
timeout, a dead store) is left alone and the copy fails. Nothing is ever
overwritten in place.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.audit import audited
from mouthguard.checkpoint.hints import pass_hint_down
from mouthguard.checkpoint.quarantine import SetAside, set_aside_confirmed
from mouthguard.checkpoint.reader import read_manifest
from mouthguard.checkpoint.sidecars import (
    CopyRef,
    mark_checked,
    mark_suspect,
    place_hold,
    read_sidecars,
    write_importance,
    write_receipt,
)
from mouthguard.checkpoint.verification import verify_and_record
from mouthguard.checkpoint.writer import commit_bytes, staging_prefix
from mouthguard.errors import (
    CheckpointExistsError,
    ChecksumMismatchError,
    MouthguardError,
    ObjectNotFoundError,
    TierError,
)
from mouthguard.format.checksum import StreamHasher
from mouthguard.format.manifest import MANIFEST_NAME, FileRecord, Manifest
from mouthguard.jobs.burst import BurstGate
from mouthguard.tiers.base import PutMode, Tier

log = logging.getLogger(__name__)

COPY_CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class CopyResult:
    """What one copy did."""

    run: str
    step: int
    source: str
    destination: str
    nbytes: int
    seconds: float
    yielded_seconds: float

    @property
    def bytes_per_second(self) -> float:
        """Effective copy bandwidth (including the read-back)."""
        busy = max(self.seconds - self.yielded_seconds, 1e-9)
        return self.nbytes / busy


class SourceDamagedError(ChecksumMismatchError):
    """The copy's *source* failed verification (or lost a file) while being read."""


class _SourceStream:
    """Streams one source file in chunks, hashing inline; remembers its own failure.

    The failure is recorded before it is raised because the destination tier may
    wrap exceptions raised by the iterable it consumes (e.g. a multipart upload).
    """

    def __init__(self, tier: Tier, key: str, record: FileRecord, gate: BurstGate | None) -> None:
        self.tier, self.key, self.record, self.gate = tier, key, record, gate
        self.error: SourceDamagedError | None = None

    def _fail(self, message: str) -> SourceDamagedError:
        self.error = SourceDamagedError(message)
        return self.error

    def __iter__(self) -> Iterator[bytes]:
        record, hasher, offset = self.record, StreamHasher(), 0
        while offset < record.size:
            if self.gate is not None:
                self.gate.wait()
            end = min(offset + COPY_CHUNK_BYTES, record.size)
            try:
                chunk = self.tier.get(self.key, offset, end)
            except ObjectNotFoundError as exc:
                missing = f"source {record.name} on {self.tier.name!r} is missing: {exc}"
                raise self._fail(missing) from exc
            except TierError as exc:
                if self.tier.exists(self.key) and self.tier.head(self.key).size != record.size:
                    raise self._fail(f"source {record.name} on {self.tier.name!r}: {exc}") from exc
                raise
            hasher.update(chunk)
            yield chunk
            offset = end
        if hasher.xxh3 != record.checksum:
            raise self._fail(
                f"source copy of {record.name} on {self.tier.name!r} is corrupt "
                f"(manifest {record.checksum}, read {hasher.xxh3})"
            )


def copy_checkpoint(
    src: Tier,
    dst: Tier,
    run: str,
    step: int,
    *,
    gate: BurstGate | None = None,
    reason: str = "replication",
    actor: str | None = None,
) -> CopyResult:
    """Copy committed checkpoint ``run``/``step`` from ``src`` to ``dst`` and verify it.

    The copy is an act of the audit trail (``copy``, on ``dst``'s trail, with
    ``reason``): its intent is recorded before anything is written, its outcome
    after the read-back.

    Raises:
        SourceDamagedError: the source copy failed verification while being read
            (nothing is committed on ``dst``).
        ChecksumMismatchError: the destination failed its read-back with proven
            damage (the new copy is set aside once a second read confirms it).
        CheckpointExistsError: ``dst`` already holds a valid committed copy.
        TierError: either tier failed; a new copy that could not be read back
            stays committed without a receipt, to be verified by a later pass.
    """
    started = time.monotonic()
    yielded_before = gate.yielded_seconds if gate is not None else 0.0
    manifest = read_manifest(src, run, step)
    raw_manifest = src.get(catalog.manifest_key(run, step))
    if dst.exists(catalog.manifest_key(run, step)):
        _clear_destination(CopyRef(dst, run, step))  # a set-aside there is its own act
    # The intent goes down just before the first byte of the copy does.
    with audited("copy", run, step, [dst], reason, actor, extra=(("from", src.name),)):
        result = _copy(src, dst, manifest, raw_manifest, gate)
    yielded = (gate.yielded_seconds - yielded_before) if gate is not None else 0.0
    result = replace(result, seconds=time.monotonic() - started, yielded_seconds=yielded)
    log.info(
        "replicated %s step %d %s -> %s (%d bytes, %.2f s, verified)",
        run,
        step,
        src.name,
        dst.name,
        manifest.nbytes,
        result.seconds,
    )
    return result


def _copy(
    src: Tier, dst: Tier, manifest: Manifest, raw_manifest: bytes, gate: BurstGate | None
) -> CopyResult:
    """Write, commit and read back the copy (``seconds`` and ``yielded_seconds`` left 0)."""
    run, step = manifest.run, manifest.step
    dst_ref = CopyRef(dst, run, step)
    staging = staging_prefix(dst, run, step, catalog.new_transaction_id())
    final = catalog.checkpoint_prefix(run, step)
    try:
        for record in manifest.files:
            stream = _SourceStream(src, final + record.name, record, gate)
            try:
                dst.put(staging + record.name, stream, mode=PutMode.CREATE)
            except Exception as exc:
                if stream.error is not None:
                    raise stream.error from exc
                raise
        commit_bytes(dst, staging, final, raw_manifest)
    except BaseException:
        _discard(dst, staging, final)
        raise
    # Read-back: a copy counts only once verified. Proven (and confirmed) damage
    # sets the new copy aside; an unreachable tier leaves it in place unverified
    # (no receipt), for the next pass to read again. It yields to saves like the copy.
    verdict = verify_and_record(dst_ref, pause=gate.wait if gate is not None else None)
    if verdict.record_error:
        log.info("could not record the receipt of %s: %s", dst_ref, verdict.record_error)
    if not verdict.ok:
        reason = f"read-back after copy failed: {verdict.reason}"
        if verdict.damaged:
            set_aside_confirmed(dst_ref, reason)
            raise ChecksumMismatchError(f"{dst_ref}: {reason}")
        raise TierError(f"{dst_ref}: {reason}")
    try:
        # The source was fully read and matched while streaming.
        write_receipt(CopyRef(src, run, step), raw_manifest, dt.datetime.now(dt.UTC))
    except MouthguardError as exc:
        log.info("could not record the source's receipt on %s: %s", src.name, exc)
    _copy_facts(CopyRef(src, run, step), dst_ref, manifest)
    return CopyResult(run, step, src.name, dst.name, manifest.nbytes, 0.0, 0.0)


def _clear_destination(dst_ref: CopyRef) -> None:
    """Make way on the destination: a valid copy stops the copy, damage is set aside.

    Raises:
        CheckpointExistsError: the destination holds a valid copy (or one whose
            damage a second read did not confirm).
        TierError: the destination copy cannot be read now; nothing is touched.
    """
    verdict = verify_and_record(dst_ref)
    if verdict.ok:
        raise CheckpointExistsError(f"{dst_ref} already holds a valid copy")
    if not verdict.damaged:
        raise TierError(f"cannot verify the existing copy {dst_ref}: {verdict.reason}")
    if set_aside_confirmed(dst_ref, verdict.reason) is SetAside.NOT_CONFIRMED:
        raise CheckpointExistsError(f"{dst_ref} already holds a copy that reads back intact")


def _discard(dst: Tier, staging: str, final: str) -> None:
    try:
        if staging != final:
            dst.delete_prefix(staging)
        elif not dst.exists(final + MANIFEST_NAME):
            dst.delete_prefix(final)  # uncommitted objects under the final prefix
    except MouthguardError as exc:
        log.warning("could not clean up an interrupted copy on %s: %s", dst.name, exc)


def _copy_facts(src: CopyRef, dst: CopyRef, manifest: Manifest) -> None:
    """Carry the mutable facts (importance change, holds, check verdict) and the hint."""
    facts = read_sidecars(src)
    when = dt.datetime.now(dt.UTC)
    if facts.importance is not None:
        write_importance(
            dst, facts.importance, facts.importance_reason, facts.importance_changed_at or when
        )
    for hold in facts.holds:
        place_hold(dst, hold.name, hold.reason, hold.placed_at or when)
    if facts.suspect:
        mark_suspect(dst, facts.suspect, when)
    elif facts.checked_at is not None:
        mark_checked(dst, facts.checked_at)
    pass_hint_down(dst, facts.importance or manifest.importance, manifest)
