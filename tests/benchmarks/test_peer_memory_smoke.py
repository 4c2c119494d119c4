"""The peer-memory benchmark end to end on a tiny state: every figure is there (no timing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("peer-memory")]


def _benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    """The benchmark in a child whose environment imports this checkout."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.peer_memory", "--sizes", "1M", "--rounds", "2", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def test_every_figure_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    done = _benchmark("--out", str(out), "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 1MiB |"))
    assert row.count(" s |") == 4 and row.count(" ms |") == 2 and "MiB |" in row
    assert "Load average" in text


def test_the_profile_names_the_recovery(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    done = _benchmark("--profile", "--out", str(out), "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "1MiB per rank: the slowest rank's recovery" in done.stdout
    assert "resume_from_peers" in done.stdout and "map_copy" in done.stdout
    assert not out.exists()  # a profile writes no report
