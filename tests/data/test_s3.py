"""Datasets on a real S3 server (the session's Ceph RGW): pack or index, verify, stream back."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from mouthguard.data import (
    StreamingDataLoader,
    StreamingDataset,
    index_dataset,
    open_dataset,
    pack,
    verify_dataset,
)
from mouthguard.data.location import LazyTier, Location, open_tier
from mouthguard.errors import DatasetError, ShardDamagedError, TierError
from mouthguard.tiers.s3 import S3Tier
from tests.s3.fault_proxy import FaultProxy
from tests.s3.fixtures import S3Bucket

from .adopted import gzipped, parquet_files, parquet_rows, wds_tars, webdataset_samples
from .helpers import expected, write_dataset
from .writing.test_pack import make_tree

N = 30


def _set_s3_env(monkeypatch: pytest.MonkeyPatch, bucket: S3Bucket) -> None:
    """The environment an S3 URL is opened with (what users set for any S3 tier)."""
    server = bucket.server
    assert server.endpoint is not None, "these tests run against a local endpoint"
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    monkeypatch.setenv("AWS_REGION", server.region)


def test_pack_to_s3_verify_and_stream_back(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    samples = make_tree(tmp_path / "src", n=N)
    tier = s3_bucket.tier()
    manifest = pack(tmp_path / "src", tier, "photos", shard_size=20 * 1024, prefix="datasets")
    assert len(manifest.shards) > 2
    assert verify_dataset(tier, prefix="datasets/photos").ok
    dataset = StreamingDataset(
        tier, prefix="datasets/photos", cache_dir=tmp_path / "cache", range_size=4096
    )
    got = {s["__key__"]: {k: v for k, v in s.items() if k != "__key__"} for s in dataset}
    assert got == samples


@pytest.fixture(autouse=True)
def _user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The per-user shard cache of a dataset without cache_dir: the test's, not the machine's."""
    monkeypatch.setenv("MOUTHGUARD_CACHE_DIR", str(tmp_path / "user-cache"))
    return tmp_path / "user-cache"


