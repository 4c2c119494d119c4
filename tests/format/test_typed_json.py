"""Tests of the typed JSON codec: exact round-trips, clear refusals, hostile input."""

from __future__ import annotations

import enum
import json
import math
import random
import sys
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mouthguard.errors import FormatError, UnsupportedStateError
from mouthguard.format.typed_json import (
    MAX_DEPTH,
    RESERVED_TAGS,
    JsonValue,
    decode,
    dumps_strict,
    encode,
    format_key_path,
    loads_strict,
)

NUMPY_NAMES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
]  # fmt: skip


def assert_same(expected: object, actual: object) -> None:
    """Equality that also demands identical types, nan == nan and the sign of zero."""
    assert type(actual) is type(expected), (expected, actual)
    if isinstance(expected, float | np.floating):
        assert isinstance(actual, float | np.floating)
        if math.isnan(expected):
            assert math.isnan(actual)
        else:
            assert actual == expected
            assert math.copysign(1, actual) == math.copysign(1, expected)
    elif isinstance(expected, list | tuple):  # torch.Size included
        assert isinstance(actual, list | tuple)
        assert len(actual) == len(expected)
        for e, a in zip(expected, actual, strict=True):
            assert_same(e, a)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict)
        assert [(type(k), k) for k in actual] == [(type(k), k) for k in expected]
        for key, value in expected.items():
            assert_same(value, actual[key])
    else:
        assert actual == expected


def roundtrip(value: object) -> object:
    return decode(loads_strict(dumps_strict(encode(value))))


# --- round-trips -------------------------------------------------------------

ROUNDTRIP_CASES = [
    None, True, False, 0, -1, 2**1000, -(10**4000), 1.5, -0.0, 0.0, 1e-320, 1.7976931348623157e308,
    math.nan, math.inf, -math.inf, "", "plain", "héllo ✓ 😀 \u2028", "$not a tag", b"",
    b"\x00\xff\x10", bytes(range(256)), [], (), (1,), [(1, (2, 3.5)), [(), [None]]],
    {"a": {"b": [1, (2, 3)]}}, {}, {"$tensor": "x"}, {"$dict": [[1, 2]]}, {1: "a", "b": 2},
    {-3: [1], 0: {2: (3,)}}, {"$": 1, "value": 2}, torch.Size([]), torch.Size([2, 3, 0]),
    [torch.Size([1]), (torch.Size([4]),)], np.float32(np.nan), np.float32(-0.0),
    np.float16(0.1), np.float64(math.inf), np.float64(-math.inf), np.int64(-(2**63)),
    np.uint64(2**64 - 1), np.int8(-128), np.bool_(True), np.bool_(False),
    {"mixed": [np.int32(7), np.float64(0.1), 0.1]},
]  # fmt: skip


@pytest.mark.parametrize("value", ROUNDTRIP_CASES, ids=repr)
def test_roundtrip_exact(value: object) -> None:
    assert_same(value, roundtrip(value))
    assert_same(value, decode(encode(value)))


def test_plain_json_stays_plain() -> None:
    value = {"step": 3, "lr": 0.1, "name": "run", "tags": ["a"], "done": False, "x": None}
    assert encode(value) == value
    assert dumps_strict(encode(-0.0)) == "-0.0"


def test_tagged_shapes() -> None:
    assert encode((1, 2)) == {"$tuple": [1, 2]}
    assert encode(math.nan) == {"$float": "nan"}
    assert encode(-math.inf) == {"$float": "-inf"}
    assert encode(b"hi") == {"$bytes": "aGk="}
    assert encode(torch.Size([2, 3])) == {"$size": [2, 3]}
    assert encode({1: "a"}) == {"$dict": [[1, "a"]]}
    assert encode({"$x": 1, "y": 2}) == {"$dict": [["$x", 1], ["y", 2]]}
    assert encode(np.float32(np.nan)) == {"$numpy": "float32", "value": {"$float": "nan"}}
    assert encode(np.int64(5)) == {"$numpy": "int64", "value": 5}
    assert {"$tuple", "$size", "$dict", "$bytes", "$float", "$numpy"} == RESERVED_TAGS


