"""The data benchmark's ``--persistent-workers``: every reader's DataLoader alike, and said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.data import readers
from benchmarks.data.config import Cell
from benchmarks.data.report import RunInfo
from benchmarks.data.report_prose import processes_line, workers_line
from benchmarks.data.run import parse_args
from benchmarks.data.wprofile import timeline

COUNT = 40


def cell(reader: str, root: Path, workers: int, *, persistent: bool) -> Cell:
    return Cell(reader, "local", workers, "throughput", str(root), COUNT, 64, 8, 0.0, False,
                persistent=persistent)  # fmt: skip


def test_the_flag_reaches_every_cell_and_the_report() -> None:
    assert parse_args(["--persistent-workers"]).persistent_workers is True
    assert parse_args([]).persistent_workers is False


@pytest.mark.parametrize("persistent", [True, False])
def test_the_loader_keeps_its_workers_only_when_asked(tmp_path: Path, persistent: bool) -> None:
    """The in-memory floor (built with the arguments every reader gets): two whole epochs."""
    loader = readers.build(cell("memory", tmp_path, 2, persistent=persistent))
    assert getattr(loader, "persistent_workers", None) is persistent
    for _ in range(2):
        keys = [k for names, _ in loader for k in names]
        assert len(keys) == len(set(keys)) == COUNT
    # Without workers there is nothing to keep (the DataLoader refuses the setting).
    assert readers.build(cell("raw", tmp_path, 0, persistent=True)).persistent_workers is False  # type: ignore[attr-defined]


def test_the_report_says_which() -> None:
    for flag, word in ((True, "reused"), (False, "new worker processes")):
        info = RunInfo(
            "", "", 0.0, (0.0,) * 3, (0.0,) * 3, 1, 1, 1, 1, 20.0, 1, "", None, "", "", ["local"],
            persistent_workers=flag,
        )  # fmt: skip
        assert word in workers_line(info)


def test_the_report_says_how_each_cell_was_started() -> None:
    assert parse_args(["--quick"]).preloaded_children is True
    assert parse_args([]).preloaded_children is False
    assert parse_args(["--preloaded-children"]).preloaded_children is True
    for flag, word in ((True, "forked from one that had imported torch"), (False, "fresh")):
        info = RunInfo(
            "", "", 0.0, (0.0,) * 3, (0.0,) * 3, 1, 1, 1, 1, 20.0, 1, "", None, "", "", ["local"],
            preloaded_children=flag,
        )  # fmt: skip
        assert word in processes_line(info)


def test_the_worker_timeline_is_read_by_epoch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``benchmarks.data.wprofile``: each epoch's workers, their start and batches from iter()."""
    events = [
        {"t": 10.0, "pid": 1, "ev": "epoch", "state": "cold"},
        {"t": 10.2, "pid": 7, "ev": "init"},
        {"t": 10.5, "pid": 7, "ev": "batch"},
        {"t": 10.6, "pid": 7, "ev": "batch"},
        {"t": 10.7, "pid": 1, "ev": "end", "seconds": 0.7, "samples": 64},
        {"t": 20.0, "pid": 1, "ev": "epoch", "state": "warm"},
        {"t": 20.1, "pid": 8, "ev": "init"},
        {"t": 20.3, "pid": 8, "ev": "batch"},
        {"t": 20.4, "pid": 1, "ev": "end", "seconds": 0.4, "samples": 32},
    ]
    (tmp_path / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert timeline(tmp_path) == {"cold": [7], "warm": [8]}
    out = capsys.readouterr().out
    assert "started 200 ms, first batch 500 ms, last 600 ms (2 batches)" in out
    assert "started 100 ms, first batch 300 ms, last 300 ms (1 batches)" in out
