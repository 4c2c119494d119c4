"""Placement and protection: greedy over tiers, distinct domains, never accept less silently."""

from __future__ import annotations

import dataclasses

import pytest

from mouthguard.policy import (
    CheckpointFacts,
    CopyFacts,
    Importance,
    PolicyConfig,
    placement_for,
    protection_status,
)
from tests.policy.scenario import copy, tier

CONFIG = PolicyConfig()
FAST = tier("fast", "node-a", is_fast=True)
NFS = tier("nfs", "rack-b")
S3 = tier("s3", "region-c", object_lock=True)
RAM = tier("ram", "node-a", durable=False, persistent=False, is_fast=True)


def ckpt(importance: Importance, *copies: CopyFacts, valid: bool | None = True) -> CheckpointFacts:
    return CheckpointFacts("r", 1, importance, 0.0, valid=valid, copies=copies)


def test_routine_takes_fast_then_a_new_domain() -> None:
    p = placement_for(Importance.ROUTINE, [FAST, NFS, S3], CONFIG)
    assert p.targets == ("fast", "nfs")
    assert (p.required_copies, p.required_domains, p.satisfiable) == (2, 2, True)
    assert p.missing == ()
    assert not p.verify and not p.legal_hold
    assert "a save is on stable storage before it is acknowledged (fast is durable)" in p.reasons


def test_greedy_prefers_a_new_failure_domain_over_configured_order() -> None:
    same = tier("nfs", "node-a")
    p = placement_for(Importance.ROUTINE, [FAST, same, S3], CONFIG)
    assert p.targets == ("fast", "s3")
    assert p.satisfiable


def test_critical_targets_every_durable_tier_and_legal_hold_where_supported() -> None:
    p = placement_for(Importance.CRITICAL, [RAM, tier("nvme", "node-a"), NFS, S3], CONFIG)
    assert p.targets == ("ram", "nvme", "nfs", "s3")
    assert p.required_copies == 3 and p.every_tier == ("nvme", "nfs", "s3")
    assert p.verify and p.legal_hold and p.satisfiable
    assert "legal hold on s3 (object lock)" in p.reasons


def test_critical_without_object_lock_says_so() -> None:
    p = placement_for(Importance.CRITICAL, [FAST, NFS], CONFIG)
    assert p.satisfiable
    assert any("no target supports object lock" in r for r in p.reasons)


def test_ram_copies_are_not_replicas() -> None:
    p = placement_for(Importance.MILESTONE, [RAM, NFS, S3], CONFIG)
    assert p.targets == ("ram", "nfs", "s3")
    assert p.counted_tiers == ("nfs", "s3")
    status = protection_status(
        ckpt(
            Importance.MILESTONE,
            copy("ram", "node-a", verified=True),
            copy("nfs", "rack-b", verified=True),
        ),
        p,
    )
    assert status.state == "verified"
    assert status.missing[0] == "only 1 of 2 required verified replicas: nfs"


def test_single_domain_is_unsatisfiable_and_says_what_is_missing() -> None:
    p = placement_for(Importance.ROUTINE, [FAST, tier("nfs", "node-a")], CONFIG)
    assert not p.satisfiable
    assert p.targets == ("fast", "nfs")  # best effort, never silently "enough"
    assert p.missing == p.reasons[-1:]
    assert p.reasons[-1] == (
        "unsatisfiable: routine needs replicas in 2 distinct failure domains but the durable "
        "tiers span 1 (node-a): add a durable tier in another failure domain"
    )


def test_too_few_tiers_is_unsatisfiable() -> None:
    p = placement_for(Importance.MILESTONE, [FAST], CONFIG)
    assert not p.satisfiable
    assert (
        "unsatisfiable: milestone needs 2 replicas on durable tiers but the store has "
        "1 durable tier (fast)"
    ) in p.reasons


def test_no_tiers() -> None:
    p = placement_for(Importance.TRANSIENT, [], CONFIG)
    assert not p.satisfiable and p.targets == ()
    assert p.reasons == ("unsatisfiable: the store has no tiers",)


def test_transient_is_one_copy_on_fast_synced_as_the_tier_does() -> None:
    # Durability is the fast tier's at every level: the local tier fsyncs transient
    # saves too, and the reasons (what doctor prints) must say so, not "no fsync".
    p = placement_for(Importance.TRANSIENT, [NFS, FAST, S3], CONFIG)
    assert p.targets == ("fast",)
    assert (p.required_copies, p.verify, p.satisfiable) == (1, False, True)
    assert (
        p.reasons[-1] == "a save is on stable storage before it is acknowledged (fast is durable)"
    )
    on_ram = placement_for(Importance.TRANSIENT, [RAM, NFS], CONFIG)
    assert on_ram.reasons[-1] == (
        "a save is not on stable storage when acknowledged (ram is not durable)"
    )


