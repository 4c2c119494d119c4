"""Result types of the checkpoint API."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import ClassVar

from mouthguard.format.manifest import FileRecord, Manifest
from mouthguard.format.typed_json import JsonValue
from mouthguard.policy.importance import Importance


@dataclass(frozen=True)
class CopyInfo:
    """One tier's copy of a checkpoint.

    Attributes:
        tier: the tier's name.
        location: the directory path or URL prefix holding the copy's files.
        verified: a read-back verification of this copy has succeeded (and no
            damage was reported since).
        verified_at: when that verification happened, if ever.
        trashed_at: when retention put this copy in the trash, if it did.
        damage: why this copy is damaged ("" when no reader found damage): its
            manifest cannot be read, or a reader (load, verify, scrub) recorded a
            damage report that no later verification withdrew.
    """

    tier: str
    location: str
    verified: bool = False
    verified_at: dt.datetime | None = None
    trashed_at: dt.datetime | None = None
    damage: str = ""

    def to_json(self) -> dict[str, JsonValue]:
        """JSON form used by ``mouthguard show --json``."""
        return {
            "tier": self.tier,
            "location": self.location,
            "verified": self.verified,
            "verified_at": None if self.verified_at is None else self.verified_at.isoformat(),
            "trashed_at": None if self.trashed_at is None else self.trashed_at.isoformat(),
            "damage": self.damage or None,
        }


@dataclass(frozen=True)
class CheckpointInfo:
    """What is known about one committed checkpoint (from its manifest and copies).

    Attributes:
        run: run name.
        step: training step.
        importance: the effective importance (changed later through a sidecar, or
            as recorded at save time).
        created: commit time (UTC).
        nbytes: bytes of the checkpoint's files (what a copy occupies).
        tensor_bytes: bytes of tensor payload.
        world_size: number of ranks (one file each).
        files: the files of the checkpoint.
        copies: one entry per tier holding a committed copy.
        save_seconds: wall time of the save that produced this info (only on save;
            for an async save, from the call until the commit).
        stall_seconds: how long the caller was blocked by the save (only on save;
            the whole save when synchronous, the snapshot when asynchronous).
        saved_importance: the importance recorded in the manifest at save time.
        holds: names of the holds on the checkpoint (on any copy).
        state: ``committed`` -> ``verified`` -> ``protected`` (the placement is met,
            every counted copy verified), or ``trashed``; ``damaged`` when every
            copy is damaged (see each copy's ``damage``).
        protection: what is still missing for ``protected``, as sentences.
        suspect: why its state failed a semantic check (``load(check=...)`` or
            the save guard): a resume that falls back skips it. "" when none did.
        checked: a semantic check of its state passed on a resume (and none failed).
    """

    run: str
    step: int
    importance: Importance
    created: dt.datetime
    nbytes: int
    tensor_bytes: int
    world_size: int
    files: tuple[FileRecord, ...]
    copies: tuple[CopyInfo, ...] = ()
    save_seconds: float | None = None
    stall_seconds: float | None = None
    saved_importance: Importance | None = None
    holds: tuple[str, ...] = ()
    state: str = "committed"
    protection: tuple[str, ...] = ()
    suspect: str = ""
    checked: bool = False

    @classmethod
    def from_manifest(
        cls,
        manifest: Manifest,
        copies: tuple[CopyInfo, ...] = (),
        save_seconds: float | None = None,
        *,
        stall_seconds: float | None = None,
        importance: Importance | None = None,
        holds: tuple[str, ...] = (),
        state: str = "committed",
        protection: tuple[str, ...] = (),
        suspect: str = "",
        checked: bool = False,
    ) -> CheckpointInfo:
        """Build the info of a checkpoint from its manifest (and its sidecar facts)."""
        return cls(
            run=manifest.run,
            step=manifest.step,
            importance=importance or manifest.importance,
            created=manifest.created,
            nbytes=manifest.nbytes,
            tensor_bytes=manifest.tensor_bytes,
            world_size=manifest.world_size,
            files=manifest.files,
            copies=copies,
            save_seconds=save_seconds,
            stall_seconds=stall_seconds,
            saved_importance=manifest.importance,
            holds=holds,
            state=state,
            protection=protection,
            suspect=suspect,
            checked=checked,
        )

    def to_json(self) -> dict[str, JsonValue]:
        """JSON form used by ``mouthguard show --json`` and ``ls --json``."""
        return {
            "run": self.run,
            "step": self.step,
            "importance": self.importance.value,
            "saved_importance": (self.saved_importance or self.importance).value,
            "holds": list(self.holds),
            "state": self.state,
            "protection_missing": list(self.protection),
            "suspect": self.suspect or None,
            "checked": self.checked,
            "created": self.created.isoformat(),
            "nbytes": self.nbytes,
            "tensor_bytes": self.tensor_bytes,
            "world_size": self.world_size,
            "files": [
                {"name": f.name, "size": f.size, "checksum": f.checksum, "sha256": f.sha256}
                for f in self.files
            ],
            "copies": [c.to_json() for c in self.copies],
        }


@dataclass(frozen=True)
class UnreadableCheckpoint:
    """A checkpoint committed on some tier whose manifest no tier can provide.

    Nothing about it is known beyond its name and, per copy, why the manifest
    cannot be read: not its importance, size or creation time. It is never
    loaded, never copied and never deleted automatically; ``ls``, ``show``,
    ``scrub``, ``gc`` and ``doctor`` name it until an operator acts.
    """

    run: str
    step: int
    copies: tuple[CopyInfo, ...]

    state: ClassVar[str] = "damaged"

    def to_json(self) -> dict[str, JsonValue]:
        """The JSON form of ``ls --json``: the keys of a checkpoint, unknown ones null."""
        return {
            "run": self.run,
            "step": self.step,
            "importance": None,
            "saved_importance": None,
            "holds": [],
            "state": self.state,
            "protection_missing": [
                f"the manifest cannot be read on any tier: {self.reason}",
            ],
            "suspect": None,
            "checked": False,
            "created": None,
            "nbytes": None,
            "tensor_bytes": None,
            "world_size": None,
            "files": [],
            "copies": [c.to_json() for c in self.copies],
        }

    @property
    def reason(self) -> str:
        """Why each copy is unreadable, as one line: ``tier: reason; ...``."""
        return "; ".join(f"{c.tier}: {c.damage}" for c in self.copies)


@dataclass(frozen=True)
class Rejection:
    """A copy that ``load()`` skipped, and why."""

    step: int
    tier: str
    reason: str


@dataclass
class LoadedCheckpoint:
    """The result of ``Checkpointer.load``.

    Attributes:
        step: the step that was loaded.
        state: the restored state.
        info: the loaded checkpoint's info.
        tier: the tier the bytes were read from.
        rejected: newer or preferred copies that failed verification (or
            checkpoints whose state failed the load's check), newest first.
        reference: the reference values saved with it (``save(reference=...)``).
    """

    step: int
    state: object
    info: CheckpointInfo
    tier: str
    rejected: list[Rejection] = field(default_factory=list)
    reference: dict[str, JsonValue] = field(default_factory=dict)
