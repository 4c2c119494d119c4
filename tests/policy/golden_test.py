"""Golden-file tests of the whole policy, in the style of restic's ``forget`` tests.

Each ``golden/*.json`` is one scenario (tiers, checkpoints with copies, ``now``,
config overrides) and the exact expected outcome, reasons included, so a change
of behaviour shows up as a readable diff of reasons. To accept new behaviour::

    MOUTHGUARD_UPDATE_GOLDEN=1 .venv/bin/pytest tests/policy/golden_test.py

then review the diff of ``tests/policy/golden/`` like code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.policy.scenario import render

GOLDEN = Path(__file__).parent / "golden"
SCENARIOS = sorted(GOLDEN.glob("*.json"))
UPDATE = os.environ.get("MOUTHGUARD_UPDATE_GOLDEN") == "1"


def test_there_are_enough_scenarios() -> None:
    assert len(SCENARIOS) >= 8


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_golden(path: Path) -> None:
    scenario = json.loads(path.read_text(encoding="utf-8"))
    actual = render(scenario)
    if UPDATE:
        scenario["expected"] = actual
        path.write_text(json.dumps(scenario, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    assert "expected" in scenario, f"{path.name} has no expected outcome: run with update"
    assert actual == scenario["expected"]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_golden_is_order_independent(path: Path) -> None:
    # The input order of checkpoints and copies must not change any decision.
    scenario = json.loads(path.read_text(encoding="utf-8"))
    shuffled = dict(scenario)
    shuffled["checkpoints"] = [
        {**c, "copies": list(reversed(c.get("copies", [])))}
        for c in reversed(scenario["checkpoints"])
    ]
    assert render(shuffled) == render(scenario)
