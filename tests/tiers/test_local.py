"""LocalTier: the conformance suite plus POSIX-specific crash-safety behaviour."""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mouthguard.errors import (
    DurabilityError,
    InvalidKeyError,
    ObjectExistsError,
    ObjectNotFoundError,
    TierError,
)
from mouthguard.testing.conformance import INVALID_KEYS, TierConformance
from mouthguard.tiers.base import PutMode, Tier
from mouthguard.tiers.local import TMP_PREFIX, LocalTier


class TestLocalTier(TierConformance):
    @pytest.fixture
    def make_tier(self, tmp_path: Path) -> Callable[[], Tier]:
        return lambda: LocalTier(tmp_path / "root")


class TestLocalTierNotDurable(TierConformance):
    @pytest.fixture
    def make_tier(self, tmp_path: Path) -> Callable[[], Tier]:
        return lambda: LocalTier(tmp_path / "root", durable=False)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def tier(root: Path) -> LocalTier:
    return LocalTier(root)


def all_names(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(TMP_PREFIX)]


def broken(after: bytes) -> Iterator[bytes]:
    yield after
    raise RuntimeError("source died")


# --- layout ---------------------------------------------------------------------


def test_objects_are_plain_files_at_root_slash_key(tier: LocalTier, root: Path) -> None:
    tier.put("runs/r1/step_1/rank0", b"bytes")
    assert (root / "runs/r1/step_1/rank0").read_bytes() == b"bytes"
    assert tier.path_of("runs/r1/step_1/rank0") == root.resolve() / "runs/r1/step_1/rank0"
    assert tier.location("runs/r1/") == str(root.resolve() / "runs/r1")
    assert tier.location() == str(root.resolve())
    assert stat.S_IMODE((root / "runs/r1/step_1/rank0").stat().st_mode) & 0o600 == 0o600


def test_root_is_created_and_stored_as_realpath(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    tier = LocalTier(str(tmp_path / "alias" / "deep" / "er"))
    assert tier.root == (tmp_path / "real/deep/er").resolve()
    assert tier.root.is_dir()
    assert tier.capabilities.durable
    assert tier.capabilities.persistent


def test_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(TierError, match="not a directory"):
        LocalTier(tmp_path / "f")


def test_objects_persist_across_instances(root: Path) -> None:
    LocalTier(root).put("a/b", b"kept")
    assert LocalTier(str(root), durable=False).get("a/b") == b"kept"


def test_key_cannot_be_both_object_and_directory(tier: LocalTier) -> None:
    tier.put("a", b"file")
    with pytest.raises(TierError, match="not a directory"):
        tier.put("a/b", b"x")
    tier.put("d/x", b"x")
    with pytest.raises(TierError):
        tier.put("d", b"x")
    with pytest.raises(TierError) as excinfo:
        tier.put("d", b"x", mode=PutMode.CREATE)
    assert not isinstance(excinfo.value, ObjectExistsError)
    assert tier.get("a") == b"file"
    assert list(tier.list()) == ["a", "d/x"]


# --- temporary files and failures -------------------------------------------------


def test_no_temp_files_after_success_or_failure(tier: LocalTier, root: Path) -> None:
    tier.put("k/obj", b"v1")
    tier.put("k/obj", [b"v", b"2"])
    assert temp_files(root) == []
    with pytest.raises(RuntimeError):
        tier.put("k/obj", broken(b"x" * 10_000))
    with pytest.raises(ObjectExistsError):
        tier.put("k/obj", b"v3", mode=PutMode.CREATE)
    assert temp_files(root) == []
    assert all_names(root) == ["k", "k/obj"]
    assert tier.get("k/obj") == b"v2"


def test_temp_files_are_never_listed(tier: LocalTier, root: Path) -> None:
    # A crashed writer can leave a temporary file; it must stay invisible.
    (root / "s").mkdir()
    (root / "s" / f"{TMP_PREFIX}0123").write_bytes(b"partial")
    (root / ".hidden-dir").mkdir()
    (root / ".hidden-dir" / "x").write_bytes(b"")
    (root / "empty").mkdir()
    (root / "bad name").write_bytes(b"")
    assert list(tier.list()) == []
    assert tier.list_dirs() == []


def test_enospc_is_a_clear_tier_error(
    tier: LocalTier, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier.put("full/old", b"previous")

    def no_space(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(TierError, match="no space left on device") as excinfo:
        tier.put("full/old", b"new bytes")
    assert "full/old" in str(excinfo.value)
    with pytest.raises(TierError, match="no space left on device"):
        tier.put("full/new", b"new bytes")
    monkeypatch.undo()
    assert tier.get("full/old") == b"previous"
    assert not tier.exists("full/new")
    assert temp_files(root) == []


def test_short_writes_are_completed(tier: LocalTier, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:3]))
    tier.put("short", [b"0123456789", bytearray(b"abcdefg")])
    monkeypatch.undo()
    assert tier.get("short") == b"0123456789abcdefg"


def test_short_reads_are_completed_or_reported(
    tier: LocalTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = bytes(range(256)) * 4
    tier.put("sr", data)
    real_preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: real_preadv(fd, [bufs[0][:5]], off))
    assert tier.get("sr", 3, 1000) == data[3:1000]
    out = bytearray(100)
    tier.read_into("sr", 50, memoryview(out))
    assert bytes(out) == data[50:150]
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: 0)  # the file "shrank"
    with pytest.raises(TierError, match="short read"):
        tier.read_into("sr", 0, memoryview(out))
    with pytest.raises(TierError, match="short read"):
        tier.get("sr")


