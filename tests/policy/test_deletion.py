"""Deletion: every safety invariant has a focused test, and a property test over random stores."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mouthguard.policy import (
    CheckpointFacts,
    CopyAction,
    CopyFacts,
    Importance,
    PolicyConfig,
    RetentionDecision,
    TierFacts,
    decide_deletions,
    decide_retention,
    placement_for,
)
from tests.policy.scenario import copy, tier

NOW = 1_000_000.0
DAY = 86400.0
R = Importance.ROUTINE
M = Importance.MILESTONE
T = Importance.TRANSIENT
C = Importance.CRITICAL
TIERS = [tier("fast", "node-a", is_fast=True), tier("nfs", "rack-b"), tier("s3", "region-c")]
CONFIG = PolicyConfig()

FAST_V = copy("fast", "node-a", verified=True)
NFS_V = copy("nfs", "rack-b", verified=True)
S3_V = copy("s3", "region-c", verified=True)


def ckpt(
    *copies: CopyFacts, importance: Importance = R, held: bool = False, step: int = 1
) -> CheckpointFacts:
    return CheckpointFacts("r", step, importance, 0.0, valid=True, held=held, copies=copies)


def verdict(
    keep: bool, *, newest: bool = False, pins: tuple[str, ...] = (), step: int = 1
) -> RetentionDecision:
    reasons = ("kept for the test",) if keep else ("dropped for the test",)
    return RetentionDecision("r", step, keep, reasons, newest_valid=newest, pin_reasons=pins)


def act(
    c: CheckpointFacts,
    retention: RetentionDecision,
    *,
    config: PolicyConfig = CONFIG,
    tiers: Sequence[TierFacts] = TIERS,
    now: float = NOW,
) -> dict[str, tuple[str, str]]:
    placement = placement_for(c.importance, tiers, config)
    actions = decide_deletions(c, retention, placement, config, now=now)
    return {a.tier: (a.action, a.reason) for a in actions}


def kinds(actions: dict[str, tuple[str, str]]) -> dict[str, str]:
    return {t: a for t, (a, _) in actions.items()}


# --- a checkpoint retention drops goes through the trash --------------------


def test_dropped_checkpoint_is_trashed_first_on_every_tier() -> None:
    actions = act(ckpt(FAST_V, NFS_V), verdict(False))
    assert kinds(actions) == {"fast": "trash", "nfs": "trash"}
    assert actions["fast"][1] == "not kept (dropped for the test); purge after 1d in trash"


@pytest.mark.parametrize(
    ("waited", "expected"), [(0, "trash"), (DAY - 1, "trash"), (DAY, "purge"), (DAY + 1, "purge")]
)
def test_purge_only_after_the_trash_delay(waited: float, expected: str) -> None:
    trashed = copy("fast", "node-a", verified=True, trashed_at=NOW - waited)
    actions = act(ckpt(trashed), verdict(False))
    assert kinds(actions) == {"fast": expected}


def test_waiting_copy_says_how_long_is_left() -> None:
    trashed = copy("nfs", "rack-b", trashed_at=NOW - 3600)
    assert act(ckpt(trashed), verdict(False))["nfs"] == (
        "trash",
        "in trash for 1h; purge after 1d (23h left)",
    )


def test_trash_mark_in_the_future_is_not_elapsed() -> None:
    trashed = copy("nfs", "rack-b", trashed_at=NOW + 60)
    assert kinds(act(ckpt(trashed), verdict(False))) == {"nfs": "trash"}


def test_transient_trash_delay_is_zero_but_still_two_phase() -> None:
    fresh = ckpt(copy("fast", "node-a"), importance=T)
    assert act(fresh, verdict(False))["fast"] == (
        "trash",
        "not kept (dropped for the test); purge on the next pass",
    )
    marked = ckpt(copy("fast", "node-a", trashed_at=NOW), importance=T)
    assert kinds(act(marked, verdict(False))) == {"fast": "purge"}


def test_per_level_trash_delay() -> None:
    config = PolicyConfig.from_toml({"routine": {"trash_delay_seconds": 10}})
    trashed = ckpt(copy("fast", "node-a", trashed_at=NOW - 10))
    assert kinds(act(trashed, verdict(False), config=config)) == {"fast": "purge"}


# --- holds ----------------------------------------------------------------------


def test_held_checkpoint_is_never_trashed_purged_or_demoted() -> None:
    long_ago = NOW - 10 * DAY
    c = ckpt(
        copy("fast", "node-a", verified=True, trashed_at=long_ago),
        copy("nfs", "rack-b", verified=True),
        copy("s3", "region-c", verified=True, trashed_at=long_ago),
        held=True,
    )
    actions = act(c, verdict(False))
    assert kinds(actions) == {"fast": "keep", "nfs": "keep", "s3": "keep"}
    assert actions["fast"][1] == "held: a hold blocks deletion; its trash mark is lifted"
    assert actions["nfs"][1] == "held: a hold blocks deletion"
    # kept and not pinned: a demotion would be allowed if it were not held
    assert kinds(act(c, verdict(True))) == {"fast": "keep", "nfs": "keep", "s3": "keep"}


# --- kept checkpoints, recovery points, critical --------------------------------


def test_kept_checkpoint_is_never_trashed_and_its_trashed_copies_are_restored() -> None:
    c = ckpt(copy("fast", "node-a", verified=True), copy("nfs", "rack-b", trashed_at=NOW - DAY))
    actions = act(c, verdict(True))
    assert actions["nfs"] == ("keep", "restore from trash: kept for the test")
    assert actions["fast"][0] == "keep"


@pytest.mark.parametrize(
    "retention",
    [verdict(False, newest=True), verdict(True, newest=True)],
    ids=["inconsistent-keep", "consistent"],
)
def test_newest_valid_is_never_deleted(retention: RetentionDecision) -> None:
    c = ckpt(copy("fast", "node-a", verified=True, trashed_at=NOW - 9 * DAY), NFS_V)
    assert set(kinds(act(c, retention)).values()) == {"keep"}


def test_critical_is_never_deleted_even_if_retention_says_so() -> None:
    c = ckpt(FAST_V, NFS_V, S3_V, importance=C)
    assert set(kinds(act(c, verdict(False))).values()) <= {"keep", "demote"}


def test_the_last_verified_copy_of_a_kept_checkpoint_stays() -> None:
    c = ckpt(FAST_V, copy("nfs", "rack-b"), copy("s3", "region-c"), importance=M)
    actions = act(c, verdict(True))
    assert actions["fast"] == (
        "keep",
        "stays on fast: no verified copy on another durable tier yet",
    )


def test_demotion_needs_the_placement_met_without_the_fast_copy() -> None:
    # routine on fast + nfs: RF2 would break without fast
    actions = act(ckpt(FAST_V, NFS_V), verdict(True))
    assert actions["fast"][0] == "keep"
    assert actions["fast"][1].startswith("stays on fast: without it only 1 of 2 required")


def test_unpinned_fast_copy_is_demoted_when_protected_elsewhere() -> None:
    actions = act(ckpt(FAST_V, NFS_V, S3_V, importance=M), verdict(True))
    assert kinds(actions) == {"fast": "demote", "nfs": "keep", "s3": "keep"}
    assert actions["fast"][1] == (
        "not pinned on fast; protected without it by verified copies on nfs, s3"
    )


def test_pinned_fast_copy_stays() -> None:
    pins = ("pinned on fast: newest critical checkpoint of run r",)
    actions = act(ckpt(FAST_V, NFS_V, S3_V, importance=C), verdict(True, pins=pins))
    assert actions["fast"] == ("keep", pins[0])


def test_two_fast_tiers_are_not_demoted_on_each_others_strength() -> None:
    tiers = [
        tier("ram", "node-a", durable=False, persistent=False, is_fast=True),
        tier("nvme", "node-a", is_fast=True),
        tier("nfs", "rack-b"),
    ]
    c = ckpt(
        copy("ram", "node-a", verified=True),
        copy("nvme", "node-a", verified=True),
        copy("nfs", "rack-b", verified=True),
        importance=M,
    )
    actions = act(c, verdict(True), tiers=tiers)
    assert kinds(actions) == {"ram": "keep", "nvme": "keep", "nfs": "keep"}


def test_transient_lives_on_fast_until_retention_drops_it() -> None:
    c = ckpt(copy("fast", "node-a"), importance=T)
    assert act(c, verdict(True))["fast"] == ("keep", "the only copy a transient checkpoint has")


def test_copies_on_unconfigured_tiers_are_left_alone() -> None:
    c = ckpt(FAST_V, copy("tape", "vault", verified=True))
    actions = decide_deletions(c, verdict(False), placement_for(R, TIERS, CONFIG), CONFIG, NOW)
    assert actions == [
        CopyAction("fast", "trash", "not kept (dropped for the test); purge after 1d in trash"),
        CopyAction("tape", "keep", "tier tape is not configured: left alone"),
    ]


def test_actions_follow_configured_tier_order() -> None:
    c = ckpt(S3_V, FAST_V, NFS_V)
    assert list(act(c, verdict(False))) == ["fast", "nfs", "s3"]


def test_mismatched_inputs_are_programming_errors() -> None:
    c = ckpt(FAST_V)
    with pytest.raises(ValueError, match="is not for r/1"):
        act(c, verdict(True, step=2))
    with pytest.raises(ValueError, match="placement for milestone"):
        decide_deletions(c, verdict(True), placement_for(M, TIERS, CONFIG), CONFIG, NOW)


# --- the safety invariants over random stores -----------------------------------

DOMAINS = ["a", "b", "c"]


@st.composite
def stores(draw: st.DrawFn) -> tuple[list[TierFacts], list[CheckpointFacts], PolicyConfig, float]:
    n_tiers = draw(st.integers(1, 4))
    tiers = [
        TierFacts(
            name=f"t{i}",
            domain=draw(st.sampled_from(DOMAINS)),
            durable=draw(st.integers(0, 3)) > 0,  # mostly durable: demotion needs replicas
            persistent=True,
            object_lock=draw(st.booleans()),
            is_fast=i == 0 and draw(st.booleans()),
        )
        for i in range(n_tiers)
    ]
    now = NOW
    # Mostly live copies, some trashed long ago, just now, or (clock skew) in the future.
    times = st.sampled_from([None, None, None, now - 3 * DAY, now - DAY, now - 10, now + 60])
    ckpts = []
    for run in draw(st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2, unique=True)):
        for step in draw(st.lists(st.integers(0, 40), max_size=10, unique=True)):
            on = [t for t in tiers if draw(st.integers(0, 3)) > 0]
            copies = tuple(
                CopyFacts(
                    t.name, t.domain, verified=draw(st.integers(0, 3)) > 0, trashed_at=draw(times)
                )
                for t in on
            )
            ckpts.append(
                CheckpointFacts(
                    run,
                    step,
                    draw(st.sampled_from(list(Importance))),
                    created=now - draw(st.floats(-100, 5 * DAY)),
                    valid=draw(st.sampled_from([True, False, None])),
                    held=draw(st.integers(0, 5)) == 0,
                    metrics=draw(st.sampled_from([{}, {"loss": 1.0}, {"loss": 2.0}])),
                    copies=copies,
                )
            )
    config = PolicyConfig.from_toml(
        {
            "trash_delay_seconds": draw(st.sampled_from([0, 3600, DAY])),
            "fast_keep_newest": draw(st.integers(0, 3)),
            "best_metric": "loss",
            "best_k": draw(st.integers(0, 2)),
            "routine": {"keep_last": draw(st.integers(0, 4))},
            "milestone": {"keep_last": draw(st.sampled_from([0, 1, "all"]))},
            "transient": {"keep_last": draw(st.integers(0, 2))},
        }
    )
    return tiers, ckpts, config, now


@settings(max_examples=400, deadline=None)
@given(stores())
def test_safety_invariants(
    store: tuple[list[TierFacts], list[CheckpointFacts], PolicyConfig, float],
) -> None:
    tiers, ckpts, config, now = store
    names = {t.name for t in tiers}
    fast = {t.name for t in tiers if t.is_fast} or {tiers[0].name}
    newest_valid = {
        max((c for c in ckpts if c.run == run and c.valid is not False), key=lambda c: c.step).key
        for run in {c.run for c in ckpts if c.valid is not False}
    }
    by_key = {c.key: c for c in ckpts}
    for decision in decide_retention(ckpts, config, now=now):
        c = by_key[decision.key]
        placement = placement_for(c.importance, tiers, config)
        actions = decide_deletions(c, decision, placement, config, now=now)
        assert sorted(a.tier for a in actions) == sorted(x.tier for x in c.copies)
        assert all(a.reason for a in actions)
        copies = {x.tier: x for x in c.copies}
        removed = {a.tier for a in actions if a.action in ("trash", "purge", "demote")}
        deleted = {a.tier for a in actions if a.action in ("trash", "purge")}
        if c.held:
            assert not removed, "a hold blocks deletion everywhere"
        if c.key in newest_valid or c.importance is Importance.CRITICAL or decision.keep:
            assert not deleted, "kept / newest valid / critical checkpoints are never trashed"
        if deleted:
            assert not decision.keep and not c.held
        for a in actions:
            if a.action == "purge":
                trashed_at = copies[a.tier].trashed_at
                assert trashed_at is not None
                assert now - trashed_at >= config.trash_delay(c.importance)
            if a.action == "demote":
                assert a.tier in fast and a.tier in names
                assert not decision.pinned_on_fast
            if a.tier not in names:
                assert a.action == "keep"
        if decision.keep:
            # Whatever goes, a verified live copy that stays must remain.
            if removed:
                assert any(
                    x.verified and not x.trashed and x.tier not in removed for x in c.copies
                ), "a kept checkpoint never loses its last verified copy"
            had_verified = any(x.verified and not x.trashed for x in c.copies)
            if had_verified:
                assert any(x.verified and not x.trashed and x.tier not in removed for x in c.copies)
