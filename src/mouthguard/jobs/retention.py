"""Applying retention: the policy decides, this module carries it out through the trash.

For every checkpoint of the store, :func:`decide_retention` says keep or drop
(with reasons) and :func:`decide_deletions` turns that into one action per
copy. Execution:

``keep``    lift a trash mark if the copy has one (the policy changed its mind)
``trash``   write the trash mark (a sidecar) unless one is already there
``purge``   delete the copy: manifest first, so the copy is uncommitted (invisible)
            before any data object goes; then the data; then the sidecars
``demote``  delete the fast copy the same way (a verified placement remains elsewhere)

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
) -> RetentionReport:
    """Decide and (unless ``dry_run``) apply retention to every checkpoint of ``store``.

    Never raises for a failing tier: failures are recorded per action, and a run
    whose facts cannot all be read is skipped whole (``report.skipped``).

    ``pause`` (the background service passes its burst gate's ``wait``) is called
    before every action and between the chunks of a demotion's re-reads, so
    retention never competes with a checkpoint save for the disk.
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
    report.decisions, planned = plan_retention(views, tier_facts(store), policy, now)
    for view, action in planned:
        if pause is not None and not dry_run:
            pause()
        report.actions.append(_apply(store, view, action, now, dry_run, pause))
    return report


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


def _apply(  # noqa: PLR0917 - one action's whole context, from one caller
    store: Store,
    view: CheckpointView,
    action: CopyAction,
    now: float,
    dry_run: bool,
    pause: Pause | None,
) -> AppliedAction:
    run, step = view.facts.run, view.facts.step
    copy = next((c for c in view.facts.copies if c.tier == action.tier), None)
    if dry_run or copy is None:
        return AppliedAction(run, step, action, done=False)
    ref = CopyRef(store.tier(action.tier), run, step)
    when = dt.datetime.fromtimestamp(now, dt.UTC)
    try:
        if action.action == "keep":
            done = copy.trashed_at is not None and restore_from_trash(ref)
        elif action.action == "trash":
            done = copy.trashed_at is None
            if done:
                mark_trashed(ref, action.reason, when)
        else:  # purge or demote
            fresh = gather(store, run, step)
            if fresh is None or fresh.facts.held:
                return AppliedAction(run, step, action, False, "held since the decision: kept")
            if action.action == "demote":
                damage = _first_damaged_other_copy(fresh, action.tier, when, pause=pause)
                if damage is not None:
                    return AppliedAction(run, step, action, False, damage)
            done = delete_copy(ref) > 0
            log.warning("retention %s %s: %s", action.action, ref, action.reason)
    except MouthguardError as exc:
        log.warning("retention %s of %s failed: %s", action.action, ref, exc)
        return AppliedAction(run, step, action, False, str(exc))
    return AppliedAction(run, step, action, done)
