"""Saving through DCP: one rank file per rank, manifest last, no pickle, commit all or nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.checkpoint.storage import WriteResult

import mouthguard
from mouthguard.checkpoint.store import Store
from mouthguard.cli.main import main as cli_main
from mouthguard.dcp import Writer
from mouthguard.dcp.metadata_json import StoredItem
from mouthguard.dcp.writer import SaveTarget
from mouthguard.errors import (
    CheckpointError,
    CheckpointExistsError,
    FormatError,
    ManifestError,
    ObjectNotFoundError,
    TierError,
)
from mouthguard.format.manifest import parse_manifest
from mouthguard.jobs.replicator import Replicator
from mouthguard.tiers.local import LocalTier
from tests.checkpoint.helpers import NoRenameTier, RecordingListener, flip_byte
from tests.dcp import workers
from tests.dcp.conftest import Saved
from tests.dcp.helpers import failure_of, load_one_rank, save_one_rank, zeros_like_state

COMMITTED = (1, 2, 4)


def _step_dir(root: Path, step: int, tier: str = "fast") -> Path:
    return root / tier / "r" / f"{step:012d}"


# --- what a save leaves -------------------------------------------------------------


@pytest.mark.parametrize("step", COMMITTED)
def test_files_per_checkpoint_are_world_size_plus_one(saved: Saved, step: int) -> None:
    names = sorted(p.name for p in _step_dir(saved.root, step).iterdir())
    assert names == ["manifest.json", "rank-00000.safetensors", "rank-00001.safetensors"]


@pytest.mark.parametrize("step", COMMITTED)
def test_manifest_holds_dcp_metadata_as_json_without_pickle(saved: Saved, step: int) -> None:
    raw = (_step_dir(saved.root, step) / "manifest.json").read_bytes()
    assert b"\x80" not in raw  # no pickle protocol header (nor any non-ASCII byte)
    body = json.loads(raw)  # plain JSON
    assert "$bytes" not in json.dumps(body["dcp"])  # nothing smuggled in as opaque blobs
    manifest = parse_manifest(raw)
    assert manifest.is_dcp and manifest.world_size == 2
    assert manifest.states == ({}, {})
    fqns = {item["fqn"] for item in body["dcp"]["items"]}
    assert {"model.embed.weight", "model.odd", "optim.step", "optim.betas"} <= fqns
    # Every stored item has its own checksum; sharded tensors have one chunk per rank.
    odd = next(i for i in body["dcp"]["items"] if i["fqn"] == "model.odd")
    assert [c["sizes"] for c in odd["chunks"]] == [[4, 3], [3, 3]]
    assert all(s["checksum"].startswith("xxh3-128:") for s in body["dcp"]["storage"])


def test_no_partial_directories_or_metadata_files_beside_commits(saved: Saved) -> None:
    names = sorted(p.name for p in (saved.root / "fast" / "r").iterdir())
    assert names[:2] == ["000000000001", "000000000002"]
    assert names[2].startswith("000000000003.partial-")  # the failed save's leftovers
    assert names[3:] == ["000000000004"]
    assert not list(saved.root.rglob("*.metadata")) and not list(saved.root.rglob("*.distcp"))


def test_rank_files_open_with_safetensors(saved: Saved) -> None:
    full = workers.full_state(1)["model"]
    with safe_open(str(_step_dir(saved.root, 1) / "rank-00000.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("model.embed.weight"), full["embed.weight"][:6])
        assert f.metadata()["writer"] == "mouthguard.dcp"
    with safe_open(str(_step_dir(saved.root, 1) / "rank-00001.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("model.embed.weight@6,0"), full["embed.weight"][6:])
        assert torch.equal(f.get_tensor("model.odd@4,0"), full["odd"][4:])


# --- the rest of mouthguard sees ordinary checkpoints ------------------------------------


def test_checkpointer_lists_dcp_checkpoints_with_importance(saved: Saved, tmp_path: Path) -> None:
    ckpt = mouthguard.Checkpointer(saved.copy(tmp_path / "s"), run="r", background=False)
    infos = ckpt.list()
    assert [i.step for i in infos] == list(COMMITTED)
    assert [i.world_size for i in infos] == [2, 2, 2]
    # Step 2 reused the step-1 writer (checkpoint_id), so it kept its importance.
    assert [i.importance.value for i in infos] == ["milestone", "milestone", "routine"]
    info = ckpt.info(1)
    assert info is not None and len(info.files) == 2
    assert all(f.sha256 is not None for f in info.files)  # with_sha256=True on step 1


def test_mouthguard_verify_accepts_and_then_rejects(
    saved: Saved, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = saved.copy(tmp_path / "s")
    assert cli_main(["--store", str(root), "verify", "r", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(line["step"] for line in lines if line["ok"]) == list(COMMITTED)
    flip_byte(_step_dir(root, 2) / "rank-00000.safetensors", -1)
    assert cli_main(["--store", str(root), "verify", "r", "2", "--json"]) != 0


def test_replicator_copies_and_protects_dcp_checkpoints(saved: Saved, tmp_path: Path) -> None:
    root = saved.copy(tmp_path / "s")
    store = mouthguard.open_store(root)
    report = Replicator(store).run_once()
    assert sorted((c.step, c.destination) for c in report.copies) == [
        (s, "durable") for s in COMMITTED
    ]
    info = mouthguard.Checkpointer(store, run="r", background=False).info(1)
    assert info is not None and info.state == "protected"
    assert (_step_dir(root, 1, "durable") / "manifest.json").read_bytes() == (
        _step_dir(root, 1) / "manifest.json"
    ).read_bytes()
    # The replica alone is a complete DCP checkpoint.
    for path in _step_dir(root, 1).iterdir():
        path.unlink()
    _step_dir(root, 1).rmdir()
    state = zeros_like_state(workers.full_state(1))
    load_one_rank(root, state, step=1)
    workers.assert_equal_states(state, workers.full_state(1))


# --- failures commit nothing ----------------------------------------------------------


def test_rank_failing_in_write_data_commits_nothing(saved: Saved, tmp_path: Path) -> None:
    for rank in saved.ranks:  # every rank saw DCP's error naming rank 1
        assert rank["failed"] == {"ranks": [1], "errors": ["OSError"]}
    root = saved.copy(tmp_path / "s")
    ckpt = mouthguard.Checkpointer(root, run="r", background=False)
    assert ckpt.steps() == list(COMMITTED)
    (partial,) = (root / "fast" / "r").glob("000000000003.partial-*")
    assert [p.name for p in partial.iterdir()] == ["rank-00000.safetensors"]
    (report, _durable) = ckpt.collect_garbage(grace_seconds=0)
    assert [p.step for p in report.partial_saves] == [3]
    assert not partial.exists() and ckpt.steps() == list(COMMITTED)


class TwoRankCommit:
    """Drives a 2-rank Writer by hand in one process: plans, rank files, then finish."""

    def __init__(self, root: Path) -> None:
        self.writer = Writer(root, run="r", step=5, background=False)
        self.writer.set_up_storage_writer(True, rank=0)
        self.plans = self.writer.prepare_global_plan([SavePlan([]), SavePlan([])])

    def write(self, rank: int) -> list[WriteResult]:
        """Rank ``rank``'s (empty) plan written: a header-only rank file and its report."""
        worker = Writer(self.writer.store, run="r", step=5, background=False)
        worker.set_up_storage_writer(rank == 0, rank=rank)
        return worker.write_data(self.plans[rank], None).value()  # type: ignore[arg-type]

    def refuse(
        self, results: list[list[WriteResult]], error: type[Exception], match: str, left: int = 0
    ) -> None:
        """finish() raises; nothing is committed; this transaction's staging is removed."""
        with pytest.raises(error, match=match):
            self.writer.finish(Metadata(state_dict_metadata={}), results)
        assert not mouthguard.Checkpointer(self.writer.store, run="r").steps()
        assert len(_partials(self.writer)) == left


