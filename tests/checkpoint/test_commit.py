"""The coordinator's commit path shared by the Checkpointer and the DCP writer.

Each side's own tests drive it through its writer; these pin the rules both now
share, on the shared code itself: what a failure removes, what it leaves alone,
which error a rank file the coordinator cannot see gives, and what follows a commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.commit import after_commit, clear_the_way, commit_staged
from mouthguard.checkpoint.writer import (
    framework_versions,
    staging_prefix,
    utc_now,
    write_rank_file,
)
from mouthguard.errors import (
    CheckpointError,
    CheckpointExistsError,
    ObjectNotFoundError,
    TierError,
)
from mouthguard.format.manifest import FileRecord, Manifest, TensorRecord
from mouthguard.format.state_tree import flatten_state
from mouthguard.policy.importance import Importance
from mouthguard.tiers.base import Tier
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.posix import get_xattrs
from tests.checkpoint.helpers import NoRenameTier, RecordingListener

RUN, STEP = "r", 1


def _stage(tier: Tier, ranks: int = 1) -> tuple[str, list[tuple[FileRecord, list[TensorRecord]]]]:
    """Every rank's file written into a fresh staging prefix, as the ranks would."""
    staging = staging_prefix(tier, RUN, STEP, clear_the_way(tier, RUN, STEP))
    written = [
        write_rank_file(
            tier, staging, rank=r, flat=flatten_state({"w": torch.full((4,), r)}), metadata={}
        )
        for r in range(ranks)
    ]
    return staging, written


def _manifest(written: list[tuple[FileRecord, list[TensorRecord]]]) -> Manifest:
    return Manifest(
        run=RUN,
        step=STEP,
        importance=Importance.MILESTONE,
        created=utc_now(),
        world_size=len(written),
        files=tuple(f for f, _ in written),
        tensors=tuple(t for _, ts in written for t in ts),
        states=tuple({} for _ in written),
        framework=framework_versions(),
    )


def _committed(tier: Tier) -> bool:
    return tier.exists(catalog.manifest_key(RUN, STEP))


@pytest.fixture
def posix(tmp_path: Path) -> LocalTier:
    return LocalTier(tmp_path / "fast")


def test_a_commit_publishes_and_hands_back_the_exact_bytes(posix: LocalTier) -> None:
    staging, written = _stage(posix, ranks=2)
    manifest, raw = commit_staged(posix, RUN, STEP, staging, 2, lambda: _manifest(written))
    assert _committed(posix) and not posix.exists(staging + "manifest.json")
    assert posix.get(catalog.manifest_key(RUN, STEP)) == raw
    assert manifest == Manifest.from_bytes(raw) and manifest.world_size == 2


@pytest.mark.parametrize("stage", ["build", "validate"])
def test_a_refusal_before_the_commit_removes_the_staging(posix: LocalTier, stage: str) -> None:
    staging, written = _stage(posix)

    def refuse(*_args: object) -> Manifest:
        raise CheckpointError(f"refused in {stage}")

    build = refuse if stage == "build" else (lambda: _manifest(written))
    validate = refuse if stage == "validate" else None
    with pytest.raises(CheckpointError, match=f"refused in {stage}"):
        commit_staged(posix, RUN, STEP, staging, 1, build, validate=validate)
    assert not _committed(posix) and not list(posix.list(f"{RUN}/"))


def test_a_rank_file_the_coordinator_cannot_see_fails_the_commit(posix: LocalTier) -> None:
    staging, written = _stage(posix, ranks=2)
    posix.delete(staging + catalog.rank_file_name(1))
    with pytest.raises(ObjectNotFoundError, match=r"rank-00001.*shared by every rank"):
        commit_staged(posix, RUN, STEP, staging, 2, lambda: _manifest(written))
    assert not _committed(posix) and not list(posix.list(f"{RUN}/"))


def test_a_rank_file_of_another_size_fails_the_commit(posix: LocalTier) -> None:
    staging, written = _stage(posix, ranks=2)
    posix.put(staging + catalog.rank_file_name(1), b"short")
    with pytest.raises(
        TierError, match=r"rank-00001\.safetensors has 5 bytes.*shared by every rank"
    ):
        commit_staged(posix, RUN, STEP, staging, 2, lambda: _manifest(written))
    assert not _committed(posix) and not list(posix.list(f"{RUN}/"))


def test_a_failed_manifest_put_removes_own_rank_files_without_rename() -> None:
    tier = NoRenameTier()
    staging, written = _stage(tier, ranks=2)
    assert staging == catalog.checkpoint_prefix(RUN, STEP)  # no rename: the final prefix
    tier.fail_manifest = True
    with pytest.raises(TierError, match="injected"):
        commit_staged(tier, RUN, STEP, staging, 2, lambda: _manifest(written))
    assert not list(tier.list(f"{RUN}/"))


def test_losing_the_race_leaves_the_winners_objects_alone() -> None:
    tier = NoRenameTier()
    staging, written = _stage(tier)
    commit_staged(tier, RUN, STEP, staging, 1, lambda: _manifest(written))  # the winner
    before = sorted(tier.list(f"{RUN}/"))
    with pytest.raises(CheckpointExistsError, match="committed by another writer"):
        commit_staged(tier, RUN, STEP, staging, 1, lambda: _manifest(written))
    assert sorted(tier.list(f"{RUN}/")) == before


def test_after_a_commit_the_hint_goes_down_and_the_listener_hears(posix: LocalTier) -> None:
    staging, written = _stage(posix)
    manifest, _raw = commit_staged(posix, RUN, STEP, staging, 1, lambda: _manifest(written))
    listener = RecordingListener()
    after_commit(posix, manifest, listener)
    assert listener.events == [("commit", RUN, STEP)]
    final = Path(posix.location(catalog.checkpoint_prefix(RUN, STEP)))
    for name in ("rank-00000.safetensors", "manifest.json"):
        assert get_xattrs(final / name) == {"importance": "milestone"}
    after_commit(posix, manifest, None)  # nobody listening: the hint alone
