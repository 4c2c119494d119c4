"""The dataset report's stall verdicts: the in-memory floor, the peers, the first batch."""

from __future__ import annotations

from benchmarks.data.config import CellResult, Epoch
from benchmarks.data.report import _stall_targets, stall_cells


def _epoch(state: str, first_ms: float, rest_ms: list[float]) -> Epoch:
    waits = [first_ms / 1000] + [w / 1000 for w in rest_ms]
    return Epoch(state, 1.0, 10, 10, 1000, 1.0, 1.0, waits=waits)


def _cell(reader: str, cold: tuple[float, float], warm: tuple[float, float]) -> CellResult:
    """A stall cell whose waits after the first are all one value (so p99 is that value)."""
    return CellResult(
        reader,
        "s3",
        4,
        "stall",
        epochs=[_epoch("cold", cold[0], [cold[1]] * 50), _epoch("warm", warm[0], [warm[1]] * 50)],
    )


def _verdicts(rows: list[str]) -> dict[str, str]:
    return {row.split(" | ")[0].removeprefix("| "): row for row in rows}


def test_warm_against_the_floor_cold_against_the_best_peer_and_the_first_batch() -> None:
    cells = [
        _cell("memory", (20.0, 1.0), (20.0, 2.0)),  # floor p99 warm 2.0 ms: limit 3.0
        _cell("webdataset", (300.0, 9.0), (50.0, 3.0)),
        _cell("litdata", (500.0, 6.0), (40.0, 2.5)),  # the lowest peer p99 cold: 6.0
        _cell("mouthguard", (400.0, 5.5), (30.0, 3.5)),
    ]
    rows = _verdicts(_stall_targets("", "s3", cells))
    warm = rows[
        "stall, s3, warm, 4 workers: mouthguard (pack, StreamingDataLoader) p99 wait per step"
    ]
    assert "3.50 ms" in warm and "3.00 ms" in warm and warm.endswith("| **not met** |")
    cold = rows[
        "stall, s3, cold, 4 workers: mouthguard (pack, StreamingDataLoader) p99 wait per step"
    ]
    assert "litdata" in cold and "6.00 ms" in cold and cold.endswith("| **met** |")
    first = rows["stall, s3, cold, 4 workers: mouthguard (pack, StreamingDataLoader) first batch"]
    # The fastest peer's first batch is webdataset's 300 ms; mouthguard's 400 ms is over it.
    assert "webdataset" in first and "300.00 ms" in first and first.endswith("| **not met** |")


def test_without_a_floor_or_a_peer_the_verdict_says_why() -> None:
    cells = [_cell("mouthguard", (400.0, 5.5), (30.0, 3.5))]
    rows = list(_verdicts(_stall_targets("", "local", cells)).values())
    assert len(rows) == 2  # no first-batch verdict on the local disk
    assert any(r.endswith("| not available (no floor measured) |") for r in rows)
    assert any(r.endswith("| not available (no peer measured) |") for r in rows)


def test_repeats_are_judged_by_their_median() -> None:
    cells = [
        _cell("memory", (20.0, 1.0), (20.0, 2.0)),
        *[_cell("mouthguard", (400.0, 5.0), (30.0, p99)) for p99 in (2.5, 9.0, 2.8)],
    ]
    rows = _verdicts(_stall_targets("", "local", cells))
    warm = rows[
        "stall, local, warm, 4 workers: mouthguard (pack, StreamingDataLoader) p99 wait per step"
    ]
    assert "| 2.80 ms |" in warm and warm.endswith("| **met** |")  # median of 2.5, 9.0, 2.8


def test_the_stall_row_sums_every_wait_the_first_included() -> None:
    row = stall_cells(_cell("mouthguard", cold=(500.0, 2.0), warm=(40.0, 1.0)))
    # 500 + 50 * 2 cold, 40 + 50 * 1 warm
    assert row[2:8] == ["500", "2.00 / 2.00 / 2.0", "600", "40", "1.00 / 1.00 / 1.0", "90"]
