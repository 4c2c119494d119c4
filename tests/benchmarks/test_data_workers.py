"""The data benchmark's ``--persistent-workers``: every reader's DataLoader alike, and said."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.data import readers
from benchmarks.data.config import Cell
from benchmarks.data.report import RunInfo
from benchmarks.data.report_prose import workers_line
from benchmarks.data.run import parse_args

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
