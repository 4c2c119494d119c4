"""weights.iter_tensors: every source kind streamed as views of the file, checked before it ends."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard import weights
from mouthguard.errors import ChecksumMismatchError, WeightsError
from tests.checkpoint.helpers import flip_byte
from tests.weights.helpers import (
    assert_equal,
    make_hub_cache,
    model_state,
    read_with_safetensors,
    write_sharded,
    write_single,
)


def _damaged_checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    state = {f"layer{i}.weight": torch.arange(i * 1000, i * 1000 + 4096.0) for i in range(3)}
    mouthguard.Checkpointer(tmp_path / "store", run="r", background=False).save(1, state)
    rank_file = tmp_path / "store" / "fast" / "r" / f"{1:012d}" / "rank-00000.safetensors"
    flip_byte(rank_file, -3)  # in the last tensor's data
    return tmp_path / "store", state


def test_a_sharded_hf_directory_streams_what_safetensors_reads(tmp_path: Path) -> None:
    state = model_state()
    directory = write_sharded(tmp_path / "m", state)
    stream = weights.iter_tensors(directory)
    got = dict(stream)
    assert_equal(got, read_with_safetensors(directory))
    assert stream.kind == "safetensors-index"
    assert stream.stats.nbytes == sum(t.numel() * t.element_size() for t in state.values())
    assert sorted(stream.stats.unverified_files) == sorted(
        p.name for p in directory.glob("*.safetensors")
    )
    assert stream.stats.verified_files == []


def test_streamed_tensors_are_views_a_write_to_one_never_reaches_the_file(
    tmp_path: Path,
) -> None:
    state = {"w": torch.arange(1024.0), "b": torch.ones(8)}
    directory = write_single(tmp_path / "m", state)
    before = (directory / "model.safetensors").read_bytes()
    got = dict(weights.iter_tensors(directory))
    # Not a private copy: both tensors share the one mapping of the file.
    assert got["w"].untyped_storage().data_ptr() != 0
    assert got["w"].untyped_storage().nbytes() == got["w"].numel() * 4
    got["w"].zero_()  # copy-on-write: this process's page only
    assert (directory / "model.safetensors").read_bytes() == before
    assert_equal(dict(weights.iter_tensors(directory)), state)


def test_include_streams_only_the_matching_tensors(tmp_path: Path) -> None:
    state = model_state()
    directory = write_single(tmp_path / "m", state)
    got = dict(weights.iter_tensors(directory, include=["model.norm.*"]))
    assert_equal(got, {"model.norm.weight": state["model.norm.weight"]})


def test_a_hub_snapshot_streams(tmp_path: Path) -> None:
    state = model_state()
    snapshot = make_hub_cache(tmp_path / "hub", write_sharded(tmp_path / "m", state))
    assert_equal(dict(weights.iter_tensors(snapshot)), state)


def test_a_checkpoint_streams_verified_by_run(tmp_path: Path) -> None:
    state = model_state()
    ckpt = mouthguard.Checkpointer(tmp_path / "store", run="sft", background=False)
    ckpt.save(7, {"model": state})
    stream = weights.iter_tensors(tmp_path / "store", run="sft")
    assert_equal(dict(stream), {f"model.{n}": t for n, t in state.items()})
    assert stream.kind == "checkpoint"
    assert stream.stats.verified_files == ["rank-00000.safetensors"]


def test_a_wrong_byte_fails_the_stream_after_its_file_s_last_tensor(tmp_path: Path) -> None:
    store, state = _damaged_checkpoint(tmp_path)
    stream = weights.iter_tensors(store, run="r")
    handed: list[str] = []

    def consume() -> None:
        for name, _ in stream:
            handed.append(name)

    with pytest.raises(ChecksumMismatchError) as excinfo:
        consume()
    # Every tensor was handed over (streamed), and the iteration did not end normally:
    # a consumer loading a model from it fails before it could serve anything.
    assert sorted(handed) == sorted(state)
    assert "rank-00000.safetensors of run 'r' step 1" in str(excinfo.value)
    assert stream.stats.verified_files == []
    # Unverified, the same bytes stream (the caller chose so).
    quick = weights.iter_tensors(store, run="r", verify=False)
    assert len(dict(quick)) == len(state)
    assert quick.stats.unverified_files == ["rank-00000.safetensors"]


def test_check_verifies_what_a_consumer_that_stopped_early_took(tmp_path: Path) -> None:
    store, _ = _damaged_checkpoint(tmp_path)
    stream = weights.iter_tensors(store, run="r")
    next(iter(stream))  # one tensor taken, then the consumer stops
    with pytest.raises(ChecksumMismatchError, match=r"rank-00000\.safetensors"):
        stream.check()
    with pytest.raises(WeightsError, match="iterated once"):
        iter(stream)


def test_a_multi_rank_checkpoint_streams_one_rank_s_file(tmp_path: Path) -> None:
    from tests.weights.multirank import save_two_ranks  # noqa: PLC0415 - spawns processes

    store = save_two_ranks(tmp_path / "store")
    with pytest.raises(WeightsError, match="choose one rank's file"):
        dict(weights.iter_tensors(store, run="tp"))
    rank1 = dict(weights.iter_tensors(store, run="tp", files=["rank-00001.safetensors"]))
    assert torch.equal(rank1["w"], torch.full((4,), 1.0))
