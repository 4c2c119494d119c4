"""Setting aside needs damage that a second read confirms; transient errors touch nothing."""

from __future__ import annotations

import pytest
import torch

import mouthguard
from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.quarantine import SetAside, set_aside_confirmed
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.checkpoint.verification import Status, verify_and_record
from mouthguard.errors import CheckpointExistsError, TierError
from mouthguard.tiers.faults import FaultPlan, FaultyTier
from tests.checkpoint.helpers import NoRenameTier, flip_byte, step_path

STATE = {"w": torch.arange(4096, dtype=torch.float32)}


def _rejected(store: mouthguard.Store, run: str = "r") -> list[str]:
    return [d for d in store.fast.list_dirs(f"{run}/") if ".rejected-" in d]


def test_confirmed_damage_is_moved_aside_with_its_bytes(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, STATE)
    flip_byte(step_path(store, "r", 1) / "rank-00000.safetensors", 6000)
    assert set_aside_confirmed(CopyRef(store.fast, "r", 1), "test") is SetAside.SET_ASIDE
    assert not ckpt.exists(1)
    (aside,) = _rejected(store)
    assert store.fast.exists(f"r/{aside}/rank-00000.safetensors")
    assert set_aside_confirmed(CopyRef(store.fast, "r", 1), "again") is SetAside.ALREADY_GONE


def test_a_misread_that_a_second_read_does_not_repeat_leaves_the_copy(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, STATE)
    flaky = FaultyTier(store.fast, FaultPlan(flip=1.0, ops=frozenset({"get", "read_into"})))
    ref = CopyRef(flaky, "r", 1)
    assert verify_and_record(ref).status is Status.DAMAGED  # one flipped bit in transit
    flaky.enabled = False  # the medium is fine: the next read matches
    assert set_aside_confirmed(ref, "one misread") is SetAside.NOT_CONFIRMED
    assert ckpt.exists(1) and _rejected(store) == []


def test_an_unreachable_tier_never_sets_anything_aside(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, STATE)
    dead = FaultyTier(store.fast, FaultPlan(error=1.0, ops=frozenset({"get", "read_into"})))
    assert set_aside_confirmed(CopyRef(dead, "r", 1), "timeout") is SetAside.NOT_CONFIRMED
    assert ckpt.exists(1) and _rejected(store) == []


def test_on_an_object_store_the_bytes_are_kept_under_the_rejected_prefix() -> None:
    tier = NoRenameTier()
    store = mouthguard.Store([tier], source="objects")
    ckpt = mouthguard.Checkpointer(store, "r", background=False)
    ckpt.save(1, STATE)
    rank = catalog.checkpoint_prefix("r", 1) + "rank-00000.safetensors"
    data = bytearray(tier.get(rank))
    data[6000] ^= 0xFF
    tier.put(rank, bytes(data))
    assert set_aside_confirmed(CopyRef(tier, "r", 1), "rot") is SetAside.SET_ASIDE
    assert not tier.exists(catalog.manifest_key("r", 1))
    (aside,) = [d for d in tier.list_dirs("r/") if ".rejected-" in d]
    assert tier.get(f"r/{aside}/rank-00000.safetensors") == bytes(data)


def test_a_save_over_a_step_it_cannot_read_now_changes_nothing(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, STATE)
    dead = FaultyTier(store.fast, FaultPlan(error=1.0, ops=frozenset({"get", "read_into"})))
    flaky_store = mouthguard.Store([dead, *store.tiers[1:]], source="flaky")
    other = mouthguard.Checkpointer(flaky_store, "r", background=False)
    with pytest.raises(TierError, match="cannot be verified now"):
        other.save(1, {"w": torch.zeros(3)})
    assert _rejected(store) == []
    assert torch.equal(ckpt.load(1).state["w"], STATE["w"])  # type: ignore[index]


def test_a_save_over_a_damaged_step_sets_it_aside_and_one_over_a_valid_step_is_refused(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, STATE)
    with pytest.raises(CheckpointExistsError):
        ckpt.save(1, STATE)
    flip_byte(step_path(store, "r", 1) / "rank-00000.safetensors", 6000)
    ckpt.save(1, {"w": torch.zeros(3)})
    assert len(_rejected(store)) == 1
    assert torch.equal(ckpt.load(1).state["w"], torch.zeros(3))  # type: ignore[index]
