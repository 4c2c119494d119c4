"""Scrubbing: re-verify copies on a schedule, so silent damage is found before it is needed.

A receipt says a copy was good *when it was read*. Bits rot, files get truncated
by a full disk or a cleanup script, object stores lose parts. The scrubber
re-reads every committed copy whose receipt is older than ``max_age`` (or that
has none -- a copy whose manifest no longer parses included), oldest first,
within an optional byte budget per pass so it never monopolises a tier.

Each copy goes through :func:`~mouthguard.checkpoint.verification.verify_and_record`:
an intact copy gets a fresh receipt, a damaged one a damage report (its receipt
stops vouching, ``ls`` shows it). The scrubber moves nothing: the replicator
confirms the damage with a second read and replaces the copy from an intact one
(the background service hands it every damaged checkpoint the pass found; from
the command line, ``mouthguard replicate``). Unreachable copies change nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mouthguard.checkpoint.sidecars import CopyRef, read_sidecars
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.verification import Status, Verdict, find_copies, verify_and_record
from mouthguard.errors import MouthguardError
from mouthguard.jobs.burst import BurstGate

#: Re-verify a copy once its receipt is a week old.
DEFAULT_MAX_AGE_SECONDS = 7 * 86400.0


@dataclass
class ScrubReport:
    """What one scrub pass found: one verdict per copy read, and what it skipped."""

    results: list[Verdict] = field(default_factory=list)
    skipped_fresh: int = 0
    skipped_budget: int = 0
    unlisted: list[str] = field(default_factory=list)  # "<tier>: <why it could not be listed>"

    def with_status(self, status: Status) -> list[Verdict]:
        """The verdicts of one status, in the order they were read."""
        return [r for r in self.results if r.status is status]

    @property
    def damaged(self) -> list[Verdict]:
        """Copies found damaged (reported; the replicator replaces them)."""
        return self.with_status(Status.DAMAGED)

    def counts(self) -> dict[str, int]:
        """Copies per outcome, as ``scrub`` prints them."""
        return {
            "scrubbed": len(self.results),
            **{s.value: len(self.with_status(s)) for s in Status},
            "skipped_fresh": self.skipped_fresh,
            "skipped_budget": self.skipped_budget,
        }


def scrub(
    store: Store,
    *,
    max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS,
    budget_bytes: int | None = None,
    now: float | None = None,
    gate: BurstGate | None = None,
) -> ScrubReport:
    """Re-verify every committed copy whose last verification is older than ``max_age_seconds``.

    Oldest receipts (and copies never verified, or whose receipt a damage report
    withdrew) first; stops starting new copies once ``budget_bytes`` have been
    read. Never raises for bad data or a failing tier.

    With a ``gate`` every read yields to checkpoint saves: before each copy and
    between the chunks of its read.
    """
    now = time.time() if now is None else now
    due: list[tuple[float, CopyRef]] = []
    report = ScrubReport()
    for ref in find_copies(store, unlisted=report.unlisted):
        try:
            verified_at = read_sidecars(ref).verified_at
        except MouthguardError:
            verified_at = None  # cannot read the facts: read the copy itself
        seen = verified_at.timestamp() if verified_at is not None else None
        if seen is not None and now - seen < max_age_seconds:
            report.skipped_fresh += 1
            continue
        due.append((seen or 0.0, ref))
    read = 0
    due.sort(key=lambda d: d[0])
    for index, (_, ref) in enumerate(due):
        if budget_bytes is not None and read >= budget_bytes:
            report.skipped_budget = len(due) - index
            break
        if gate is not None:
            gate.wait()
        verdict = verify_and_record(ref, pause=gate.wait if gate is not None else None)
        report.results.append(verdict)
        read += verdict.nbytes
    return report
