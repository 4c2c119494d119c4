"""The stall and weights benchmarks end to end on tiny inputs: every row and target reported.

Never a timing assertion: only that one run writes the whole report. A peer that is not
installed (the weights peers are the ``bench`` extra) says "not available" and still counts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def _run(module: str, *args: str, out: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(
        [sys.executable, "-m", module, *args, "--out", str(out), "--dir", str(out.parent)],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out.read_text()


def test_the_stall_benchmark_reports_every_mode_and_target(tmp_path: Path) -> None:
    text = _run("benchmarks.stall", "--size", "8M", "--rounds", "2", out=tmp_path / "stall.md")
    for row in (
        "| memcpy into a preallocated copy |",
        "| first save_async of a new Checkpointer |",
        "| prepare(state) before the first save",
        "| first save_async after prepare(state) |",
        "| save_async, one tier (steady) |",
        "| save_async while the previous save replicates (jobs yield, as shipped) |",
        "| save_async while the previous save replicates (burst gate bypassed) |",
        "stall with replication in flight <= 1.25x memcpy in every round",
        "first save_async stall <= 2.0x the steady stall",
    ):
        assert row in text, row
    assert "python -m benchmarks.stall --size 8M --rounds 2" in text


def test_the_weights_benchmark_reports_every_loader_and_target(tmp_path: Path) -> None:
    args = ("--size", "8M", "--shards", "2", "--repeats", "1")
    text = _run("benchmarks.weights", *args, out=tmp_path / "weights.md")
    for row in (
        "| raw O_DIRECT read of the same bytes (the disk's limit) |",
        "| safetensors load_file, every shard |",
        "| mouthguard weights.load, HF directory (no checksums to verify) |",
        "| mouthguard weights.load, checkpoint (xxh3-128 verified) |",
        "| fastsafetensors SafeTensorsFileLoader |",
        "| Run:ai Model Streamer SafetensorsStreamer |",
        "| tensorizer TensorDeserializer (its own .tensors file) |",
        "weights load >= 0.9x the raw read",
    ):
        assert row in text, row
    # mouthguard's own rows are always measured, never "not available".
    assert "| mouthguard weights.load, HF directory (no checksums to verify) | not" not in text
    assert "| mouthguard weights.load, checkpoint (xxh3-128 verified) | not" not in text
