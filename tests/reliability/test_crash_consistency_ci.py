"""The power-loss and rank-death harnesses at their CI level, through the runner as CI runs them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import mouthguard
from reliability import run as runner


def run_ci_level(harness: str, tmp_path: Path) -> dict[str, Any]:
    """One harness at its CI level through the runner; its JSON report."""
    argv = ["--level", "ci", "--only", harness, "--json-dir", str(tmp_path), "--no-doc"]
    assert runner.main(argv) == runner.EXIT_OK
    report: dict[str, Any] = json.loads((tmp_path / f"{harness}.json").read_text())
    return report


# Two tests, not one: the two harnesses are independent, and apart they can run on
# two workers at once instead of being one of the suite's longest single tests.
@pytest.mark.slow
def test_powerloss_ci_level_passes_with_its_case_counts(tmp_path: Path) -> None:
    powerloss = run_ci_level("powerloss", tmp_path)
    assert powerloss["ok"], powerloss["details"]["failures"]
    assert powerloss["cases"] >= 500
    # sync, async, replication, retention, multirank, dcp, pack
    assert len(powerloss["cases_by_kind"]) == 7
    # every crash point of every variant got at least one state, even at ci level
    details = powerloss["details"]
    assert details["crash_points_covered"] == details["crash_points"]


@pytest.mark.slow
def test_rankdeath_ci_level_passes_with_its_case_counts(tmp_path: Path) -> None:
    rankdeath = run_ci_level("rankdeath", tmp_path)
    assert rankdeath["ok"], rankdeath["details"]["failures"]
    assert rankdeath["cases"] >= 20
    # the survivors said what happened, in mouthguard's words
    assert set(rankdeath["details"]["survivor_errors"]) <= {"RankLostError", "RankFailedError"}
    assert rankdeath["details"]["survivor_errors"]
    # a victim that stays alive but silent (SIGSTOP): only the collective timeout ends it
    stopped = [k for k in rankdeath["cases_by_kind"] if k.startswith("stopped (SIGSTOP)")]
    assert sum(rankdeath["cases_by_kind"][k] for k in stopped) >= 2


def test_collective_timeout_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="collective_timeout"):
        mouthguard.Checkpointer(tmp_path / "s", "r", collective_timeout=0)
