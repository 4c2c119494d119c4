"""One table of hostile names (``mouthguard.testing.hostile_names``), every validator against it.

Each validator of a name that becomes a path or a key must refuse every name of
the table with its own clear error. A validator added to mouthguard belongs in
``REFUSERS`` below; the tier operations are held to the same table by the
conformance suite (``INVALID_KEYS`` starts with it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mouthguard.checkpoint.catalog import validate_run
from mouthguard.data.formats import names
from mouthguard.errors import FormatError, MouthguardError
from mouthguard.integrations.dir_files import check_relative
from mouthguard.pathsafety import (
    PATH_MAX,
    check_relative_path,
    is_safe_relative_path,
    relative_path_problem,
)
from mouthguard.testing.conformance import INVALID_KEYS
from mouthguard.testing.hostile_names import HOSTILE_NAMES
from mouthguard.tiers import object_keys
from mouthguard.tiers.local import LocalTier
from mouthguard.weights import source
from mouthguard.weights.hub import HubSnapshot


def _refused_by_problem(problem: Callable[[str], str | None]) -> Callable[[str], None]:
    def check(name: str) -> None:
        why = problem(name)
        if why is None:
            raise AssertionError(f"{name!r:.80} passed")
        raise ValueError(why)

    return check


def _refused_by_predicate(ok: Callable[[str], bool]) -> Callable[[str], None]:
    def check(name: str) -> None:
        if ok(name):
            raise AssertionError(f"{name!r:.80} passed")
        raise ValueError("refused")

    return check


def _hub_key(tmp: Path) -> Callable[[str], object]:
    snapshot = HubSnapshot(tmp, tmp / "snapshots" / "rev", LocalTier(tmp))
    return snapshot.key


#: validator -> (a call that raises on a refused name, the error it raises).
REFUSERS: dict[str, tuple[Callable[[Path], Callable[[str], object]], type[Exception]]] = {
    "pathsafety.relative_path_problem": (
        lambda _: _refused_by_problem(relative_path_problem),
        ValueError,
    ),
    "pathsafety.relative_path_problem, ./ allowed": (
        lambda _: _refused_by_problem(lambda n: relative_path_problem(n, dot_segments=True)),
        ValueError,
    ),
    "pathsafety.check_relative_path": (
        lambda _: lambda n: check_relative_path(n, "name", ValueError),
        ValueError,
    ),
    "pathsafety.is_safe_relative_path": (
        lambda _: _refused_by_predicate(is_safe_relative_path),
        ValueError,
    ),
    "object keys: validate_key": (lambda _: object_keys.validate_key, MouthguardError),
    "object keys: validate_segment": (lambda _: object_keys.validate_segment, MouthguardError),
    "object keys: is_valid_segment": (
        lambda _: _refused_by_predicate(object_keys.is_valid_segment),
        ValueError,
    ),
    "object keys: is_valid_key": (
        lambda _: _refused_by_predicate(object_keys.is_valid_key),
        ValueError,
    ),
    "run names: validate_run": (lambda _: validate_run, ValueError),
    "stored file names (HF, Lightning dirs): check_relative": (
        lambda _: check_relative,
        FormatError,
    ),
    "dataset sample keys: names.check_key": (lambda _: names.check_key, MouthguardError),
    "adopted data file paths: names.check_data_path": (
        lambda _: lambda n: names.check_data_path(n, ".tar"),
        MouthguardError,
    ),
    "tar member names: names.member_path_problem": (
        lambda _: _refused_by_problem(names.member_path_problem),
        ValueError,
    ),
    "weights index file names: source._plain_name": (
        lambda _: source._plain_name,  # the validator itself, without a directory
        MouthguardError,
    ),
    "hub snapshot entries: HubSnapshot.key": (_hub_key, MouthguardError),
}


@pytest.mark.parametrize("what", list(HOSTILE_NAMES))
@pytest.mark.parametrize("refuser", list(REFUSERS))
def test_every_validator_refuses_every_hostile_name(
    refuser: str, what: str, tmp_path: Path
) -> None:
    make, error = REFUSERS[refuser]
    with pytest.raises(error):
        make(tmp_path)(HOSTILE_NAMES[what])


@pytest.mark.parametrize("name", list(HOSTILE_NAMES.values()))
def test_every_tier_key_check_starts_from_the_table(name: str) -> None:
    assert name in INVALID_KEYS


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (1, "is not a non-empty string"),
        ("", "is not a non-empty string"),
        ("a\udcffb", "is not valid UTF-8"),
        ("a" * (PATH_MAX + 1), f"is longer than {PATH_MAX} bytes"),
        ("é" * (PATH_MAX // 2 + 1), f"is longer than {PATH_MAX} bytes"),  # bytes, not characters
        ("a\x00b", "control character"),
        ("a\\b", "backslash"),
        ("/a", "absolute path"),
        ("a/../b", "path traversal"),
        ("a//b", "empty path segment"),
        ("a/./b", "'.' path segment"),
    ],
)
def test_the_reason_is_named(name: object, why: str) -> None:
    problem = relative_path_problem(name)
    assert problem is not None and why in problem


@pytest.mark.parametrize(
    "name",
    ["a", "a/b/c.safetensors", "train/x.seg.png", ".hidden/x", "a b/ü.txt", "x" * PATH_MAX],
)
def test_plain_relative_names_pass(name: str) -> None:
    assert relative_path_problem(name) is None
    assert check_relative_path(name, "name", ValueError) == name


def test_dot_segments_only_where_allowed() -> None:
    assert relative_path_problem("./a/./b", dot_segments=True) is None
    assert relative_path_problem("./a") is not None
    assert relative_path_problem("../a", dot_segments=True) is not None


def test_the_caller_s_error_carries_a_bounded_name() -> None:
    with pytest.raises(FormatError, match=r"stored file name '\.\./x' has a '\.\.' path") as info:
        check_relative_path("../x", "stored file name", FormatError)
    assert isinstance(info.value, FormatError)
    with pytest.raises(ValueError, match="is longer than") as long:
        check_relative_path("a" * 10_000, "name", ValueError)
    assert len(str(long.value)) < 300
