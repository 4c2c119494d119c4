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


def test_the_gpu_benchmark_runs_its_every_step_on_the_cpu(tmp_path: Path) -> None:
    # CI has no GPU: --device cpu drives the same harness on CPU tensors.
    args = ("--device", "cpu", "--size", "8M", "--tensors", "6", "--repeats", "1")
    text = _run("benchmarks.gpu", *args, out=tmp_path / "gpu.md")
    assert "no statement about GPUs" in text
    for row in (
        "| device-to-host copy into pinned memory (the stall reference) |",
        "| raw parallel O_DIRECT write + fsync |",
        "| raw parallel O_DIRECT read |",
        "| mouthguard save_async stall, first save, no prepare |",
        "| mouthguard save_async stall, first save after prepare |",
        "| mouthguard save_async stall, later saves |",
        "| DCP async_save stall, later saves |",
        "| mouthguard save (sync, durable, xxh3) |",
        "| DCP save (8 threads) |",
        "| safetensors save_file + fsync |",
        "| mouthguard load(into=device state), verified |",
        "| mouthguard load(device=...), verified |",
        "| DCP load into the device state |",
        "| safetensors load_file(device=...) |",
        "| load into the device >= 1.3x safetensors load_file(device=...) |",
    ):
        assert row in text, row


def test_the_gpu_benchmark_refuses_cuda_without_a_gpu(tmp_path: Path) -> None:
    import torch  # noqa: PLC0415 - only to know whether this machine has a GPU

    if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs the real thing
        return
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--out", str(tmp_path / "x.md")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2
    assert "no CUDA device" in result.stderr
    assert not (tmp_path / "x.md").exists()
