"""The trainer-stall benchmark end to end on a tiny state: every row is there (no timing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]


@pytest.mark.slow
def test_every_row_is_reported(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.trainer_stall", "--size", "3M", "--saves", "2",
         "--gap", "0", "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for row in ("clone every tensor", "TorchCheckpointIO", "AsyncCheckpointIO", "mouthguard"):
        assert row in done.stderr, row
    assert "Load average" in done.stderr
