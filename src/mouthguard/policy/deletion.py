"""Deletion: what to do with each copy of one checkpoint, given retention's verdict.

:func:`decide_deletions` returns one :class:`CopyAction` per copy. The actions:

``keep``
    leave the copy. On a copy that carries a trash mark, ``keep`` means
    *restore*: the executor lifts the mark (a newer checkpoint turned out
    corrupt, a hold arrived, ...).
``trash``
    mark the copy as trashed (a sidecar). Idempotent: on a copy already in the
    trash it means "still waiting" and must not reset ``trashed_at``.
``purge``
    delete the copy's bytes. Only ever for a copy trashed at least the level's
    trash delay before ``now``.
``demote``
    delete the fast-tier copy of a checkpoint that stays kept elsewhere. Not
    delayed by the trash: it is allowed only while verified replicas that meet
    the whole placement remain on other tiers, so no data is at risk, and the
    fast tier's space is what recovery of newer checkpoints needs.

Invariants (each has a test in ``tests/policy/test_deletion.py`` and a
property test):

* a held checkpoint is never trashed, purged or demoted anywhere, and an already
  trashed copy of it is restored -- the hold wins;
* a checkpoint retention keeps, a recovery point (``newest_valid``) and a
  critical checkpoint are never trashed or purged; the only removal is a
  demotion, which needs a live verified copy on another, durable, non-fast tier
  and the placement still protected without the fast copies -- so a kept
  checkpoint never loses its last verified copy;
* a checkpoint retention drops goes through the trash on every tier: ``trash``
  first, ``purge`` only once ``now - trashed_at >= trash delay``;
* copies on tiers the store no longer configures are left alone: the executor
  cannot reach them and the policy knows nothing about them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from mouthguard.policy.config import PolicyConfig
from mouthguard.policy.facts import CheckpointFacts, CopyFacts, check_time, format_duration
from mouthguard.policy.placement import Placement, ordered_copies, protection_status
from mouthguard.policy.retention import RetentionDecision

ActionKind = Literal["keep", "trash", "purge", "demote"]


@dataclass(frozen=True)
class CopyAction:
    """What to do with one tier's copy of a checkpoint.

    Attributes:
        tier: the tier holding the copy.
        action: ``keep``, ``trash``, ``purge`` or ``demote`` (see the module doc).
        reason: why, for operators and logs.
    """

    tier: str
    action: ActionKind
    reason: str


def decide_deletions(
    checkpoint: CheckpointFacts,
    retention: RetentionDecision,
    placement: Placement,
    config: PolicyConfig,
    now: float,
) -> list[CopyAction]:
    """Decide what happens to each copy of ``checkpoint``.

    Args:
        checkpoint: the checkpoint and its copies.
        retention: retention's decision for it (from :func:`decide_retention`
            over the whole store, so recovery points and pins are known).
        placement: :func:`placement_for` for the checkpoint's importance.
        config: the policy configuration (trash delays).
        now: the current unix time.

    Returns:
        One action per copy: configured tiers in configured order, then copies
        on unconfigured tiers by name.

    Raises:
        ValueError: ``retention`` or ``placement`` is for another checkpoint or
            level, or ``now`` is not finite.
    """
    now = check_time("now", now)
    if retention.key != checkpoint.key:
        raise ValueError(f"retention decision {retention.key} is not for {checkpoint.label}")
    if placement.importance is not checkpoint.importance:
        raise ValueError(
            f"placement for {placement.importance.value} given for {checkpoint.label}, "
            f"which is {checkpoint.importance.value}"
        )
    copies = ordered_copies(checkpoint.copies, placement)
    stays = (
        retention.keep
        or retention.newest_valid
        or config.level(checkpoint.importance).never_auto_delete
    )
    actions = []
    for copy in copies:
        if checkpoint.held:
            lifted = "; its trash mark is lifted" if copy.trashed else ""
            actions.append(CopyAction(copy.tier, "keep", f"held: a hold blocks deletion{lifted}"))
        elif placement.tier(copy.tier) is None:
            actions.append(
                CopyAction(copy.tier, "keep", f"tier {copy.tier} is not configured: left alone")
            )
        elif stays:
            transient = config.level(checkpoint.importance).fast_only
            actions.append(_kept_copy(checkpoint, copy, retention, placement, transient))
        else:
            actions.append(_dropped_copy(checkpoint, copy, retention, config, now))
    return actions


def _dropped_copy(
    checkpoint: CheckpointFacts,
    copy: CopyFacts,
    retention: RetentionDecision,
    config: PolicyConfig,
    now: float,
) -> CopyAction:
    """The checkpoint goes: trash first, purge once the delay has passed."""
    delay = config.trash_delay(checkpoint.importance)
    if copy.trashed_at is None:
        why = "; ".join(retention.reasons)
        when = f"after {format_duration(delay)} in trash" if delay > 0 else "on the next pass"
        return CopyAction(copy.tier, "trash", f"not kept ({why}); purge {when}")
    waited = now - copy.trashed_at
    if waited >= delay:
        return CopyAction(
            copy.tier,
            "purge",
            f"in trash for {format_duration(waited)}, delay {format_duration(delay)} has passed",
        )
    return CopyAction(
        copy.tier,
        "trash",
        f"in trash for {format_duration(waited)}; purge after {format_duration(delay)} "
        f"({format_duration(delay - waited)} left)",
    )


def _kept_copy(
    checkpoint: CheckpointFacts,
    copy: CopyFacts,
    retention: RetentionDecision,
    placement: Placement,
    transient: bool,
) -> CopyAction:
    """The checkpoint stays: keep (restore) every copy, demote an unpinned fast copy."""
    if copy.trashed:
        # Restore first, decide a demotion on the next pass: one change at a time.
        why = retention.reasons[0] if retention.keep else "the checkpoint must stay"
        return CopyAction(copy.tier, "keep", f"restore from trash: {why}")
    if not _is_fast(copy.tier, placement):
        return CopyAction(copy.tier, "keep", "replica of a kept checkpoint")
    if transient:
        # The fast copy is the only copy transient may have; it leaves by retention.
        return CopyAction(copy.tier, "keep", "the only copy a transient checkpoint has")
    if retention.pinned_on_fast:
        return CopyAction(copy.tier, "keep", "; ".join(retention.pin_reasons))
    blocker = _demotion_blocker(checkpoint, placement)
    if blocker is not None:
        return CopyAction(copy.tier, "keep", f"stays on fast: {blocker}")
    rest = _off_fast(checkpoint.copies, placement)
    held_by = ", ".join(c.tier for c in rest if c.verified)
    return CopyAction(
        copy.tier,
        "demote",
        f"not pinned on fast; protected without it by verified copies on {held_by}",
    )


def _demotion_blocker(checkpoint: CheckpointFacts, placement: Placement) -> str | None:
    """Why the fast copies cannot go yet, or ``None`` when they can.

    Every fast-tier copy is left out at once, so two fast tiers (RAM and NVMe)
    can never each be demoted on the strength of the other.
    """
    rest = _off_fast(checkpoint.copies, placement)
    durable = {t.name for t in placement.tiers if t.durable}
    if not any(c.verified and c.tier in durable for c in rest):
        return "no verified copy on another durable tier yet"
    protection = protection_status(replace(checkpoint, copies=tuple(rest)), placement)
    if protection.state != "protected":
        return "without it " + "; ".join(protection.missing)
    return None


def _off_fast(copies: Sequence[CopyFacts], placement: Placement) -> list[CopyFacts]:
    """Live copies on configured tiers other than the fast ones."""
    return [
        c
        for c in ordered_copies(copies, placement)
        if not c.trashed and placement.tier(c.tier) is not None and not _is_fast(c.tier, placement)
    ]


def _is_fast(name: str, placement: Placement) -> bool:
    tier = placement.tier(name)
    return name == placement.fast_tier or (tier is not None and tier.is_fast)
