"""What a chaos run injected and counted: :class:`ChaosReport`."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ChaosReport:
    """What a chaos run injected and whether every invariant held.

    The never-events are ``accepted_corrupt``, ``lost_acknowledged``,
    ``writes_outside``, ``crashes``, ``false_damage`` and ``false_receipt``;
    :attr:`ok` is True when all are zero. ``set_aside`` and ``receipts_checked``
    count what the last two judged.
    """

    run: str
    plan: str
    seed: int
    rounds: int = 0
    rounds_ok: int = 0
    injected: Counter[str] = field(default_factory=Counter)
    survived: int = 0
    saves: int = 0
    acknowledged: int = 0
    save_errors: Counter[str] = field(default_factory=Counter)
    failed_but_visible: int = 0
    loads: int = 0
    load_fallbacks: int = 0
    load_errors: Counter[str] = field(default_factory=Counter)
    pass_errors: Counter[str] = field(default_factory=Counter)
    deleted_by_policy: int = 0
    lost_to_storage: int = 0
    listed_damaged: int = 0
    accepted_corrupt: int = 0
    lost_acknowledged: int = 0
    writes_outside: int = 0
    crashes: int = 0
    false_damage: int = 0
    false_receipt: int = 0
    set_aside: int = 0
    receipts_checked: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def cases(self) -> int:
        """How many faults were injected in all."""
        return sum(self.injected.values())

    @property
    def never_events(self) -> int:
        """Invariant violations of every kind."""
        return (
            self.accepted_corrupt
            + self.lost_acknowledged
            + self.writes_outside
            + self.crashes
            + self.false_damage
            + self.false_receipt
        )

    @property
    def ok(self) -> bool:
        """Every invariant held in every round."""
        return self.never_events == 0

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (``cases`` and ``ok`` included)."""
        raw = dataclasses.asdict(self)
        for name in ("injected", "save_errors", "load_errors", "pass_errors"):
            raw[name] = dict(sorted(getattr(self, name).items()))
        return {**raw, "cases": self.cases, "ok": self.ok}