def test_first_tier_is_fast_when_none_is_marked() -> None:
    p = placement_for(Importance.ROUTINE, [NFS, S3], CONFIG)
    assert p.fast_tier == "nfs" and p.targets == ("nfs", "s3")


def test_distinct_domains_off_allows_one_domain() -> None:
    config = PolicyConfig.from_toml({"routine": {"distinct_domains": False}})
    p = placement_for(Importance.ROUTINE, [FAST, tier("nfs", "node-a")], config)
    assert p.satisfiable and p.required_domains == 1


def test_duplicate_tier_names_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unique"):
        placement_for(Importance.ROUTINE, [FAST, FAST], CONFIG)


def test_protection_states() -> None:
    p = placement_for(Importance.MILESTONE, [FAST, NFS, S3], CONFIG)
    assert protection_status(ckpt(Importance.MILESTONE), p).state == "missing"
    committed = ckpt(Importance.MILESTONE, copy("fast", "node-a"), copy("nfs", "rack-b"))
    status = protection_status(committed, p)
    assert status.state == "committed"
    assert "(not verified yet: fast, nfs)" in status.missing[0]
    one = ckpt(Importance.MILESTONE, copy("fast", "node-a", verified=True), copy("nfs", "rack-b"))
    assert protection_status(one, p).state == "verified"
    both = ckpt(
        Importance.MILESTONE,
        copy("fast", "node-a", verified=True),
        copy("nfs", "rack-b", verified=True),
        copy("s3", "region-c"),  # an extra unverified copy does not hold protection back
    )
    status = protection_status(both, p)
    assert status.state == "protected" and status.missing == ()
    assert status.met[0] == "2 verified replicas (required 2): fast, nfs"


def test_trashed_copies_do_not_count() -> None:
    p = placement_for(Importance.ROUTINE, [FAST, NFS], CONFIG)
    c = ckpt(Importance.ROUTINE, copy("fast", "node-a"), copy("nfs", "rack-b", trashed_at=5.0))
    assert protection_status(c, p).state == "committed"


def test_invalid_checkpoint_is_never_protected() -> None:
    p = placement_for(Importance.ROUTINE, [FAST, NFS], CONFIG)
    c = ckpt(Importance.ROUTINE, copy("fast", "node-a"), copy("nfs", "rack-b"), valid=False)
    status = protection_status(c, p)
    assert status.state == "committed"
    assert "the checkpoint failed verification: its copies cannot be loaded" in status.missing


def test_a_suspect_checkpoint_is_never_protected_and_says_why() -> None:
    p = placement_for(Importance.ROUTINE, [FAST, NFS], CONFIG)
    c = ckpt(Importance.ROUTINE, copy("fast", "node-a"), copy("nfs", "rack-b"), valid=True)
    status = protection_status(dataclasses.replace(c, suspect="loss is NaN"), p)
    assert status.state == "committed"
    assert "suspect: loss is NaN (a resume skips it)" in status.missing
    assert not any("failed verification" in m for m in status.missing)


def test_critical_needs_every_durable_tier_off_fast() -> None:
    p = placement_for(Importance.CRITICAL, [FAST, NFS, S3], CONFIG)
    c = ckpt(
        Importance.CRITICAL,
        copy("fast", "node-a", verified=True),
        copy("nfs", "rack-b", verified=True),
    )
    status = protection_status(c, p)
    assert status.state == "verified"
    assert status.missing == (
        "no verified replica on durable tier s3 "
        "(every durable tier off the fast tier holds a critical copy)",
    )


def test_protection_does_not_depend_on_copy_order() -> None:
    p = placement_for(Importance.ROUTINE, [FAST, NFS, S3], CONFIG)
    a = ckpt(Importance.ROUTINE, copy("s3", "region-c"), copy("fast", "node-a"))
    b = ckpt(Importance.ROUTINE, copy("fast", "node-a"), copy("s3", "region-c"))
    assert protection_status(a, p) == protection_status(b, p)


def test_the_old_name_still_works_with_a_deprecation_warning() -> None:
    import mouthguard.policy  # noqa: PLC0415

    with pytest.warns(
        DeprecationWarning, match="plan_placement is deprecated; use .*placement_for"
    ):
        from mouthguard.policy import plan_placement  # noqa: PLC0415
    assert plan_placement is mouthguard.policy.placement_for
    with pytest.raises(AttributeError, match="no_such_name"):
        mouthguard.policy.no_such_name  # noqa: B018


def test_a_copy_with_a_damage_report_counts_toward_no_protection() -> None:
    p = placement_for(Importance.ROUTINE, [FAST, NFS], CONFIG)
    reported = dataclasses.replace(copy("nfs", "rack-b"), damage_reported=True)
    status = protection_status(ckpt(Importance.ROUTINE, copy("fast", "node-a"), reported), p)
    assert status.state != "protected"
    assert any("damage reported, not counted: nfs" in m for m in status.missing)
