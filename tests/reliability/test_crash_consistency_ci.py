"""The power-loss and rank-death harnesses at their CI level, through the runner as CI runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mouthguard
from reliability import run as runner


@pytest.mark.slow
def test_powerloss_and_rankdeath_ci_levels_pass_with_their_case_counts(tmp_path: Path) -> None:
    argv = ["--level", "ci", "--only", "powerloss,rankdeath", "--json-dir", str(tmp_path)]
    assert runner.main([*argv, "--no-doc"]) == runner.EXIT_OK
    powerloss = json.loads((tmp_path / "powerloss.json").read_text())
    rankdeath = json.loads((tmp_path / "rankdeath.json").read_text())
    assert powerloss["ok"], powerloss["details"]["failures"]
    assert powerloss["cases"] >= 500
    # sync, async, replication, retention, multirank, dcp, pack
    assert len(powerloss["cases_by_kind"]) == 7
    # every crash point of every variant got at least one state, even at ci level
    details = powerloss["details"]
    assert details["crash_points_covered"] == details["crash_points"]
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