def test_s3_url_with_workers_and_the_user_cache(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An s3:// URL: settings from the environment; each worker opens its own connection."""
    _set_s3_env(monkeypatch, s3_bucket)
    write_dataset(s3_bucket.tier(), n=N)
    url = f"{s3_bucket.url.rstrip('/')}/ds"
    assert open_dataset(url).samples == N
    reference = [s["__key__"] for s in StreamingDataset(url, shuffle=True, batch_size=2)]
    dataset = StreamingDataset(url, shuffle=True, batch_size=2)  # no cache_dir: the user's
    assert dataset.cache_dir == str(tmp_path / "user-cache")
    # A reader opens the bucket read-only: no probe objects written by every worker.
    assert getattr(dataset.dataset.location.tier, "read_only", None) is True
    loader = StreamingDataLoader(dataset, num_workers=2)
    # Not forked from this process (its S3 client would hang), nor spawned (a torch
    # import per worker and epoch): forked from the clean fork server.
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    for _ in range(2):  # the second epoch's workers come from the same server
        keys = [k for b in loader for k in b["__key__"]]
        assert sorted(keys) == sorted(expected(N))
    assert keys != reference  # epoch 1's order
    first = StreamingDataLoader(StreamingDataset(url, shuffle=True, batch_size=2), num_workers=2)
    assert [k for b in first for k in b["__key__"]] == reference
    cache_dir = Path(dataset.cache_dir)
    del dataset, loader
    import gc  # noqa: PLC0415

    gc.collect()
    assert list((cache_dir / "blobs").iterdir()), "the user's cache outlives its dataset"


def test_a_worker_reopening_the_location_skips_the_bucket_check(
    s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The opener checks the bucket; a worker unpickling its location does not, every epoch.

    The worker's tier is opened by its first request (a worker reading only the
    cache makes no S3 client); a bucket gone since the opener's check fails that
    request instead of the open.
    """
    _set_s3_env(monkeypatch, s3_bucket)
    write_dataset(s3_bucket.tier(), n=4)
    url = f"{s3_bucket.url.rstrip('/')}/ds"
    opened = open_dataset(url).location
    location = pickle.loads(pickle.dumps(opened))  # as a worker gets it
    assert isinstance(location.tier, LazyTier)
    assert location.tier.domain == opened.tier.domain
    assert location.tier.exists(location.key("dataset.json"))  # opened now, and it reads
    gone = ("s3", f"s3://{s3_bucket.name}-gone/ds")
    with pytest.raises(TierError, match="does not exist"):
        open_tier(gone, create=False)  # the opener's check
    unchecked = pickle.loads(pickle.dumps(Location(opened.tier, "", gone)))  # no request yet
    with pytest.raises(TierError):
        unchecked.tier.get("dataset.json")


@pytest.mark.timeout(120)  # the failure this guards against is a hang
def test_forked_workers_are_refused_instead_of_hanging(
    s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set_s3_env(monkeypatch, s3_bucket)
    write_dataset(s3_bucket.tier(), n=4)
    dataset = StreamingDataset(f"{s3_bucket.url.rstrip('/')}/ds")
    loader = DataLoader(dataset, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(DatasetError, match="cannot be used after a fork"):
        list(loader)
    with pytest.raises(ValueError, match="s3:// URL"):
        StreamingDataLoader(StreamingDataset(s3_bucket.tier(), prefix="ds"), num_workers=1)


def test_damage_on_s3_is_found(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    tier = s3_bucket.tier()
    manifest = write_dataset(tier, n=N)
    key = "ds/shards/shard-000001.tar"
    data = bytearray(tier.get(key))
    data[700] ^= 1
    tier.put(key, bytes(data))
    report = verify_dataset(tier, prefix="ds")
    assert [c.name for c in report.mismatched] == ["shard-000001.tar"]
    dataset = StreamingDataset(tier, prefix="ds", cache_dir=tmp_path / "cache")
    with pytest.raises(ShardDamagedError, match=r"shard-000001\.tar"):
        list(dataset)
    assert manifest.shards[1].name == "shard-000001.tar"


# --- adopting datasets that already live in a bucket ------------------------------


def _upload(bucket: S3Bucket, local: Path, prefix: str) -> None:
    tier = bucket.tier()
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        tier.put(f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())


def test_webdataset_tars_in_a_bucket_are_indexed_in_place_and_streamed(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set_s3_env(monkeypatch, s3_bucket)
    paths = wds_tars(tmp_path / "mine", shards=2, per=5)
    _upload(s3_bucket, tmp_path / "mine", "users/mine")
    url = f"{s3_bucket.url.rstrip('/')}/users/mine"
    manifest = index_dataset(url, workers=2)
    assert manifest.layout == "indexed" and manifest.name == "mine"
    tier = s3_bucket.tier()
    assert tier.exists("users/mine/mouthguard-index/dataset.json")
    assert tier.exists("users/mine/mouthguard-index/shards/train/part-001.index.json")
    assert tier.get("users/mine/train/part-000.tar") == paths[0].read_bytes()  # untouched
    got = list(StreamingDataset(url, cache_dir=tmp_path / "cache", range_size=4096))
    assert got == webdataset_samples(paths)
    assert verify_dataset(url).ok


def test_gzip_tars_in_a_bucket_are_indexed_streamed_and_verified_whole(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set_s3_env(monkeypatch, s3_bucket)
    plain = wds_tars(tmp_path / "mine", shards=2, per=5)
    reference = webdataset_samples(plain)
    paths = gzipped(plain, ".tgz")
    _upload(s3_bucket, tmp_path / "mine", "users/gz")
    url = f"{s3_bucket.url.rstrip('/')}/users/gz"
    manifest = index_dataset(url, workers=2)
    assert [s.name for s in manifest.shards] == ["train/part-000.tgz", "train/part-001.tgz"]
    assert all(s.ranges is None for s in manifest.shards)  # read whole: gzip has no ranges
    got = list(StreamingDataset(url, cache_dir=tmp_path / "cache", range_size=4096))
    assert got == reference
    assert verify_dataset(url).ok
    data = bytearray(paths[1].read_bytes())
    data[len(data) // 2] ^= 1
    s3_bucket.tier().put("users/gz/train/part-001.tgz", bytes(data))
    [bad] = verify_dataset(url).mismatched
    assert bad.name == "train/part-001.tgz"
    with pytest.raises(ShardDamagedError, match=r"part-001\.tgz"):
        list(StreamingDataset(url, cache_dir=tmp_path / "fresh"))


def test_parquet_in_a_bucket_is_indexed_streamed_by_row_group_and_checked(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set_s3_env(monkeypatch, s3_bucket)
    paths, rows = parquet_files(tmp_path / "text", files=2)
    _upload(s3_bucket, tmp_path / "text", "corpora/text")
    url = f"{s3_bucket.url.rstrip('/')}/corpora/text"
    manifest = index_dataset(url)
    assert manifest.kind == "parquet" and manifest.samples == rows
    dataset = StreamingDataset(url, shuffle=True, seed=4, shuffle_window=3, range_size=4096)
    got = list(dataset)
    assert sorted(got, key=lambda r: r["id"]) == parquet_rows(paths)
    assert verify_dataset(url).ok
    key = "corpora/text/data/train-00001-of-00002.parquet"
    group = manifest.files[1].row_groups[1]
    data = bytearray(s3_bucket.tier().get(key))
    data[group.offset + 5] ^= 1
    s3_bucket.tier().put(key, bytes(data))
    [bad] = verify_dataset(url).mismatched
    assert bad.name == "data/train-00001-of-00002.parquet" and "row group 1" in bad.reason
    with pytest.raises(ShardDamagedError, match="row group 1"):
        list(StreamingDataset(url, cache_dir=tmp_path / "fresh"))


def _shard_get(method: str, target: str) -> bool:
    """A GET of a shard (not a HEAD, an index or the manifest)."""
    return method == "GET" and target.split("?", maxsplit=1)[0].endswith(".tar")


def test_ranged_reads_survive_the_object_store_failing_them(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    """Shard GETs through a fault-injecting proxy get 500s, 503 SlowDown, connection
    resets, truncated bodies and a timeout, with the S3 client's own retries off: the
    dataset's retries absorb every one, and every sample comes back exactly."""
    server = s3_bucket.server
    if server.endpoint is None or not server.endpoint.startswith("http://"):
        pytest.skip("the fault proxy fronts a plain-HTTP endpoint")
    write_dataset(s3_bucket.tier(), n=300, shard_size=200 * 1024, range_size=64 * 1024)

    with FaultProxy(server.endpoint, seed=2, timeout_delay=1.5) as proxy:
        options = {**server.tier_options(), "endpoint": proxy.endpoint}
        tier = S3Tier(s3_bucket.url, **options, max_retries=0, request_timeout=1.0, read_only=True)
        stream = StreamingDataset(
            tier, prefix="ds", cache_dir=tmp_path / "cache", range_coalesce=1, range_retries=20
        )
        for kind in ("error_500", "slow_down", "reset", "truncate"):
            proxy.inject_next(kind, 2, match=_shard_get)
        proxy.inject_next("timeout", 1, match=_shard_get)
        got = {s["__key__"]: {k: v for k, v in s.items() if k != "__key__"} for s in stream}
        assert proxy.counts == {
            "error_500": 2,
            "slow_down": 2,
            "timeout": 1,
            "reset": 2,
            "truncate": 2,
        }
    assert got == expected(300)


def test_a_range_the_object_store_always_fails_names_the_dataset_shard_and_bytes(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    server = s3_bucket.server
    if server.endpoint is None or not server.endpoint.startswith("http://"):
        pytest.skip("the fault proxy fronts a plain-HTTP endpoint")
    write_dataset(s3_bucket.tier(), n=N)
    with FaultProxy(server.endpoint, seed=2) as proxy:
        options = {**server.tier_options(), "endpoint": proxy.endpoint}
        tier = S3Tier(s3_bucket.url, **options, max_retries=0, read_only=True)
        stream = StreamingDataset(tier, prefix="ds", cache_dir=tmp_path / "c", range_retries=1)
        proxy.inject_next("error_500", 1000, match=_shard_get)
        with pytest.raises(TierError) as caught:
            next(iter(stream))
    assert str(caught.value).startswith(
        f"{tier.location('ds')}: shard shard-000000.tar: bytes 0 to "
    )
    assert "could not be read (2 tries; the last failed with: " in str(caught.value)
