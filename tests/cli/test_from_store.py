"""``plan``/``simulate --from-store``: the figures are the run's recorded saves, on a real store."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.reader import read_manifest
from mouthguard.cli.main import main


def _store_with_saves(tmp_path: Path) -> tuple[Path, list[Any]]:
    """Run ``alpha``: 3 sync and 2 async saves; returns the store and their recorded timings."""
    path = tmp_path / "store"
    store = mouthguard.open_store(path)
    ckpt = mouthguard.Checkpointer(store, "alpha", background=False)
    for step in (1, 2, 3):
        ckpt.save(step, {"w": torch.full((4096,), float(step))})
    for step in (4, 5):
        ckpt.save_async(step, {"w": torch.full((4096,), float(step))})
        ckpt.flush()
    ckpt.close()
    tier = store.tiers[0]
    timings = [read_manifest(tier, "alpha", step).save for step in range(1, 6)]
    assert all(t is not None for t in timings)
    return path, timings


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(argv) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_simulate_uses_the_recorded_medians(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, timings = _store_with_saves(tmp_path)
    argv = ["simulate", "--from-store", str(path), "--run", "alpha", "--runs", "3", "--json"]
    out = _json([*argv, "--mode", "async"], capsys)
    write = statistics.median(t.seconds for t in timings)
    stall = statistics.median(t.stall_seconds for t in timings if t.mode == "async")
    scenario = out["scenario"]
    assert scenario["write_seconds"] == write
    assert scenario["snapshot_seconds"] == stall
    measured = scenario["from_store"]
    assert (measured["timed_saves"], measured["sync_saves"], measured["async_saves"]) == (5, 3, 2)
    assert measured["steps"] == [1, 5] and measured["used"] == ["write_seconds", "stall_seconds"]
    assert measured["checkpoint_bytes"] > 4096 * 4  # the tensor's bytes and the safetensors header
    assert "load" in measured["not_recorded"]


def test_plan_uses_them_and_names_the_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, timings = _store_with_saves(tmp_path)
    figures = _json(["plan", "70b", "--from-store", str(path), "--run", "alpha", "--json"], capsys)
    assert figures["checkpoint_seconds"] == statistics.median(t.seconds for t in timings)
    assert figures["checkpoint_seconds_source"] == "store"
    assert figures["stall_seconds"] == statistics.median(
        t.stall_seconds for t in timings if t.mode == "async"
    )
    assert figures["from_store"]["timed_saves"] == 5
    # The table says where the figures came from and how many saves they summarise.
    capsys.readouterr()
    assert main(["plan", "70b", "--from-store", str(path), "--run", "alpha"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "run alpha: 5 recorded saves" in text and "not recorded: load" in text


def test_sync_only_run_keeps_the_modelled_stall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store"
    ckpt = mouthguard.Checkpointer(mouthguard.open_store(path), "beta", background=False)
    ckpt.save(7, {"w": torch.zeros(16)})
    ckpt.close()
    plain = _json(["plan", "70b", "--json"], capsys)
    figures = _json(["plan", "70b", "--from-store", str(path), "--run", "beta", "--json"], capsys)
    assert figures["from_store"]["used"] == ["write_seconds"]
    assert figures["from_store"]["stall_seconds"] is None
    assert figures["stall_seconds"] == plain["stall_seconds"]


@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    path, _ = _store_with_saves(tmp_path)
    model = ["70b"] if command == "plan" else []
    cases = {
        ("--from-store", str(path), "--run", "nope"): "run 'nope' has no checkpoints",
        ("--from-store", str(path)): "--from-store needs --run",
        ("--run", "alpha"): "give --from-store too",
        ("--from-store", str(tmp_path / "missing"), "--run", "alpha"): "no store at",
        ("--from-store", str(path), "--run", "alpha", "--checkpoint-seconds", "3"): (
            "--checkpoint-seconds would assume"
        ),
    }
    for extra, message in cases.items():
        capsys.readouterr()
        assert main([command, *model, *extra]) == 2
        assert message in " ".join(capsys.readouterr().err.split())
