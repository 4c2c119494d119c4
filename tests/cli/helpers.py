"""Helpers shared by the CLI tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.cli.main import main
from mouthguard.jobs.replicator import Replicator


def show_json(
    store: Path, run: str, step: int, capsys: pytest.CaptureFixture[str]
) -> dict[str, object]:
    """``mouthguard --store STORE show RUN STEP --json`` in-process, parsed (exit 0 asserted)."""
    capsys.readouterr()
    assert main(["--store", str(store), "show", run, str(step), "--json"]) == 0
    result: dict[str, object] = json.loads(capsys.readouterr().out)
    return result


def alpha_store(tmp_path: Path) -> Path:
    """Default two-tier store (fast + durable): run alpha 10 routine, 20 milestone, replicated."""
    path = tmp_path / "store"
    store = mouthguard.open_store(path)
    alpha = mouthguard.Checkpointer(store, "alpha", background=False)
    alpha.save(10, {"w": torch.ones(64)}, importance="routine")
    alpha.save(20, {"w": torch.ones(64) * 2}, importance="milestone")
    Replicator(store).run_once()
    return path
