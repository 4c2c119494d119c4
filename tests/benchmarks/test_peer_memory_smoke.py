"""The peer-memory benchmark end to end on a tiny state: every figure and profile (no timing).

The S3 column needs the Ceph programs (``make system-deps``); where they are
missing the benchmark says so in the report, and the tests check that and skip
only the S3 figures, saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.s3.ceph import missing_binaries

REPO = Path(__file__).parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("peer-memory")]


def _benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    """The benchmark in a child whose environment imports this checkout."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.peer_memory", "--sizes", "1M", "--rounds", "2", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


class Run(NamedTuple):
    """One run of the benchmark with ``--profile``: its report and what it printed."""

    done: subprocess.CompletedProcess[str]
    report: Path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The benchmark run once, with profiles, for every test here (a run takes tens of seconds)."""
    root = tmp_path_factory.mktemp("peer-memory")
    out = root / "report.md"
    return Run(_benchmark("--profile", "--out", str(out), "--dir", str(root)), out)


def test_every_figure_is_reported(run: Run) -> None:
    assert run.done.returncode == 0, run.done.stderr
    text = run.report.read_text()
    assert text in run.done.stdout  # printed as written
    row = next(line for line in text.splitlines() if line.startswith("| 1MiB |"))
    assert row.count(" ms |") == 2 and "MiB |" in row
    assert "Load average" in text
    # disk cold, peer memory, two saves; the speed-ups vs disk and vs S3 and the stall ratio
    assert row.count(" s |") == 4 + (not missing_binaries())
    assert row.count("met |") == 2 + (not missing_binaries())
    if missing := missing_binaries():
        assert "S3 not run: Ceph programs missing" in text and row.count("not run |") == 2
        pytest.skip(f"the S3 column was not run: Ceph programs missing: {', '.join(missing)}")
    assert "S3: Ceph RGW" in text and "not run" not in row


def test_the_profile_names_the_recovery(run: Run) -> None:
    assert run.done.returncode == 0, run.done.stderr
    printed = run.done.stdout.split(run.report.read_text(), 1)[1]  # after the report
    assert "1MiB per rank: the slowest rank's peer-memory recovery" in printed
    # resume_from_peers holds nearly all of the load's time, so it is always among
    # the top lines; its parts (map_copy, the transfer) are not: under load the
    # collectives' waits can push them out of the 30 printed.
    peers = printed.split("## 1MiB per rank: the slowest rank's S3", 1)[0]
    assert "resume_from_peers" in peers
    if missing := missing_binaries():
        assert "1MiB per rank: no S3 recovery (Ceph programs missing" in printed
        pytest.skip(f"the S3 profile was not run: Ceph programs missing: {', '.join(missing)}")
    s3 = printed.split("1MiB per rank: the slowest rank's S3 recovery")[1]
    # A profile of a load that did not go through peer memory. (Which S3 functions
    # reach its top lines at 1 MiB varies from run to run, so none is named.)
    assert "(load)" in s3 and "resume_from_peers" not in s3
