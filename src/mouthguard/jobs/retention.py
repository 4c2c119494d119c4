"""Applying retention: the policy decides, this module carries it out through the trash.

For every checkpoint of the store, :func:`decide_retention` says keep or drop
(with reasons) and :func:`decide_deletions` turns that into one action per
copy. Execution:

``keep``    lift a trash mark if the copy has one (the policy changed its mind)
``trash``   write the trash mark (a sidecar) unless one is already there
``purge``   delete the copy: manifest first, so the copy is uncommitted (invisible)
            before any data object goes; then the data; then the sidecars
``demote``  delete the fast copy the same way (a verified placement remains elsewhere)

The blast-radius limit (:mod:`mouthguard.policy.blast_radius`): before any
action runs, a run whose pass would start deleting more than
``policy.max_delete_share`` of its checkpoints, or any milestone, has all its
trash and purge actions withheld (``report.refused`` says what they would have
deleted and why); ``force=True`` lifts the limit.

Copies of one checkpoint are purged in tier order (the fast tier first, the
farthest region last); a purge that fails holds back the later ones of that
checkpoint until a later pass, so the copy in another region is never the first
to go.

Safety is the policy's job (holds, the newest valid checkpoint, the last
verified copy, the trash delay are all enforced there and tested there); this
module adds one guard of its own: before deleting a copy it re-reads the facts,
so a hold placed or a copy lost since the decision is honoured.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mouthguard.checkpoint.audit import audited
from mouthguard.checkpoint.gathering import CheckpointView, gather, runs_of, steps_of, tier_facts
from mouthguard.checkpoint.reader import Pause
from mouthguard.checkpoint.sidecars import (
    CopyRef,
    mark_trashed,
    restore_from_trash,
)
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.verification import verify_and_record
from mouthguard.errors import MouthguardError
from mouthguard.format.manifest import MANIFEST_NAME
from mouthguard.policy.blast_radius import Refusal, check_blast_radius
from mouthguard.policy.config import PolicyConfig
from mouthguard.policy.deletion import CopyAction, decide_deletions
from mouthguard.policy.facts import TierFacts
from mouthguard.policy.placement import placement_for
from mouthguard.policy.retention import RetentionDecision, decide_retention

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppliedAction:
    """One copy action, and whether it was carried out."""

    run: str
    step: int
    action: CopyAction
    done: bool
    error: str | None = None


@dataclass
class RetentionReport:
    """Decisions and actions of one retention pass."""

    decisions: list[RetentionDecision] = field(default_factory=list)
    actions: list[AppliedAction] = field(default_factory=list)
    dry_run: bool = False
    #: Runs left alone this pass because a tier failed while reading their facts.
    skipped: list[str] = field(default_factory=list)
    #: Runs whose deletions the blast-radius limit withheld this pass.
    refused: list[Refusal] = field(default_factory=list)

    def count(self, kind: str) -> int:
        """How many actions of ``kind`` were (or would be, in a dry run) carried out."""
        return sum(a.action.action == kind and (a.done or self.dry_run) for a in self.actions)


def delete_copy(ref: CopyRef) -> int:
    """Delete every object of one copy, manifest first; return how many were deleted."""
    deleted = int(ref.tier.delete(ref.key(MANIFEST_NAME)))
    for key in list(ref.tier.list(ref.prefix)):
        deleted += int(ref.tier.delete(key))
    return deleted


def _first_damaged_other_copy(
    view: CheckpointView, tier: str, when: dt.datetime, pause: Pause | None = None
) -> str | None:
    """Re-read every other copy before a demotion deletes this one; why not, if any fails.

    The policy allows a demotion on the strength of receipts, but receipts age:
    a copy may have rotted since it was read back. A demotion is irreversible, so
    the copies that justify it are verified again first; a damaged one gets a
    damage report (the replicator repairs it) and the demotion waits.
    """
    for other, reason in (*view.unreachable, *view.damaged):
        if other.name != tier:  # a copy the demotion may count on cannot even be read
            return f"not demoted: the copy on {other.name} cannot be read ({reason})"
    for other in view.readable:
        if other.name == tier:
            continue
        verdict = verify_and_record(
            CopyRef(other, view.facts.run, view.facts.step), now=lambda: when, pause=pause
        )
        if not verdict.ok:  # damage is recorded for the replicator; unreachable just waits
            return f"not demoted: the copy on {other.name} failed its re-check ({verdict.reason})"
    return None


def apply_retention(
    store: Store,
    policy: PolicyConfig | None = None,
    *,
    now: float | None = None,
    dry_run: bool = False,
    runs: Iterable[str] | None = None,
    pause: Pause | None = None,
    force: bool = False,
    max_delete_share: float | None = None,
    actor: str | None = None,
) -> RetentionReport:
    """Decide and (unless ``dry_run``) apply retention to every checkpoint of ``store``.

    Never raises for a failing tier: failures are recorded per action, and a run
    whose facts cannot all be read is skipped whole (``report.skipped``).

    ``pause`` (the background service passes its burst gate's ``wait``) is called
    before every action and between the chunks of a demotion's re-reads, so
    retention never competes with a checkpoint save for the disk.

    ``max_delete_share`` overrides the policy's blast-radius limit for this pass;
    ``force`` lifts it (and the milestone rule) entirely.

    Every trash, restore, purge and demotion is recorded in the audit trail of
    the copy's tier (:mod:`mouthguard.checkpoint.audit`) by ``actor`` (default
    ``user@host``), its intent before the act.

    Raises:
        ValueError: ``max_delete_share`` is not in (0, 1].
    """
    policy = policy or store.policy
    now = time.time() if now is None else now
    views: list[CheckpointView] = []
    report = RetentionReport(dry_run=dry_run)
    try:
        chosen = list(runs) if runs is not None else runs_of(store)
    except MouthguardError as exc:
        report.skipped.append(f"cannot list the runs: {exc}")
        return report
    for run in chosen:
        try:
            run_views = [v for step in steps_of(store, run) if (v := gather(store, run, step))]
        except MouthguardError as exc:
            # Deciding on part of a run could count the wrong checkpoints as the
            # newest: the whole run waits for the next pass.
            report.skipped.append(f"run {run}: {exc}")
            continue
        views.extend(run_views)
    share = policy.max_delete_share if max_delete_share is None else max_delete_share
    report.decisions, planned = plan_retention(views, tier_facts(store), policy, now)
    if not force:
        planned = _within_blast_radius(views, planned, share, report)
    # Copies are purged in tier order (fast first, the farthest region last). A purge
    # that fails holds back the later ones of that checkpoint until the next pass, so
    # a copy in another region is never the first to go.
    stalled: dict[tuple[str, int], str] = {}
    for view, action in planned:
        key = view.facts.key
        if action.action == "purge" and key in stalled:
            why = f"waits: the copy on {stalled[key]} was not purged first"
            report.actions.append(AppliedAction(key[0], key[1], action, False, why))
            continue
        if pause is not None and not dry_run:
            pause()
        applied = _apply(store, view, action, now, dry_run, pause, actor)
        if action.action == "purge" and applied.error is not None:
            stalled[key] = action.tier
        report.actions.append(applied)
    return report


def _within_blast_radius(
    views: Sequence[CheckpointView],
    planned: list[tuple[CheckpointView, CopyAction]],
    share: float,
    report: RetentionReport,
) -> list[tuple[CheckpointView, CopyAction]]:
    """``planned`` less the trash and purge actions of runs the limit refuses."""
    refusals = check_blast_radius(
        [v.facts for v in views], [(v.facts, a) for v, a in planned], share
    )
    report.refused.extend(refusals)
    for refusal in refusals:
        steps = ", ".join(str(d.step) for d in refusal.would_delete)
        log.warning("retention of run %s refused: %s (steps %s)", refusal.run, refusal.why, steps)
    refused = {r.run for r in refusals}
    return [
        (v, a)
        for v, a in planned
        if v.facts.run not in refused or a.action not in ("trash", "purge")
    ]


def plan_retention(
    views: Sequence[CheckpointView],
    tiers: Sequence[TierFacts],
    policy: PolicyConfig,
    now: float,
) -> tuple[list[RetentionDecision], list[tuple[CheckpointView, CopyAction]]]:
    """The pure policy's verdict on gathered checkpoints: decisions, then one action per copy.

    No I/O: what :func:`apply_retention` carries out (or reports, in a dry run),
    and what ``mouthguard serve`` shows as pending, from the same functions.
    """
    decisions = decide_retention([v.facts for v in views], policy, now)
    by_key = {d.key: d for d in decisions}
    planned: list[tuple[CheckpointView, CopyAction]] = []
    for view in views:
        placement = placement_for(view.facts.importance, tiers, policy)
        planned.extend(
            (view, action)
            for action in decide_deletions(
                view.facts, by_key[view.facts.key], placement, policy, now
            )
        )
    return decisions, planned


def _carry_out(  # noqa: PLR0917 - one action's whole context, from one caller
    store: Store,
    view: CheckpointView,
    ref: CopyRef,
    action: CopyAction,
    when: dt.datetime,
    pause: Pause | None,
) -> AppliedAction:
    """Do one copy action (its audit record is the caller's)."""
    run, step = view.facts.run, view.facts.step
    if action.action == "keep":
        return AppliedAction(run, step, action, restore_from_trash(ref))
    if action.action == "trash":
        mark_trashed(ref, action.reason, when)
        return AppliedAction(run, step, action, True)
    # purge or demote
    fresh = gather(store, run, step)
    if fresh is None or fresh.facts.held:
        return AppliedAction(run, step, action, False, "held since the decision: kept")
    if action.action == "demote":
        damage = _first_damaged_other_copy(fresh, action.tier, when, pause=pause)
        if damage is not None:
            return AppliedAction(run, step, action, False, damage)
    done = delete_copy(ref) > 0
    log.warning("retention %s %s: %s", action.action, ref, action.reason)
    return AppliedAction(run, step, action, done)


def _apply(  # noqa: PLR0917 - one action's whole context, from one caller
    store: Store,
    view: CheckpointView,
    action: CopyAction,
    now: float,
    dry_run: bool,
    pause: Pause | None,
    actor: str | None,
) -> AppliedAction:
    run, step = view.facts.run, view.facts.step
    copy = next((c for c in view.facts.copies if c.tier == action.tier), None)
    if dry_run or copy is None:
        return AppliedAction(run, step, action, done=False)
    ref = CopyRef(store.tier(action.tier), run, step)
    when = dt.datetime.fromtimestamp(now, dt.UTC)
    if action.action == "keep" and copy.trashed_at is None:
        return AppliedAction(run, step, action, False)  # nothing to do: no act, no record
    if action.action == "trash" and copy.trashed_at is not None:
        return AppliedAction(run, step, action, False)  # still waiting out the delay
    act = "restore" if action.action == "keep" else action.action
    try:
        with audited(act, run, step, [ref.tier], action.reason, actor, store.manifest_keys) as out:
            applied = _carry_out(store, view, ref, action, when, pause)
            if not applied.done:
                out.result, out.detail = "not needed", applied.error or ""
            return applied
    except MouthguardError as exc:
        log.warning("retention %s of %s failed: %s", action.action, ref, exc)
        return AppliedAction(run, step, action, False, str(exc))
