"""Hugging Face hub cache snapshots: links followed inside the model's folder, and only there.

The layout is built the way ``huggingface_hub`` writes it (blobs named by their
hash, relative links from ``snapshots/<rev>/``, ``refs/main``), and
``huggingface_hub``'s own ``scan_cache_dir`` and ``try_to_load_from_cache``
confirm it is the real one. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir, try_to_load_from_cache

from mouthguard import weights
from mouthguard.cli.main import main
from mouthguard.errors import WeightsError
from tests.weights.helpers import (
    REPO,
    REVISION,
    assert_equal,
    make_hub_cache,
    model_state,
    read_with_safetensors,
    write_sharded,
    write_single,
)


def test_a_sharded_snapshot_loads_as_safetensors_reads_it(tmp_path: Path) -> None:
    state = model_state()
    cache = tmp_path / "hub"
    snapshot = make_hub_cache(cache, write_sharded(tmp_path / "m", state))
    # huggingface_hub itself recognises the layout: the repo, its revision, its files.
    (repo,) = scan_cache_dir(cache).repos
    assert (repo.repo_id, repo.repo_type) == (REPO, "model")
    assert [r.commit_hash for r in repo.revisions] == [REVISION]
    found = try_to_load_from_cache(REPO, "model.safetensors.index.json", cache_dir=cache)
    assert found == str(snapshot / "model.safetensors.index.json")
    assert all(path.is_symlink() for path in snapshot.iterdir())

    loaded = weights.load(snapshot)
    assert_equal(loaded.tensors, state)
    assert_equal(loaded.tensors, read_with_safetensors(snapshot))
    assert loaded.kind == "safetensors-index"
    assert loaded.source == str(snapshot)
    assert sorted(loaded.unverified_files) == sorted(p.name for p in snapshot.glob("*.safetensors"))
    # The model's folder itself: the snapshot refs/main names.
    assert_equal(weights.load(cache / "models--org--tiny").tensors, state)


def test_a_single_file_snapshot_loads_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = model_state(seed=2)
    snapshot = make_hub_cache(tmp_path / "hub", write_single(tmp_path / "m", state))
    assert main(["weights", "load", str(snapshot), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["kind"], out["tensors"]) == ("safetensors", len(state))
    assert out["unverified_files"] == ["model.safetensors"]


def test_a_link_leaving_the_model_folder_is_refused_naming_it(tmp_path: Path) -> None:
    snapshot = make_hub_cache(tmp_path / "hub", write_sharded(tmp_path / "m", model_state()))
    # Another file outside the model's folder, with the right bytes: still refused.
    shard = sorted(snapshot.glob("*.safetensors"))[0]
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(shard.read_bytes())
    for target in [f"../../../../{outside.name}", str(outside)]:
        shard.unlink()
        shard.symlink_to(target)
        with pytest.raises(WeightsError) as excinfo:
            weights.load(snapshot)
        message = str(excinfo.value)
        assert str(shard) in message and target in message
        assert "outside the model's cache folder" in message
    # Another model's blob is outside this model's folder too.
    other = make_hub_cache(tmp_path / "hub2", write_single(tmp_path / "m2", model_state()))
    shard.unlink()
    shard.symlink_to(os.path.relpath(other / "model.safetensors", shard.parent))
    with pytest.raises(WeightsError, match="outside the model's cache folder"):
        weights.load(snapshot)


def test_a_dangling_link_is_a_clear_error_naming_the_file(tmp_path: Path) -> None:
    snapshot = make_hub_cache(tmp_path / "hub", write_sharded(tmp_path / "m", model_state()))
    shard = sorted(snapshot.glob("*.safetensors"))[1]
    shard.resolve().unlink()  # the blob is gone (an interrupted or pruned download)
    with pytest.raises(WeightsError, match="dangling link") as excinfo:
        weights.load(snapshot)
    assert str(shard) in str(excinfo.value)
    index = snapshot / "model.safetensors.index.json"
    index.resolve().unlink()  # the index itself dangling: named, not "no index"
    with pytest.raises(WeightsError, match="dangling link") as excinfo:
        weights.load(snapshot)
    assert str(index) in str(excinfo.value)


def test_a_link_through_another_link_is_never_followed(tmp_path: Path) -> None:
    # blobs/ replaced by a link to a folder elsewhere: the target path stays inside
    # the model's folder on paper, but the local tier refuses a path through a link.
    snapshot = make_hub_cache(tmp_path / "hub", write_single(tmp_path / "m", model_state()))
    blobs = snapshot.parent.parent / "blobs"
    blobs.rename(tmp_path / "moved-blobs")
    blobs.symlink_to(tmp_path / "moved-blobs")
    with pytest.raises(Exception, match="symbolic link"):
        weights.load(snapshot)


def test_a_model_folder_without_refs_main_says_which_snapshots_exist(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    make_hub_cache(cache, write_single(tmp_path / "m", model_state()))
    (cache / "models--org--tiny" / "refs" / "main").unlink()
    with pytest.raises(WeightsError, match=REVISION):
        weights.load(cache / "models--org--tiny")


def test_links_outside_a_hub_snapshot_are_named_not_reported_missing(tmp_path: Path) -> None:
    # A plain folder of links (not a hub snapshot): the local tier never follows them,
    # and the error says so instead of claiming there is no index.
    snapshot = make_hub_cache(tmp_path / "hub", write_sharded(tmp_path / "m", model_state()))
    links = tmp_path / "links"
    links.mkdir()
    for path in snapshot.iterdir():
        (links / path.name).symlink_to(path.resolve())
    with pytest.raises(WeightsError, match="is a symbolic link") as excinfo:
        weights.load(links)
    assert "hub cache snapshot" in str(excinfo.value)
