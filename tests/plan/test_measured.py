"""The summary of recorded saves: medians, which figures they replace, the errors."""

from __future__ import annotations

import pytest

from mouthguard.plan.measured import NoRecordsError, RecordedSave, summarise


def _save(step: int, mode: str, seconds: float, stall: float) -> RecordedSave:
    return RecordedSave(step, mode, seconds, stall, nbytes=1000 * step, world_size=4)


def test_medians_over_every_save_and_the_async_stall_over_async_ones() -> None:
    saves = [_save(3, "async", 9.0, 0.5), _save(1, "sync", 2.0, 2.0), _save(2, "sync", 4.0, 4.0)]
    m = summarise("s", "r", 5, saves)
    assert [s.step for s in m.saves] == [1, 2, 3]
    assert (m.write_seconds, m.stall_seconds, m.checkpoint_bytes) == (4.0, 0.5, 2000.0)
    assert (m.sync_saves, m.async_saves, m.checkpoints) == (2, 1, 5)
    assert m.used() == ["write_seconds", "stall_seconds"]


def test_sync_only_leaves_the_stall_modelled() -> None:
    m = summarise("s", "r", 1, [_save(1, "sync", 2.0, 2.0)])
    assert m.stall_seconds is None and m.used() == ["write_seconds"]
    assert "stays modelled" in m.describe()


def test_no_records_says_which_is_missing() -> None:
    with pytest.raises(NoRecordsError, match="has no checkpoints"):
        summarise("s", "r", 0, [])
    with pytest.raises(NoRecordsError, match="none of the 2 checkpoints"):
        summarise("s", "r", 2, [])
