"""One read of a store, judged once: what the operator's page and ``/metrics`` show.

:func:`take_snapshot` gathers every checkpoint's facts from every tier once
(:func:`~mouthguard.checkpoint.gathering.gather`, as ``ls`` and ``gc`` do) and
judges that one gathering twice, with the functions the CLI uses:

* :func:`~mouthguard.checkpoint.describe.describe_view`: importance, state, holds,
  copies with their receipts and damage -- what ``mouthguard ls``/``show`` print;
* :func:`~mouthguard.jobs.retention.plan_retention`: the pure retention and
  deletion policy -- what ``mouthguard gc`` (a dry run) would do, with its reasons.

A checkpoint whose manifest no tier can read is listed as ``damaged`` with the
reason per copy, as ``ls`` lists it. Nothing here writes to the store.

The snapshot is plain data (rows of JSON-ready dicts) so that serving a page of
it, or the metrics, never touches the tiers again. Invariants: ``rows`` is
sorted by (run, step); every row's ``state`` is one of :data:`STATES`; every
pending action names a checkpoint present in ``rows``.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mouthguard.checkpoint.surface import (
    CheckpointInfo,
    CheckpointView,
    Store,
    UnreadableCheckpoint,
    describe_view,
    gather,
    latest_acts,
    merged,
    read_trails,
    runs_of,
    steps_of,
    tier_facts,
    unreadable_checkpoints,
)
from mouthguard.errors import MouthguardError
from mouthguard.format.manifest import SaveTiming
from mouthguard.jobs.retention import plan_retention
from mouthguard.policy.retention import RetentionDecision
from mouthguard.tiers.base import Tier
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.wrapper import WrappedTier

log = logging.getLogger(__name__)

#: Every state a row may have (``describe``'s, plus ``damaged`` for unreadable ones).
STATES = ("committed", "verified", "protected", "trashed", "damaged")

Row = dict[str, Any]


@dataclass(frozen=True)
class Snapshot:
    """What the store held when it was read, and what the policy would do about it.

    Attributes:
        source: the store's description (its directory or configuration file).
        taken_at: when the read started (UTC, from the injected clock).
        build_seconds: how long reading and judging took (monotonic clock).
        tiers: each tier's name, failure domain, durability and location, whether
            it answers (``health``: ``ok`` or ``unreachable: ...``) and, for a
            local tier, its filesystem's free and total bytes (else None).
        rows: one row per checkpoint, sorted by (run, step) (see :func:`_row`).
        pending: the copy actions retention would take now, other than a plain
            keep: ``trash``, ``purge``, ``demote`` or ``restore`` (a trash mark
            lifted), each with its run, step, tier and the policy's reason.
        errors: runs that could not be read whole (a tier failed), with why.
    """

    source: str
    taken_at: dt.datetime
    build_seconds: float
    tiers: tuple[Row, ...]
    rows: tuple[Row, ...]
    pending: tuple[Row, ...]
    errors: tuple[str, ...] = ()
    _by_key: dict[tuple[str, int], Row] = field(default_factory=dict, repr=False, compare=False)
    #: What is computed from the rows once per snapshot (the summary), not per request.
    _memo: dict[str, Row] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_key.update({(r["run"], r["step"]): r for r in self.rows})

    def row(self, run: str, step: int) -> Row | None:
        """The row of ``run`` step ``step``, if the snapshot has one."""
        return self._by_key.get((run, step))

    @property
    def runs(self) -> list[str]:
        """Every run with a checkpoint, sorted."""
        return sorted({r["run"] for r in self.rows})


def take_snapshot(
    store: Store,
    *,
    now: Callable[[], dt.datetime],
    monotonic: Callable[[], float],
) -> Snapshot:
    """Read ``store`` once and judge it (see the module docstring).

    ``now`` gives the wall time the policy judges at (the trash delay, keep-within);
    ``monotonic`` times the build. A run whose checkpoints cannot all be read is
    left out and named in ``errors``, as ``gc`` skips it: judging part of a run
    could call the wrong checkpoint its newest.
    """
    started, taken_at = monotonic(), now()
    views: list[CheckpointView] = []
    unreadable: list[UnreadableCheckpoint] = []
    errors: list[str] = []
    try:
        runs = runs_of(store)
    except MouthguardError as exc:
        runs, errors = [], [f"cannot list the runs: {exc}"]
    for run in runs:
        try:
            steps = steps_of(store, run)
            gathered = {step: gather(store, run, step) for step in steps}
            missing = [step for step, view in gathered.items() if view is None]
            unreadable.extend(unreadable_checkpoints(store, run, missing))
        except MouthguardError as exc:
            errors.append(f"run {run}: {exc}")
            continue
        views.extend(view for view in gathered.values() if view is not None)
    decisions, planned = plan_retention(
        views, tier_facts(store), store.policy, taken_at.timestamp()
    )
    by_key = {d.key: d for d in decisions}
    pending: list[Row] = []
    deleting: set[tuple[str, int]] = set()
    for view, action in planned:
        copy = next((c for c in view.facts.copies if c.tier == action.tier), None)
        kind: str = action.action
        if kind == "keep":
            if copy is None or not copy.trashed:
                continue
            kind = "restore"  # a keep that lifts a trash mark: the policy changed its mind
        if kind in ("trash", "purge"):
            deleting.add(view.facts.key)
        pending.append(
            {
                "run": view.facts.run,
                "step": view.facts.step,
                "tier": action.tier,
                "action": kind,
                "reason": action.reason,
                "in_trash": copy is not None and copy.trashed,
            }
        )
    rows = [_row(describe_view(store, v), v, by_key[v.facts.key], deleting) for v in views]
    rows += [_unreadable_row(u) for u in unreadable]
    _add_acts(store, rows, errors)
    rows.sort(key=lambda r: (r["run"], r["step"]))
    pending.sort(key=lambda p: (p["run"], p["step"], p["tier"]))
    return Snapshot(
        source=str(store.source),
        taken_at=taken_at,
        build_seconds=monotonic() - started,
        tiers=tuple(_tier_row(store, i) for i in range(len(store.tiers))),
        rows=tuple(rows),
        pending=tuple(pending),
        errors=tuple(errors),
    )


#: Acts per checkpoint the page shows (the newest first).
ACTS_SHOWN = 3
#: Records of each tier's trail the page reads on a refresh: its bound on the trail's
#: reads and memory. A checkpoint whose latest act is older than these shows none
#: (``mouthguard audit`` and ``doctor`` read the whole trail).
TRAIL_RECORDS_READ = 2000


def _add_acts(store: Store, rows: list[Row], errors: list[str]) -> None:
    """Give every row ``acts``: its latest acts in the audit trail, newest first."""
    trails = read_trails(store.tiers, TRAIL_RECORDS_READ)
    errors.extend(f"audit trail on {t}: {why}" for t, why in trails.unreadable.items())
    latest = latest_acts(merged(trails), ACTS_SHOWN)
    for row in rows:
        row["acts"] = [
            {
                "time": a.intent.record.time,
                "act": a.intent.record.act,
                "actor": a.intent.record.actor,
                "status": a.status,
                "reason": a.intent.record.reason,
            }
            for a in latest.get((row["run"], row["step"]), [])
        ]


def _tier_row(store: Store, index: int) -> Row:
    """A tier as its card shows it: what it is, whether it answers, its free space."""
    tier = store.tiers[index]
    try:
        # Any lookup proves the tier answers; a name no checkpoint can have.
        tier.exists(_PROBE)
        health = "ok"
    except MouthguardError as exc:
        health = f"unreachable: {exc}"
    free, total = _disk_space(tier)
    return {
        "name": tier.name,
        "domain": tier.domain,
        "durable": tier.capabilities.durable,
        "fast": index == 0,
        "location": tier.location(),
        "health": health,
        "free_bytes": free,
        "total_bytes": total,
    }


#: The key the health probe looks up (never written).
_PROBE = "mouthguard-health-probe"


def _disk_space(tier: Tier) -> tuple[int | None, int | None]:
    """Free and total bytes of a local tier's filesystem (through wrappers); None elsewhere."""
    while isinstance(tier, WrappedTier):
        tier = tier.inner
    if not isinstance(tier, LocalTier):
        return None, None  # an object store has no free space to speak of
    try:
        usage = shutil.disk_usage(tier.root)
    except OSError:
        return None, None
    return usage.free, usage.total