def _partials(writer: Writer) -> list[Path]:
    return list(Path(writer.store.fast.location("r/")).glob("*.partial-*"))


def test_two_empty_ranks_commit(tmp_path: Path) -> None:
    drive = TwoRankCommit(tmp_path / "store")
    drive.writer.finish(Metadata(state_dict_metadata={}), [drive.write(0), drive.write(1)])
    assert mouthguard.Checkpointer(drive.writer.store, run="r").steps() == [5]


def test_finish_refuses_a_set_missing_a_rank_and_removes_staging(tmp_path: Path) -> None:
    drive = TwoRankCommit(tmp_path / "store")
    first = drive.write(0)
    assert _partials(drive.writer)  # rank 0's file is staged
    drive.refuse([first, []], CheckpointError, r"ranks \[1\] reported no rank file")


def test_finish_refuses_a_rank_file_missing_from_staging(tmp_path: Path) -> None:
    drive = TwoRankCommit(tmp_path / "store")
    results = [drive.write(0), drive.write(1)]
    (_partials(drive.writer)[0] / "rank-00001.safetensors").unlink()
    drive.refuse(results, ObjectNotFoundError, "rank-00001")


def test_finish_refuses_a_rank_file_of_another_transaction(tmp_path: Path) -> None:
    drive = TwoRankCommit(tmp_path / "store")
    stale = drive.write(0)
    drive.writer.prepare_global_plan([SavePlan([]), SavePlan([])])  # a new transaction
    # The earlier transaction's staging is another save's leftovers: GC's, not ours.
    drive.refuse([stale, drive.write(1)], CheckpointError, "stale or reported twice", left=1)


def test_finish_refuses_an_item_written_twice(tmp_path: Path) -> None:
    drive = TwoRankCommit(tmp_path / "store")
    item = WriteResult(MetadataIndex("w"), 4, StoredItem("f", "w", "xxh3-128:" + "0" * 32))
    drive.refuse([[item], [item]], CheckpointError, "written twice")


