"""The default shard directory of an S3 dataset, and the warning when it is RAM."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

from mouthguard.data.scratch import default_shard_dir, filesystem_type


def mounts(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "mounts"
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


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


def test_a_ram_backed_default_directory_is_named_in_a_warning(tmp_path: Path) -> None:
    table = mounts(tmp_path, "none / tmpfs rw 0 0")
    with pytest.warns(UserWarning, match=r"on tmpfs: in memory.*cache_dir="):
        directory = default_shard_dir(table)
    assert Path(directory).is_dir()
    shutil.rmtree(directory)


def test_a_disk_backed_default_directory_says_nothing(tmp_path: Path) -> None:
    table = mounts(tmp_path, "/dev/vda / ext4 rw 0 0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        directory = default_shard_dir(table)
    shutil.rmtree(directory)
