"""``mouthguard demo``: watch a training run survive a crash mid-save and a corrupted checkpoint.

The package holds the demo's training job (:mod:`~mouthguard.demo.training`),
the worker process that trains and checkpoints (:mod:`~mouthguard.demo.worker`)
and the scenario that drives workers and reports (:mod:`~mouthguard.demo.scenario`).
This module defines the scenario's vocabulary: its configuration, progress
events and the typed report it returns (plain frozen dataclasses, no I/O).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from mouthguard.checkpoint.info import Rejection
from mouthguard.demo.training import TrainConfig

__all__ = [
    "CorruptionRecord",
    "DemoConfig",
    "DemoEvent",
    "DemoReport",
    "FinalState",
    "KillRecord",
    "Phase",
    "ResumeRecord",
    "SaveRecord",
    "SaveStatus",
]


class Phase(enum.StrEnum):
    """The scenario's phases (values are display names)."""

    TRAIN = "first run"
    CORRUPT = "corruption"
    RESUME = "resumed run"
    REFERENCE = "reference"


class SaveStatus(enum.StrEnum):
    """What became of one save attempt."""

    COMMITTED = "committed"
    KILLED = "killed mid-save"
    CORRUPTED = "corrupted"


@dataclass(frozen=True)
class DemoConfig:
    """Sizes and timings of the scenario (defaults: the ``mouthguard demo`` run).

    Attributes:
        steps: training steps of every run.
        every: checkpoint interval in steps.
        milestone_every: steps between ``milestone`` checkpoints (others are routine,
            the final one critical).
        kill_at_save: the first run is killed during its n-th save (>= 3, so one
            checkpoint can be corrupted and an older one is left to resume from).
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
    """One save attempt: ``nbytes``/``seconds`` are what was written, and when it ended or died."""

    step: int
    importance: str
    phase: Phase
    status: SaveStatus
    nbytes: int
    seconds: float
    detail: str = ""


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
class CorruptionRecord:
    """Where the bytes of a committed checkpoint were flipped."""

    step: int
    file: Path
    offset: int
    length: int
    tensor: str


@dataclass(frozen=True)
class ResumeRecord:
    """What the resumed run loaded, how long that took, and what it rejected on the way."""

    step: int
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
    """Everything the scenario did and found; ``matches`` is the verdict."""

    run: str
    store: Path
    run_dir: Path
    config: DemoConfig
    params: int
    saves: tuple[SaveRecord, ...]
    kill: KillRecord
    corruption: CorruptionRecord
    resume: ResumeRecord
    reference: FinalState
    resumed: FinalState
    listed_final: tuple[int, ...]
    set_aside: tuple[str, ...]
    seconds: float

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
    def corruption_rejected(self) -> bool:
        """``load()`` rejected the corrupted checkpoint instead of resuming from it."""
        return any(r.step == self.corruption.step for r in self.resume.rejections)
