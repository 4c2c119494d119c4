"""The node cache's freshness rule on any remote tier (here a memory tier; S3 in test_s3.py)."""

from __future__ import annotations

from pathlib import Path

from mouthguard import weights
from mouthguard.tiers.memory import MemoryTier
from mouthguard.weights.node_cache import source_id
from mouthguard.weights.source import open_source
from tests.weights.helpers import assert_equal, model_state, write_single


def _push(tier: MemoryTier, directory: Path) -> None:
    for path in sorted(directory.iterdir()):
        tier.put(f"m/{path.name}", path.read_bytes())


def test_a_rewrite_with_the_same_size_is_downloaded_again(tmp_path: Path) -> None:
    remote, cache = MemoryTier(), tmp_path / "cache"
    _push(remote, write_single(tmp_path / "a", model_state(seed=0)))
    assert weights.load(remote, prefix="m", cache_dir=cache).refreshed_files == []
    _push(remote, write_single(tmp_path / "b", model_state(seed=1)))  # same shapes and sizes
    again = weights.load(remote, prefix="m", cache_dir=cache)
    assert again.refreshed_files == ["model.safetensors"]
    assert_equal(again.tensors, model_state(seed=1))
    # Pushing the same bytes again still makes a new version here (the memory tier's
    # stamp is per write): downloaded again, never served from the older copy.
    _push(remote, write_single(tmp_path / "b", model_state(seed=1)))
    assert weights.load(remote, prefix="m", cache_dir=cache).refreshed_files == [
        "model.safetensors"
    ]


def test_a_copy_in_the_earlier_one_file_per_name_layout_is_replaced(tmp_path: Path) -> None:
    remote, cache = MemoryTier(), tmp_path / "cache"
    _push(remote, write_single(tmp_path / "a", model_state(seed=0)))
    folder = cache / source_id(open_source(remote, prefix="m"))
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"stale bytes of an unknown version")
    loaded = weights.load(remote, prefix="m", cache_dir=cache)
    assert_equal(loaded.tensors, model_state(seed=0))
    assert loaded.downloaded == remote.head("m/model.safetensors").size
    assert [p.parent.name for p in folder.glob("*/*")] == ["model.safetensors"]
