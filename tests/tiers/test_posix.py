"""The local tier's POSIX helpers: the symbolic-link check every key path goes through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mouthguard.tiers.posix import links_below


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A tier root with real directories, a file, and links to a directory and a file."""
    real = Path(os.path.realpath(tmp_path)) / "root"
    (real / "a" / "b").mkdir(parents=True)
    (real / "a" / "file").write_bytes(b"x")
    outside = real.parent / "outside"
    (outside / "deep").mkdir(parents=True)
    (real / "a" / "dirlink").symlink_to(outside, target_is_directory=True)
    (real / "filelink").symlink_to(real / "a" / "file")
    return real


DIR_KEYS = [
    "",
    "a/",
    "a/b/",
    "a/b/missing/",
    "missing/a/",
    "a/file/",  # a file where a directory would be
    "a/file/below/",
    "a/dirlink/",
    "a/dirlink/deep/",
    "a/dirlink/missing/",
    "filelink/",
    "a/b/missing/dirlink/",
]


@pytest.mark.parametrize("dir_key", DIR_KEYS)
def test_the_answer_is_realpaths(root: Path, dir_key: str) -> None:
    lexical = root / dir_key
    assert links_below(root, dir_key) == (os.path.realpath(lexical) != str(lexical))


def test_a_link_is_found_through_a_real_directory_of_the_same_name(root: Path) -> None:
    assert links_below(root, "a/dirlink/deep/")
    assert not links_below(root, "a/b/")


def test_a_root_replaced_by_a_link_is_found(root: Path, tmp_path: Path) -> None:
    moved = root.with_name("moved")
    root.rename(moved)
    root.symlink_to(moved, target_is_directory=True)
    assert links_below(root, "")
    assert links_below(root, "a/b/")


def test_a_missing_root_has_no_links(tmp_path: Path) -> None:
    assert not links_below(Path(os.path.realpath(tmp_path)) / "gone", "a/")
