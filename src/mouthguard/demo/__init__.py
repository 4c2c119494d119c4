"""``mouthguard demo``: watch a training run survive a crash mid-save and lost checkpoints.

The package holds the demo's training job (:mod:`~mouthguard.demo.training`),
the worker process that trains and checkpoints (:mod:`~mouthguard.demo.worker`),
the on-disk damage the scenario inflicts (:mod:`~mouthguard.demo.damage`) and
the scenario that drives workers and reports (:mod:`~mouthguard.demo.scenario`).
This module defines the scenario's vocabulary: its configuration, progress
events and the typed report it returns (plain frozen dataclasses, no I/O).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mouthguard.checkpoint.info import Rejection
from mouthguard.demo.training import TrainConfig

if TYPE_CHECKING:
    from mouthguard.demo.diverged import DivergedRecord
    from mouthguard.demo.lifecycle import Lifecycle

__all__ = [
    "CopyCheck",
    "DamageKind",
    "DamageRecord",
    "DemoConfig",
    "DemoEvent",
    "DemoReport",
    "FinalState",
    "KillRecord",
    "Phase",
    "ResumeRecord",
    "SaveRecord",
    "SaveStatus",
    "SetAsideRecord",
]


class Phase(enum.StrEnum):
    """The scenario's phases (values are display names)."""

    TRAIN = "first run"
    DAMAGE = "damage"
    RESUME = "resumed run"
    VERIFY = "verify"
    REFERENCE = "reference"


class SaveStatus(enum.StrEnum):
    """What became of one save attempt."""

    COMMITTED = "committed"
    KILLED = "killed mid-save"
    CORRUPTED = "corrupted"


class DamageKind(enum.StrEnum):
    """How the scenario damaged a committed copy."""

    CORRUPTED = "corrupted"
    DELETED = "deleted"


@dataclass(frozen=True)
class DemoConfig:
    """Sizes and timings of the scenario (defaults: the ``mouthguard demo`` run).

    Attributes:
        steps: training steps of every run.
        every: checkpoint interval in steps.
        milestone_every: steps between ``milestone`` checkpoints (others are routine,
            the final one critical).
        kill_at_save: the first run is killed during its n-th save (>= 3: the newest
            committed checkpoint is then lost on every tier, and the one before it,
            which lost its fast copy, is left to resume from).
        throttle_seconds: how long the throttled save would take if not killed.
        kill_fraction: kill once this fraction of that save's bytes is on disk.
        seed: seed of the job (model init, teacher, RNGs).
        hidden: hidden width of the model (the state is ~12 bytes per parameter).
        depth: hidden layers of the model.
        phase_timeout: bound in seconds on every single wait for a worker.

    Raises:
        ValueError: the values cannot produce the scenario.
    """

    steps: int = 100
    every: int = 10
    milestone_every: int = 20
    kill_at_save: int = 5
    throttle_seconds: float = 3.0
    kill_fraction: float = 0.3
    seed: int = 0
    hidden: int = TrainConfig.hidden
    depth: int = TrainConfig.depth
    phase_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.every < 1 or self.kill_at_save < 3 or self.kill_step >= self.steps:
            raise ValueError(
                f"need every >= 1, kill_at_save >= 3 and a save after the kill "
                f"(every={self.every}, kill_at_save={self.kill_at_save}, steps={self.steps})"
            )
        if not (
            0 < self.kill_fraction < 1 and self.throttle_seconds > 0 and self.phase_timeout > 0
        ):
            raise ValueError("kill_fraction must be in (0, 1); timings must be positive")

    @property
    def kill_step(self) -> int:
        """The step whose save is interrupted."""
        return self.every * self.kill_at_save


@dataclass(frozen=True)
class DemoEvent:
    """Progress of the scenario, for a display. ``message`` is set for notable moments."""

    phase: Phase
    step: int
    total_steps: int
    message: str = ""
    loss: float | None = None