# --- durability -------------------------------------------------------------------


def record_fsyncs(monkeypatch: pytest.MonkeyPatch, fail_on_dirs: bool = False) -> list[str]:
    calls: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        calls.append(kind)
        if kind == "dir" and fail_on_dirs:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_durable_put_fsyncs_file_then_new_dirs_and_entry(
    tier: LocalTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = record_fsyncs(monkeypatch)
    tier.put("x/y/obj", b"data")
    # mkdir x, mkdir x/y (each fsyncs its parent), then the data, then x/y itself.
    assert calls == ["dir", "dir", "file", "dir"]
    calls.clear()
    tier.put("x/y/obj2", b"data")
    assert calls == ["file", "dir"]
    calls.clear()
    tier.delete("x/y/obj2")
    assert calls == ["dir"]


def test_not_durable_never_fsyncs(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tier = LocalTier(root, durable=False)
    assert not tier.capabilities.durable
    calls = record_fsyncs(monkeypatch)
    tier.put("a/b/c", b"v")
    tier.rename_prefix("a", "z")
    tier.delete("z/b/c")
    assert calls == []


def test_fsync_failure_is_durability_error_and_leaves_nothing(
    tier: LocalTier, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier.put("dir/other", b"o")
    calls: list[int] = []

    def failing_fsync(fd: int) -> None:
        calls.append(fd)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(DurabilityError, match="input/output error"):
        tier.put("dir/obj", b"data")
    assert len(calls) == 1  # never retried
    monkeypatch.undo()
    assert not tier.exists("dir/obj")
    assert temp_files(root) == []
    assert all_names(root) == ["dir", "dir/other"]


def test_directory_fsync_failure_unpublishes_the_object(
    tier: LocalTier, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier.put("d/keep", b"k")
    record_fsyncs(monkeypatch, fail_on_dirs=True)
    with pytest.raises(DurabilityError):
        tier.put("d/new", b"n", mode=PutMode.CREATE)
    with pytest.raises(DurabilityError):
        tier.delete("d/keep")
    monkeypatch.undo()
    assert list(tier.list()) == []
    assert temp_files(root) == []


# --- symbolic links and special files ---------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret").write_bytes(b"secret")
    return out


def test_symlinked_directory_is_not_followed(tier: LocalTier, root: Path, outside: Path) -> None:
    (root / "evil").symlink_to(outside, target_is_directory=True)
    for op in (
        lambda: tier.get("evil/secret"),
        lambda: tier.head("evil/secret"),
        lambda: tier.read_into("evil/secret", 0, memoryview(bytearray(1))),
        lambda: tier.put("evil/new", b"x"),
        lambda: tier.put("evil/sub/new", b"x"),
        lambda: tier.delete("evil/secret"),
        lambda: tier.path_of("evil/secret"),
    ):
        with pytest.raises(InvalidKeyError, match="evil"):
            op()
    tier.put("real/a", b"a")
    with pytest.raises(InvalidKeyError):
        tier.rename_prefix("real", "evil/moved")
    with pytest.raises(ObjectNotFoundError):
        tier.rename_prefix("evil", "moved")
    assert list(tier.list()) == ["real/a"]
    assert list(tier.list("evil/")) == []
    assert tier.list_dirs() == ["real"]
    assert tier.list_dirs("evil/") == []
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_bytes() == b"secret"


def test_symlinked_file_is_not_an_object(tier: LocalTier, root: Path, outside: Path) -> None:
    (root / "link").symlink_to(outside / "secret")
    with pytest.raises(ObjectNotFoundError):
        tier.get("link")
    with pytest.raises(ObjectNotFoundError):
        tier.head("link")
    with pytest.raises(ObjectNotFoundError):
        tier.open_object("link")  # what a caller that maps files opens: the same rules
    assert not tier.exists("link")
    assert list(tier.list()) == []
    assert tier.delete("link") is False
    with pytest.raises(TierError) as excinfo:
        tier.put("link", b"x", mode=PutMode.CREATE)
    assert not isinstance(excinfo.value, ObjectExistsError)
    tier.put("link", b"replaced")  # replaces the link itself, never writes through it
    assert (outside / "secret").read_bytes() == b"secret"
    assert not (root / "link").is_symlink()
    assert tier.get("link") == b"replaced"


def test_fifo_is_not_an_object_and_does_not_block(tier: LocalTier, root: Path) -> None:
    os.mkfifo(root / "pipe")
    with pytest.raises(ObjectNotFoundError):
        tier.get("pipe")
    with pytest.raises(ObjectNotFoundError):
        tier.head("pipe")
    assert list(tier.list()) == []


@pytest.mark.parametrize("key", INVALID_KEYS)
def test_invalid_keys_touch_nothing_on_disk(tier: LocalTier, tmp_path: Path, key: str) -> None:
    before = all_names(tmp_path)
    with pytest.raises(InvalidKeyError):
        tier.put(key, b"data")
    with pytest.raises(InvalidKeyError):
        tier.path_of(key)
    assert all_names(tmp_path) == before


# --- delete and rename -------------------------------------------------------------


def test_delete_prunes_empty_directories_only(tier: LocalTier, root: Path) -> None:
    tier.put("p/q/r/obj", b"x")
    tier.put("p/keep", b"y")
    assert tier.delete("p/q/r/obj")
    assert all_names(root) == ["p", "p/keep"]
    assert tier.delete("p/keep")
    assert all_names(root) == []
    assert root.is_dir()


def test_put_recreates_a_directory_pruned_concurrently(
    tier: LocalTier, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open
    pruned: list[str] = []

    def open_after_prune(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        target = Path(path)
        if target.name.startswith(TMP_PREFIX) and not pruned:
            target.parent.rmdir()  # what a concurrent delete() of the last object does
            pruned.append(target.parent.name)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", open_after_prune)
    tier.put("gc/step/obj", b"x")
    monkeypatch.undo()
    assert pruned == ["step"]
    assert tier.get("gc/step/obj") == b"x"


def test_rename_prefix_onto_empty_directory_and_prunes_source(tier: LocalTier, root: Path) -> None:
    tier.put("staging/run/step/a", b"a")
    (root / "final").mkdir()
    tier.rename_prefix("staging/run/step", "final")
    assert list(tier.list()) == ["final/a"]
    assert all_names(root) == ["final", "final/a"]
    (root / "busy").mkdir()
    (root / "busy" / f"{TMP_PREFIX}x").write_bytes(b"")  # a put in progress
    with pytest.raises(ObjectExistsError):
        tier.rename_prefix("final", "busy")
    assert list(tier.list()) == ["final/a"]


def test_collect_incomplete_removes_only_old_temp_files(
    tier: LocalTier, root: Path, outside: Path
) -> None:
    tier.put("a/obj", b"x")
    old, fresh = root / "a" / f"{TMP_PREFIX}old", root / "a" / f"{TMP_PREFIX}fresh"
    crashed = root / "b" / "c" / f"{TMP_PREFIX}crashed"
    crashed.parent.mkdir(parents=True)
    for path in (old, fresh, crashed, outside / f"{TMP_PREFIX}foreign"):
        path.write_bytes(b"partial")
    (root / "evil").symlink_to(outside, target_is_directory=True)
    hour_ago = time.time() - 3600
    for path in (old, crashed, outside / f"{TMP_PREFIX}foreign"):
        os.utime(path, (hour_ago, hour_ago))
    assert tier.collect_incomplete("a/o", 60) == 0  # a/.tmp-old may not belong to a/o...
    assert tier.collect_incomplete("b/", 60) == 1
    assert not (root / "b").exists()  # emptied directories are pruned
    assert tier.collect_incomplete("", 60) == 1
    assert sorted(p.name for p in (root / "a").iterdir()) == [f"{TMP_PREFIX}fresh", "obj"]
    assert (outside / f"{TMP_PREFIX}foreign").exists()
    assert tier.get("a/obj") == b"x"
    with pytest.raises(InvalidKeyError):
        tier.collect_incomplete("../", 0)


def test_open_object_gives_a_descriptor_of_the_object(tier: LocalTier) -> None:
    tier.put("a/b", b"mapped bytes")
    fd, size = tier.open_object("a/b")
    try:
        assert size == 12
        assert os.pread(fd, size, 0) == b"mapped bytes"
    finally:
        os.close(fd)
