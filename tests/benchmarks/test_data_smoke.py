"""The dataset loader benchmark end to end in ``--quick`` mode: every expected row is reported.

Timings are never asserted (16 MiB on a shared CI machine says nothing); only that
one run writes the report with its tables, rows and verdicts. The raw-file and
mouthguard rows always run; a peer (webdataset, mosaicml-streaming, litdata, the
``bench-data`` extra) runs only when it is importable, and its test is skipped
with the reason otherwise. S3 rows run against the local Ceph RGW when Ceph is
installed and say "not available" (still a row) when it is not.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]

#: reader -> (the module it needs, the label its rows start with)
PEERS = {
    "webdataset": ("webdataset", "webdataset (its TarWriter shards)"),
    "mosaic": ("streaming", "mosaicml-streaming (MDS, StreamingDataset)"),
    "litdata": ("litdata", "litdata (optimize, StreamingDataset)"),
}
ALWAYS = {
    "raw": "raw small files (one file per sample, open/read)",
    "mouthguard": "mouthguard (pack, StreamingDataLoader)",
}
LOCAL_ONLY = {
    "memory": "in-memory samples, no I/O (the DataLoader's own cost)",
    "mouthguard-cache": "mouthguard with a local cache_dir",
}
TABLES = [
    f"### {source}, {state}, 0 workers" for source in ("local", "s3") for state in ("cold", "warm")
]
VERDICTS = ("| **met** |", "| **not met** |", ")")  # "not available (why)" ends with ")"


def importable(reader: str) -> bool:
    return importlib.util.find_spec(PEERS[reader][0]) is not None


def sections(report: str) -> dict[str, list[str]]:
    """Each ``### `` heading's lines up to the next heading."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in report.splitlines():
        if line.startswith("#"):
            current = found.setdefault(line, []) if line.startswith("### ") else None
        elif current is not None:
            current.append(line)
    return found


# One benchmark run serves every test here: keep them on one xdist worker
# (`--dist loadgroup`), or each worker that gets one would run it again. The
# fixture is session-scoped because a worker may run other modules' tests between
# these, which would tear a module-scoped one down and run the benchmark twice.
pytestmark = pytest.mark.xdist_group("bench-data")


@pytest.fixture(scope="session")
def report(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("bench-data")
    out, work = tmp / "bench-data.md", tmp / "work"
    readers = [*ALWAYS, *LOCAL_ONLY, *(r for r in PEERS if importable(r))]
    cmd = [sys.executable, "-m", "benchmarks.data", "--quick", "--readers", ",".join(readers)]
    cmd += ["--dir", str(work), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # With --dir the benchmark removes what it wrote but leaves the directory.
    assert not any(work.iterdir()), sorted(p.name for p in work.iterdir())
    return out.read_text()


def rows_of(lines: list[str], label: str) -> list[str]:
    return [line for line in lines if line.startswith(f"| {label}")]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_report_has_machine_command_and_every_table(report: str) -> None:
    lines = report.splitlines()
    assert any(line.startswith("Machine: ") and "litdata" in line for line in lines)
    assert "**Shared machine.**" in report
    assert "python -m benchmarks.data --quick" in report
    found = sections(report)
    for table in TABLES:
        assert table in found, f"table {table!r} missing"
    assert "### Stall at a 20 ms step: local" in found
    assert "### Stall at a 20 ms step: s3" in found
    assert "torchvision::nms" in report  # the mosaicml-streaming workaround is documented


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_raw_and_mouthguard_rows_in_every_table(report: str) -> None:
    for heading, lines in sections(report).items():
        wanted = dict(ALWAYS)
        if "local" in heading:
            wanted |= LOCAL_ONLY
        for label in wanted.values():
            found = rows_of(lines, label)
            assert len(found) == 1, f"{label!r} missing in {heading!r}"
            if "**not available**" not in found[0]:
                expected = 10 if heading.startswith("### Stall") else 12
                assert found[0].count("|") == expected, found[0]  # every cell filled
                if not heading.startswith("### Stall"):
                    # The CPU sums were measured: the loader's, the server's on S3 only.
                    server = r"\d+\.\d\d" if "s3" in heading else "-"
                    cell = found[0].rstrip(" |").rsplit("|", 1)[1].strip()
                    assert re.fullmatch(rf"\d+\.\d\d / {server} / \d+% of \d+", cell), cell


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_mouthguard_row_has_a_verdict(report: str) -> None:
    verdicts = report.split("## Targets: verdicts", 1)[1].split("##", 1)[0].splitlines()
    rows = [line for line in verdicts if line.startswith("| ") and "---" not in line]
    throughput = [r for r in rows if "best peer" in r]
    stall = [r for r in rows if r.startswith("| stall,")]
    # 2 sources x 2 states x 1 worker count; mouthguard-cache is local only.
    assert len(throughput) == 2 * 2 + 2, throughput
    # The same, plus mouthguard's first batch on S3 cold against the fastest peer's.
    assert len(stall) == 2 * 2 + 2 + 1, stall
    # The in-memory floor was measured beside the S3 cells too: every warm verdict has one.
    assert not [r for r in stall if "no floor measured" in r], stall
    for row in rows[1:]:
        assert row.endswith(VERDICTS), row


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("peer", sorted(PEERS))
def test_peer_rows(report: str, peer: str) -> None:
    if not importable(peer):
        pytest.skip(f"{PEERS[peer][0]} is not installed (the bench-data extra)")
    label = PEERS[peer][1]
    for heading, lines in sections(report).items():
        assert len(rows_of(lines, label)) == 1, f"{label!r} missing in {heading!r}"
