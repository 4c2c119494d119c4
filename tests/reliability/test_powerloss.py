"""The power-loss harness: its persistence model, its recorder, and that it finds a lost fsync."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from reliability.crashstates import Log, candidates, replay
from reliability.fsrecord import Op, Recorder, read_log

from mouthguard.tiers.local import LocalTier
from reliability import powerloss


def _ops() -> list[Op]:
    """create a/f, write 2 pages, fsync f, fsync root, then an unsynced rename f -> g."""
    return [
        {"op": "create", "kind": "file", "dir": 1, "name": "f", "ino": 2},
        {"op": "write", "ino": 2, "off": 0, "data": b"x" * 8192},
        {"op": "fsync", "ino": 2},
        {"op": "fsync", "ino": 1},
        {"op": "mark", "ev": "acked", "step": 1},
        {"op": "rename", "ino": 2, "sdir": 1, "sname": "f", "dir": 1, "name": "g"},
        {"op": "write", "ino": 2, "off": 0, "data": b"y" * 8192},
    ]


def _images(log: Log, k: int) -> set[tuple[tuple[str, bytes], ...]]:
    return {tuple(replay(log, s).files()) for s in candidates(log, k)}


def test_unsynced_data_may_be_lost_or_torn_by_page() -> None:
    log = Log.resolve(_ops()[:2], root_ino=1)
    images = _images(log, 2)
    # the create is not covered by a directory fsync: the file may be gone entirely
    assert () in images
    assert (("f", b"x" * 8192),) in images
    assert (("f", b""),) in images  # the name persisted, the data did not
    assert (("f", b"x" * 4096),) in images  # torn: only the first page


def test_fsynced_file_and_directory_persist_and_the_rest_is_free() -> None:
    log = Log.resolve(_ops(), root_ino=1)
    # after both fsyncs nothing before them can be lost
    assert _images(log, 4) == {(("f", b"x" * 8192),)}
    images = _images(log, 7)
    # the rename and the second write are unsynced: each may persist or not ...
    assert (("f", b"x" * 8192),) in images
    assert (("g", b"x" * 8192),) in images
    assert (("g", b"y" * 8192),) in images
    # ... but never the old name with the file's page torn into bytes nobody wrote
    assert all(set(data) <= {ord("x"), ord("y")} for image in images for _, data in image)
    assert log.marks_before(5) == [{"op": "mark", "ev": "acked", "step": 1}]


def test_recorder_logs_the_local_tier_put_in_order(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with Recorder(root, tmp_path / "log"):
        LocalTier(root / "t").put("a/b", b"hello")
        (tmp_path / "outside").write_bytes(b"not recorded")
    kinds = [op["op"] for op in read_log(tmp_path / "log")]
    assert kinds[:2] == ["create", "fsync"]  # the tier root and its directory entry
    # temp file, its bytes, its fsync, published by rename, directory synced
    assert kinds[-5:] == ["create", "write", "fsync", "rename", "fsync"]
    assert type(os.open).__name__ == "builtin_function_or_method"  # the real one is back


@pytest.mark.parametrize("variant", ["sync", "retention", "dcp", "pack"])
def test_every_crash_state_of_a_variant_survives(tmp_path: Path, variant: str) -> None:
    tally = powerloss.Tally()
    powerloss.explore(variant, tmp_path, 60, random.Random(1), tally)
    # A budget below the crash points is raised to them: each point gets a state.
    points = tally.crash_points[variant]
    assert tally.points_covered[variant] == points
    assert tally.states[variant] == max(60, points)
    assert tally.survived == tally.states[variant], tally.messages


@pytest.mark.parametrize("variant", ["sync", "dcp", "pack"])
def test_a_put_without_data_fsync_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    real = LocalTier._sync_fd

    def skip_data(self: LocalTier, fd: int, key: str, what: str) -> None:
        if what != "the data":
            real(self, fd, key, what)

    monkeypatch.setattr(LocalTier, "_sync_fd", skip_data)
    tally = powerloss.Tally()
    powerloss.explore(variant, tmp_path, 150, random.Random(1), tally)
    assert tally.survived < tally.states[variant]
    assert tally.lost or tally.corrupt or any("rejected" in m for m in tally.messages)
