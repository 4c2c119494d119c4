"""The whole lifecycle over a real S3 server (Ceph RGW with Object Lock): a critical save
is tagged, held and survives gc --apply; a named hold blocks deletion on every tier;
old routine saves leave through the trash on both tiers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.jobs.replicator import Replicator
from mouthguard.jobs.retention import apply_retention
from tests.jobs.test_s3_replication import RUN, copy_keys, held, s3_store, s3_tier
from tests.s3.fixtures import S3Bucket

DAY = 86400.0


def test_gc_apply_over_s3_keeps_critical_and_held_deletes_the_rest(
    tmp_path: Path, s3_lock_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = s3_store(tmp_path / "store", s3_lock_bucket, monkeypatch, local=True)
    tier = s3_tier(store)
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
    for step in range(1, 8):
        level = "critical" if step == 2 else "routine"
        ckpt.save(step, {"w": torch.full((512,), float(step))}, importance=level)
    ckpt.hold(1, "legal", reason="audit")
    report = Replicator(store).run_once()
    assert report.protected == 7, report.shortfalls

    # The critical save: importance tag on every object, legal hold on every object.
    for key in copy_keys(tier, 2):
        assert tier.annotations(key).get("importance") == "critical"
        assert held(s3_lock_bucket, tier, key)

    now = time.time()
    first = apply_retention(store, now=now)  # gc --apply: trash marks first
    trashed = {
        (a.step, a.action.tier) for a in first.actions if a.action.action == "trash" and a.done
    }
    assert trashed == {(s, t) for s in (3, 4) for t in ("fast", "s3")}
    late = apply_retention(store, now=now + DAY + 1)  # after the delay: purged on both tiers
    assert {
        (a.step, a.action.tier) for a in late.actions if a.action.action == "purge" and a.done
    } == trashed

    assert [i.step for i in ckpt.list()] == [1, 2, 5, 6, 7]
    for step in (1, 2):  # held and critical survive on every tier, verified and loadable
        info = ckpt.info(step)
        assert info is not None and sorted(c.tier for c in info.copies) == ["fast", "s3"]
        assert info.state == "protected"
        assert torch.equal(ckpt.load(step).state["w"], torch.full((512,), float(step)))  # type: ignore[index]
    assert all(held(s3_lock_bucket, tier, key) for key in copy_keys(tier, 2))
    assert not any(key.startswith(f"{RUN}/000000000003/") for key in tier.list(f"{RUN}/"))
