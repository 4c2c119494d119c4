"""Two regions: two Ceph RGW servers on loopback, each an object store in its own domain.

Region A holds the fast tier and an object store; region B a second object store
(a second, throwaway Ceph cluster for region A, so that it can be lost whole).
Critical checkpoints get a read-back-verified copy in region B; when region A is
lost entirely, the run resumes from region B; deletion goes through the trash on
every tier in both regions, and the copy in the other region is never the first
to go.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.audit_check import acts, merged, read_trails
from mouthguard.format.manifest import Manifest
from mouthguard.jobs.replicator import Replicator
from mouthguard.jobs.retention import apply_retention
from mouthguard.tiers.faults import FaultPlan, FaultyTier
from tests.s3.ceph import CephCluster, CephStartError, S3Endpoint, missing_binaries
from tests.s3.fixtures import S3Bucket, S3Server

DAY = 86400.0


@pytest.fixture
def region_a() -> Iterator[tuple[CephCluster, S3Endpoint]]:
    """A Ceph cluster of its own for region A (stopped by the test that loses the region)."""
    if missing := missing_binaries():
        pytest.skip(f"a second S3 server needs a local Ceph (missing: {', '.join(missing)})")
    cluster = CephCluster()
    try:
        endpoint = cluster.start()
    except CephStartError as exc:
        pytest.fail(f"region A's Ceph did not start:\n{exc}", pytrace=False)
    try:
        yield cluster, endpoint
    finally:
        cluster.stop()


def _bucket(endpoint: S3Endpoint, name: str) -> str:
    server = S3Server(endpoint.endpoint, endpoint.access_key, endpoint.secret_key)
    server.client().create_bucket(Bucket=name)
    return f"s3://{name}/store"


def _config(root: Path, tiers: list[tuple[str, str, str, str | None]]) -> Path:
    """A mouthguard.toml: (name, domain, path or s3 url, endpoint) per tier."""
    lines = []
    for name, domain, where, endpoint in tiers:
        lines += ["[[tiers]]", f'name = "{name}"', f'domain = "{domain}"']
        if endpoint is None:
            lines += ['kind = "local"', f'path = "{where}"']
        else:
            lines += ['kind = "s3"', f'url = "{where}"', f'endpoint = "{endpoint}"']
        lines.append("")
    root.mkdir(parents=True, exist_ok=True)
    config = root / "mouthguard.toml"
    config.write_text("\n".join(lines))
    return config


@pytest.fixture
def regions(
    tmp_path: Path,
    region_a: tuple[CephCluster, S3Endpoint],
    s3_bucket: S3Bucket,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Path, S3Bucket, CephCluster]:
    """Store A: fast (region A's node), s3-a (region A), s3-b (region B, the session's server)."""
    cluster, endpoint = region_a
    server_b = s3_bucket.server
    if not server_b.is_local_ceph:
        pytest.skip("two regions need the local Ceph (both clusters share its test user)")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server_b.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server_b.secret_key)
    monkeypatch.setenv("AWS_REGION", server_b.region)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    url_a = _bucket(endpoint, "region-a")
    config = _config(
        tmp_path / "a",
        [
            ("fast", "region-a/node-1", str(tmp_path / "a" / "fast"), None),
            ("s3-a", "region-a", url_a, endpoint.endpoint),
            ("s3-b", "region-b", f"{s3_bucket.url}store", server_b.endpoint),
        ],
    )
    return config, s3_bucket, cluster


def _state(step: int) -> dict[str, object]:
    return {"w": torch.full((1024,), float(step)), "step": step}


def test_region_a_lost_entirely_the_run_resumes_from_region_b(
    tmp_path: Path, regions: tuple[Path, S3Bucket, CephCluster]
) -> None:
    config, bucket_b, cluster_a = regions
    store = mouthguard.open_store(config)
    ckpt = mouthguard.Checkpointer(store, "r", background=False)
    for step, level in ((1, "routine"), (2, "critical"), (3, "routine")):
        ckpt.save(step, _state(step), importance=level)
    report = Replicator(store).run_once()
    assert not report.shortfalls, report.shortfalls
    # The critical checkpoint is in region B, read back and verified there.
    critical = ckpt.info(2)
    assert critical is not None and critical.state == "protected"
    in_b = {c.tier: c for c in critical.copies}["s3-b"]
    assert in_b.verified_at is not None
    # Routine ones are protected inside region A (two domains there), not shipped away.
    assert "s3-b" not in {c.tier for c in ckpt.info(1).copies}  # type: ignore[union-attr]

    # Region A is lost: its object store's cluster stops, its node's disk is gone.
    cluster_a.stop()
    shutil.rmtree(tmp_path / "a")

    # In region B: a new node with a new fast tier, and region B's object store.
    config_b = _config(
        tmp_path / "b",
        [
            ("fast", "region-b/node-1", str(tmp_path / "b" / "fast"), None),
            ("s3-b", "region-b", f"{bucket_b.url}store", bucket_b.server.endpoint),
        ],
    )
    resumed = mouthguard.Checkpointer(mouthguard.open_store(config_b), "r", background=False)
    loaded = resumed.load()
    assert loaded.step == 2 and loaded.tier == "s3-b"
    assert torch.equal(loaded.state["w"], torch.full((1024,), 2.0))  # type: ignore[index]
    # It continues there; the lineage says where from.
    resumed.save(4, _state(4), importance="critical")
    assert resumed.steps() == [2, 4]
    lineage = Manifest.from_bytes(resumed.store.fast.get("r/000000000004/manifest.json")).lineage
    assert lineage is not None and lineage.resumed_from is not None
    assert lineage.resumed_from.step == 2


def test_deletion_waits_out_the_trash_everywhere_and_region_b_goes_last(
    regions: tuple[Path, S3Bucket, CephCluster],
) -> None:
    config, _bucket_b, _cluster = regions
    store = mouthguard.open_store(config)
    ckpt = mouthguard.Checkpointer(store, "r", background=False)
    ckpt.save(1, _state(1), importance="critical")
    for step in range(2, 6):
        ckpt.save(step, _state(step))
    assert not Replicator(store).run_once().shortfalls
    assert {c.tier for c in ckpt.info(1).copies} == {"fast", "s3-a", "s3-b"}  # type: ignore[union-attr]
    ckpt.set_importance(1, "routine", reason="superseded release candidate")

    now = time.time()
    first = apply_retention(store, now=now)  # keep-last 3: step 1 (and 2) leave
    trashed = {(a.step, a.action.tier) for a in first.actions if a.action.action == "trash"}
    assert {(1, "fast"), (1, "s3-a"), (1, "s3-b")} <= trashed
    early = apply_retention(store, now=now + DAY / 2)
    assert early.count("purge") == 0  # the trash delay holds in both regions

    # Region A's object store refuses deletes: region B's copy must wait for it.
    faulty = [
        FaultyTier(t, FaultPlan(error=1.0, ops=frozenset({"delete"}))) if t.name == "s3-a" else t
        for t in store.tiers
    ]
    broken = mouthguard.Store(faulty, source=store.source, policy=store.policy)
    late = apply_retention(broken, now=now + DAY + 1)
    by_tier = {a.action.tier: a for a in late.actions if a.step == 1}
    assert by_tier["fast"].done
    assert by_tier["s3-a"].error is not None and not by_tier["s3-a"].done
    assert not by_tier["s3-b"].done and "waits: the copy on s3-a" in str(by_tier["s3-b"].error)
    assert {c.tier for c in ckpt.info(1).copies} == {"s3-a", "s3-b"}  # type: ignore[union-attr]

    # Region A healthy again: the next pass finishes, region B last.
    again = apply_retention(store, now=now + DAY + 2)
    assert [a.action.tier for a in again.actions if a.step == 1 and a.done] == ["s3-a", "s3-b"]
    assert ckpt.info(1, missing_ok=True) is None
    purges = [
        a.intent.record.tiers[0]
        for a in acts(merged(read_trails(store.tiers)), "r", 1)
        if a.intent.record.act == "purge" and a.status == "done"
    ]
    assert purges == ["fast", "s3-a", "s3-b"]
