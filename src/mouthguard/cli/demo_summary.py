"""What ``mouthguard demo`` leaves behind, and its ``--json`` object.

Every demo run writes its checkpoints (about 620 MiB: a model's state, on two
tiers, several steps) into the store under a new run name, and keeps them so
that they can be listed and verified afterwards. Runs accumulate, so the demo
says how much this run left and how much the store holds in all.

It also shows the end of the audit trail of its run (:func:`trail_tail`): who
committed, copied, found damage, set aside and marked what, and whether the
trail's chains check out.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from mouthguard.checkpoint.audit import trail_keys
from mouthguard.checkpoint.audit_check import Act, acts, check_store, merged
from mouthguard.checkpoint.store import open_store
from mouthguard.cli.audit import act_json
from mouthguard.demo import DemoReport
from mouthguard.tiers.local import LocalTier


@dataclass(frozen=True)
class DiskUse:
    """Bytes on disk (allocated blocks, as ``du`` counts them) of the demo's run and store."""

    run_bytes: int
    store_bytes: int


def disk_use(report: DemoReport) -> DiskUse:
    """What the run of ``report`` and the whole store occupy on the store's local tiers.

    The run's bytes include its diverged sibling run (``<run>-diverged``), which
    the demo writes too.
    """
    store = open_store(report.store)
    roots = [t.root for t in store.tiers if isinstance(t, LocalTier)]
    runs = [report.run] + ([report.diverged.run] if report.diverged is not None else [])
    return DiskUse(
        run_bytes=sum(_du(root / run) for root in roots for run in runs),
        store_bytes=sum(_du(root) for root in roots),
    )


#: How many of the run's latest acts the demo shows.
TRAIL_SHOWN = 8


@dataclass(frozen=True)
class TrailTail:
    """The end of a run's audit trail: its latest acts, how many in all, whether intact."""

    acts: tuple[Act, ...]
    total: int
    intact: bool
    breaks: tuple[str, ...]


def trail_tail(report: DemoReport, shown: int = TRAIL_SHOWN) -> TrailTail:
    """Up to ``shown`` acts of the demo's run, and the store's trail check.

    The notable acts (anything but commits and copies) come first in the choice,
    then the newest three; they are shown in time order.
    """
    store = open_store(report.store)
    breaks, trails = check_store(store.tiers, trail_keys(store.manifest_keys))
    found = acts(merged(trails), report.run)
    # The acts worth seeing first: what went wrong and what was done about it, then the
    # newest; the routine commits and copies in between are left to `mouthguard audit`.
    notable = [a for a in found if a.intent.record.act not in ("commit", "copy")]
    chosen = {a.intent.record.id for a in [*notable[-(shown - 3) :], *found[-3:]]}
    tail = tuple(a for a in found if a.intent.record.id in chosen)
    return TrailTail(tail, len(found), not breaks, tuple(map(str, breaks)))


def tail_json(tail: TrailTail) -> dict[str, object]:
    """The ``audit_trail`` member of the demo's JSON object."""
    return {
        "acts": tail.total,
        "intact": tail.intact,
        "breaks": list(tail.breaks),
        "latest": [act_json(a) for a in tail.acts],
    }


def _du(path: Path) -> int:
    """Allocated bytes under ``path`` (0 if it is gone); files vanishing meanwhile are skipped."""
    total = 0
    for folder, _dirs, files in os.walk(path):  # Path.walk needs Python 3.12
        for name in files:
            try:
                total += Path(folder, name).lstat().st_blocks * 512
            except OSError:
                continue
    return total


def report_json(
    report: DemoReport, disk: DiskUse, tail: TrailTail | None = None
) -> dict[str, object]:
    """The demo's ``--json`` object: the verdict, what happened, what it left on disk.

    With ``tail``, also the end of the run's audit trail (``audit_trail``).
    """
    extra = {} if tail is None else {"audit_trail": tail_json(tail)}
    return {
        "ok": report.matches and report.store_verified,
        "matches": report.matches,
        "store_verified": report.store_verified,
        "store": str(report.store),
        "run": report.run,
        "seconds": round(report.seconds, 3),
        "tiers": list(report.tiers),
        "killed": {"step": report.kill.step, "hidden": report.killed_step_hidden},
        "damage": [
            {"step": d.step, "tier": d.tier, "kind": d.kind.value, "file": str(d.file)}
            for d in report.damage
        ],
        "rejected": [dataclasses.asdict(r) for r in report.resume.rejections],
        "resumed_from": {"step": report.resume.step, "tier": report.resume.tier},
        "reference": dataclasses.asdict(report.reference),
        "resumed": dataclasses.asdict(report.resumed),
        "verification": [dataclasses.asdict(c) for c in report.verification],
        "diverged": None if report.diverged is None else dataclasses.asdict(report.diverged),
        "disk": dataclasses.asdict(disk),
        **extra,
    }


__all__ = ["DiskUse", "TrailTail", "disk_use", "report_json", "tail_json", "trail_tail"]
