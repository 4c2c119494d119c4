"""Retention rules, one at a time, plus order-independence as a property."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mouthguard.policy import (
    CheckpointFacts,
    Importance,
    PolicyConfig,
    RetentionDecision,
    decide_retention,
)
from tests.policy.scenario import copy

R = Importance.ROUTINE
M = Importance.MILESTONE
T = Importance.TRANSIENT
C = Importance.CRITICAL
NOW = 1_000_000.0


def ck(
    step: int,
    importance: Importance = R,
    *,
    run: str = "r",
    valid: bool | None = True,
    held: bool = False,
    loss: float | None = None,
    created: float | None = None,
) -> CheckpointFacts:
    return CheckpointFacts(
        run,
        step,
        importance,
        NOW - 100_000 + step if created is None else created,
        valid=valid,
        held=held,
        metrics={} if loss is None else {"loss": loss},
        copies=(copy("fast", "a", verified=valid is True),),
    )


def decide(*ckpts: CheckpointFacts, **config: object) -> dict[int, RetentionDecision]:
    decisions = decide_retention(ckpts, PolicyConfig.from_toml(config), now=NOW)
    return {d.step: d for d in decisions}


def kept(decisions: dict[int, RetentionDecision]) -> list[int]:
    return [step for step, d in decisions.items() if d.keep]


def test_one_decision_per_checkpoint_ordered_by_run_and_step() -> None:
    ckpts = [ck(3, run="b"), ck(2, run="a"), ck(1, run="b"), ck(1, run="a")]
    decisions = decide_retention(ckpts, PolicyConfig(), now=NOW)
    assert [d.key for d in decisions] == [("a", 1), ("a", 2), ("b", 1), ("b", 3)]


def test_duplicate_checkpoints_and_bad_now_are_errors() -> None:
    with pytest.raises(ValueError, match="r/1 appears twice"):
        decide_retention([ck(1), ck(1)], PolicyConfig(), now=NOW)
    with pytest.raises(ValueError, match="now must be a finite"):
        decide_retention([ck(1)], PolicyConfig(), now=math.nan)


def test_routine_keeps_the_last_n_and_says_why_the_rest_go() -> None:
    d = decide(*(ck(s) for s in range(1, 6)))
    assert kept(d) == [3, 4, 5]
    assert d[2].reasons == ("routine: older than the last 3 valid routine checkpoints of run r",)
    assert d[4].reasons == ("routine: one of the last 3 valid routine checkpoints of run r",)
    assert d[5].reasons == (
        "newest valid checkpoint of run r",
        "routine: one of the last 3 valid routine checkpoints of run r",
    )
    assert d[5].newest_valid and not d[4].newest_valid


def test_keep_last_counts_per_level() -> None:
    d = decide(ck(1), ck(2, M), ck(3, M), ck(4, T), ck(5, T), routine={"keep_last": 1})
    # the one routine save is kept although four newer saves of other levels exist
    assert d[1].reasons == ("routine: the last valid routine checkpoint of run r",)
    assert d[4].reasons == ("transient: older than the last valid transient checkpoint of run r",)
    assert kept(d) == [1, 2, 3, 5]


def test_keep_last_zero() -> None:
    d = decide(ck(1), ck(2), routine={"keep_last": 0})
    assert d[1].reasons == ("routine: keep_last is 0: no routine checkpoint is kept by count",)
    assert d[2].reasons == ("newest valid checkpoint of run r",)


def test_milestone_rule_keeps_all_by_default_or_the_last_n() -> None:
    d = decide(*(ck(s, M) for s in range(1, 5)))
    assert kept(d) == [1, 2, 3, 4]
    assert d[1].reasons == ("milestone: every valid milestone is kept",)
    d = decide(*(ck(s, M) for s in range(1, 5)), milestone={"keep_last": 2})
    assert kept(d) == [3, 4]


def test_critical_is_never_auto_deleted_even_when_invalid() -> None:
    d = decide(ck(1, C, valid=False), ck(2, C), *(ck(s) for s in range(3, 10)))
    assert d[1].keep and d[1].reasons == ("critical: never auto-deleted",)
    assert d[2].keep and not d[2].newest_valid


def test_held_is_kept_even_when_invalid_and_old() -> None:
    d = decide(ck(1, held=True), ck(2, valid=False, held=True), *(ck(s) for s in range(3, 9)))
    assert d[1].reasons == ("held: a hold blocks deletion",)
    assert d[2].reasons == ("held: a hold blocks deletion",)


def test_a_corrupt_newest_checkpoint_falls_back_to_the_newest_valid() -> None:
    d = decide(
        ck(1), ck(2), ck(3), ck(4, valid=False), ck(5, valid=False), routine={"keep_last": 2}
    )
    assert kept(d) == [2, 3]
    assert d[3].newest_valid and d[3].reasons[0] == "newest valid checkpoint of run r"
    # invalid ones are never counted by keep-last, so they never push a valid one out
    assert d[5].reasons == (
        "invalid: failed verification; only a hold or critical importance keeps it",
    )


def test_a_suspect_checkpoint_is_called_suspect_with_its_reason() -> None:
    """Intact bytes, a state a check refused: never "failed verification"."""
    suspect = dataclasses.replace(ck(3, valid=None), suspect="16 NaN in model.w")
    d = decide(ck(1), ck(2), suspect, routine={"keep_last": 5})
    assert not d[3].keep and not d[3].newest_valid and d[2].newest_valid
    assert d[3].reasons == (
        "suspect: 16 NaN in model.w; only a hold or critical importance keeps it",
    )


def test_what_its_trainer_released_is_kept_only_as_a_recovery_point_or_by_a_guard() -> None:
    released = [dataclasses.replace(ck(s), released=True) for s in (2, 3)]
    held = dataclasses.replace(ck(4, held=True), released=True)
    newest = dataclasses.replace(ck(6), released=True)
    d = decide(ck(1), *released, held, ck(5), newest, routine={"keep_last": 10})
    assert kept(d) == [1, 4, 5, 6]  # keep-last would have kept 2 and 3 as well
    assert d[2].reasons[0].startswith("released by its trainer")
    assert d[4].reasons == ("held: a hold blocks deletion",)
    assert d[6].newest_valid  # never the last recovery point given up


def test_newest_valid_is_kept_whatever_its_level() -> None:
    d = decide(ck(1), ck(2, T), routine={"keep_last": 0}, transient={"keep_last": 0})
    assert d[2].keep and d[2].reasons == ("newest valid checkpoint of run r",)
    assert not d[1].keep


def test_unchecked_newest_is_kept_with_the_newest_proven_valid_as_fallback() -> None:
    d = decide(ck(1), ck(2), ck(3, valid=None), ck(4, valid=None), routine={"keep_last": 1})
    assert kept(d) == [2, 4]
    assert d[4].reasons[0] == "newest checkpoint of run r not known to be invalid (unchecked)"
    assert d[2].reasons == ("newest verified-valid checkpoint of run r (newer ones are unchecked)",)
    assert d[2].newest_valid and d[4].newest_valid


def test_a_verified_copy_proves_an_unchecked_checkpoint_valid() -> None:
    proven = CheckpointFacts("r", 2, R, 0.0, copies=(copy("fast", "a", verified=True),))
    d = decide(ck(1), proven, routine={"keep_last": 0})
    assert d[2].reasons == ("newest valid checkpoint of run r",)
    assert not d[1].keep


def test_best_k_min_and_max() -> None:
    ckpts = [ck(1, loss=3.0), ck(2, loss=1.0), ck(3, loss=2.0), ck(4, loss=5.0), ck(5)]
    d = decide(*ckpts, routine={"keep_last": 1}, best_metric="loss", best_k=2)
    assert kept(d) == [2, 3, 5]
    assert d[2].reasons == ("best 2 by loss (min): loss=1, rank 1",)
    assert d[3].reasons == ("best 2 by loss (min): loss=2, rank 2",)
    d = decide(*ckpts, routine={"keep_last": 1}, best_metric="loss", best_mode="max")
    assert kept(d) == [4, 5]
    assert d[4].reasons == ("best 1 by loss (max): loss=5, rank 1",)


def test_best_k_ignores_missing_nan_invalid_and_transient_and_prefers_newer_ties() -> None:
    d = decide(
        ck(1, loss=1.5),
        ck(2, loss=math.nan),
        ck(3, loss=0.1, valid=False),
        ck(4, T, loss=0.2),
        ck(5, loss=1.5),
        ck(6),
        ck(7, T),
        routine={"keep_last": 0},
        best_metric="loss",
    )
    assert d[5].reasons == ("best 1 by loss (min): loss=1.5, rank 1",)
    assert kept(d) == [5, 7]


def test_keep_within_keeps_young_checkpoints_including_future_ones() -> None:
    d = decide(
        ck(1, created=NOW - 7200),
        ck(2, created=NOW - 1800),
        ck(3, T, created=NOW - 10),
        ck(4, created=NOW + 60),
        routine={"keep_last": 0},
        transient={"keep_last": 0},
        keep_within_seconds=3600,
    )
    assert kept(d) == [2, 4]
    assert d[2].reasons == ("created within 1h of now (30m old)",)
    assert d[4].reasons[-1] == "created within 1h of now (0s old)"


def test_every_rule_that_keeps_is_listed_in_order() -> None:
    d = decide(ck(1, C, held=True, loss=0.5), best_metric="loss")
    assert d[1].reasons == (
        "held: a hold blocks deletion",
        "critical: never auto-deleted",
        "newest valid checkpoint of run r",
        "best 1 by loss (min): loss=0.5, rank 1",
    )


def test_fast_pins_the_newest_valid_and_the_newest_critical() -> None:
    d = decide(ck(1, C), ck(2, C), ck(3, M), ck(4), ck(5), ck(6, valid=False), ck(7, T))
    assert [s for s, x in d.items() if x.pinned_on_fast] == [2, 4, 5]
    assert d[2].pin_reasons == ("pinned on fast: newest critical checkpoint of run r",)
    assert d[5].pin_reasons == ("pinned on fast: one of the 2 newest valid checkpoints of run r",)
    d = decide(ck(1, C), ck(2), ck(3), fast_keep_newest=0)
    assert [s for s, x in d.items() if x.pinned_on_fast] == [1]


def test_only_kept_checkpoints_are_pinned() -> None:
    d = decide(ck(1), ck(2), routine={"keep_last": 0}, fast_keep_newest=2)
    assert not d[1].keep and not d[1].pinned_on_fast
    assert d[2].pin_reasons == ("pinned on fast: one of the 2 newest valid checkpoints of run r",)


checkpoints = st.lists(
    st.builds(
        ck,
        st.integers(0, 30),
        st.sampled_from(list(Importance)),
        run=st.sampled_from(["a", "b"]),
        valid=st.sampled_from([True, False, None]),
        held=st.booleans(),
        loss=st.none() | st.floats(0, 10),
    ),
    max_size=25,
    unique_by=lambda c: c.key,
)


@settings(max_examples=200, deadline=None)
@given(checkpoints, st.randoms(use_true_random=False))
def test_properties(ckpts: list[CheckpointFacts], rnd: random.Random) -> None:
    config = PolicyConfig(best_metric="loss", best_k=1)
    decisions = decide_retention(ckpts, config, now=NOW)
    shuffled = list(ckpts)
    rnd.shuffle(shuffled)
    assert decide_retention(shuffled, config, now=NOW) == decisions
    assert [d.key for d in decisions] == sorted(c.key for c in ckpts)
    by_key = {c.key: c for c in ckpts}
    for d in decisions:
        c = by_key[d.key]
        assert d.reasons, "every decision carries a reason"
        if c.held or c.importance is C:
            assert d.keep
        if d.pinned_on_fast:
            assert d.keep
    for run in {c.run for c in ckpts}:
        candidates = [c for c in ckpts if c.run == run and c.valid is not False]
        if candidates:
            newest = max(candidates, key=lambda c: c.step)
            decision = next(d for d in decisions if d.key == newest.key)
            assert decision.keep and decision.newest_valid
