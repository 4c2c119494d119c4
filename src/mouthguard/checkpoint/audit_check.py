"""Reading the audit trails back: verifying each chain, merging the tiers, pairing acts.

:func:`check_store` walks every tier's trail (:mod:`mouthguard.checkpoint.audit`)
and names each break, by tier and record number:

* a number missing from the sequence -- a **removed** record;
* a record stored under another number than it says -- a **moved** record
  (reordered, or copied over another);
* a record whose ``prev`` is not the digest of the record before it -- the
  record before was **edited** or replaced;
* an unreadable record (not canonical JSON) -- edited or damaged;
* with keys: a record without a valid signature -- forged or edited;
* across tiers: an intent recorded for tiers A and B found only on A -- removed
  from B (this is how a cut tail of one trail shows, while another tier keeps it).

:func:`acts` merges the trails (a record is on every tier its act touched;
duplicates share an id) and pairs each intent with its outcome: an intent
without one is reported as such (the process died mid-act, or the act is still
running).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mouthguard.checkpoint.audit import Entry, read_trail
from mouthguard.errors import MouthguardError
from mouthguard.format.audit_record import GENESIS, StoredRecord, check_mac
from mouthguard.tiers.base import Tier
from mouthguard.tiers.key_material import Keyring


@dataclass(frozen=True)
class Break:
    """One place where a trail is not what was written: tier, record number, what."""

    tier: str
    seq: int
    what: str

    def __str__(self) -> str:
        return f"{self.tier} record {self.seq}: {self.what}"


@dataclass(frozen=True)
class Act:
    """An intent and its outcome (None: none was recorded)."""

    intent: StoredRecord
    outcome: StoredRecord | None

    @property
    def status(self) -> str:
        """``done``, ``failed: ...``, ``not needed``, or ``no outcome recorded``."""
        if self.outcome is None:
            return "no outcome recorded (interrupted, or still running)"
        record = self.outcome.record
        return f"{record.result}: {record.detail}" if record.detail else record.result


@dataclass
class Trails:
    """What was read: every tier's entries, and the tiers that could not be read."""

    entries: dict[str, list[Entry]]
    unreadable: dict[str, str]


def read_trails(tiers: Iterable[Tier], newest: int | None = None) -> Trails:
    """Read the trail of every tier; a tier that fails is listed with its error.

    With ``newest``, only each tier's last ``newest`` records (see
    :func:`~mouthguard.checkpoint.audit.read_trail`).
    """
    trails = Trails({}, {})
    for tier in tiers:
        try:
            trails.entries[tier.name] = read_trail(tier, newest)
        except MouthguardError as exc:
            trails.unreadable[tier.name] = str(exc)
    return trails


def check_chain(entries: Sequence[Entry], keys: Keyring | None) -> list[Break]:
    """The breaks of one tier's trail (see the module doc)."""
    breaks: list[Break] = []
    expected, prev = 0, GENESIS
    link: str | None = prev  # None: the previous record is gone, its digest unknown
    for entry in entries:
        tier = entry.tier
        if entry.seq > expected:
            gap = f"{expected}" if entry.seq == expected + 1 else f"{expected}-{entry.seq - 1}"
            breaks.append(Break(tier, expected, f"record(s) {gap} missing: removed"))
            link = None
        stored = entry.stored
        if stored is None:
            breaks.append(Break(tier, entry.seq, f"unreadable ({entry.error}): edited or damaged"))
            expected, link = entry.seq + 1, None
            continue
        if stored.seq != entry.seq:
            breaks.append(
                Break(tier, entry.seq, f"says it is record {stored.seq}: moved (reordered)")
            )
        elif link is not None and stored.prev != link:
            breaks.append(
                Break(
                    tier,
                    entry.seq - 1,
                    f"edited or replaced: record {entry.seq} was chained to other bytes",
                )
            )
        if keys is not None:
            why = check_mac(stored, keys)
            if why is not None:
                breaks.append(Break(tier, entry.seq, why))
        expected, link = entry.seq + 1, stored.digest
    return breaks


def check_store(tiers: Sequence[Tier], keys: Keyring | None) -> tuple[list[Break], Trails]:
    """Every break of every tier's trail, and of the trails against each other."""
    trails = read_trails(tiers)
    breaks = [b for entries in trails.entries.values() for b in check_chain(entries, keys)]
    breaks.extend(_missing_across(trails))
    return breaks, trails


def _missing_across(trails: Trails) -> list[Break]:
    """Intents recorded for several tiers but absent from one that was read."""
    ids = {
        name: {e.stored.record.id for e in entries if e.stored is not None}
        for name, entries in trails.entries.items()
    }
    failed = {
        e.stored.record.of
        for entries in trails.entries.values()
        for e in entries
        if e.stored is not None and e.stored.record.result == "failed"
    }
    breaks, seen = [], set()
    for name, entries in trails.entries.items():
        for e in entries:
            record = None if e.stored is None else e.stored.record
            if record is None or record.phase != "intent" or record.id in failed:
                continue
            for other in record.tiers:
                if other in ids and record.id not in ids[other] and (other, record.id) not in seen:
                    seen.add((other, record.id))
                    what = (
                        f"the intent of {record.act} {record.run} step {record.step} "
                        f"(record {e.seq} on {name}) is missing here: removed"
                    )
                    breaks.append(Break(other, -1, what))
    return breaks


def merged(trails: Trails) -> list[StoredRecord]:
    """Every record once (tiers share ids), in time order."""
    unique: dict[str, StoredRecord] = {}
    for entries in trails.entries.values():
        for e in entries:
            if e.stored is not None:
                unique.setdefault(e.stored.record.id, e.stored)
    return sorted(unique.values(), key=lambda s: (s.record.time, s.record.id))


def acts(
    records: Iterable[StoredRecord],
    run: str | None = None,
    step: int | None = None,
    since: dt.datetime | None = None,
) -> list[Act]:
    """Intents paired with their outcomes, in time order, filtered by run, step and time."""
    records = list(records)
    outcomes = {s.record.of: s for s in records if s.record.phase == "outcome"}
    chosen = []
    for s in records:
        r = s.record
        if r.phase != "intent" or (run is not None and r.run != run):
            continue
        if step is not None and r.step != step:
            continue
        if since is not None and _time(r.time) < since:
            continue
        chosen.append(Act(s, outcomes.get(r.id)))
    return chosen


def _time(text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return dt.datetime.min.replace(tzinfo=dt.UTC)
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def latest_acts(
    records: Iterable[StoredRecord], limit: int = 3
) -> dict[tuple[str, int], list[Act]]:
    """The newest ``limit`` acts of each checkpoint, newest first (for doctor and the page)."""
    per: dict[tuple[str, int], list[Act]] = {}
    for act in reversed(acts(records)):
        r = act.intent.record
        if r.step is None:
            continue
        bucket = per.setdefault((r.run, r.step), [])
        if len(bucket) < limit:
            bucket.append(act)
    return per


__all__ = [
    "Act",
    "Break",
    "Trails",
    "acts",
    "check_chain",
    "check_store",
    "latest_acts",
    "merged",
    "read_trails",
]
