"""The crash harness at its CI level: SIGKILL loops over a saving process, all invariants held."""

from __future__ import annotations

import pytest

from reliability import crash, crash_checks


@pytest.mark.slow
def test_crash_harness_ci_level_survives_every_kill() -> None:
    result = crash.run("ci")
    assert result.ok, result.details["failures"]
    assert result.cases >= 6
    assert result.survived == result.cases
    landed = result.details["kills_landed"]
    assert landed.get("inside_save_write", 0) >= 1, f"no kill landed inside a save: {landed}"
    assert result.details["saves_acknowledged"] > 0


def test_retention_rule_allows_only_routine_steps_with_enough_newer_ones() -> None:
    ledger = crash_checks.Ledger()
    routine = [s for s in range(40) if crash_checks.importance_for(s) == "routine"]
    kept = [s for s in range(40) if crash_checks.importance_for(s) != "routine"]
    assert kept, "the worker saves milestone and critical steps too"
    # a pass that saw routine steps 0, 1, 2, 3: only step 0 has keep_last (3) newer ones
    ledger.passes.append((frozenset(routine[:4]), None))
    assert ledger.may_be_dropped(routine[0])
    assert not ledger.may_be_dropped(routine[1])
    # the save in flight when the pass began counts once it is known to have committed
    ledger.passes.append((frozenset(routine[1:4]), routine[4]))
    assert not ledger.may_be_dropped(routine[1])
    ledger.committed.add(routine[4])
    assert ledger.may_be_dropped(routine[1])
    # milestone and critical steps are never the policy's to drop
    ledger.passes.append((frozenset(range(40)), None))
    assert not any(ledger.may_be_dropped(s) for s in kept)