def _iso(when: dt.datetime | None) -> str | None:
    return None if when is None else when.astimezone(dt.UTC).isoformat()


def save_row(timing: SaveTiming | None, nbytes: int) -> Row | None:
    """The save's figures: mode, seconds, stall, throughput (bytes/s over ``seconds``)."""
    if timing is None:
        return None
    rate = nbytes / timing.seconds if timing.seconds > 0 else None
    return {
        "mode": timing.mode,
        "seconds": timing.seconds,
        "stall_seconds": timing.stall_seconds,
        "bytes_per_second": rate,
    }


def _row(
    info: CheckpointInfo,
    view: CheckpointView,
    decision: RetentionDecision,
    deleting: set[tuple[str, int]],
) -> Row:
    """One checkpoint as the page and the API show it."""
    verdict = "delete" if (not decision.keep or view.facts.key in deleting) else "keep"
    return {
        "run": info.run,
        "step": info.step,
        "importance": info.importance.value,
        "state": info.state,
        # Intact bytes, a state a check refused: the one word and its reason, as ls says it.
        "suspect": info.suspect or None,
        "held": bool(info.holds),
        "holds": list(info.holds),
        "created": _iso(info.created),
        "nbytes": info.nbytes,
        "world_size": info.world_size,
        "dcp": view.manifest.is_dcp,
        "save": save_row(view.manifest.save, info.nbytes),
        "copies": [
            {
                "tier": c.tier,
                "verified": c.verified,
                "verified_at": _iso(c.verified_at),
                "trashed_at": _iso(c.trashed_at),
                "damage": c.damage or None,
            }
            for c in info.copies
        ],
        "protection_missing": list(info.protection),
        "retention": {"verdict": verdict, "reasons": list(decision.reasons)},
        # Finite numbers only: a nan loss is typed JSON in the manifest, not a metric.
        "metrics": dict(view.facts.metrics),
    }


