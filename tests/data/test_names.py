"""Sample keys and extensions: accepted only when WebDataset splits them back identically."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from webdataset.tariterators import base_plus_ext

from mouthguard.data import names
from mouthguard.errors import SampleError
from mouthguard.tiers import validate_key


@pytest.mark.parametrize(
    "key", ["x", "000123", "train/n01440764_10026", "a.b/c", "dir/sub-dir/x-1", "é/ü"]
)
def test_valid_keys(key: str) -> None:
    assert names.check_key(key) == key


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("", "non-empty"),
        ("x.y", "dot in its last path segment"),
        ("a/b.c", "dot in its last path segment"),
        ("_meta", "starts with '_'"),
        ("__key__", "starts with '_'"),
        ("/abs", "empty"),
        ("a//b", "empty"),
        ("a/", "empty"),
        ("a/../b", "'..'"),
        ("a\\b", "backslash"),
        ("a\nb", "control character"),
        ("x" * 201, "longer than"),
        ("\ud800", "not valid Unicode"),
    ],
)
def test_invalid_keys(key: str, why: str) -> None:
    with pytest.raises(SampleError, match=why.replace("(", r"\(")):
        names.check_key(key)


def test_non_string_key() -> None:
    with pytest.raises(SampleError, match="non-empty string"):
        names.check_key(7)


@pytest.mark.parametrize("ext", ["jpg", "json", "seg.png", "cls", "x_y", "a+b", "mp4-720"])
def test_valid_extensions(ext: str) -> None:
    assert names.check_ext(ext, "k") == ext


@pytest.mark.parametrize("ext", ["", "JPG", "Jpg", ".jpg", "jpg.", "a..b", "a/b", "_x", "é"])
def test_invalid_extensions(ext: str) -> None:
    with pytest.raises(SampleError, match="not a valid extension"):
        names.check_ext(ext, "k")


_KEY_CHARS = st.sampled_from(list("abcXYZ019_-.+ é/\\\n"))


@given(
    key=st.text(_KEY_CHARS, min_size=1, max_size=30),
    ext=st.text(st.sampled_from(list("abz09_.+-X")), min_size=1, max_size=10),
)
def test_whatever_is_accepted_webdataset_splits_back_identically(key: str, ext: str) -> None:
    try:
        names.check_key(key)
        names.check_ext(ext, key)
    except SampleError:
        return
    assert base_plus_ext(names.member_name(key, ext)) == (key, ext.lower())
    assert ext == ext.lower()  # so the reader's lowercasing changes nothing


def test_layout_names_are_valid_tier_keys() -> None:
    shard = names.shard_name(7)
    assert shard == "shard-000007.tar"
    assert names.index_name(shard) == "shard-000007.index.json"
    assert names.is_shard_name(shard) and not names.is_shard_name("shard-7.tar")
    for name in (shard, names.index_name(shard), names.MANIFEST_NAME):
        validate_key(f"ds/{names.SHARDS_DIR}/{name}")
