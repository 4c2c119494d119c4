"""What a store measured about one run's saves, summarised for ``plan`` and ``simulate``.

Every manifest records how its save went (:class:`~mouthguard.format.manifest.SaveTiming`:
the mode, the seconds from the call until every rank file was written and
fsynced, and how long the caller was blocked). ``--from-store`` reads those
records (the command-line side does the reading) and :func:`summarise` turns
them into the two figures the model takes:

* the save's duration ``W``: the median ``seconds`` over every timed save, sync
  or async (both count the call to the fsync of the last rank file);
* the async stall ``S``: the median ``stall_seconds`` over the async saves only
  (a sync save's stall is its whole duration); ``None`` when the run made none.

Medians, not means: one save that waited on a busy disk should not move the
figure a plan is made from. The store records no load or restart times, so
the recovery's read stays the storage strategy's bandwidth model; the summary
says so (:data:`NOT_RECORDED`). Pure: no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["NOT_RECORDED", "MeasuredRun", "NoRecordsError", "RecordedSave", "summarise"]

#: What a plan needs that no store records, stated in every summary.
NOT_RECORDED = "load and restart times (the store records none): the recovery read stays modelled"


class NoRecordsError(ValueError):
    """The run has no checkpoint, or none whose manifest records its save's timing."""


@dataclass(frozen=True)
class RecordedSave:
    """One save as its manifest recorded it. Seconds and bytes.

    Attributes:
        step: the checkpoint's step.
        mode: ``sync`` or ``async``.
        seconds: call until every rank file was written and fsynced.
        stall_seconds: how long the caller was blocked.
        nbytes: bytes of the checkpoint's files.
        world_size: ranks that saved it.
    """

    step: int
    mode: str
    seconds: float
    stall_seconds: float
    nbytes: int
    world_size: int


@dataclass(frozen=True)
class MeasuredRun:
    """The figures a plan takes from one run's recorded saves.

    Attributes:
        source: the store's description; run: the run.
        checkpoints: committed checkpoints whose manifest could be read.
        saves: those that record their save's timing, ascending by step.
        write_seconds: median save duration over ``saves``.
        stall_seconds: median stall over the async ones, or None when there are none.
        checkpoint_bytes: median bytes per checkpoint.
        world_size: ranks of the newest timed save.
    """

    source: str
    run: str
    checkpoints: int
    saves: tuple[RecordedSave, ...]
    write_seconds: float
    stall_seconds: float | None
    checkpoint_bytes: float
    world_size: int

    @property
    def sync_saves(self) -> int:
        """How many of the timed saves were synchronous."""
        return sum(1 for s in self.saves if s.mode == "sync")

    @property
    def async_saves(self) -> int:
        """How many of the timed saves were asynchronous."""
        return len(self.saves) - self.sync_saves

    def used(self) -> list[str]:
        """The model's figures these replace: ``write_seconds``, and ``stall_seconds`` if known."""
        return ["write_seconds", *(["stall_seconds"] if self.stall_seconds is not None else [])]

    def as_json(self) -> dict[str, Any]:
        """The JSON form (``--json``'s ``from_store``)."""
        return {
            "store": self.source,
            "run": self.run,
            "checkpoints": self.checkpoints,
            "timed_saves": len(self.saves),
            "sync_saves": self.sync_saves,
            "async_saves": self.async_saves,
            "steps": [self.saves[0].step, self.saves[-1].step],
            "write_seconds": self.write_seconds,
            "stall_seconds": self.stall_seconds,
            "checkpoint_bytes": self.checkpoint_bytes,
            "world_size": self.world_size,
            "used": self.used(),
            "not_recorded": NOT_RECORDED,
            "summary": self.describe(),
        }

    def describe(self) -> str:
        """One line for the table output: what came from the store, over how many saves."""
        stall = (
            f"async stall {_seconds(self.stall_seconds)} (median of {self.async_saves} async)"
            if self.stall_seconds is not None
            else "no async save recorded: the async stall stays modelled"
        )
        return (
            f"from {self.source}, run {self.run}: {len(self.saves)} recorded saves "
            f"(steps {self.saves[0].step}-{self.saves[-1].step}, {self.sync_saves} sync, "
            f"{self.async_saves} async) of {self.checkpoints} checkpoints, "
            f"{self.checkpoint_bytes / 1e6:,.1f} MB each (median): "
            f"save {_seconds(self.write_seconds)} (median), {stall}; not recorded: {NOT_RECORDED}"
        )


def _seconds(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def summarise(
    source: str, run: str, checkpoints: int, saves: Sequence[RecordedSave]
) -> MeasuredRun:
    """The medians of ``saves`` (any order); :class:`NoRecordsError` when there are none.

    ``checkpoints`` is how many checkpoints were read, timed or not, so that the
    error can say whether the run is missing or only its timings are.
    """
    if not saves:
        if checkpoints == 0:
            raise NoRecordsError(f"run {run!r} has no checkpoints in {source}")
        raise NoRecordsError(
            f"none of the {checkpoints} checkpoints of run {run!r} in {source} records its "
            "save's timing (they were written by a mouthguard that did not record it)"
        )
    ordered = tuple(sorted(saves, key=lambda s: s.step))
    stalls = [s.stall_seconds for s in ordered if s.mode == "async"]
    return MeasuredRun(
        source=source,
        run=run,
        checkpoints=checkpoints,
        saves=ordered,
        write_seconds=statistics.median(s.seconds for s in ordered),
        stall_seconds=statistics.median(stalls) if stalls else None,
        checkpoint_bytes=float(statistics.median(s.nbytes for s in ordered)),
        world_size=ordered[-1].world_size,
    )
