"""End to end over a real S3 server: racing saves, replication to S3, fallback, legal holds.

Stores are built the way users build them: a ``mouthguard.toml`` whose S3 tier
names the bucket and endpoint, with credentials from the ``AWS_*`` variables.
The server is the session's ``s3_server`` (a throwaway Ceph RGW on loopback
unless ``MOUTHGUARD_TEST_S3_ENDPOINT`` names another).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.reader import read_manifest
from mouthguard.checkpoint.sidecars import CopyRef, read_sidecars
from mouthguard.errors import CheckpointExistsError, ObjectExistsError
from mouthguard.format.manifest import MANIFEST_NAME
from mouthguard.jobs.replicator import Replicator
from mouthguard.tiers.s3 import CreateGuard, S3Tier
from tests.checkpoint.helpers import assert_same
from tests.s3.fixtures import S3Bucket

RUN = "r"
TIMEOUT = 120.0  # seconds: bounds every barrier wait and thread join below


def s3_store(
    root: Path, bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch, *, local: bool
) -> mouthguard.Store:
    """A store from a ``mouthguard.toml``: optionally a local fast tier, then an S3 tier."""
    server = bucket.server
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    monkeypatch.setenv("AWS_REGION", server.region)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    lines = []
    if local:
        lines += ["[[tiers]]", 'name = "fast"', 'kind = "local"', 'path = "fast"']
        lines += ['domain = "node-a"', ""]
    lines += ["[[tiers]]", 'name = "s3"', 'kind = "s3"', f'url = "{bucket.url}store"']
    lines += ['domain = "region-a"']
    if server.endpoint is not None:
        lines.append(f'endpoint = "{server.endpoint}"')
    root.mkdir(parents=True, exist_ok=True)
    config = root / "mouthguard.toml"
    config.write_text("\n".join(lines) + "\n")
    return mouthguard.open_store(config)


def state_of(seed: int) -> dict[str, object]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(256, 1024, generator=generator), "b": torch.arange(7.0)},
        "step": seed,
        "note": f"writer-{seed}",
    }


def copy_keys(tier: S3Tier, step: int) -> list[str]:
    """Keys of every file the copy's manifest names, and of the manifest itself."""
    prefix = CopyRef(tier, RUN, step).prefix
    manifest = read_manifest(tier, RUN, step)
    return [prefix + name for name in [*(f.name for f in manifest.files), MANIFEST_NAME]]


def s3_tier(store: mouthguard.Store) -> S3Tier:
    tier = store.tier("s3")
    assert isinstance(tier, S3Tier)
    return tier


# --- two writers, one step, a bucket that ignores If-None-Match -------------------------


def first_rank_check_waits(exists: Callable[[str], bool], barrier: threading.Barrier) -> object:
    """``exists`` whose first answer about a rank file waits until both writers have theirs."""
    waited = threading.Event()

    def check(key: str) -> bool:
        found = exists(key)
        if key.endswith(".safetensors") and not waited.is_set():
            waited.set()
            barrier.wait()
        return found

    return check


