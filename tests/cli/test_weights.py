"""``mouthguard weights load``: what it prints, and its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.cli.main import main
from tests.checkpoint.helpers import flip_byte
from tests.weights.helpers import model_state, write_sharded


def test_load_an_hf_directory_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = model_state()
    directory = write_sharded(tmp_path / "m", state)
    assert main(["weights", "load", str(directory), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "safetensors-index"
    assert out["tensors"] == len(state)
    assert out["bytes"] == sum(t.numel() * t.element_size() for t in state.values())
    assert out["verified_files"] == [] and len(out["unverified_files"]) == 3
    assert out["device"] == "cpu" and out["gds"] is False


def test_load_a_checkpoint_tensor_parallel_shows_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mouthguard.Checkpointer(tmp_path / "s", run="r", background=False).save(
        2, {"a.q_proj.weight": torch.randn(8, 4)}
    )
    args = ["weights", "load", str(tmp_path / "s"), "--run", "r", "--tp-size", "2"]
    assert main([*args, "--tp-rank", "1", "--tp-rule", "*.q_proj.weight=0"]) == 0
    out = capsys.readouterr().out
    assert "rank-00000.safetensors" in out  # verified
    assert "1 (64 B)" in out  # one tensor, half of 8x4 fp32


def test_damage_exits_1_and_usage_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mouthguard.Checkpointer(tmp_path / "s", run="r", background=False).save(1, {"w": torch.ones(9)})
    flip_byte(tmp_path / "s" / "fast" / "r" / f"{1:012d}" / "rank-00000.safetensors", -1)
    assert main(["weights", "load", str(tmp_path / "s"), "--run", "r"]) == 1
    assert "checksum mismatch" in capsys.readouterr().err
    assert main(["weights", "load", str(tmp_path / "nothing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    directory = write_sharded(tmp_path / "m", model_state())
    bad_rule = ["weights", "load", str(directory), "--tp-size", "2", "--tp-rule", "nodim"]
    assert main(bad_rule) == 2
    assert "PATTERN=DIM" in capsys.readouterr().err


def test_the_reported_time_starts_after_torch_is_imported(tmp_path: Path) -> None:
    # A fresh process, as a user runs the command: torch is imported by the load, and
    # the load's clock must start only once it is (the import is not the storage's time).
    directory = write_sharded(tmp_path / "m", model_state())
    code = f"""
import sys, time, types
from mouthguard.weights import loader
assert "torch" not in sys.modules
starts = []
def perf_counter():
    starts.append("torch" in sys.modules)
    return time.perf_counter()
loader.time = types.SimpleNamespace(perf_counter=perf_counter)
from mouthguard.cli.main import main
assert main(["weights", "load", {str(directory)!r}, "--json"]) == 0
print("torch imported when the clock started:", starts[0])
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "torch imported when the clock started: True" in done.stdout
