"""What ``mouthguard demo`` leaves behind, and its ``--json`` object.

Every demo run writes its checkpoints (about 620 MiB: a model's state, on two
tiers, several steps) into the store under a new run name, and keeps them so
that they can be listed and verified afterwards. Runs accumulate, so the demo
says how much this run left and how much the store holds in all.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from mouthguard.checkpoint.store import open_store
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


def report_json(report: DemoReport, disk: DiskUse) -> dict[str, object]:
    """The demo's ``--json`` object: the verdict, what happened, what it left on disk."""
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
    }


__all__ = ["DiskUse", "disk_use", "report_json"]
