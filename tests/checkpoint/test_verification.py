"""verify_and_record: one verdict per copy (ok / damaged / unreachable), and what it leaves."""

from __future__ import annotations

import shutil

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.sidecars import DAMAGE, RECEIPT, CopyRef, read_sidecars
from mouthguard.checkpoint.verification import (
    Status,
    confirm_damage,
    find_copies,
    verify_and_record,
)
from mouthguard.tiers.faults import FaultPlan, FaultyTier
from tests.checkpoint.helpers import flip_byte, step_path


def _saved(ckpt: mouthguard.Checkpointer) -> CopyRef:
    ckpt.save(1, {"w": torch.arange(4096, dtype=torch.float32)})
    return CopyRef(ckpt.store.fast, "r", 1)


def test_intact_copy_gets_a_receipt_and_loses_an_old_damage_report(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ref = _saved(ckpt)
    (step_path(store, "r", 1) / DAMAGE).write_bytes(b"not even a sealed sidecar")
    verdict = verify_and_record(ref)
    assert verdict.status is Status.OK and verdict.ok and not verdict.record_error
    assert verdict.nbytes == ckpt.info(1).nbytes  # type: ignore[union-attr]
    assert not (step_path(store, "r", 1) / DAMAGE).exists()
    assert read_sidecars(ref).verified_at is not None


def test_damaged_copy_gets_a_damage_report_that_withdraws_its_receipt(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ref = _saved(ckpt)
    assert verify_and_record(ref).ok
    flip_byte(step_path(store, "r", 1) / "rank-00000.safetensors", 6000)
    verdict = verify_and_record(ref)
    assert verdict.status is Status.DAMAGED and "checksum" in verdict.reason.lower()
    side = read_sidecars(ref)
    assert side.verified_at is None and side.damage == verdict.reason
    assert not (step_path(store, "r", 1) / RECEIPT).exists()
    (copy,) = [c for c in ckpt.info(1).copies if c.tier == "fast"]  # type: ignore[union-attr]
    assert copy.damage == verdict.reason and not copy.verified


def test_unreachable_tier_is_neither_damage_nor_recorded(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ref = _saved(ckpt)
    assert verify_and_record(ref).ok
    before = sorted(p.name for p in step_path(store, "r", 1).iterdir())
    dead = FaultyTier(store.fast, FaultPlan(error=1.0, ops=frozenset({"get", "read_into"})))
    verdict = verify_and_record(CopyRef(dead, "r", 1))
    assert verdict.status is Status.UNREACHABLE and "injected" in verdict.reason
    assert sorted(p.name for p in step_path(store, "r", 1).iterdir()) == before
    assert read_sidecars(ref).verified_at is not None  # the old receipt still vouches
    assert not confirm_damage(CopyRef(dead, "r", 1))


def test_a_receipt_that_cannot_be_written_does_not_make_an_intact_copy_invalid(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ref = _saved(ckpt)
    read_only = FaultyTier(store.fast, FaultPlan(error=1.0, ops=frozenset({"put", "delete"})))
    verdict = verify_and_record(CopyRef(read_only, "r", 1))
    assert verdict.ok and "injected" in verdict.record_error
    assert verdict.to_json()["recorded"] is False
    assert read_sidecars(ref).verified_at is None  # nothing was written


def test_a_copy_set_aside_while_being_read_is_not_recreated_by_a_damage_report(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ref = _saved(ckpt)
    shutil.rmtree(step_path(store, "r", 1))
    verdict = verify_and_record(ref)
    assert verdict.status is Status.UNREACHABLE and "no longer committed" in verdict.reason
    assert not step_path(store, "r", 1).exists()


def test_find_copies_counts_a_copy_whose_manifest_does_not_parse(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    _saved(ckpt)
    (step_path(store, "r", 1) / "manifest.json").write_bytes(b"\xa0 garbage")
    (ref,) = find_copies(store)
    verdict = verify_and_record(ref)
    assert verdict.status is Status.DAMAGED and verdict.nbytes == 0


def test_an_unlistable_tier_is_reported_not_raised_when_asked(store: mouthguard.Store) -> None:
    dead = FaultyTier(store.fast, FaultPlan(error=1.0))
    broken = mouthguard.Store([dead, store.tiers[1]], source="broken")
    with pytest.raises(mouthguard.errors.TierError):
        find_copies(broken)
    unlisted: list[str] = []
    assert find_copies(broken, unlisted=unlisted) == []
    assert len(unlisted) == 1 and unlisted[0].startswith("fast: ")