def test_key_order_preserved() -> None:
    value = {"z": 1, "a": 2, "m": 3}
    assert list(roundtrip(value)) == ["z", "a", "m"]  # type: ignore[call-overload]
    int_keyed = {3: "c", 1: "a", "x": "s", 2: "b"}
    assert list(roundtrip(int_keyed)) == [3, 1, "x", 2]  # type: ignore[call-overload]


def test_ordered_dict_comes_back_as_plain_dict_in_order() -> None:
    value = OrderedDict([("b", 1), ("a", OrderedDict([(2, "x"), (1, "y")]))])
    result = roundtrip(value)
    assert_same({"b": 1, "a": {2: "x", 1: "y"}}, result)


def test_realistic_optimizer_state_dict_with_tensor_hook() -> None:
    model = torch.nn.Linear(3, 2)
    optim = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
    model(torch.ones(4, 3)).sum().backward()
    optim.step()
    state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": 1}

    stored: dict[str, torch.Tensor] = {}

    def enc_hook(obj: object, path: str) -> JsonValue | None:
        if isinstance(obj, torch.Tensor):
            stored[path] = obj
            return {"$tensor": path}
        return None

    def dec_hook(tag: dict[str, JsonValue], path: str) -> object:
        name = tag["$tensor"]
        assert name == path
        return stored[name]

    encoded = encode(state, hook=enc_hook)
    assert "state['optim']['state'][0]['exp_avg']" in stored
    result = decode(loads_strict(dumps_strict(encoded, indent=1)), hook=dec_hook)
    assert isinstance(result, dict)
    assert result["optim"]["param_groups"] == optim.state_dict()["param_groups"]
    assert type(result["optim"]["param_groups"][0]["betas"]) is tuple
    assert list(result["optim"]["state"]) == [0, 1]
    assert result["optim"]["state"][0]["exp_avg"] is stored["state['optim']['state'][0]['exp_avg']"]
    assert list(result["model"]) == ["weight", "bias"]


def test_python_random_state_roundtrip() -> None:
    rng = random.Random(1234)
    rng.random()
    state = rng.getstate()
    restored = roundtrip(state)
    assert_same(state, restored)
    other = random.Random()
    other.setstate(restored)  # type: ignore[arg-type]
    assert [other.random() for _ in range(5)] == [rng.random() for _ in range(5)]


def test_numpy_random_state_roundtrip() -> None:
    rng = np.random.RandomState(99)
    rng.standard_normal()  # leaves a cached gaussian, the float member
    name, keys, pos, has_gauss, cached = rng.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)
    state = {"numpy": (name, keys.tolist(), pos, has_gauss, cached)}
    restored = roundtrip(state)
    assert_same(state, restored)
    assert isinstance(restored, dict)
    r_name, r_keys, r_pos, r_gauss, r_cached = restored["numpy"]
    other = np.random.RandomState()
    other.set_state((r_name, np.array(r_keys, dtype=np.uint32), r_pos, r_gauss, r_cached))
    assert (other.standard_normal(5) == rng.standard_normal(5)).all()


# --- hooks -------------------------------------------------------------------


class Fake:
    pass


def test_hooks_see_key_paths_and_tags_pass_through() -> None:
    seen: list[str] = []

    def enc_hook(obj: object, path: str) -> JsonValue | None:
        seen.append(path)
        return {"$tensor": "t0", "extra": [1]} if isinstance(obj, Fake) else None

    encoded = encode({"layers": [0, Fake()]}, hook=enc_hook, root="ckpt")
    assert seen == ["ckpt['layers'][1]"]
    assert encoded == {"layers": [0, {"$tensor": "t0", "extra": [1]}]}

    calls: list[tuple[dict[str, JsonValue], str]] = []

    def dec_hook(tag: dict[str, JsonValue], path: str) -> object:
        calls.append((tag, path))
        return "TENSOR"

    text = dumps_strict(encoded)
    assert decode(loads_strict(text), hook=dec_hook) == {"layers": [0, "TENSOR"]}
    assert calls == [({"$tensor": "t0", "extra": [1]}, "state['layers'][1]")]
    with pytest.raises(FormatError, match="unknown tag '\\$tensor'"):
        decode(loads_strict(text))