@pytest.mark.parametrize("force", [True, False], ids=["both-past-head", "natural"])
def test_two_checkpointers_racing_for_one_step_commit_once(
    tmp_path: Path, s3_lock_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch, force: bool
) -> None:
    # Two jobs (own stores, own clients) saving the same run and step with different states.
    stores = [
        s3_store(tmp_path / f"w{i}", s3_lock_bucket, monkeypatch, local=False) for i in (0, 1)
    ]
    tier = s3_tier(stores[0])
    assert tier.probe.create_guard is not CreateGuard.EXISTENCE_CHECK
    if force:
        checked = threading.Barrier(2, timeout=TIMEOUT)
        for store in stores:
            fast = store.fast
            fast.exists = first_rank_check_waits(fast.exists, checked)  # type: ignore[method-assign]
    states = [state_of(0), state_of(1)]
    start = threading.Barrier(2, timeout=TIMEOUT)
    outcomes: list[BaseException | None] = [None, None]

    def save(i: int) -> None:
        ckpt = mouthguard.Checkpointer(stores[i], run=RUN, background=False)
        start.wait()
        try:
            ckpt.save(5, states[i], importance="milestone")
        except Exception as exc:  # the outcome is what the test asserts
            outcomes[i] = exc

    threads = [threading.Thread(target=save, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "a save hung"
    assert outcomes.count(None) == 1, outcomes
    winner = outcomes.index(None)
    loser = outcomes[1 - winner]
    assert isinstance(loser, CheckpointExistsError | ObjectExistsError), loser
    # A third process sees one checkpoint, byte-exact the winner's.
    reader = mouthguard.Checkpointer(
        s3_store(tmp_path / "reader", s3_lock_bucket, monkeypatch, local=False),
        run=RUN,
        background=False,
    )
    assert reader.steps() == [5]
    loaded = reader.load(5)
    assert loaded.rejected == []
    assert_same(loaded.state, states[winner])
    # The loser left no version behind that a reader of the latest version could see.
    for key in copy_keys(tier, 5):
        assert len(tier.object_versions(key)) == 1, key


# --- replication to S3 --------------------------------------------------------------------


def test_routine_copy_on_s3_is_verified_tagged_and_a_fallback(
    tmp_path: Path, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = s3_store(tmp_path, s3_bucket, monkeypatch, local=True)
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
    state = state_of(3)
    ckpt.save(1, state, importance="routine")
    report = Replicator(store, store.policy).run_once()
    assert [(c.source, c.destination) for c in report.copies] == [("fast", "s3")]
    assert report.protected == 1 and not report.shortfalls
    tier = s3_tier(store)
    manifest_key = CopyRef(tier, RUN, 1).key(MANIFEST_NAME)
    assert tier.get(manifest_key) == store.fast.get(manifest_key)  # byte-identical
    assert read_sidecars(CopyRef(tier, RUN, 1)).verified_at is not None  # the receipt
    for key in copy_keys(tier, 1):
        assert tier.annotations(key) == {"importance": "routine"}, key
    assert Replicator(store, store.policy).run_once().copies == []  # nothing left to do

    rank_file = Path(store.fast.location(CopyRef(store.fast, RUN, 1).prefix))
    (rank_file / "rank-00000.safetensors").unlink()
    with pytest.warns(mouthguard.CheckpointFallbackWarning, match="fast"):
        loaded = ckpt.load()
    assert loaded.step == 1 and loaded.tier == "s3"
    assert_same(loaded.state, state)


# --- legal holds on an Object-Lock bucket ------------------------------------------------


def replicated_critical(
    tmp_path: Path, bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> tuple[mouthguard.Checkpointer, S3Tier, list[str]]:
    """Save step 2 as critical, replicate it to the lock bucket; the S3 copy's keys."""
    store = s3_store(tmp_path, bucket, monkeypatch, local=True)
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
    ckpt.save(2, state_of(2), importance="critical")
    report = Replicator(store, store.policy).run_once()
    assert [c.destination for c in report.copies] == ["s3"], report
    tier = s3_tier(store)
    assert tier.capabilities.object_lock
    return ckpt, tier, copy_keys(tier, 2)


def held(bucket: S3Bucket, tier: S3Tier, key: str) -> bool:
    """The legal hold of ``key``'s latest version, asked through the tier and through boto3."""
    answer = bucket.server.client().get_object_legal_hold(Bucket=bucket.name, Key=tier.prefix + key)
    status = answer["LegalHold"]["Status"]
    assert tier.legal_hold(key) == (status == "ON")
    return bool(status == "ON")


def test_critical_copy_on_a_lock_bucket_is_under_legal_hold(
    tmp_path: Path, s3_lock_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt, tier, keys = replicated_critical(tmp_path, s3_lock_bucket, monkeypatch)
    assert keys and all(held(s3_lock_bucket, tier, key) for key in keys)
    for key in keys:
        assert tier.annotations(key) == {"importance": "critical"}, key
    # A named hold keeps the storage-level hold through a demotion.
    ckpt.hold(2, "audit", reason="kept for review")
    ckpt.set_importance(2, "routine", reason="superseded")
    Replicator(ckpt.store, ckpt.store.policy).run_once()
    assert all(held(s3_lock_bucket, tier, key) for key in keys)


def test_demotion_without_holds_releases_the_legal_hold(
    tmp_path: Path, s3_lock_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt, tier, keys = replicated_critical(tmp_path, s3_lock_bucket, monkeypatch)
    assert all(held(s3_lock_bucket, tier, key) for key in keys)
    ckpt.set_importance(2, "routine", reason="superseded")
    Replicator(ckpt.store, ckpt.store.policy).run_once()
    still_held = [key for key in keys if held(s3_lock_bucket, tier, key)]
    assert still_held == []
