"""The chaos loop: invariants hold under faults, and the judge really catches violations.

Two tests are regressions of bugs the chaos run found: the replicator set an
intact copy aside after one misread, and one flaky checkpoint ended a whole pass.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.chaos import (
    ChaosReport,
    chaos_policy,
    chaos_state,
    remove_run,
    run_chaos,
    same_state,
)
from mouthguard.checkpoint import quarantine, reader
from mouthguard.checkpoint.audit import TRAIL_DIR
from mouthguard.checkpoint.audit_check import check_store
from mouthguard.errors import CheckpointFallbackWarning
from mouthguard.jobs.replicator import Replicator
from mouthguard.policy.config import PolicyConfig
from mouthguard.tiers.faults import FaultPlan, FaultyTier
from mouthguard.tiers.local import LocalTier

#: Every fault but bit flips on read, at rates above the default mix so that a short
#: run sees torn and short writes often. Flips are in the default mix the chaos
#: harness runs, and the bug they found has its regression test below.
NO_FLIPS = "error=0.003,enospc=0.05,torn=0.03,short=0.03,fsync=0.05,delay=0.02:0.0005"


def test_chaos_state_is_deterministic_and_compared_exactly() -> None:
    assert same_state(chaos_state(5), chaos_state(5))
    assert not same_state(chaos_state(5), chaos_state(6))
    changed = chaos_state(5)
    model = changed["model"]
    assert isinstance(model, dict)
    model["w"] = model["w"].clone()
    model["w"][0] += 1e-6
    assert not same_state(changed, chaos_state(5))
    assert not same_state({"a": torch.zeros(2)}, {"a": torch.zeros(2, dtype=torch.float64)})
    assert not same_state([1], (1,))


def test_chaos_policy_purges_without_delay() -> None:
    policy = chaos_policy(PolicyConfig())
    assert policy.trash_delay_seconds == 0
    assert all(policy.trash_delay(level) == 0 for level in policy.levels)


def test_chaos_without_flips_keeps_every_invariant(tmp_path: Path) -> None:
    store = mouthguard.open_store(tmp_path / "store")
    seen: list[int] = []

    def progress(report: ChaosReport) -> None:
        seen.append(report.rounds)

    report = run_chaos(
        store, rounds=14, plan=FaultPlan.parse(NO_FLIPS), seed=3, run="c", on_round=progress
    )
    assert seen == list(range(1, 15))
    assert report.ok, report.failures
    assert report.survived == report.cases > 50
    for kind in ("error", "enospc", "torn", "short", "fsync", "delay"):
        assert report.injected[kind] > 0, kind
    assert report.acknowledged < report.saves  # some saves failed, cleanly
    assert report.failed_but_visible == 0
    assert report.deleted_by_policy > 0  # retention really purged
    json = report.to_json()
    assert json["ok"] is True and json["cases"] == report.cases
    # Everything it wrote lives under the run, and goes with it -- except the audit
    # trail's record of its acts, which is append-only (and intact: no fault touched it).
    for tier in store.tiers:
        assert {key.split("/")[0] for key in tier.list()} <= {"c", TRAIL_DIR}
    assert remove_run(store, "c") > 0
    assert all({k.split("/")[0] for k in tier.list()} <= {TRAIL_DIR} for tier in store.tiers)
    assert check_store(store.tiers, None)[0] == []


def test_chaos_never_touches_other_runs(tmp_path: Path) -> None:
    store = mouthguard.open_store(tmp_path / "store")
    mouthguard.Checkpointer(store, "precious", background=False).save(1, {"w": torch.ones(4)})
    before = _contents(store)
    report = run_chaos(store, rounds=3, plan=FaultPlan.parse("error=0.01"), seed=1, run="c")
    assert report.writes_outside == 0
    remove_run(store, "c")
    after = _contents(store)
    # The audit trail only grew (chaos's acts are recorded); nothing else changed.
    for name, objects in before.items():
        assert {k: v for k, v in after[name].items() if k in objects} == objects
        assert all(k.startswith(TRAIL_DIR + "/") for k in set(after[name]) - set(objects))


def _contents(store: mouthguard.Store) -> dict[str, dict[str, bytes]]:
    return {t.name: {k: t.get(k) for k in t.list()} for t in store.tiers}


def test_the_judge_catches_accepted_corruption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With checksum verification switched off, torn writes must show as accepted_corrupt."""
    monkeypatch.setattr(reader, "verify_digest", lambda hasher, record: None)
    store = mouthguard.open_store(tmp_path / "store")
    plan = FaultPlan(torn=0.5, keys="rank-")
    report = run_chaos(store, rounds=6, plan=plan, seed=2, run="c")
    assert report.accepted_corrupt > 0
    assert not report.ok and report.survived < report.cases
    assert any("wrong bytes" in f for f in report.failures)