def test_decode_hook_format_error_propagates() -> None:
    def dec_hook(tag: dict[str, JsonValue], path: str) -> object:
        raise FormatError(f"{path}: bad tensor {tag!r}")

    with pytest.raises(FormatError, match=r"state\['a'\]: bad tensor"):
        decode({"a": {"$tensor": 5}}, hook=dec_hook)


@pytest.mark.parametrize(
    "bad",
    [
        {"$tuple": [1]},  # builtin tag: would decode as something else
        {"$tensor": 1, "$other": 2},
        {"tensor": 1},
        "not a dict",
        {"$tensor": math.nan},
        {"$tensor": (1, 2)},
    ],
    ids=repr,
)
def test_encode_hook_result_is_validated(bad: JsonValue) -> None:
    with pytest.raises(TypeError, match=r"state\['x'\]"):
        encode({"x": Fake()}, hook=lambda obj, path: bad)


def test_encode_hook_declining_gives_unsupported() -> None:
    with pytest.raises(UnsupportedStateError, match=r"state\['x'\] \(type "):
        encode({"x": Fake()}, hook=lambda obj, path: None)


# --- refusals on encode ------------------------------------------------------

Point = namedtuple("Point", "x y")


class Color(enum.IntEnum):
    RED = 1


UNSUPPORTED = [
    (object(), "object"),
    ({1, 2}, "set"),
    (frozenset(), "frozenset"),
    (Point(1, 2), "Point"),
    (lambda: 0, "function"),
    (Fake(), "test_typed_json.Fake"),  # module name depends on rootdir
    (Color.RED, "Color"),
    (bytearray(b"x"), "bytearray"),
    (np.array([1.0]), "numpy.ndarray"),
    (np.complex64(1j), "numpy.complex64"),
    (np.str_("s"), "numpy.str_"),
]


@pytest.mark.parametrize(("obj", "type_name"), UNSUPPORTED, ids=lambda v: type(v).__name__)
def test_unsupported_objects_name_their_path(obj: object, type_name: str) -> None:
    state = {"optim": {"foo": obj}, "layers": [0, 1, 2, obj]}
    with pytest.raises(UnsupportedStateError) as info:
        encode(state)
    message = str(info.value)
    assert message.startswith("cannot store state['optim']['foo'] (type ")
    assert type_name in message
    assert "without pickle; supported: tensors, None, bool, int, float, str, bytes" in message
    with pytest.raises(UnsupportedStateError, match=r"^cannot store state\['layers'\]\[3\] "):
        encode({"layers": state["layers"]})


@pytest.mark.parametrize(
    ("key", "type_name"),
    [((1, 2), "tuple"), (True, "bool"), (1.5, "float"), (None, "NoneType"), (b"k", "bytes")],
)
def test_bad_dict_keys(key: object, type_name: str) -> None:
    with pytest.raises(UnsupportedStateError) as info:
        encode({"optim": {"ok": 1, key: 2}})
    assert str(info.value).startswith("cannot store state['optim']: dict key")
    assert f"of type {type_name}" in str(info.value)


def test_lone_surrogates_and_oversized_ints_refused() -> None:
    with pytest.raises(UnsupportedStateError, match=r"state\['s'\].*surrogate"):
        encode({"s": "\ud800"})
    with pytest.raises(UnsupportedStateError, match=r"state\['k'\]: dict key"):
        encode({"k": {"\udfff": 1}})
    if sys.get_int_max_str_digits():
        with pytest.raises(UnsupportedStateError, match=r"state\['n'\]"):
            encode({"n": 10 ** (sys.get_int_max_str_digits() + 5)})


def test_longdouble_refused_where_wider_than_float64() -> None:
    if np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("longdouble is float64 here")
    with pytest.raises(UnsupportedStateError, match=r"numpy\.(longdouble|float128)"):
        encode([np.longdouble(1)])


