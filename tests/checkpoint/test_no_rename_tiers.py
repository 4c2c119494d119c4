"""The commit protocol on tiers without atomic rename (object stores), via a memory tier
that declares no rename: failed saves clean up after themselves, GC collects leftovers."""

from __future__ import annotations

import pytest
import torch

import mouthguard
from mouthguard.errors import CheckpointExistsError, TierError
from tests.checkpoint.helpers import NoRenameTier


@pytest.fixture
def objects() -> NoRenameTier:
    return NoRenameTier()


def test_save_and_load_without_rename(objects: NoRenameTier) -> None:
    ckpt = mouthguard.Checkpointer(mouthguard.Store([objects]), run="r")
    ckpt.save(1, {"w": torch.arange(10)})
    assert not any(".partial-" in k for k in objects.list(""))
    assert torch.equal(ckpt.load().state["w"], torch.arange(10))  # type: ignore[index]


def test_failed_save_removes_its_uncommitted_objects(objects: NoRenameTier) -> None:
    ckpt = mouthguard.Checkpointer(mouthguard.Store([objects]), run="r")
    objects.fail_manifest = True
    with pytest.raises(TierError, match="injected"):
        ckpt.save(1, {"w": torch.ones(3)})
    assert list(objects.list("r/")) == []
    objects.fail_manifest = False
    ckpt.save(1, {"w": torch.ones(3)})  # the retry is not blocked
    assert [i.step for i in ckpt.list()] == [1]


def test_second_writer_of_a_step_gets_checkpoint_exists(objects: NoRenameTier) -> None:
    store = mouthguard.Store([objects])
    mouthguard.Checkpointer(store, run="r").save(1, {"w": torch.ones(3)})
    with pytest.raises(CheckpointExistsError):
        mouthguard.Checkpointer(store, run="r").save(1, {"w": torch.zeros(3)})
    assert torch.equal(  # the first writer's checkpoint is intact
        mouthguard.Checkpointer(store, run="r").load(1).state["w"],
        torch.ones(3),  # type: ignore[index]
    )


def test_gc_collects_uncommitted_step_directories_after_the_grace(objects: NoRenameTier) -> None:
    ckpt = mouthguard.Checkpointer(mouthguard.Store([objects]), run="r")
    ckpt.save(1, {"w": torch.ones(3)})
    objects.put("r/000000000002/rank-00000.safetensors", b"left by a killed save")
    (young,) = ckpt.collect_garbage(grace_seconds=3600)
    assert young.partial_saves == []
    (old,) = ckpt.collect_garbage(grace_seconds=0)
    assert [p.step for p in old.partial_saves] == [2]
    assert list(objects.list("r/000000000002/")) == []
    assert [i.step for i in ckpt.list()] == [1]
