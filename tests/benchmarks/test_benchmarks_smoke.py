"""The benchmark harness end to end on a tiny state: every row and target is reported.

Timings are never asserted (a tiny state on a shared CI disk says nothing); only that
one run produces the whole report. Rows whose feature is not there yet say "not
available" and still count as present.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]

ROWS = [
    "memcpy into a preallocated copy (copy_)",
    "clone every tensor (allocates)",
    "raw write + fsync (",  # O_DIRECT, or buffered where the filesystem refuses it
    "raw read (",
    "torch.save + fsync",
    "torch.load",
    "safetensors save_file + fsync",
    "safetensors load_file",
    "DCP save (FileSystemWriter, 4 threads)",
    "DCP load (into preallocated)",
    "DCP async_save — first-save stall",
    "DCP async_save — stall (until it returns)",
    "DCP async_save — total (until the future's result)",
    "mouthguard save —",
    "mouthguard save, checksums disabled",
    "mouthguard load (verified)",
    "mouthguard load(into=...) (verified)",
    "mouthguard save with_sha256=True",
    "AES-GCM encrypted save (EncryptedTier over local)",
    "AES-GCM encrypted load (EncryptedTier over local)",
    "mouthguard save_async — first-save stall",
    "mouthguard save_async — stall (until it returns)",
    "mouthguard save_async — total (until result())",
]

TARGETS = [
    "durable sync save vs DCP save",
    "durable sync save vs raw ",
    "async save stall / memcpy of the state",
    "async save stall / DCP `async_save` stall",
    "cold load vs safetensors `load_file`",
    "cold load vs DCP load",
    "checksum cost: verified save / unverified save",
    "memory: peak RSS - baseline - state - one staging copy",
    "memory: growth from save 5 to save ",
    "files per checkpoint (2 ranks, gloo)",
    "(context) with_sha256 save / default save",
    "(context) async save total / DCP `async_save` total",
    "(context) first async save stall / later stall",
]
VERDICTS = ("| **met** |", "| **not met** |", "| not available (", "| - |")


@pytest.mark.slow
def test_one_run_reports_every_row_and_target(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    cmd = [sys.executable, "-m", "benchmarks.run", "--sizes", "8M", "--repeats", "1"]
    cmd += ["--dir", str(tmp_path / "work"), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = out.read_text()
    lines = report.splitlines()

    assert "Reproduce (from the repository root):" in report
    assert "benchmarks.run --sizes 8M --repeats 1" in report
    assert any(line.startswith("Machine: ") for line in lines)
    assert "## 8M state" in report
    assert "## Targets" in report and "### Targets at 8M" in report
    assert "DESIGN" not in report  # the report states its targets itself

    for row in ROWS:
        found = [line for line in lines if line.startswith(f"| {row}")]
        assert found, f"row {row!r} missing"
        if "not available" not in found[0]:
            assert found[0].count("|") == 7, found[0]  # all six cells filled
    for target in TARGETS:
        found = [line for line in lines if line.startswith(f"| {target}")]
        assert len(found) == 1, f"target {target!r} missing"
        assert found[0].endswith(VERDICTS), found[0]
    # Nothing was left behind in the benchmark directory.
    assert not any((tmp_path / "work").iterdir())
