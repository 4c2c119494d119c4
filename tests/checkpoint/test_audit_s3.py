"""The audit trail on a real S3 server (Ceph RGW): create-only records beside the data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.checkpoint import audit
from mouthguard.checkpoint.audit_check import acts, check_store, merged
from mouthguard.cli.main import main
from mouthguard.errors import ObjectExistsError
from mouthguard.jobs.replicator import Replicator
from mouthguard.tiers.base import PutMode
from tests.jobs.test_s3_replication import RUN, s3_store, s3_tier
from tests.s3.fixtures import S3Bucket


def test_acts_are_recorded_on_s3_and_an_edit_there_is_found(
    tmp_path: Path,
    s3_bucket: S3Bucket,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MOUTHGUARD_MANIFEST_KEY", "c" * 64)
    store = s3_store(tmp_path / "store", s3_bucket, monkeypatch, local=True)
    tier = s3_tier(store)
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False, actor="trainer@node-a")
    ckpt.save(1, {"w": torch.ones(256)}, importance="milestone")
    assert Replicator(store).run_once().protected == 1
    ckpt.hold(1, "legal", reason="regulator asked")

    keys = audit.trail_keys(None)
    breaks, trails = check_store(store.tiers, keys)
    assert breaks == []
    on_s3 = [e.stored.record for e in trails.entries["s3"] if e.stored is not None]
    # The copy to S3 and the hold touched S3: their intents and outcomes are there.
    assert [(r.act, r.phase) for r in on_s3] == [
        ("copy", "intent"),
        ("copy", "outcome"),
        ("hold", "intent"),
        ("hold", "outcome"),
    ]
    assert [a.intent.record.act for a in acts(merged(trails), RUN, 1)] == [
        "commit",
        "copy",
        "hold",
    ]
    # Create-only: a record is never overwritten through the tier.
    first = audit.record_key(0)
    with pytest.raises(ObjectExistsError):
        tier.put(first, b"{}", mode=PutMode.CREATE)

    # Someone with write access to the bucket edits the hold's reason on S3.
    key = audit.record_key(2)
    body = json.loads(tier.get(key))
    body["reason"] = "legal: nothing to see"
    tier.put(key, json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    capsys.readouterr()
    assert main(["--store", store.source, "audit", "--check", "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["breaks"]
    assert {(b["tier"], b["seq"]) for b in found} == {("s3", 2)}
    assert any("signature does not match" in b["what"] for b in found)
