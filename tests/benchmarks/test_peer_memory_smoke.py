"""The peer-memory benchmark end to end on a tiny state: every figure is there (no timing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("peer-memory")]


def test_every_figure_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.peer_memory", "--sizes", "1M", "--rounds", "2",
         "--out", str(out), "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 1MiB |"))
    assert row.count(" s |") == 4 and row.count(" ms |") == 2 and "MiB |" in row
    assert "Load average" in text
