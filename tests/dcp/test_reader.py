"""Loading DCP checkpoints: resharding 2 -> 4 and 2 -> 1, every byte verified, fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import LoadPlan

import mouthguard
from mouthguard.dcp import Reader
from mouthguard.dcp.reader import LoadTarget
from mouthguard.errors import (
    CheckpointError,
    CheckpointFallbackWarning,
    CheckpointNotFoundError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    FormatError,
    NoValidCheckpointError,
)
from mouthguard.format.manifest import parse_manifest, seal
from mouthguard.jobs.replicator import Replicator
from tests.checkpoint.helpers import flip_byte
from tests.dcp import workers
from tests.dcp.conftest import Saved
from tests.dcp.helpers import failure_of, load_one_rank, save_one_rank, zeros_like_state
from tests.distributed import run_distributed


def _step_dir(root: Path, step: int, tier: str = "fast") -> Path:
    return root / tier / "r" / f"{step:012d}"


def _offset_of(root: Path, step: int, tensor: str) -> tuple[str, int]:
    """(file, absolute offset) of a stored tensor, from the manifest."""
    manifest = parse_manifest((_step_dir(root, step) / "manifest.json").read_bytes())
    record = next(t for t in manifest.tensors if t.name == tensor)
    return record.file, record.offset


# --- resharding -----------------------------------------------------------------


def test_two_rank_save_loads_into_four_ranks(saved: Saved) -> None:
    resolved = run_distributed(workers.load_four_ranks, 4, str(saved.root))
    # Explicit step 1, and step=None -> the newest committed (the async save, step 4).
    assert resolved == [{"explicit": 1, "newest": 4}] * 4


@pytest.mark.parametrize("step", [1, 2, 4])
def test_two_rank_save_loads_into_one_rank(saved: Saved, step: int) -> None:
    state = zeros_like_state(workers.full_state(step))
    reader = load_one_rank(saved.root, state, step=step)
    assert reader.resolved_step == step
    workers.assert_equal_states(state, workers.full_state(step))


def test_load_reads_only_what_the_plan_needs(saved: Saved, tmp_path: Path) -> None:
    """A partial state dict loads; chunks it does not need are never read (nor judged)."""
    root = saved.copy(tmp_path / "store")
    file, offset = _offset_of(root, 1, "model.embed.weight")
    flip_byte(_step_dir(root, 1) / file, offset)
    state = {"model": {"fc.bias": torch.zeros(10)}}
    load_one_rank(root, state, step=1)
    assert torch.equal(state["model"]["fc.bias"], workers.full_state(1)["model"]["fc.bias"])


# --- verification -----------------------------------------------------------------


def test_flipped_byte_in_a_chunk_raises_checksum_error_naming_it(
    saved: Saved, tmp_path: Path
) -> None:
    root = saved.copy(tmp_path / "store")
    file, offset = _offset_of(root, 1, "model.fc.weight@5,0")
    flip_byte(_step_dir(root, 1) / file, offset + 3)
    state = zeros_like_state(workers.full_state(1))
    with pytest.raises(CheckpointException) as info:
        load_one_rank(root, state, step=1)
    error = failure_of(info.value)
    assert isinstance(error, ChecksumMismatchError)
    assert "'model.fc.weight' [5, 0]" in str(error) and "checksum mismatch" in str(error)
    # The damage is reported for the replicator (a sidecar next to the manifest).
    assert (_step_dir(root, 1) / "sidecar.damage.json").exists()


def test_truncated_rank_file_is_rejected_by_size(saved: Saved, tmp_path: Path) -> None:
    root = saved.copy(tmp_path / "store")
    path = _step_dir(root, 2) / "rank-00001.safetensors"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(CheckpointException) as info:
        load_one_rank(root, zeros_like_state(workers.full_state(2)), step=2)
    assert isinstance(failure_of(info.value), ChecksumMismatchError)
    assert "truncated" in str(failure_of(info.value))


def test_damaged_chunk_is_read_from_a_replica(saved: Saved, tmp_path: Path) -> None:
    root = saved.copy(tmp_path / "store")
    store = mouthguard.open_store(root)
    Replicator(store).run_once()
    assert (_step_dir(root, 1, "durable") / "manifest.json").exists()
    file, offset = _offset_of(root, 1, "model.embed.weight")
    flip_byte(_step_dir(root, 1) / file, offset)
    state = zeros_like_state(workers.full_state(1))
    with pytest.warns(CheckpointFallbackWarning, match="reading it from tier 'durable'"):
        load_one_rank(store, state, step=1)
    workers.assert_equal_states(state, workers.full_state(1))


def test_newest_with_damaged_manifest_falls_back(saved: Saved, tmp_path: Path) -> None:
    root = saved.copy(tmp_path / "store")
    flip_byte(_step_dir(root, 4) / "manifest.json", 100)
    state = zeros_like_state(workers.full_state(2))
    with pytest.warns(CheckpointFallbackWarning, match="step 4"):
        reader = load_one_rank(root, state)
    assert reader.resolved_step == 2
    workers.assert_equal_states(state, workers.full_state(2))
    with pytest.warns(CheckpointFallbackWarning), pytest.raises(CorruptCheckpointError):
        Reader(root, run="r", step=4).read_metadata()


def test_every_manifest_damaged_is_no_valid_checkpoint(saved: Saved, tmp_path: Path) -> None:
    root = saved.copy(tmp_path / "store")
    for step in (1, 2, 4):
        flip_byte(_step_dir(root, step) / "manifest.json", 50)
    with pytest.warns(CheckpointFallbackWarning), pytest.raises(NoValidCheckpointError):
        Reader(root, run="r").read_metadata()


def test_hostile_dcp_metadata_with_valid_checksum_is_rejected(saved: Saved, tmp_path: Path) -> None:
    root = saved.copy(tmp_path / "store")
    path = _step_dir(root, 4) / "manifest.json"
    body = json.loads(path.read_bytes())
    del body["manifest_checksum"]
    body["dcp"]["items"][0]["size"] = [-12, 6]
    path.write_bytes(seal(body))
    with (
        pytest.warns(CheckpointFallbackWarning, match="items\\[0\\].size"),
        pytest.raises(CorruptCheckpointError),
    ):
        Reader(root, run="r", step=4).read_metadata()


# --- choosing the checkpoint ----------------------------------------------------------


def test_checkpointer_saves_are_not_dcp_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "store"
    save_one_rank(root, 1, {"w": torch.arange(4.0)})
    mouthguard.Checkpointer(root, run="r", background=False).save(2, {"w": torch.ones(2)})
    reader = load_one_rank(root, state := {"w": torch.zeros(4)})
    assert reader.resolved_step == 1  # the newer Checkpointer save is not DCP: skipped
    assert torch.equal(state["w"], torch.arange(4.0))
    with pytest.raises(CheckpointError, match="not saved through DCP"):
        Reader(root, run="r", step=2).read_metadata()
    with pytest.raises(CheckpointNotFoundError):
        Reader(root, run="other").read_metadata()


def test_checkpoint_id_retargets_the_reader(saved: Saved) -> None:
    reader = Reader(saved.root, run="elsewhere")
    reader.reset("r/000000000002")
    assert reader.read_metadata().storage_meta is not None
    assert reader.resolved_step == 2 and reader.checkpoint_id == "r/000000000002"
    assert Reader.validate_checkpoint_id("r") and Reader.validate_checkpoint_id("r/7")
    assert not Reader.validate_checkpoint_id("../x/1") and not Reader.validate_checkpoint_id("r/x")


def test_ranks_that_resolved_different_checkpoints_are_refused(saved: Saved) -> None:
    reader = Reader(saved.root, run="r")
    plans = [
        LoadPlan([], storage_data=LoadTarget(4, "a")),
        LoadPlan([], storage_data=LoadTarget(2, "b")),
    ]
    with pytest.raises(CheckpointError, match="different checkpoints"):
        reader.prepare_global_plan(plans)
    same = [LoadPlan([], storage_data=LoadTarget(4, "a")) for _ in range(2)]
    assert reader.prepare_global_plan(same) == same


# --- bytes items ----------------------------------------------------------------------


class Opaque:
    """A value DCP stores as a bytes item that torch's restricted unpickler refuses."""

    def __init__(self, value: int) -> None:
        self.value = value


def test_bytes_items_need_the_restricted_unpickler_unless_trusted(tmp_path: Path) -> None:
    root = tmp_path / "store"
    save_one_rank(root, 1, {"w": torch.ones(3), "meta": {"obj": Opaque(5), "n": 3}})
    with pytest.raises(CheckpointException) as info:
        load_one_rank(root, {"w": torch.zeros(3), "meta": {"obj": None, "n": None}})
    error = failure_of(info.value)
    assert isinstance(error, FormatError) and "'meta.obj'" in str(error)
    state = {"w": torch.zeros(3), "meta": {"obj": None, "n": None}}
    load_one_rank(root, state, trust_bytes_items=True)
    assert state["meta"]["obj"].value == 5 and state["meta"]["n"] == 3
