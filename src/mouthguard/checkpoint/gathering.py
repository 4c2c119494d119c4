"""Gathering what the tiers hold about a checkpoint into the plain facts the policy decides on.

For each tier: is the step committed, does its manifest read, and what do the
copy's sidecars say (receipt, trash mark, importance change, holds, damage).
The result is :class:`CheckpointView`: the pure policy's input dataclasses
(:mod:`mouthguard.policy.facts`) plus what I/O needs (readable copies, damaged
and unreachable tiers). This module does the reading; the policy never does.

Used by ``Checkpointer.info`` (:mod:`~mouthguard.checkpoint.describe`) and by the
jobs (replication, retention), so every part of the system judges from the same facts.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.checking import saved_suspect
from mouthguard.checkpoint.reader import read_manifest
from mouthguard.checkpoint.sidecars import CopyRef, Sidecars, read_sidecars
from mouthguard.checkpoint.store import Store
from mouthguard.errors import MouthguardError, is_data_damage
from mouthguard.format.manifest import Manifest
from mouthguard.policy.facts import CheckpointFacts, CopyFacts, TierFacts
from mouthguard.policy.importance import Importance
from mouthguard.tiers.base import Tier

log = logging.getLogger(__name__)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def tier_facts(store: Store) -> list[TierFacts]:
    """What the policy needs to know about each tier (the first is the fast tier)."""
    return [
        TierFacts(
            name=t.name,
            domain=t.domain,
            durable=t.capabilities.durable,
            persistent=t.capabilities.persistent,
            object_lock=t.capabilities.object_lock,
            is_fast=i == 0,
        )
        for i, t in enumerate(store.tiers)
    ]


@dataclass(frozen=True)
class CheckpointView:
    """One checkpoint as found on the tiers: the policy facts plus what I/O needs."""

    facts: CheckpointFacts
    manifest: Manifest
    readable: tuple[Tier, ...]  # tiers whose manifest parsed (copy sources)
    damaged: tuple[tuple[Tier, str], ...]  # tiers whose committed manifest is proven damaged
    holds: tuple[str, ...] = ()  # names of the holds on any copy
    sidecars: tuple[tuple[str, Sidecars], ...] = ()  # (tier name, its copy's facts)
    unreachable: tuple[tuple[Tier, str], ...] = ()  # tiers whose manifest cannot be read now
    suspect: str = ""  # why its state failed a semantic check ("" when none did)


def _ts(value: dt.datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def gather(store: Store, run: str, step: int) -> CheckpointView | None:
    """Collect the facts about ``run``/``step`` from every tier (None if not committed)."""
    manifest: Manifest | None = None
    copies: list[CopyFacts] = []
    readable: list[Tier] = []
    damaged: list[tuple[Tier, str]] = []
    unreachable: list[tuple[Tier, str]] = []
    holds: set[str] = set()
    per_copy: list[tuple[str, Sidecars]] = []
    changes: list[tuple[dt.datetime, Importance]] = []
    for tier in store.tiers:
        if not tier.exists(catalog.manifest_key(run, step)):
            continue
        try:
            found = read_manifest(tier, run, step)
        except MouthguardError as exc:
            (damaged if is_data_damage(exc) else unreachable).append((tier, str(exc)))
            continue
        manifest = manifest or found
        readable.append(tier)
        side = read_sidecars(CopyRef(tier, run, step))
        per_copy.append((tier.name, side))
        holds.update(h.name for h in side.holds)
        if side.importance is not None:
            changes.append((side.importance_changed_at or _EPOCH, side.importance))
        copies.append(
            CopyFacts(
                tier=tier.name,
                domain=tier.domain,
                verified=side.verified_at is not None,
                verified_at=_ts(side.verified_at),
                trashed_at=_ts(side.trashed_at),
                damage_reported=bool(side.damage),
            )
        )
    if manifest is None:
        return None
    importance = max(changes, key=lambda c: c[0])[1] if changes else manifest.importance
    metrics = _metrics(manifest)
    verified = any(c.verified for c in copies)
    # A suspect mark on any copy, or the save guard's verdict in the manifest, makes
    # the checkpoint invalid: a resume skips it and retention never counts it.
    suspect = saved_suspect(manifest.reference) or next(
        (side.suspect for _, side in per_copy if side.suspect), ""
    )
    facts = CheckpointFacts(
        run=run,
        step=step,
        importance=importance,
        created=manifest.created.timestamp(),
        valid=False if suspect else (True if verified else None),
        held=bool(holds),
        metrics=metrics,
        copies=tuple(copies),
        checked=not suspect and any(side.checked_at is not None for _, side in per_copy),
        suspect=suspect,
        # Given up by its trainer: every copy in the trash, under the trainer's mark.
        released=bool(per_copy)
        and all(side.trashed_at is not None for _, side in per_copy)
        and any(side.trash_released for _, side in per_copy),
    )
    return CheckpointView(
        facts,
        manifest,
        tuple(readable),
        tuple(damaged),
        tuple(sorted(holds)),
        tuple(per_copy),
        tuple(unreachable),
        suspect,
    )


def unreadable_copies(store: Store, run: str, step: int) -> list[tuple[Tier, str]]:
    """The copies of ``run``/``step`` when it is committed but no manifest can be read.

    Each entry is a copy whose manifest is proven damaged, with the reason.
    Empty when any tier's manifest reads (see :func:`gather`), when nothing is
    committed, or when a tier holding it cannot be read now: an unreachable copy
    may be intact, so nothing is concluded until it answers.
    """
    found: list[tuple[Tier, str]] = []
    for tier in store.tiers:
        try:
            if not tier.exists(catalog.manifest_key(run, step)):
                continue
            read_manifest(tier, run, step)
        except MouthguardError as exc:
            if not is_data_damage(exc):
                return []
            found.append((tier, str(exc)))
            continue
        return []  # one readable manifest: gather() describes it
    return found


def _metrics(manifest: Manifest) -> dict[str, float]:
    """Numeric reference values saved with the checkpoint (``reference={"loss": ...}``)."""
    ref = manifest.reference
    if not isinstance(ref, dict):
        return {}
    return {
        k: float(v)
        for k, v in ref.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def steps_of(store: Store, run: str) -> list[int]:
    """Steps committed on any tier of ``store``, ascending."""
    found: set[int] = set()
    for tier in store.tiers:
        found.update(catalog.committed_steps(tier, run))
    return sorted(found)


def runs_of(store: Store) -> list[str]:
    """Runs present on any tier of ``store``."""
    return sorted({r for tier in store.tiers for r in catalog.list_runs(tier)})
