"""What one harness run tried and what survived: the row of the reliability table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Level = Literal["ci", "soak"]


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

    @property
    def ok(self) -> bool:
        """Every case survived and none of the three never-events happened."""
        return (
            self.survived == self.cases
            and self.accepted_corrupt == 0
            and self.lost_acknowledged == 0
            and self.writes_outside == 0
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``ok`` included)."""
        return {**asdict(self), "ok": self.ok}

    def write(self, path: Path) -> None:
        """Write the JSON form to ``path``."""
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, path: Path) -> HarnessResult:
        """Read a result written by :meth:`write`."""
        raw = json.loads(path.read_text())
        raw.pop("ok", None)
        return cls(**raw)