def _unreadable_row(item: UnreadableCheckpoint) -> Row:
    """A checkpoint no tier's manifest describes: only its name and each copy's damage."""
    return {
        "run": item.run,
        "step": item.step,
        "importance": None,
        "state": item.state,
        "suspect": None,
        "held": False,
        "holds": [],
        "created": None,
        "nbytes": None,
        "world_size": None,
        "dcp": False,
        "save": None,
        "copies": [
            {
                "tier": c.tier,
                "verified": False,
                "verified_at": None,
                "trashed_at": None,
                "damage": c.damage,
            }
            for c in item.copies
        ],
        "protection_missing": [f"the manifest cannot be read on any tier: {item.reason}"],
        "retention": {
            "verdict": "keep",
            "reasons": ["no manifest can be read: never deleted automatically"],
        },
        "metrics": {},
    }


def summary(snapshot: Snapshot, *, now: dt.datetime) -> Row:
    """Counts per state and importance, and per run its newest, protected and last save.

    Computed once per snapshot (a pass over every row); only the age is of ``now``.
    """
    if "summary" not in snapshot._memo:
        snapshot._memo["summary"] = _summary(snapshot)
    age = max(0.0, (now - snapshot.taken_at).total_seconds())
    return {**snapshot._memo["summary"], "age_seconds": age}


def _summary(snapshot: Snapshot) -> Row:
    by_state = dict.fromkeys(STATES, 0)
    by_importance: dict[str, int] = {}
    runs: dict[str, Row] = {}
    for row in snapshot.rows:
        by_state[row["state"]] += 1
        level = row["importance"] or "unknown"
        by_importance[level] = by_importance.get(level, 0) + 1
        run = runs.setdefault(
            row["run"],
            {
                "run": row["run"],
                "checkpoints": 0,
                "nbytes": 0,
                "newest_step": None,
                "newest_protected_step": None,
                "held": 0,
                "damaged": 0,
                "last_save": None,
            },
        )
        run["checkpoints"] += 1
        run["nbytes"] += row["nbytes"] or 0
        run["newest_step"] = row["step"]  # rows ascend by step within a run
        run["held"] += int(row["held"])
        run["damaged"] += int(row["state"] == "damaged")
        if row["state"] == "protected":
            run["newest_protected_step"] = row["step"]
        if row["save"] is not None:
            run["last_save"] = {"step": row["step"], **row["save"]}
    return {
        "source": snapshot.source,
        "taken_at": _iso(snapshot.taken_at),
        "build_seconds": snapshot.build_seconds,
        "checkpoints": len(snapshot.rows),
        "by_state": by_state,
        "by_importance": by_importance,
        "unprotected_bytes": unprotected_bytes(snapshot),
        "pending": _count_actions(snapshot.pending),
        "tiers": list(snapshot.tiers),
        "runs": list(runs.values()),
        "errors": list(snapshot.errors),
    }


def _count_actions(pending: tuple[Row, ...]) -> dict[str, int]:
    counts = dict.fromkeys(("trash", "purge", "demote", "restore"), 0)
    for action in pending:
        counts[action["action"]] += 1
    return counts


def is_unprotected(row: Mapping[str, Any]) -> bool:
    """Committed, not in the trash, readable, and its placement not yet met and verified."""
    return row["state"] in ("committed", "verified")


def unprotected_bytes(snapshot: Snapshot) -> int:
    """Bytes of the checkpoints that are :func:`is_unprotected` (one copy's size each)."""
    return sum(r["nbytes"] for r in snapshot.rows if is_unprotected(r))
