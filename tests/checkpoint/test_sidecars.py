"""Mutable facts next to the manifest: receipts, importance changes, holds, trash marks."""

from __future__ import annotations

import datetime as dt

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.sidecars import (
    CopyRef,
    mark_trashed,
    read_sidecars,
    restore_from_trash,
)
from mouthguard.errors import CheckpointNotFoundError
from mouthguard.tiers.posix import get_xattrs
from tests.checkpoint.helpers import flip_byte, step_path


def test_importance_change_is_recorded_merged_and_hinted(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, {"w": torch.ones(4)}, importance="routine")
    rank = step_path(store, "r", 1) / "rank-00000.safetensors"
    assert get_xattrs(rank) == {"importance": "routine"}
    manifest_before = (step_path(store, "r", 1) / "manifest.json").read_bytes()

    info = ckpt.set_importance(1, "golden", reason="release candidate")
    assert info.importance is mouthguard.Importance.CRITICAL
    assert info.saved_importance is mouthguard.Importance.ROUTINE
    assert get_xattrs(rank) == {"importance": "critical"}
    # The manifest is immutable: the change lives in a sidecar.
    assert (step_path(store, "r", 1) / "manifest.json").read_bytes() == manifest_before
    assert (step_path(store, "r", 1) / "sidecar.importance.json").is_file()
    assert [i.importance.value for i in ckpt.list()] == ["critical"]
    assert ckpt.info(1).to_json()["saved_importance"] == "routine"  # type: ignore[union-attr]


def test_holds_are_named_listed_and_released(ckpt: mouthguard.Checkpointer) -> None:
    ckpt.save(1, {"w": torch.ones(2)})
    assert ckpt.hold(1, "legal", reason="case 42").holds == ("legal",)
    assert ckpt.hold(1, "rc").holds == ("legal", "rc")
    assert ckpt.release(1, "legal") is True
    assert ckpt.release(1, "legal") is False
    assert ckpt.info(1).holds == ("rc",)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="invalid hold name"):
        ckpt.hold(1, "../escape")
    with pytest.raises(CheckpointNotFoundError):
        ckpt.hold(2)


def test_an_unreadable_hold_still_holds(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, {"w": torch.ones(2)})
    ckpt.hold(1, "legal", reason="keep")
    (step_path(store, "r", 1) / "sidecar.hold.legal.json").write_bytes(b"\x00garbage")
    facts = read_sidecars(CopyRef(store.fast, "r", 1))
    assert [h.name for h in facts.holds] == ["legal"]
    assert "still holding" in facts.holds[0].reason


def test_trash_marks_and_damaged_marks_restart_the_delay(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, {"w": torch.ones(2)})
    ref = CopyRef(store.fast, "r", 1)
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    mark_trashed(ref, "routine: older than the last 3", when)
    facts = read_sidecars(ref)
    assert facts.trashed_at == when and "older" in facts.trash_reason
    assert ckpt.info(1).copies[0].trashed_at == when  # type: ignore[union-attr]
    (step_path(store, "r", 1) / "sidecar.trash.json").write_text("{not json")
    damaged = read_sidecars(ref)
    assert damaged.trashed_at is not None and damaged.trashed_at > when
    assert restore_from_trash(ref) is True
    assert read_sidecars(ref).trashed_at is None


def test_receipt_vouches_only_for_its_manifest(
    store: mouthguard.Store, ckpt: mouthguard.Checkpointer
) -> None:
    from mouthguard.checkpoint.verification import find_copies, verify_and_record  # noqa: PLC0415

    ckpt.save(1, {"w": torch.ones(2)})
    (target,) = find_copies(store, "r", 1)
    assert verify_and_record(target).ok
    ref = CopyRef(store.fast, "r", 1)
    assert read_sidecars(ref).verified_at is not None
    manifest = step_path(store, "r", 1) / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"routine"', b'"critical"'))
    assert read_sidecars(ref).verified_at is None


def test_sidecars_do_not_disturb_verification_or_loading(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, {"w": torch.arange(3)})
    ckpt.hold(1, "a")
    ckpt.set_importance(1, "milestone")
    assert torch.equal(ckpt.load().state["w"], torch.arange(3))  # type: ignore[index]
    from mouthguard.checkpoint.verification import find_copies, verify_and_record  # noqa: PLC0415

    assert all(verify_and_record(t).ok for t in find_copies(store))


def test_every_sidecar_is_sealed_and_a_flipped_byte_is_caught(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    from mouthguard.checkpoint.sidecars import check_sidecars  # noqa: PLC0415
    from mouthguard.checkpoint.verification import find_copies, verify_and_record  # noqa: PLC0415
    from mouthguard.format.sealed import unseal  # noqa: PLC0415

    ckpt.save(1, {"w": torch.ones(2)})
    ckpt.hold(1, "legal", reason="audit")
    ckpt.set_importance(1, "milestone")
    (target,) = find_copies(store, "r", 1)
    assert verify_and_record(target).ok
    ref = CopyRef(store.fast, "r", 1)
    names = sorted(p.name for p in step_path(store, "r", 1).glob("sidecar.*.json"))
    assert names == ["sidecar.hold.legal.json", "sidecar.importance.json", "sidecar.verified.json"]
    for name in names:
        assert unseal((step_path(store, "r", 1) / name).read_bytes())  # each carries its checksum
    assert check_sidecars(ref) == []
    flip_byte(step_path(store, "r", 1) / "sidecar.verified.json", 12, 0x01)
    flip_byte(step_path(store, "r", 1) / "sidecar.hold.legal.json", 20, 0x01)
    damaged = dict(check_sidecars(ref))
    assert set(damaged) == {"sidecar.verified.json", "sidecar.hold.legal.json"}
    assert all("checksum" in why for why in damaged.values())
    facts = read_sidecars(ref)
    assert facts.verified_at is None  # a damaged receipt vouches for nothing
    assert [h.name for h in facts.holds] == ["legal"]  # a damaged hold still holds
