"""Finding the DCP checkpoint a load reads: the newest valid one, or a given step.

A step counts only with a manifest that passes its own checksum and full
validation, DCP metadata included. Copies of one step on several tiers are used
together when their manifests are byte-identical (replicas always are), so a
chunk damaged on one tier is read from another. Damaged manifests are skipped
with a :class:`~mouthguard.errors.CheckpointFallbackWarning` and reported in a
damage sidecar (best effort), so the replicator confirms and repairs them.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.sidecars import CopyRef, report_damage
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.writer import utc_now
from mouthguard.dcp.metadata_json import decode_metadata
from mouthguard.errors import (
    CheckpointError,
    CheckpointFallbackWarning,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    ManifestError,
    MouthguardError,
    NoValidCheckpointError,
    is_data_damage,
)
from mouthguard.format.checksum import xxh3_digest
from mouthguard.format.manifest import Manifest, TensorRecord, parse_manifest
from mouthguard.tiers.base import Tier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Copy:
    """One tier's copy of the resolved checkpoint."""

    tier: Tier
    prefix: str
    manifest: Manifest
    records: dict[tuple[str, str], TensorRecord] = field(hash=False, compare=False)


@dataclass(frozen=True)
class Resolved:
    """The checkpoint a load reads: its step, manifest digest and usable copies."""

    run: str
    step: int
    digest: str
    copies: tuple[Copy, ...]

    @property
    def manifest(self) -> Manifest:
        """The manifest (identical on every copy)."""
        return self.copies[0].manifest


def report(tier: Tier, run: str, step: int, reason: str) -> None:
    """Leave a damage report for the replicator; never turns a load into a failure."""
    try:
        report_damage(CopyRef(tier, run, step), reason, utc_now())
    except MouthguardError as exc:
        log.info("could not record the damage of %s step %d on %s: %s", run, step, tier.name, exc)


def _read_copy(tier: Tier, run: str, step: int) -> tuple[bytes, Manifest]:
    raw = tier.get(catalog.manifest_key(run, step))
    manifest = parse_manifest(raw)
    if manifest.run != run or manifest.step != step:
        raise ManifestError(
            f"manifest in {run}/{step} describes {manifest.run}/{manifest.step} (moved or forged)"
        )
    if manifest.is_dcp:
        decode_metadata(manifest.dcp, manifest)  # validated once here, before any rank plans
    return raw, manifest


def _copies_of(
    store: Store, run: str, step: int, *, explicit: bool, rejected: list[str]
) -> tuple[str, tuple[Copy, ...]] | None:
    """Valid DCP copies of ``step`` (byte-identical manifests), or None.

    Raises:
        CheckpointError: ``explicit`` and the step was not saved through DCP.
    """
    found: list[tuple[bytes, Copy]] = []
    prefix = catalog.checkpoint_prefix(run, step)
    for tier in store.tiers:
        if not tier.exists(catalog.manifest_key(run, step)):
            continue
        try:
            raw, manifest = _read_copy(tier, run, step)
        except MouthguardError as exc:
            rejected.append(f"step {step} on {tier.name}: {exc}")
            warnings.warn(
                f"DCP checkpoint {run} step {step} on tier {tier.name!r} rejected: {exc}",
                CheckpointFallbackWarning,
                stacklevel=5,
            )
            if is_data_damage(exc):
                report(tier, run, step, str(exc))
            continue
        if not manifest.is_dcp:
            if explicit:
                raise CheckpointError(
                    f"{run} step {step} was not saved through DCP: load it with Checkpointer.load"
                )
            return None
        records = {(t.file, t.name): t for t in manifest.tensors}
        found.append((raw, Copy(tier, prefix, manifest, records)))
    if not found:
        return None
    first = found[0][0]
    # Replicas are byte-identical; anything else is another save of this step and
    # its chunks' checksums would not be the ones the metadata names.
    return xxh3_digest(first), tuple(c for raw, c in found if raw == first)


def resolve(store: Store, run: str, step: int | None) -> Resolved:
    """The checkpoint to load: ``step``, or the newest valid DCP checkpoint of ``run``.

    Raises:
        CheckpointNotFoundError: nothing (DCP) is committed for the request.
        CorruptCheckpointError: every copy of the requested ``step`` is damaged.
        NoValidCheckpointError: ``step=None`` and no DCP checkpoint has a valid manifest.
        CheckpointError: ``step`` was saved by ``Checkpointer``, not through DCP.
    """
    if step is not None:
        candidates = [step]
    else:
        steps: set[int] = set()
        for tier in store.tiers:
            steps.update(catalog.committed_steps(tier, run))
        candidates = sorted(steps, reverse=True)
    rejected: list[str] = []
    for candidate in candidates:
        found = _copies_of(store, run, candidate, explicit=step is not None, rejected=rejected)
        if found is not None:
            digest, copies = found
            return Resolved(run, candidate, digest, copies)
    reasons = "; ".join(rejected)
    if step is not None and rejected:
        raise CorruptCheckpointError(f"every copy of {run} step {step} is damaged: {reasons}")
    if rejected:
        raise NoValidCheckpointError(f"run {run!r} has no valid DCP checkpoint: {reasons}")
    what = f"step {step}" if step is not None else "any step"
    raise CheckpointNotFoundError(f"run {run!r} has no committed DCP checkpoint for {what}")
