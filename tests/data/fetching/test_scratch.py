"""Where an S3 dataset without cache_dir caches shards: a per-user cache, named once."""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path

import pytest

from mouthguard.data.fetching import scratch
from mouthguard.data.fetching.scratch import default_shard_dir, filesystem_type


def mounts(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "mounts"
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


@pytest.fixture(autouse=True)
def _fresh_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees a process that has named no directory yet."""
    monkeypatch.setattr(scratch, "_SAID", set())


def test_the_longest_mount_point_above_a_path_names_its_filesystem(tmp_path: Path) -> None:
    table = mounts(
        tmp_path,
        "/dev/vda / ext4 rw 0 0",
        "tmpfs /tmp tmpfs rw 0 0",
        "/dev/vdb /tmpdata xfs rw 0 0",
        "garbage",
    )
    assert filesystem_type("/tmp/x/y", table) == "tmpfs"
    assert filesystem_type("/tmp", table) == "tmpfs"
    assert filesystem_type("/tmpdata/z", table) == "xfs"  # not /tmp's: a prefix is not a parent
    assert filesystem_type("/home", table) == "ext4"
    assert filesystem_type("/home", str(tmp_path / "missing")) is None


def test_the_default_is_a_per_user_cache_named_once_with_its_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = mounts(tmp_path, "/dev/vda / ext4 rw 0 0")
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    with caplog.at_level(logging.WARNING, logger="mouthguard.data.fetching.scratch"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # disk, not RAM: a log line, no warning
            directory, temporary = default_shard_dir(environ=env, mounts=table)
        again = default_shard_dir(3 << 30, environ=env, mounts=table)
    assert directory == str(tmp_path / "xdg" / "mouthguard" / "shards") and not temporary
    assert again == (directory, False)
    assert Path(directory).stat().st_mode & 0o777 == 0o700
    [line] = [r.getMessage() for r in caplog.records]  # once per process and directory
    assert directory in line and "kept across runs" in line and "on ext4" in line
    assert "up to half of the space free there" in line and "GiB now" in line
    assert "cache_dir=" in line and "cache_limit=" in line
    caplog.clear()
    named = {"MOUTHGUARD_CACHE_DIR": str(tmp_path / "mine")}
    with caplog.at_level(logging.WARNING, logger="mouthguard.data.fetching.scratch"):
        assert default_shard_dir(3 << 30, environ=named, mounts=table)[0] == str(tmp_path / "mine")
    assert "up to 3.0 GiB (cache_limit)" in caplog.text


def test_a_cache_others_could_write_is_not_used(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    table = mounts(tmp_path, "/dev/vda / ext4 rw 0 0")
    directory, temporary = default_shard_dir(
        environ={"MOUTHGUARD_CACHE_DIR": str(shared)}, mounts=table
    )
    try:
        assert temporary and Path(directory).is_dir() and directory != str(shared)
    finally:
        shutil.rmtree(directory)


def test_a_ram_backed_directory_is_named_in_a_warning(tmp_path: Path) -> None:
    table = mounts(tmp_path, "none / tmpfs rw 0 0")
    with pytest.warns(UserWarning, match=r"on tmpfs: in memory, up to half.*cache_dir="):
        directory, _ = default_shard_dir(environ={"XDG_CACHE_HOME": str(tmp_path)}, mounts=table)
    assert Path(directory).is_dir()
