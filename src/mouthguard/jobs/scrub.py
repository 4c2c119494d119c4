"""Scrubbing: re-verify copies on a schedule, so silent damage is found before it is needed.

A receipt says a copy was good *when it was read*. Bits rot, files get truncated
by a full disk or a cleanup script, object stores lose parts. The scrubber
re-reads every copy whose receipt is older than ``max_age`` (or that has none),
oldest first, within an optional byte budget per pass so it never monopolises a
tier. A copy that verifies gets a fresh receipt; a damaged one gets a damage
report and is set aside, and the replicator makes a new copy from an intact one.
Transient errors (the tier is unreachable) change nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass, field

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.facts import gather, runs_of, steps_of
from mouthguard.checkpoint.quarantine import set_aside
from mouthguard.checkpoint.reader import read_manifest, verify_copy
from mouthguard.checkpoint.sidecars import CopyRef, report_damage, write_receipt
from mouthguard.checkpoint.store import Store
from mouthguard.errors import MouthguardError, is_data_damage
from mouthguard.jobs.burst import BurstGate

log = logging.getLogger(__name__)

#: Re-verify a copy once its receipt is a week old.
DEFAULT_MAX_AGE_SECONDS = 7 * 86400.0


@dataclass(frozen=True)
class ScrubResult:
    """The verdict on one copy."""

    run: str
    step: int
    tier: str
    ok: bool
    reason: str
    nbytes: int


@dataclass
class ScrubReport:
    """What one scrub pass did."""

    results: list[ScrubResult] = field(default_factory=list)
    skipped_fresh: int = 0

    @property
    def damaged(self) -> list[ScrubResult]:
        """Copies found damaged (and set aside)."""
        return [r for r in self.results if not r.ok and r.reason.startswith("damaged")]


def scrub(
    store: Store,
    *,
    max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS,
    budget_bytes: int | None = None,
    now: float | None = None,
    gate: BurstGate | None = None,
) -> ScrubReport:
    """Re-verify every copy whose last verification is older than ``max_age_seconds``.

    Oldest receipts (and copies never verified) first; stops starting new copies
    once ``budget_bytes`` have been read. Never raises for bad data or a failing tier.
    """
    now = time.time() if now is None else now
    due: list[tuple[float, CopyRef, int]] = []
    report = ScrubReport()
    for run in runs_of(store):
        for step in steps_of(store, run):
            view = gather(store, run, step)
            if view is None:
                continue
            for copy in view.facts.copies:
                age = now - copy.verified_at if copy.verified_at is not None else float("inf")
                if age < max_age_seconds:
                    report.skipped_fresh += 1
                    continue
                ref = CopyRef(store.tier(copy.tier), run, step)
                due.append((copy.verified_at or 0.0, ref, view.manifest.nbytes))
    read = 0
    for _, ref, nbytes in sorted(due, key=lambda d: d[0]):
        if budget_bytes is not None and read >= budget_bytes:
            break
        if gate is not None:
            gate.wait()
        report.results.append(_scrub_copy(ref, nbytes))
        read += nbytes
    return report


def _scrub_copy(ref: CopyRef, nbytes: int) -> ScrubResult:
    try:
        manifest = read_manifest(ref.tier, ref.run, ref.step)
        verify_copy(ref.tier, ref.prefix, manifest)
        raw = ref.tier.get(catalog.manifest_key(ref.run, ref.step))
        write_receipt(ref, raw, dt.datetime.now(dt.UTC))
    except MouthguardError as exc:
        if not is_data_damage(exc):
            return ScrubResult(ref.run, ref.step, ref.tier.name, False, f"unreachable: {exc}", 0)
        log.warning("scrub found %s damaged: %s", ref, exc)
        try:
            report_damage(ref, str(exc), dt.datetime.now(dt.UTC))
            set_aside(ref, f"scrub: {exc}")
        except MouthguardError as inner:
            log.warning("could not set aside %s: %s", ref, inner)
        return ScrubResult(ref.run, ref.step, ref.tier.name, False, f"damaged: {exc}", nbytes)
    return ScrubResult(ref.run, ref.step, ref.tier.name, True, "ok", nbytes)
