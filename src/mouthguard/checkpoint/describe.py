"""Describing checkpoints from what the tiers hold: ``CheckpointInfo``, ``UnreadableCheckpoint``.

``Checkpointer.info``/``list``/``unreadable`` (and through them ``ls``, ``show``,
``doctor``) report what :mod:`~mouthguard.checkpoint.gathering` gathers from every
tier, judged by the pure policy:

* every copy with its receipt, trash mark and damage report; a tier whose
  manifest is proven damaged is a copy too, damaged ``manifest: <why>``;
* the state: how far the copies meet the placement of the effective importance
  (``committed`` -> ``verified`` -> ``protected``), ``damaged`` when every copy
  is, ``trashed`` when every copy is in the trash;
* a tier that cannot be read now is left out with a warning: it may hold an
  intact copy, so it is neither counted nor condemned.

A checkpoint whose manifest no tier can provide cannot be described this way
(importance, size and time are in the manifest); :func:`unreadable_checkpoints`
names those.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.gathering import (
    CheckpointView,
    gather,
    tier_facts,
    unreadable_copies,
)
from mouthguard.checkpoint.info import CheckpointInfo, CopyInfo, UnreadableCheckpoint
from mouthguard.checkpoint.store import Store
from mouthguard.policy.placement import placement_for, protection_status

log = logging.getLogger(__name__)


def describe(store: Store, run: str, step: int) -> CheckpointInfo | None:
    """The info of ``run``/``step`` merged over every copy (None: no manifest readable).

    The effective importance is the newest recorded change on any copy (else the
    saved one); the holds are the union over copies.
    """
    view = gather(store, run, step)
    return None if view is None else describe_view(store, view)


def describe_view(store: Store, view: CheckpointView) -> CheckpointInfo:
    """The info of a checkpoint already gathered (:func:`describe` without the reading).

    For callers that judge the same gathered facts in more than one way (the
    dashboard describes and runs retention over one gathering of the store).
    """
    run, step = view.facts.run, view.facts.step
    prefix = catalog.checkpoint_prefix(run, step)
    damage = {name: side.damage for name, side in view.sidecars if side.damage}
    copies = tuple(
        CopyInfo(
            tier=c.tier,
            location=store.tier(c.tier).location(prefix),
            verified=c.verified,
            verified_at=_datetime(c.verified_at),
            trashed_at=_datetime(c.trashed_at),
            damage=damage.get(c.tier, ""),
        )
        for c in view.facts.copies
    ) + tuple(
        CopyInfo(tier=t.name, location=t.location(prefix), damage=f"manifest: {reason}")
        for t, reason in view.damaged
    )
    for tier, reason in view.unreachable:
        log.warning("%s step %d on tier %s: %s", run, step, tier.name, reason)
    placement = placement_for(view.facts.importance, tier_facts(store), store.policy)
    protection = protection_status(view.facts, placement)
    trashed = bool(copies) and all(c.trashed_at is not None for c in copies)
    state: str = protection.state
    missing = protection.missing
    if all(c.damage for c in copies):
        state = "damaged"
        missing = ("every copy is damaged: " + _damage_line(copies), *missing)
    return CheckpointInfo.from_manifest(
        view.manifest,
        copies,
        importance=view.facts.importance,
        holds=view.holds,
        state="trashed" if trashed else state,
        protection=missing,
        suspect=view.suspect,
        checked=view.facts.checked,
    )


def unreadable_checkpoints(
    store: Store, run: str, steps: Iterable[int]
) -> list[UnreadableCheckpoint]:
    """Those of ``steps`` whose manifest is proven damaged on every tier holding it."""
    found = []
    for step in steps:
        copies = unreadable_copies(store, run, step)
        if copies:
            location = catalog.checkpoint_prefix(run, step)
            found.append(
                UnreadableCheckpoint(
                    run,
                    step,
                    tuple(CopyInfo(t.name, t.location(location), damage=why) for t, why in copies),
                )
            )
    return found


def _datetime(timestamp: float | None) -> dt.datetime | None:
    return None if timestamp is None else dt.datetime.fromtimestamp(timestamp, dt.UTC)


def _damage_line(copies: tuple[CopyInfo, ...]) -> str:
    return "; ".join(f"{c.tier}: {c.damage}" for c in copies)