@dataclass(frozen=True)
class SaveRecord:
    """One save attempt: ``nbytes``/``seconds`` are what was written, and when it ended or died.

    ``stall_seconds`` is how long the async save blocked training (the snapshot),
    ``memcpy_seconds`` a plain memcpy of the same state, measured just before.
    """

    step: int
    importance: str
    phase: Phase
    status: SaveStatus
    nbytes: int
    seconds: float
    detail: str = ""
    stall_seconds: float = 0.0
    memcpy_seconds: float = 0.0


@dataclass(frozen=True)
class KillRecord:
    """The interrupted save: what was on disk after ``SIGKILL`` and what ``list()`` showed."""

    step: int
    pid: int
    partial_dir: Path
    file: Path
    bytes_on_disk: int
    expected_bytes: int
    listed_after_kill: tuple[int, ...]


@dataclass(frozen=True)
class CopyCheck:
    """The verdict on one committed copy (``reason`` says why it is not ``ok``)."""

    step: int
    tier: str
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class DamageRecord:
    """Damage done on disk to one committed copy.

    ``CORRUPTED``: ``length`` bytes flipped at ``offset`` of ``file``, inside
    ``tensor``. ``DELETED``: ``file`` removed (offset, length and tensor unused).
    """

    step: int
    tier: str
    kind: DamageKind
    file: Path
    offset: int = 0
    length: int = 0
    tensor: str = ""


@dataclass(frozen=True)
class SetAsideRecord:
    """A damaged copy moved out of the way (kept for inspection), and who moved it."""

    step: int
    tier: str
    name: str
    by: str


@dataclass(frozen=True)
class ResumeRecord:
    """What the resumed run loaded, from which tier, and what it rejected on the way."""

    step: int
    tier: str
    seconds: float
    loss: float | None
    rejections: tuple[Rejection, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class FinalState:
    """The end of a run: its last loss (``float.hex``) and digests of every tensor."""

    step: int
    loss: float
    loss_hex: str
    weights_sha256: str
    optimizer_sha256: str
    tensors: int


@dataclass(frozen=True)
class DemoReport:
    """Everything the scenario did and found; ``matches`` is the verdict.

    ``replicas`` are the copies of every checkpoint right after the kill (by
    their verification receipts); ``verification`` is the full read-back of every
    committed copy of the run at the end, as ``mouthguard verify`` does it;
    ``lifecycle`` the final checkpoints' importance and state and a gc dry run.
    """

    run: str
    store: Path
    run_dir: Path
    tiers: tuple[str, ...]
    config: DemoConfig
    params: int
    saves: tuple[SaveRecord, ...]
    kill: KillRecord
    replicas: tuple[CopyCheck, ...]
    damage: tuple[DamageRecord, ...]
    resume: ResumeRecord
    reference: FinalState
    resumed: FinalState
    listed_final: tuple[int, ...]
    set_aside: tuple[SetAsideRecord, ...]
    verification: tuple[CopyCheck, ...]
    lifecycle: Lifecycle
    seconds: float
    diverged: DivergedRecord | None = None

    @property
    def matches(self) -> bool:
        """Resumed and reference runs end bitwise identical (step, loss, every tensor)."""
        a, b = self.reference, self.resumed
        return (a.step, a.loss_hex, a.weights_sha256, a.optimizer_sha256) == (
            b.step,
            b.loss_hex,
            b.weights_sha256,
            b.optimizer_sha256,
        )

    @property
    def killed_step_hidden(self) -> bool:
        """``Checkpointer.list()`` after the kill did not show the interrupted step."""
        return self.kill.step not in self.kill.listed_after_kill

    @property
    def damage_rejected(self) -> bool:
        """``load()`` rejected every damaged copy it met instead of resuming from one."""
        rejected = {(r.step, r.tier) for r in self.resume.rejections}
        return all((d.step, d.tier) in rejected for d in self.damage if d.step >= self.resume.step)

    @property
    def store_verified(self) -> bool:
        """Every committed copy of the run passed the final read-back."""
        return bool(self.verification) and all(c.ok for c in self.verification)

    @property
    def lost_step(self) -> int:
        """The newest committed checkpoint, lost on every tier (the scenario's target)."""
        return max(self.kill.listed_after_kill)
