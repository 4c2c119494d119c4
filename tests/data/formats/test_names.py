"""Sample keys and extensions: accepted only when WebDataset splits them back identically.

Adopted tars: member names split as WebDataset splits them, hostile names refused.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from webdataset.tariterators import base_plus_ext

from mouthguard.data.formats import names
from mouthguard.errors import InvalidKeyError, SampleError
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
        ("/abs", "absolute path"),
        ("a//b", "empty"),
        ("a/", "empty"),
        ("a/../b", "'..'"),
        ("a\\b", "backslash"),
        ("a\nb", "control character"),
        ("x" * 201, "longer than"),
        ("\ud800", "not valid UTF-8"),
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


# --- adopted datasets: the user's names, as WebDataset reads them -------------------

_NAME_CHARS = st.sampled_from(list("abX09_-. /_é"))


@given(name=st.text(_NAME_CHARS, min_size=1, max_size=30))
def test_members_split_exactly_as_webdataset_groups_them(name: str) -> None:
    key, ext = base_plus_ext(name)
    skipped = key is None or re.match(r"__[^/]*__($|/)", name) is not None
    skipped = skipped or ("/" not in name and name.startswith("__") and name.endswith("__"))
    split = names.webdataset_split(name)
    if skipped:
        assert split is None
    else:
        assert split == (key, ext.lower())


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("x.jpg", ("x", "jpg")),
        ("a.b/c.SEG.PNG", ("a.b/c", "seg.png")),
        ("./000.json", ("./000", "json")),
        ("README", None),
        ("__meta__", None),
        ("__meta__/x.json", None),
        (".hidden", None),
    ],
)
def test_webdataset_split_examples(name: str, split: tuple[str, str] | None) -> None:
    assert names.webdataset_split(name) == split


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../x.jpg", "traversal"),
        ("a/../../x.jpg", "traversal"),
        ("/etc/passwd", "absolute"),
        ("a//b.jpg", "empty"),
        ("a\\b.jpg", "backslash"),
        ("a\x00b.jpg", "control"),
        ("a\nb.jpg", "control"),
        ("\udcff.jpg", "UTF-8"),
        ("x" * 5000 + ".jpg", "longer"),
    ],
)
def test_hostile_member_names(name: str, why: str) -> None:
    problem = names.member_path_problem(name)
    assert problem is not None and why in problem


@pytest.mark.parametrize("name", ["x.jpg", "./x.jpg", "a/b.c/d.e", "é/ü.txt", "_x.jpg", "x" * 300])
def test_harmless_member_names(name: str) -> None:
    assert names.member_path_problem(name) is None


@pytest.mark.parametrize(
    ("ext", "why"),
    [("", "empty"), ("JPG", "lowercase"), ("__key__", "metadata"), ("a\tb", "control")],
)
def test_adopted_extensions_refused(ext: str, why: str) -> None:
    problem = names.adopted_ext_problem(ext)
    assert problem is not None and why in problem


@pytest.mark.parametrize("path", ["x.tar", "a/b/part-0001.tar", "a=1/x+y.tar"])
def test_data_paths(path: str) -> None:
    assert names.check_data_path(path, ".tar") == path
    assert names.adopted_index_name(path).endswith(".index.json")
    validate_key(f"{names.INDEX_DIR}/{names.SHARDS_DIR}/{names.adopted_index_name(path)}")


@pytest.mark.parametrize(
    "path", ["../x.tar", "/x.tar", "a/.b/x.tar", "x.parquet", ".tar", "mouthguard-index/x.tar", 5]
)
def test_bad_data_paths(path: object) -> None:
    with pytest.raises(InvalidKeyError):
        names.check_data_path(path, ".tar")


@given(
    st.text(alphabet="ab_+-./\\0Zé\x01", max_size=12)
    | st.from_regex(r"[A-Za-z0-9_+-]{1,8}(/[A-Za-z0-9_+.-]{0,8}){0,3}", fullmatch=True)
)
def test_the_fast_path_for_plain_keys_judges_as_the_full_rules(key: str) -> None:
    assert names._key_problem(key) == names._any_key_problem(key)
