"""Replication: make every committed checkpoint meet its placement, verified.

For each checkpoint the pure policy (:func:`placement_for`) names the target
tiers for its importance. The replicator copies the checkpoint to each target
that lacks a *verified* copy, from a source whose bytes check out (fast tier
first), reading every destination byte back before the copy counts. A source
that fails its checksums during a copy is skipped for the next source: a damaged
copy is never propagated. A damaged copy is set aside (moved out of sight, bytes
kept) only once a second read confirms the damage and an intact copy exists to
replace it; the last copies of a checkpoint are never hidden, whatever their state.

Where the policy asks for a legal hold (critical) and the tier supports Object
Lock, the copy's objects are put under hold; the hint (importance) is passed
down as annotations on every copy.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.gathering import CheckpointView, gather, tier_facts
from mouthguard.checkpoint.quarantine import SetAside, set_aside_confirmed
from mouthguard.checkpoint.sidecars import (
    CopyRef,
    clear_legal_hold_mark,
    has_legal_hold_mark,
    mark_checked,
    mark_legal_hold,
    mark_suspect,
    place_hold,
    write_importance,
)
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.verification import verify_and_record
from mouthguard.clock import SYSTEM_CLOCK, Clock
from mouthguard.errors import CheckpointExistsError, MouthguardError
from mouthguard.format.manifest import MANIFEST_NAME
from mouthguard.jobs.burst import BurstGate
from mouthguard.jobs.copy import CopyResult, SourceDamagedError, copy_checkpoint
from mouthguard.policy.config import PolicyConfig
from mouthguard.policy.placement import Placement, placement_for, protection_status
from mouthguard.tiers.base import Tier

log = logging.getLogger(__name__)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Shortfall:
    """A checkpoint whose placement could not be met (yet), and why."""

    run: str
    step: int
    reason: str


@dataclass
class ReplicationReport:
    """What one pass did."""

    copies: list[CopyResult] = field(default_factory=list)
    shortfalls: list[Shortfall] = field(default_factory=list)
    protected: int = 0
    checked: int = 0

    @property
    def copied_bytes(self) -> int:
        """Bytes copied (and read back) in this pass."""
        return sum(c.nbytes for c in self.copies)


class Replicator:
    """Copies checkpoints between the tiers of one store until placements are met.

    Args:
        store: the store whose tiers are managed.
        policy: importance policy (default: ``PolicyConfig()``, the default levels).
        gate: burst gate shared with the savers of this process.
        clock: what :meth:`wait_protected` waits on (the real clock by default).
    """

    def __init__(
        self,
        store: Store,
        policy: PolicyConfig | None = None,
        gate: BurstGate | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.policy = policy or PolicyConfig()
        self.gate = gate or BurstGate(clock=clock)
        self.clock = clock

    def placement(self, view: CheckpointView) -> Placement:
        """The policy's placement for a checkpoint, on this store's tiers."""
        return placement_for(view.facts.importance, tier_facts(self.store), self.policy)

    def replicate(
        self, run: str, step: int, report: ReplicationReport | None = None
    ) -> ReplicationReport:
        """Bring one checkpoint to its placement. Never raises for bad data or a failing tier.

        1. Every existing copy without a valid receipt (new, or reported damaged
           by a reader) is read back in place; confirmed damage is set aside.
        2. Each target tier still lacking a verified copy gets one, copied from
           an intact source (fast first) and read back before it counts.
        """
        report = report if report is not None else ReplicationReport()
        try:
            return self._replicate(run, step, report)
        except MouthguardError as exc:
            # A tier failing mid-way (listing, sidecars, legal holds): this checkpoint
            # waits for the next pass; the pass goes on with the others.
            report.shortfalls.append(Shortfall(run, step, f"replication interrupted: {exc}"))
            return report

    def _replicate(self, run: str, step: int, report: ReplicationReport) -> ReplicationReport:
        view = gather(self.store, run, step)
        if view is None:
            key = catalog.manifest_key(run, step)
            if any(tier.exists(key) for tier in self.store.tiers):  # not just deleted meanwhile
                report.shortfalls.append(Shortfall(run, step, "no tier could read its manifest"))
            return report
        if any(c.trashed_at is not None for c in view.facts.copies):
            # Retention is removing it: copying it again would undo a purge on one
            # tier while another still waits out the delay. A lifted mark resumes it.
            return report
        report.checked += 1
        placement = self.placement(view)
        if not placement.satisfiable:
            report.shortfalls.append(Shortfall(run, step, "; ".join(placement.missing)))
        good = self._confirm_copies(view, report)
        self._sync_facts(view, good, report)
        for target in placement.targets:
            if any(t.name == target for t in good):
                continue
            result = self._copy_to(view, self.store.tier(target), good, report)
            if result is not None:
                report.copies.append(result)
                good.append(self.store.tier(target))
        final = gather(self.store, run, step)  # now including the copies just made
        if final is None:
            return report
        # Storage-level legal hold while critical or held; released once neither is true.
        self._legal_hold(final, placement, on=placement.legal_hold or final.facts.held)
        if protection_status(final.facts, placement).state == "protected":
            report.protected += 1
        return report

    def _confirm_copies(self, view: CheckpointView, report: ReplicationReport) -> list[Tier]:
        """Tiers whose copy is verified: by a receipt, or by reading it back now.

        A copy found damaged is set aside only when a second read confirms the
        damage *and* an intact copy exists to replace it from; the last copies of
        a checkpoint stay where they are, reported as damaged, never hidden.
        """
        run, step = view.facts.run, view.facts.step
        receipts = {c.tier for c in view.facts.copies if c.verified}
        good: list[Tier] = []
        suspects: list[tuple[CopyRef, str]] = []
        for tier in view.readable:
            if tier.name in receipts:
                good.append(tier)
                continue
            ref = CopyRef(tier, run, step)
            # A new copy's first read-back is as long as a copy: it yields to saves too.
            verdict = verify_and_record(ref, pause=self.gate.wait)
            if verdict.ok:
                good.append(tier)  # verified just now, whether or not the receipt was written
                if verdict.record_error:
                    reason = f"cannot record {ref}: {verdict.record_error}"
                    report.shortfalls.append(Shortfall(run, step, reason))
            elif verdict.damaged:
                suspects.append((ref, verdict.reason))
            else:
                reason = f"cannot verify {ref}: {verdict.reason}"
                report.shortfalls.append(Shortfall(run, step, reason))
        suspects += [(CopyRef(tier, run, step), reason) for tier, reason in view.damaged]
        for ref, reason in suspects:
            report.shortfalls.append(Shortfall(run, step, self._set_aside(ref, reason, good)))
        return good

    @staticmethod
    def _set_aside(ref: CopyRef, reason: str, intact: list[Tier]) -> str:
        """Set a damaged copy aside if it can be replaced; say what happened."""
        if not any(t is not ref.tier for t in intact):
            return (
                f"copy on {ref.tier.name} damaged, no intact copy to repair from: kept ({reason})"
            )
        outcome = set_aside_confirmed(ref, reason)
        if outcome is SetAside.NOT_CONFIRMED:
            return f"cannot read {ref} ({reason}); a second read found no damage: kept"
        return f"copy on {ref.tier.name} damaged: {reason}"

    def _sync_facts(
        self, view: CheckpointView, good: list[Tier], report: ReplicationReport
    ) -> None:
        """Give every intact copy the holds, the newest importance change and the check verdict.

        A copy committed by a replicator that died before copying the facts (or a
        hold placed while a tier was unreachable) would otherwise lose them once
        the other copies go. Holds and suspect marks only ever spread, never
        vanish, this way (a suspect copy left alone on a tier would otherwise be
        resumed from once the marked copy is demoted); a passed check spreads
        only while no copy is suspect.
        """
        run, step = view.facts.run, view.facts.step
        facts = dict(view.sidecars)
        holds = {h.name: h for _, side in view.sidecars for h in side.holds}
        changes = [s for _, s in view.sidecars if s.importance is not None]
        newest = max(changes, key=lambda s: s.importance_changed_at or _EPOCH, default=None)
        suspect = next((s.suspect for _, s in view.sidecars if s.suspect), "")
        checked = next((s.checked_at for _, s in view.sidecars if s.checked_at), None)
        for tier in good:
            side = facts.get(tier.name)
            if side is None:
                continue
            ref = CopyRef(tier, run, step)
            try:
                have = {h.name for h in side.holds}
                for name, hold in holds.items():
                    if name not in have:
                        place_hold(ref, name, hold.reason, hold.placed_at or _now())
                if (
                    newest is not None
                    and newest.importance is not None
                    and (
                        side.importance is not newest.importance
                        or side.importance_changed_at != newest.importance_changed_at
                    )
                ):
                    when = newest.importance_changed_at or _now()
                    write_importance(ref, newest.importance, newest.importance_reason, when)
                if suspect and not side.suspect:
                    mark_suspect(ref, suspect, _now())
                elif checked is not None and not suspect and side.checked_at is None:
                    mark_checked(ref, checked)
            except MouthguardError as exc:
                report.shortfalls.append(Shortfall(run, step, f"cannot sync facts to {ref}: {exc}"))

    def _copy_to(
        self, view: CheckpointView, dst: Tier, good: list[Tier], report: ReplicationReport
    ) -> CopyResult | None:
        run, step = view.facts.run, view.facts.step
        for src in [t for t in good if t is not dst]:
            try:
                why = f"replication: the placement needs a copy on {dst.name}"
                return copy_checkpoint(src, dst, run, step, gate=self.gate, reason=why)
            except SourceDamagedError as exc:
                # Never propagate a damaged copy: try the next source, and set this
                # one aside (if confirmed) when another intact copy can replace it.
                good.remove(src)
                reason = self._set_aside(CopyRef(src, run, step), str(exc), good)
                report.shortfalls.append(Shortfall(run, step, f"source damaged: {reason}"))
            except CheckpointExistsError as exc:
                if _same_copy_made_meanwhile(src, dst, run, step):
                    # Another replicator on this store (a second trainer's service)
                    # committed it first: the copy exists, nothing fell short.
                    log.info("%s step %d: %s made meanwhile, identical", run, step, dst.name)
                    return None
                reason = f"copy {src.name} -> {dst.name} failed: {exc}"
                report.shortfalls.append(Shortfall(run, step, reason))
                return None
            except MouthguardError as exc:
                reason = f"copy {src.name} -> {dst.name} failed: {exc}"
                report.shortfalls.append(Shortfall(run, step, reason))
                return None
        report.shortfalls.append(Shortfall(run, step, f"no intact source for a copy to {dst.name}"))
        return None

    def _legal_hold(self, view: CheckpointView, placement: Placement, *, on: bool) -> None:
        """Place (or release) Object Lock legal holds on a copy's objects.

        A ``sidecar.legal-hold.json`` mark records that mouthguard placed them,
        so releasing costs one lookup per copy and never touches holds placed by
        someone else on a checkpoint mouthguard never held.
        """
        for tier in self.store.tiers:
            if not tier.capabilities.object_lock or tier not in view.readable:
                continue
            if on and tier.name not in placement.targets:
                continue
            ref = CopyRef(tier, view.facts.run, view.facts.step)
            if not on and not has_legal_hold_mark(ref):
                continue
            try:
                for name in [*(f.name for f in view.manifest.files), MANIFEST_NAME]:
                    tier.set_legal_hold(ref.key(name), on)
                if on:
                    mark_legal_hold(ref, dt.datetime.now(dt.UTC))
                else:
                    clear_legal_hold_mark(ref)
                    log.info("released the legal hold on %s (no longer critical or held)", ref)
            except MouthguardError as exc:
                log.warning("legal hold %s on %s failed: %s", "on" if on else "off", ref, exc)

    def targets(self, runs: Iterable[str] | None = None) -> list[tuple[str, int]]:
        """The checkpoints a pass visits, in order: every run, newest step first."""
        chosen = list(runs) if runs is not None else self._runs()
        return [(run, step) for run in chosen for step in self._steps(run)]

    def _runs(self) -> list[str]:
        """Runs on any tier; a tier that cannot list is skipped (the next pass retries)."""
        found: set[str] = set()
        for tier in self.store.tiers:
            try:
                found.update(catalog.list_runs(tier))
            except MouthguardError as exc:
                log.warning("cannot list the runs on tier %s: %s", tier.name, exc)
        return sorted(found)

    def _steps(self, run: str) -> list[int]:
        """Committed steps of ``run``, newest first, tolerant of a failing tier.

        A step whose manifest cannot even be looked up is still visited:
        :meth:`replicate` then reports what fails for that one checkpoint, and
        one flaky checkpoint never hides the others from the pass.
        """
        try:
            steps = catalog.committed_steps_on(self.store.tiers, run, include_unsure=True)
        except MouthguardError as exc:
            log.warning("cannot list %s on any tier: %s", run, exc)
            return []
        return steps[::-1]

    def run_once(
        self,
        runs: Iterable[str] | None = None,
        *,
        on_checkpoint: Callable[[str, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        report: ReplicationReport | None = None,
    ) -> ReplicationReport:
        """One pass over every committed checkpoint (newest first within a run).

        Args:
            runs: only these runs (default: all).
            on_checkpoint: called with ``(run, step)`` after each checkpoint (progress).
            should_stop: checked between checkpoints (never inside a copy); a True
                ends the pass early.
            report: a report to fill as the pass goes (visible to another thread
                while the pass runs); a new one by default.
        """
        report = report if report is not None else ReplicationReport()
        try:
            targets = self.targets(runs)
        except MouthguardError as exc:
            report.shortfalls.append(Shortfall("-", 0, f"cannot list checkpoints: {exc}"))
            return report
        for run, step in targets:
            if should_stop is not None and should_stop():
                break
            self.replicate(run, step, report)
            if on_checkpoint is not None:
                on_checkpoint(run, step)
        return report

    def wait_protected(self, run: str, step: int, timeout: float) -> bool:
        """Replicate ``run``/``step`` in this thread until protected or ``timeout`` passes.

        One attempt at least, then one every half second (on :attr:`clock`) while
        time is left; True as soon as an attempt leaves the checkpoint protected.
        """
        deadline = self.clock.monotonic() + timeout
        while True:
            report = self.replicate(run, step)
            if report.protected:
                return True
            if self.clock.monotonic() >= deadline:
                return False
            self.clock.sleep(min(0.5, max(0.0, deadline - self.clock.monotonic())))


def _same_copy_made_meanwhile(src: Tier, dst: Tier, run: str, step: int) -> bool:
    """Whether ``dst`` now holds a copy with ``src``'s very manifest that reads back intact."""
    key = catalog.manifest_key(run, step)
    try:
        same = dst.get(key) == src.get(key)
    except MouthguardError:
        return False
    return same and verify_and_record(CopyRef(dst, run, step)).ok
