"""What one harness run tried and what survived: the row of the reliability table.

A result is one of three things (:attr:`HarnessResult.status`): ``passed`` (it
ran, every case survived, no never-event), ``failed``, or ``not run`` -- the
harness could not run at all (e.g. no object-store server to test against) and
says why in :attr:`HarnessResult.not_run`. A harness that ran nothing is never
reported as passed.

Every count says what it leaves out: ``cases_by_kind`` breaks the cases down,
``excluded`` names the acknowledged saves left out of ``lost_acknowledged`` and
why, and ``not_measured`` names the never-events a harness does not look for
(their zeros mean nothing).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Level = Literal["ci", "soak"]
Status = Literal["passed", "failed", "not run"]
#: The never-events a harness may declare it does not look for.
NEVER_EVENTS = ("accepted_corrupt", "lost_acknowledged", "writes_outside")


@dataclass
class HarnessResult:
    """One harness run.

    Attributes:
        harness: short name (``crash``, ``chaos``, ``s3-faults``, ``fuzz``, ``security``).
        what: what was tried, in a sentence (kinds of faults, kill points, inputs).
        cases: how many cases were tried (kills, injected faults, fuzz inputs).
        survived: cases in which every invariant held.
        accepted_corrupt: checkpoints that ``list``/``load`` accepted with wrong bytes.
        lost_acknowledged: saves that returned (were acknowledged) but are gone.
        writes_outside: writes found outside the store's roots.
        command: the command that reruns exactly this (with its level).
        seconds: wall time of the run.
        details: anything else worth reporting (per-kind counts, seeds, failures).
        cases_by_kind: ``cases`` broken down (fault kinds, attack kinds, kill
            targets); empty when the harness has no breakdown.
        acknowledged: saves acknowledged in the run, the population that
            ``lost_acknowledged`` is counted over (``None``: the harness saves
            nothing of its own).
        excluded: acknowledged saves *not* counted in ``lost_acknowledged``
            although they are gone, by reason (e.g. deleted by retention as the
            policy asks, or destroyed by a torn write the storage itself
            acknowledged).
        not_measured: never-events (of :data:`NEVER_EVENTS`) this harness does
            not look for.
        not_run: non-empty: the harness did not run, and this says why.
    """

    harness: str
    what: str
    cases: int = 0
    survived: int = 0
    accepted_corrupt: int = 0
    lost_acknowledged: int = 0
    writes_outside: int = 0
    command: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    cases_by_kind: dict[str, int] = field(default_factory=dict)
    acknowledged: int | None = None
    excluded: dict[str, int] = field(default_factory=dict)
    not_measured: list[str] = field(default_factory=list)
    not_run: str = ""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.not_measured) - set(NEVER_EVENTS))
        if unknown:
            raise ValueError(f"not_measured names unknown never-events: {unknown}")

    @property
    def ran(self) -> bool:
        """The harness ran (a result that did not run is neither passed nor failed)."""
        return not self.not_run

    @property
    def ok(self) -> bool:
        """It ran, every case survived and none of the three never-events happened."""
        return (
            self.ran
            and self.survived == self.cases
            and self.accepted_corrupt == 0
            and self.lost_acknowledged == 0
            and self.writes_outside == 0
        )

    @property
    def status(self) -> Status:
        """``passed``, ``failed`` or ``not run``."""
        if not self.ran:
            return "not run"
        return "passed" if self.ok else "failed"

    @classmethod
    def skipped(cls, harness: str, why: str, *, command: str = "") -> HarnessResult:
        """A result for a harness that could not run: status ``not run``, no cases."""
        return cls(harness, what=f"not run: {why}", command=command, not_run=why)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``ok`` and ``status`` included)."""
        return {**asdict(self), "ok": self.ok, "status": self.status}

    def write(self, path: Path) -> None:
        """Write the JSON form to ``path``."""
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, path: Path) -> HarnessResult:
        """Read a result written by :meth:`write`."""
        raw = json.loads(path.read_text())
        raw.pop("ok", None)
        raw.pop("status", None)
        return cls(**raw)
