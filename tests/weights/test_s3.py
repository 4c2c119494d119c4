"""Weights from S3 (a real Ceph RGW) through the node-local cache: downloaded once, verified."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard import weights
from mouthguard.checkpoint import catalog
from mouthguard.errors import ChecksumMismatchError
from mouthguard.tiers.base import PutMode
from tests.s3.fixtures import S3Bucket
from tests.weights.helpers import assert_equal, model_state, write_sharded


def _upload(bucket: S3Bucket, directory: Path, prefix: str) -> None:
    tier = bucket.tier()
    for path in sorted(directory.iterdir()):
        tier.put(f"{prefix}/{path.name}", [path.read_bytes()], mode=PutMode.CREATE)


def _checkpoint_on_s3(bucket: S3Bucket) -> dict[str, torch.Tensor]:
    """Step 3 of run ``r`` saved straight to the bucket; its state."""
    state = {"w": torch.randn(300, 70), "b": torch.arange(5)}
    mouthguard.Checkpointer(mouthguard.Store([bucket.tier()]), run="r", background=False).save(
        3, state
    )
    return state


def _rot_cached_copy(cache: Path) -> tuple[Path, int]:
    """Flip the last byte of the cached rank file; its path and size."""
    (cached,) = cache.glob("*/rank-00000.safetensors/*")  # <source>/<file>/<version>
    data = bytearray(cached.read_bytes())
    data[-1] ^= 0xFF
    cached.write_bytes(bytes(data))
    return cached, len(data)


def test_an_hf_model_on_s3_is_cached_once_then_read_locally(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    state = model_state()
    _upload(s3_bucket, write_sharded(tmp_path / "m", state), "models/tiny")
    cache = tmp_path / "cache"
    first = weights.load(s3_bucket.tier(), prefix="models/tiny", cache_dir=cache)
    assert_equal(first.tensors, state)
    total = sum(p.stat().st_size for p in (tmp_path / "m").glob("*.safetensors"))
    assert first.downloaded == total
    second = weights.load(s3_bucket.tier(), prefix="models/tiny", cache_dir=cache)
    assert second.downloaded == 0  # the node-local copy served it
    assert_equal(second.tensors, state)
    # Without a cache the same model is read from S3 by ranges, straight into memory.
    direct = weights.load(s3_bucket.tier(), prefix="models/tiny")
    assert direct.downloaded == 0
    assert_equal(direct.tensors, state)
    # Streamed, the same: views of the cache's copy, and without a cache file by file.
    streamed = weights.iter_tensors(s3_bucket.tier(), prefix="models/tiny", cache_dir=cache)
    assert_equal(dict(streamed), state)
    assert streamed.stats.downloaded == 0
    assert_equal(dict(weights.iter_tensors(s3_bucket.tier(), prefix="models/tiny")), state)


def test_a_model_pushed_again_to_the_same_url_is_never_served_stale(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    # A fine-tuned model pushed over the base one: same names, shapes and dtypes, so
    # every shard keeps its size and only its bytes (and its ETag) change.
    base, tuned = model_state(seed=0), model_state(seed=1)
    base_dir = write_sharded(tmp_path / "base", base)
    tuned_dir = write_sharded(tmp_path / "tuned", tuned)
    shards = sorted(p.name for p in base_dir.glob("*.safetensors"))
    sizes = {name: (base_dir / name).stat().st_size for name in shards}
    assert sizes == {name: (tuned_dir / name).stat().st_size for name in shards}
    tier, cache = s3_bucket.tier(), tmp_path / "cache"
    _upload(s3_bucket, base_dir, "models/ft")
    first = weights.load(tier, prefix="models/ft", cache_dir=cache)
    assert_equal(first.tensors, base)
    assert first.refreshed_files == []
    for path in sorted(tuned_dir.iterdir()):  # the push: overwrite in place
        tier.put(f"models/ft/{path.name}", [path.read_bytes()])
    second = weights.load(tier, prefix="models/ft", cache_dir=cache)
    assert_equal(second.tensors, tuned)  # the new bytes, not the cached base model
    assert second.refreshed_files == shards  # and the cache says why it downloaded
    assert second.downloaded == sum(sizes.values())
    third = weights.load(tier, prefix="models/ft", cache_dir=cache)
    assert (third.downloaded, third.refreshed_files) == (0, [])
    assert_equal(third.tensors, tuned)
    # One copy per file stays: the base model's versions were deleted.
    assert sorted(p.parent.name for p in cache.glob("*/*/*")) == shards


def test_a_checkpoint_on_s3_is_verified_on_download_and_on_load(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    tier, state = s3_bucket.tier(), _checkpoint_on_s3(s3_bucket)
    cache = tmp_path / "cache"
    loaded = weights.load(tier, run="r", cache_dir=cache)
    assert loaded.verified_files == ["rank-00000.safetensors"]
    assert_equal(loaded.tensors, state)
    # The cached copy rots on the local disk: the next load's inline check catches it,
    # and the file is fetched again from the verified remote copy.
    _, size = _rot_cached_copy(cache)
    repaired = weights.load(tier, run="r", cache_dir=cache)
    assert repaired.downloaded == size
    assert_equal(repaired.tensors, state)
    # A damaged remote copy is refused while downloading: nothing enters the cache.
    key = catalog.checkpoint_prefix("r", 3) + "rank-00000.safetensors"
    remote = bytearray(tier.get(key))
    remote[-1] ^= 0xFF
    tier.put(key, [bytes(remote)])
    fresh = tmp_path / "fresh"
    with pytest.raises(ChecksumMismatchError, match="downloaded bytes") as excinfo:
        weights.load(tier, run="r", cache_dir=fresh)
    assert "rank-00000.safetensors of run 'r' step 3" in str(excinfo.value)
    assert not list(fresh.glob("*/*.safetensors/*"))  # no version of it cached


def test_a_rotten_cached_copy_fails_the_stream_and_is_fetched_again_next_time(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    tier, state = s3_bucket.tier(), _checkpoint_on_s3(s3_bucket)
    cache = tmp_path / "cache"
    assert_equal(dict(weights.iter_tensors(tier, run="r", cache_dir=cache)), state)
    cached, size = _rot_cached_copy(cache)
    # Its tensors were handed over before the check: this load fails, naming the file...
    with pytest.raises(ChecksumMismatchError, match="the next load downloads it again") as exc:
        dict(weights.iter_tensors(tier, run="r", cache_dir=cache))
    assert "rank-00000.safetensors of run 'r' step 3" in str(exc.value)
    assert not cached.exists()
    # ...and the next one downloads the verified remote copy again.
    again = weights.iter_tensors(tier, run="r", cache_dir=cache)
    assert_equal(dict(again), state)
    assert again.stats.downloaded == size
    assert again.stats.verified_files == ["rank-00000.safetensors"]
