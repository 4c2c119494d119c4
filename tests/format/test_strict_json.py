"""The one hardened JSON parser: each limit is a parameter, and each refusal says why."""

from __future__ import annotations

import math

import pytest

from mouthguard.format.strict_json import StrictJsonError, json_problem, parse


def test_plain_json_parses_with_types_kept() -> None:
    text = '{"a": [1, -0.0, 1.5, "é", null, true], "b": {}}'
    assert parse(text, max_depth=3) == {"a": [1, -0.0, 1.5, "é", None, True], "b": {}}
    assert parse(text.encode(), max_depth=3) == parse(text, max_depth=3)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"a": 1, "a": 2}', "duplicate object key 'a'"),
        ("[NaN]", "NaN is not allowed"),
        ('{"x": -Infinity}', "-Infinity is not allowed"),
        ("1e400", "number '1e400' is out of range"),
        ('["\\ud800"]', "lone surrogate"),
        ("{} x", "Extra data"),
        ("[" * 10_000 + "]" * 10_000, "nested deeper than 8 levels"),
        ("[" * 200_000 + "]" * 200_000, "nested deeper than 8 levels"),  # past the C recursion
    ],
)
def test_hostile_text_is_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(StrictJsonError, match=why.replace("[", r"\[")):
        parse(text, max_depth=8)


def test_depth_limit_is_inclusive() -> None:
    assert parse("[[[]]]", max_depth=3) == [[[]]]
    with pytest.raises(StrictJsonError, match="nesting limit"):
        parse("[[[[]]]]", max_depth=3)


def test_size_limit() -> None:
    assert parse(b"[1, 2]", max_depth=1, max_bytes=6) == [1, 2]
    with pytest.raises(StrictJsonError, match="7 bytes, more than the 6 accepted"):
        parse(b"[1,  2]", max_depth=1, max_bytes=6)


def test_integers_beyond_a_double_only_when_asked() -> None:
    huge = "9" * 400
    assert parse(huge, max_depth=1) == int(huge)
    with pytest.raises(StrictJsonError, match="out of range"):
        parse(huge, max_depth=1, ints_within_double=True)
    assert parse("123", max_depth=1, ints_within_double=True) == 123


def test_bad_utf8_names_its_position_in_the_source() -> None:
    with pytest.raises(StrictJsonError) as exc:
        parse(b'{"a\xa0": 1}', max_depth=1)
    assert str(exc.value) == "not UTF-8 (byte 3 of the text)"
    with pytest.raises(StrictJsonError) as exc:
        parse(b'{"a\xa0": 1}', max_depth=1, first_byte=8, source="the file")
    assert str(exc.value) == "not UTF-8 (byte 11 of the file)"
    assert "codec" not in str(exc.value)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({"a": (1,)}, "tuple is not a JSON type"),
        ({1: "x"}, "object key is not a string"),
        ([math.nan], "non-finite number nan"),
        (["\udc00"], "lone surrogate"),
        ([[[]]], "nested deeper than 2 levels"),
    ],
)
def test_json_problem_of_python_values(value: object, why: str) -> None:
    assert why in (json_problem(value, 2) or "")


def test_json_problem_accepts_strict_json() -> None:
    assert json_problem({"a": [1, 2.5, "s", None, True, {"b": []}]}, 4) is None


@pytest.mark.parametrize(
    "text",
    ['{"\\udfff": 1}', '[[{"a": ["\\ud800"]}]]', '["\ud800"]', '{"k\udc00": 0}'],
    ids=["escaped key", "escaped deep", "raw string", "raw key"],
)
def test_a_lone_surrogate_is_found_wherever_it_is_and_however_it_came(text: str) -> None:
    """Strings are checked when the text holds a \\u escape or a surrogate (skipped otherwise)."""
    with pytest.raises(StrictJsonError, match="lone surrogate"):
        parse(text, max_depth=8)


def test_escaped_pairs_and_plain_text_parse() -> None:
    assert parse('["\\ud83d\\ude00", {"\\u00e9": [1.5, null]}]', max_depth=3) == [
        "\U0001f600",
        {"é": [1.5, None]},
    ]
    assert json_problem(["\udc00"], 2, strings=False) is None  # the caller vouched for strings
    assert json_problem([math.inf], 2, strings=False) == "non-finite number inf"


def test_shape_checked_leaves_only_the_depth_to_the_caller() -> None:
    """The walk is skipped: depth is the caller's; every other refusal still holds."""
    deep = "[" * 20 + "]" * 20
    assert parse(deep, max_depth=3, shape_checked=True) is not None
    with pytest.raises(StrictJsonError, match="nesting limit"):
        parse(deep, max_depth=3)
    for text, why in [
        ('{"a": 1, "a": 2}', "duplicate object key"),
        ("[NaN]", "NaN is not allowed"),
        ("[1e400]", "out of range"),
        ("[" * 200_000 + "]" * 200_000, "nesting limit"),
    ]:
        with pytest.raises(StrictJsonError, match=why):
            parse(text, max_depth=3, shape_checked=True)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('[["\\ud800"]]', "lone surrogate"),
        ('[{"k\udc00": 0}]', "lone surrogate"),
        ('[["\\u00e9"], [[[[]]]]]', "nesting limit"),
    ],
)
def test_shape_checked_text_that_may_hold_a_surrogate_is_walked_in_full(
    text: str, why: str
) -> None:
    """A \\u escape or a raw surrogate: strings and depth are checked as without the flag."""
    with pytest.raises(StrictJsonError, match=why):
        parse(text, max_depth=3, shape_checked=True)