def test_finish_refuses_metadata_with_unstored_chunks(tmp_path: Path) -> None:
    drive = TwoRankCommit(tmp_path / "store")
    results = [drive.write(0), drive.write(1)]
    metadata = Metadata(state_dict_metadata={"step": BytesStorageMetadata()})
    with pytest.raises(ManifestError, match="has no stored data"):
        drive.writer.finish(metadata, results)
    assert not _partials(drive.writer)


def test_plan_without_target_is_refused(tmp_path: Path) -> None:
    writer = Writer(tmp_path / "store", run="r", step=5, background=False)
    with pytest.raises(CheckpointError, match="no mouthguard target"):
        writer.write_data(SavePlan([]), None)  # type: ignore[arg-type]
    plan = SavePlan([], storage_data=SaveTarget("a" * 32, rank=1, world_size=2))
    writer.set_up_storage_writer(False, rank=0)
    with pytest.raises(CheckpointError, match="plan of rank 1"):
        writer.write_data(plan, None)  # type: ignore[arg-type]


def test_unsupported_dtype_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointException) as info:
        save_one_rank(tmp_path / "store", 1, {"z": torch.zeros(2, dtype=torch.complex128)})
    error = failure_of(info.value)
    assert isinstance(error, FormatError) and "'z'" in str(error) and "complex128" in str(error)
    assert not list((tmp_path / "store" / "fast").rglob("*.safetensors"))


def test_existing_step_is_refused_and_a_damaged_one_set_aside(tmp_path: Path) -> None:
    root = tmp_path / "store"
    save_one_rank(root, 1, {"w": torch.arange(3.0)})
    with pytest.raises(CheckpointException) as info:
        save_one_rank(root, 1, {"w": torch.ones(3)})
    assert isinstance(failure_of(info.value), CheckpointExistsError)
    flip_byte(_step_dir(root, 1) / "rank-00000.safetensors", -1)
    save_one_rank(root, 1, {"w": torch.ones(3)}, importance="critical")
    assert list((root / "fast" / "r").glob("000000000001.rejected-*"))
    load_one_rank(root, state := {"w": torch.zeros(3)})
    assert torch.equal(state["w"], torch.ones(3))
    info_1 = mouthguard.Checkpointer(root, run="r").info(1)
    assert info_1 is not None and info_1.importance is mouthguard.Importance.CRITICAL


def test_one_rank_save_has_two_files_and_reference_values(tmp_path: Path) -> None:
    root = tmp_path / "store"
    save_one_rank(root, 7, {"w": torch.arange(6.0).view(2, 3), "n": 1}, reference={"loss": 2.5})
    assert sorted(p.name for p in _step_dir(root, 7).iterdir()) == [
        "manifest.json",
        "rank-00000.safetensors",
    ]
    manifest = parse_manifest((_step_dir(root, 7) / "manifest.json").read_bytes())
    assert manifest.reference == {"loss": 2.5} and manifest.world_size == 1


def test_checkpoint_ids(tmp_path: Path) -> None:
    writer = Writer(tmp_path / "store", run="r", step=3, background=False)
    assert writer.checkpoint_id == "r/000000000003"
    writer.reset("other/12")
    assert (writer.run, writer.step) == ("other", 12)
    assert Writer.validate_checkpoint_id("r/0") and not Writer.validate_checkpoint_id("r")
    with pytest.raises(ValueError):
        writer.reset("r")
    meta = writer.storage_meta()
    assert meta is not None and meta.checkpoint_id == "other/000000000012"


def test_object_store_commit_is_the_manifest_and_failures_clean_up() -> None:
    tier = NoRenameTier()
    store = Store([tier])
    save_one_rank(store, 1, {"w": torch.arange(5.0), "n": 3})
    assert sorted(tier.list("r/")) == [
        "r/000000000001/manifest.json",
        "r/000000000001/rank-00000.safetensors",
    ]
    tier.fail_manifest = True
    with pytest.raises(CheckpointException) as info:
        save_one_rank(store, 2, {"w": torch.ones(5), "n": 4})
    assert isinstance(failure_of(info.value), TierError)
    assert not list(tier.list("r/000000000002/"))  # its own rank file went with it
    tier.fail_manifest = False
    save_one_rank(store, 2, {"w": torch.ones(5), "n": 4})
    load_one_rank(store, state := {"w": torch.zeros(5), "n": None})
    assert torch.equal(state["w"], torch.ones(5)) and state["n"] == 4


def test_a_dcp_commit_is_told_to_the_stores_listener(tmp_path: Path) -> None:
    recorder = RecordingListener()
    tiers = [LocalTier(tmp_path / n, name=n, domain=n) for n in ("fast", "durable")]
    store = Store(tiers, listener=lambda _s: recorder)
    save_one_rank(store, 1, {"w": torch.ones(2)}, background=None)  # default: two tiers
    save_one_rank(store, 2, {"w": torch.ones(2)}, background=False)
    assert recorder.events == [("commit", "r", 1)]