def test_the_judge_catches_an_intact_copy_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the confirming second read, a bit flip on read moves an intact copy."""
    monkeypatch.setattr(quarantine, "confirm_damage", lambda *args, **kwargs: True)
    store = mouthguard.open_store(tmp_path / "store")
    plan = FaultPlan(flip=0.3, keys="rank-")
    report = run_chaos(store, rounds=8, plan=plan, seed=2, run="c")
    assert report.false_damage > 0 and not report.ok
    assert any("set aside but verifies intact" in f for f in report.failures)


def test_the_judge_catches_a_receipt_on_bad_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With checksum verification switched off, torn copies get receipts: the judge,
    hashing on its own, says so."""
    monkeypatch.setattr(reader, "verify_digest", lambda hasher, record: None)
    store = mouthguard.open_store(tmp_path / "store")
    plan = FaultPlan(torn=0.5, keys="rank-")
    report = run_chaos(store, rounds=6, plan=plan, seed=2, run="c")
    assert report.false_receipt > 0 and not report.ok
    assert any("has a receipt but fails verification" in f for f in report.failures)


def test_a_crash_is_a_violation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise AttributeError("a bug, not a storage fault")

    monkeypatch.setattr("mouthguard.chaos.run.apply_retention", broken)
    report = run_chaos(mouthguard.open_store(tmp_path / "s"), rounds=2, plan=FaultPlan(), run="c")
    assert report.crashes == 2 and not report.ok
    assert "retention crashed: AttributeError" in report.failures[0]


# --- bugs found by the chaos run -------------------------------------------------------


def _two_tiers(tmp_path: Path) -> tuple[LocalTier, LocalTier]:
    return (
        LocalTier(tmp_path / "fast", name="fast", domain="node-a"),
        LocalTier(tmp_path / "durable", name="durable", domain="node-b"),
    )


class _FlipOnce(FaultyTier):
    """Flips bits on reads until the first flip has happened, then reads cleanly."""

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        super().read_into(key, offset, out)
        if self.injected["flip"]:
            self.enabled = False


def test_a_flipped_read_never_sets_aside_the_only_intact_copy(tmp_path: Path) -> None:
    fast, durable = _two_tiers(tmp_path)
    clean = mouthguard.Store([fast, durable])
    mouthguard.Checkpointer(clean, "r", background=False).save(1, chaos_state(1))
    # One bit flipped in transit while the replicator reads the new copy back;
    # every later read is clean (a transient fault, not damage on the medium).
    flaky = _FlipOnce(fast, FaultPlan(flip=1.0, ops=frozenset({"read_into"})))
    Replicator(mouthguard.Store([flaky, durable])).run_once()
    assert flaky.injected["flip"] >= 1
    # The bytes on disk were never damaged: the checkpoint must still load.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointFallbackWarning)
        loaded = mouthguard.Checkpointer(clean, "r", background=False).load()
    assert loaded.step == 1 and same_state(loaded.state, chaos_state(1))


def test_one_flaky_checkpoint_does_not_end_the_replication_pass(tmp_path: Path) -> None:
    fast, durable = _two_tiers(tmp_path)
    ckpt = mouthguard.Checkpointer(mouthguard.Store([fast, durable]), "r", background=False)
    ckpt.save(1, chaos_state(1))
    ckpt.save(2, chaos_state(2))
    # Every call touching step 2 on the fast tier fails (visited first: newest first).
    flaky = FaultyTier(fast, FaultPlan(error=1.0, keys="r/000000000002/"))
    report = Replicator(mouthguard.Store([flaky, durable])).run_once()
    assert any(s.step == 2 for s in report.shortfalls)  # step 2 reported, not raised
    assert report.protected == 1  # and step 1 still replicated


def test_retention_skips_a_run_it_cannot_read_whole_instead_of_raising(tmp_path: Path) -> None:
    from mouthguard.jobs.retention import apply_retention  # noqa: PLC0415

    fast, durable = _two_tiers(tmp_path)
    ckpt = mouthguard.Checkpointer(mouthguard.Store([fast, durable]), "r", background=False)
    for step in range(1, 7):
        ckpt.save(step, chaos_state(step))
    flaky = FaultyTier(fast, FaultPlan(error=1.0, keys="r/000000000006/"))
    report = apply_retention(mouthguard.Store([flaky, durable]), now=1e12)
    assert report.skipped and "run r" in report.skipped[0]
    assert report.actions == []  # nothing decided on part of a run
    assert ckpt.steps() == [1, 2, 3, 4, 5, 6]
