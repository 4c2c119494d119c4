"""Regression tests for what the fuzz harness (reliability/fuzz.py) found on the read path.

Each input here is hostile but carries a *valid* checksum (made with ``seal``), or is a
link planted in a tier root: every case must end in a documented mouthguard error, or
in a load of the intact copy, never in another exception.
"""

from __future__ import annotations

import datetime as dt
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.sidecars import CopyRef, read_sidecars
from mouthguard.errors import CorruptCheckpointError
from mouthguard.format.sealed import seal
from mouthguard.jobs.replicator import Replicator
from tests.checkpoint.helpers import step_path


def _body(path: Path) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(path.read_bytes())
    del body["manifest_checksum"]
    return body


def test_manifest_claiming_a_huge_tensor_is_refused_before_allocating(tmp_path: Path) -> None:
    """A consistent manifest (tensors tile the file) whose last tensor claims 256 TiB.

    ``load_copy`` allocated the destination tensors (``torch.empty``) before comparing
    the file's real size with the manifest, so the allocation failed with a
    RuntimeError out of ``Checkpointer.load`` (fuzz: reader, mode manifest_inflate).
    """
    store = mouthguard.open_store(tmp_path / "store")
    ckpt = mouthguard.Checkpointer(store, run="r", background=False)
    ckpt.save(1, {"w": torch.arange(8, dtype=torch.float32)})
    manifest = step_path(store, "r", 1) / "manifest.json"
    body = _body(manifest)
    (tensor,) = body["tensors"]
    grown = 2**48
    tensor["shape"], tensor["length"] = [grown // 4], grown
    body["files"][0]["size"] = tensor["offset"] + grown
    manifest.write_bytes(seal(body))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CorruptCheckpointError, match="size"):
            ckpt.load(1)


@pytest.mark.parametrize("where", ["run", "step"])
def test_link_planted_in_another_tier_does_not_block_the_intact_copy(
    tmp_path: Path, where: str
) -> None:
    """A link in the durable tier (run or step directory pointing outside the root).

    ``tier.exists`` raised InvalidKeyError ("passes through a symbolic link"), so
    ``load`` of the intact fast copy and ``Replicator.replicate`` (documented never to
    raise for bad data) both failed (fuzz: symlink, destination_*_link).
    """
    store = mouthguard.open_store(tmp_path / "store")
    ckpt = mouthguard.Checkpointer(store, run="r", background=False)
    ckpt.save(1, {"w": torch.ones(4)})
    outside = tmp_path / "outside"
    outside.mkdir()
    durable = Path(store.tier("durable").location())
    link = durable / "r" if where == "run" else durable / "r" / f"{1:012d}"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    loaded = ckpt.load(1)
    assert loaded.tier == "fast" and torch.equal(loaded.state["w"], torch.ones(4))  # type: ignore[index]
    report = Replicator(store).replicate("r", 1)
    # No copy through the link: a shortfall that names the durable tier, nothing written outside.
    assert report.copies == [] and report.protected == 0
    (shortfall,) = report.shortfalls
    assert shortfall.reason.startswith("copy fast -> durable failed")
    assert list(outside.iterdir()) == []
    (info,) = ckpt.list()
    assert [c.tier for c in info.copies] == ["fast"]


def _two_copies(tmp_path: Path) -> tuple[mouthguard.Store, mouthguard.Checkpointer]:
    store = mouthguard.open_store(tmp_path / "store")
    ckpt = mouthguard.Checkpointer(store, run="r", background=False)
    ckpt.save(1, {"w": torch.ones(4)})
    Replicator(store).replicate("r", 1)
    ckpt.set_importance(1, "critical", reason="genuine")  # an importance sidecar per copy
    return store, ckpt


def test_sealed_sidecar_with_a_naive_timestamp_is_tolerated(tmp_path: Path) -> None:
    """An importance change time without a UTC offset, checksum valid, on one copy.

    ``sidecars._time`` returned a naive datetime; merging it with the other copy's
    aware one raised TypeError (can't compare offset-naive and offset-aware
    datetimes) out of ``Checkpointer.list`` and ``Replicator.replicate``
    (fuzz: e2e, mode sidecars; sidecar target).
    """
    store, ckpt = _two_copies(tmp_path)
    body = {"importance": "milestone", "reason": "", "changed_at": "2024-01-02T00:00:00"}
    path = step_path(store, "r", 1) / "sidecar.importance.json"
    path.write_bytes(seal(body))
    fast = read_sidecars(CopyRef(store.tier("fast"), "r", 1))
    # A bare time is read as UTC (mouthguard always writes an offset).
    assert fast.importance is mouthguard.Importance.MILESTONE
    assert fast.importance_changed_at == dt.datetime(2024, 1, 2, tzinfo=dt.UTC)
    # The newer, genuine change on the other copy wins the merge.
    (info,) = ckpt.list()
    assert (info.step, info.importance) == (1, mouthguard.Importance.CRITICAL)
    report = Replicator(store).replicate("r", 1)
    assert report.protected == 1 and not report.shortfalls and not report.copies
    # ...and is written back over the odd copy's older one.
    repaired = read_sidecars(CopyRef(store.tier("fast"), "r", 1))
    assert repaired.importance is mouthguard.Importance.CRITICAL
    assert repaired.importance_reason == "genuine"


def test_sealed_trash_mark_at_the_end_of_time_is_tolerated(tmp_path: Path) -> None:
    """``trashed_at`` of 9999-12-31T23:59:59.999999+00:00, checksum valid.

    The fact is kept as a float timestamp, which rounds up past year 9999;
    ``Checkpointer.list`` turned it back into a datetime and raised ValueError
    ("year 10000 is out of range") (fuzz: e2e, mode sidecars, case 3260).
    """
    store, ckpt = _two_copies(tmp_path)
    body = {"reason": "retention", "trashed_at": "9999-12-31T23:59:59.999999+00:00"}
    (step_path(store, "r", 1) / "sidecar.trash.json").write_bytes(seal(body))
    before = dt.datetime.now(dt.UTC)
    (info,) = ckpt.list()
    after = dt.datetime.now(dt.UTC)
    # An unusable time restarts the trash delay from now: never purged early, never kept forever.
    trashed = {c.tier: c.trashed_at for c in info.copies}
    assert trashed["durable"] is None
    assert trashed["fast"] is not None and before <= trashed["fast"] <= after
    assert torch.equal(ckpt.load(1).state["w"], torch.ones(4))  # type: ignore[index]
