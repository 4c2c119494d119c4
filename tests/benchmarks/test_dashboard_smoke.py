"""The dashboard benchmark end to end on a small store: every row is reported (no timings)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.dashboard import ROUTES, main


@pytest.mark.slow
def test_the_benchmark_reports_every_row(tmp_path: Path) -> None:
    out = tmp_path / "dashboard.md"
    args = ["--checkpoints", "20", "--repeats", "1", "--requests", "1", "--dir", str(tmp_path)]
    assert main([*args, "--out", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("Store: 20 checkpoints in 10 runs")
    assert "| snapshot: read and judge the whole store" in report
    for route in ROUTES:
        assert f"| GET `{route}` |" in report
    assert "| chromium" in report and "| peak RSS" in report
