"""The blast-radius limit as a pure rule: what one pass may start deleting of a run."""

from __future__ import annotations

import pytest

from mouthguard.errors import ConfigError
from mouthguard.policy.blast_radius import check_blast_radius
from mouthguard.policy.config import PolicyConfig
from mouthguard.policy.deletion import CopyAction
from mouthguard.policy.facts import CheckpointFacts, CopyFacts
from mouthguard.policy.importance import Importance

R, M, T = Importance.ROUTINE, Importance.MILESTONE, Importance.TRANSIENT


def _facts(step: int, importance: Importance = R, *, trashed: bool = False) -> CheckpointFacts:
    copy = CopyFacts("fast", "node", trashed_at=1.0 if trashed else None)
    return CheckpointFacts("r", step, importance, created=float(step), copies=(copy,))


def _trash(facts: CheckpointFacts) -> tuple[CheckpointFacts, CopyAction]:
    return facts, CopyAction("fast", "trash", f"step {facts.step} is old")


def test_half_a_run_may_go_but_not_more() -> None:
    run = [_facts(s) for s in range(1, 7)]
    assert check_blast_radius(run, [_trash(f) for f in run[:3]]) == []
    (refusal,) = check_blast_radius(run, [_trash(f) for f in run[:4]])
    assert refusal.run == "r" and refusal.checkpoints == 6
    assert [d.step for d in refusal.would_delete] == [1, 2, 3, 4]
    assert refusal.would_delete[0].reason == "step 1 is old"
    assert "4 of the run's 6 checkpoints (67%)" in refusal.why and "50%" in refusal.why
    # A larger share allows it.
    assert check_blast_radius(run, [_trash(f) for f in run[:4]], max_share=0.7) == []


def test_any_milestone_is_refused_whatever_the_share() -> None:
    run = [_facts(1, M), *(_facts(s) for s in range(2, 12))]
    (refusal,) = check_blast_radius(run, [_trash(run[0])], max_share=1.0)
    assert "milestone step(s) 1" in refusal.why


def test_transient_and_finished_deletions_are_not_counted() -> None:
    scratch = [_facts(s, T) for s in range(1, 10)]
    routine = [_facts(10), _facts(11, trashed=True), _facts(12)]
    planned = [_trash(f) for f in scratch] + [
        (routine[1], CopyAction("fast", "purge", "trash delay over")),
        _trash(routine[0]),
    ]
    # 1 of 3 routine starts its deletion; the purge finishes one started earlier.
    assert check_blast_radius([*scratch, *routine], planned) == []


def test_demotions_and_keeps_are_never_refused() -> None:
    run = [_facts(s, M) for s in range(1, 4)]
    planned = [(f, CopyAction("fast", "demote", "replicated")) for f in run]
    assert check_blast_radius(run, planned) == []


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, float("nan"), True])
def test_a_bad_share_is_a_clear_error(bad: float) -> None:
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        check_blast_radius([], [], max_share=bad)
    with pytest.raises(ConfigError, match=r"policy\.max_delete_share"):
        PolicyConfig(max_delete_share=bad)


def test_the_share_is_a_policy_setting() -> None:
    assert PolicyConfig().max_delete_share == 0.5
    assert PolicyConfig.from_toml({"max_delete_share": 0.25}).max_delete_share == 0.25
    with pytest.raises(ConfigError, match=r"policy\.max_delete_share"):
        PolicyConfig.from_toml({"max_delete_share": 2})