def test_cycles_refused_but_shared_references_fine() -> None:
    looped: list[object] = [1]
    looped.append(looped)
    with pytest.raises(UnsupportedStateError, match=r"state\['a'\]\[1\]: cyclic reference"):
        encode({"a": looped})
    d: dict[str, object] = {}
    d["self"] = {"inner": d}
    with pytest.raises(UnsupportedStateError, match=r"state\['self'\]\['inner'\]: cyclic"):
        encode(d)
    shared = [1, 2]
    assert roundtrip({"a": shared, "b": (shared, shared)}) == {"a": [1, 2], "b": ([1, 2], [1, 2])}


def nested_lists(depth: int) -> object:
    value: object = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_depth_limit_matches_between_encode_and_decode() -> None:
    at_limit = nested_lists(MAX_DEPTH)
    assert roundtrip(at_limit) == at_limit
    with pytest.raises(UnsupportedStateError, match="nested deeper than 256"):
        encode(nested_lists(MAX_DEPTH + 1))
    tuples: object = ()
    for _ in range(MAX_DEPTH // 2 - 1):
        tuples = (tuples,)
    assert roundtrip(tuples) == tuples  # each tuple is two JSON levels
    with pytest.raises(UnsupportedStateError, match="nested deeper"):
        encode((tuples,))
    with pytest.raises(UnsupportedStateError, match="nested deeper"):
        encode(nested_lists(100_000))


# --- hostile input on decode -------------------------------------------------

HOSTILE_JSON = [
    '{"$foo": 1}',
    '{"$tuple": 1}',
    '{"$tuple": [1], "x": 2}',
    '{"$tuple": [1], "$bytes": ""}',
    '{"$bytes": "!!"}',
    '{"$bytes": "QQ="}',
    '{"$bytes": "QR=="}',
    '{"$bytes": "QQ==\\n"}',
    '{"$bytes": "é"}',
    '{"$bytes": 5}',
    '{"$float": "NaN"}',
    '{"$float": 1.0}',
    '{"$float": "nan", "value": 1}',
    '{"$size": [-1]}',
    '{"$size": [true]}',
    '{"$size": [1.0]}',
    '{"$size": [9223372036854775808]}',
    '{"$size": {"a": 1}}',
    '{"$dict": "x"}',
    '{"$dict": [5]}',
    '{"$dict": [[1]]}',
    '{"$dict": [[1, 2, 3]]}',
    '{"$dict": [[true, 1]]}',
    '{"$dict": [[1.5, 1]]}',
    '{"$dict": [[null, 1]]}',
    '{"$dict": [[[1], 1]]}',
    '{"$dict": [[1, 1], [1, 2]]}',
    '{"$dict": [["a", {"$bogus": 1}]]}',
    '{"$numpy": "float32"}',
    '{"$numpy": "float32", "value": 1.0, "x": 1}',
    '{"$numpy": "object", "value": 1}',
    '{"$numpy": "float128", "value": 1.0}',
    '{"$numpy": "complex64", "value": 1.0}',
    '{"$numpy": 5, "value": 1}',
    '{"$numpy": "int8", "value": 300}',
    '{"$numpy": "uint8", "value": -1}',
    '{"$numpy": "int8", "value": 1.0}',
    '{"$numpy": "int8", "value": true}',
    '{"$numpy": "bool", "value": 1}',
    '{"$numpy": "float32", "value": 1}',
    '{"$numpy": "float16", "value": 1e10}',
    '{"$numpy": "float32", "value": 0.1}',
    '{"$numpy": "float32", "value": {"$float": "bogus"}}',
    '{"$numpy": "float32", "value": {"$tuple": []}}',
    '{"$numpy": "float32", "value": "1.0"}',
    '{"a": [0, {"$bytes": "!"}]}',
]


@pytest.mark.filterwarnings("error")  # hostile input must not even warn
@pytest.mark.parametrize("text", HOSTILE_JSON)
def test_hostile_typed_json_raises_format_error(text: str) -> None:
    data = loads_strict(text)
    with pytest.raises(FormatError, match=r"^invalid typed JSON at state"):
        decode(data)


def test_decode_errors_name_the_key_path() -> None:
    with pytest.raises(FormatError, match=r"at state\['a'\]\[1\]: \$bytes payload"):
        decode(loads_strict('{"a": [0, {"$bytes": "!"}]}'))
    with pytest.raises(FormatError, match=r"at cfg\[3\]\['k'\]: unknown tag"):
        decode(loads_strict('{"$dict": [[3, {"k": {"$x": 1}}]]}'), root="cfg")


HOSTILE_TEXT: list[str | bytes] = [
    "[" * 100_000 + "]" * 100_000,
    '{"a":' * 100_000 + "1" + "}" * 100_000,
    "[" * 300 + "]" * 300,
    '{"a": 1, "a": 2}',
    '{"x": {"b": 1, "b": 1}}',
    "NaN",
    "[Infinity]",
    '{"x": -Infinity}',
    "1e400",
    "[-1e999]",
    b"\xff",
    b'{"a": "\xc3"}',
    "\ufeff{}".encode(),
    "\ufeff{}",
    '"\\ud800"',
    '{"\\udc00": 1}',
    "1" * 5000,
    "{} x",
    "",
    "{'a': 1}",
    '{"a": 1,}',
]


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("text", HOSTILE_TEXT, ids=lambda t: repr(t[:20]))
def test_hostile_text_raises_format_error(text: str | bytes) -> None:
    with pytest.raises(FormatError, match=r"^invalid JSON: "):
        loads_strict(text)


def test_loads_strict_depth_limit_is_inclusive() -> None:
    assert loads_strict("[" * 256 + "]" * 256) is not None
    assert loads_strict("[[1]]", max_depth=2) == [[1]]
    with pytest.raises(FormatError, match="nested deeper than 2"):
        loads_strict('[{"a": 1}]'.replace("1", "[]"), max_depth=2)
    assert loads_strict(b'{"\xc3\xa9": [1.5, -0.0, null, true]}') == {"é": [1.5, -0.0, None, True]}


@pytest.mark.parametrize(
    "data",
    [nested_lists(100_000), {"a": math.nan}, [math.inf], (1, 2), {1: 2}, {"a": {1, 2}}, b"x"],
    ids=lambda d: type(d).__name__,
)
def test_decode_rejects_non_json_python_data(data: object) -> None:
    with pytest.raises(FormatError):
        decode(data)  # type: ignore[arg-type]


def test_decode_max_depth_parameter() -> None:
    assert decode([[1]], max_depth=2) == [[1]]
    with pytest.raises(FormatError, match="nested deeper than 1"):
        decode([[1]], max_depth=1)
    assert decode({"$tuple": [1]}, max_depth=2) == (1,)
    with pytest.raises(FormatError, match="nested deeper than 1"):
        decode({"$tuple": [1]}, max_depth=1)


def test_dumps_strict() -> None:
    assert dumps_strict({"é": [1, "😀"]}) == '{"é": [1, "😀"]}'
    assert json.loads(dumps_strict({"a": [1]}, indent=2)) == {"a": [1]}
    with pytest.raises(ValueError, match="JSON compliant"):
        dumps_strict([math.nan])


def test_format_key_path() -> None:
    assert format_key_path([]) == "state"
    assert format_key_path(["optim", "foo"]) == "state['optim']['foo']"
    assert format_key_path(["layers", 3], root="m") == "m['layers'][3]"
    assert format_key_path(["it's"]) == 'state["it\'s"]'


# --- property ----------------------------------------------------------------

numpy_scalars = st.sampled_from(NUMPY_NAMES).flatmap(
    lambda name: hnp.from_dtype(np.dtype(name)).map(np.dtype(name).type)
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**3000), max_value=2**3000)
    | st.floats()
    | st.text(st.characters(codec="utf-8"))
    | st.binary()
    | numpy_scalars
    | st.lists(st.integers(0, 2**63 - 1), max_size=4).map(torch.Size)
)
keys = st.text(st.characters(codec="utf-8")) | st.integers() | st.text().map(lambda s: "$" + s)
values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=5)
        | st.lists(children, max_size=5).map(tuple)
        | st.dictionaries(keys, children, max_size=5)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_property_roundtrip_preserves_values_and_types(value: object) -> None:
    assert_same(value, roundtrip(value))
