"""Helpers shared by the CLI tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mouthguard.cli.main import main


def show_json(
    store: Path, run: str, step: int, capsys: pytest.CaptureFixture[str]
) -> dict[str, object]:
    """``mouthguard --store STORE show RUN STEP --json`` in-process, parsed (exit 0 asserted)."""
    capsys.readouterr()
    assert main(["--store", str(store), "show", run, str(step), "--json"]) == 0
    result: dict[str, object] = json.loads(capsys.readouterr().out)
    return result
