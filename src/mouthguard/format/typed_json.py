"""Typed JSON: the pickle-free codec for the non-tensor part of a checkpoint's state.

Step counters, LR-scheduler dicts, RNG states and user metadata are stored in the
manifest as plain JSON plus a few *tagged objects* for what JSON cannot say
(``{"$tuple": [...]}``, ``{"$bytes": "..."}``, ...). Loading never runs pickle or
``eval``: a manifest may be hostile, so :func:`loads_strict` and :func:`decode`
validate everything and fail only with :class:`~mouthguard.errors.FormatError`.
Text is parsed by :mod:`mouthguard.format.strict_json`, the one hardened parser.

Depth is counted in JSON nesting levels of the *encoded* form (a tuple costs two:
its tag object and its array), so whatever :func:`encode` accepts also passes
:func:`loads_strict` and :func:`decode` with the default limit.
"""

from __future__ import annotations

import base64
import json
import math
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, cast

from mouthguard.errors import FormatError, UnsupportedStateError
from mouthguard.format import strict_json
from mouthguard.format.strict_json import (
    JsonValue,
    is_valid_text,
    json_problem,
    short_repr,
    type_name,
)

__all__ = [
    "MAX_DEPTH",
    "RESERVED_TAGS",
    "DecodeHook",
    "EncodeHook",
    "JsonValue",
    "decode",
    "dumps_strict",
    "encode",
    "format_key_path",
    "loads_strict",
]

EncodeHook: TypeAlias = Callable[[object, str], JsonValue | None]
DecodeHook: TypeAlias = Callable[[dict[str, JsonValue], str], object]

MAX_DEPTH = 256
RESERVED_TAGS: frozenset[str] = frozenset(
    {"$tuple", "$size", "$dict", "$bytes", "$float", "$numpy"}
)

# Only dtypes whose values survive a trip through a Python bool/int/float exactly;
# longdouble (float128) would silently lose precision, so it goes to the hook.
_NUMPY_DTYPES = frozenset({"bool", "float16", "float32", "float64"}) | {
    f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)
}
_SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_SUPPORTED = (
    "tensors, None, bool, int, float, str, bytes, list, tuple, dict with str or int keys, "
    "numpy scalars"
)
_SIZE_LIMIT = 2**63  # torch.Size dimensions are int64
_repr = short_repr  # error messages stay short even on hostile input


def format_key_path(parts: Sequence[str | int], root: str = "state") -> str:
    """Render a key path the way Python would index it, e.g. ``state['layers'][3]``."""
    return root + "".join(f"[{part!r}]" for part in parts)


def _loaded(name: str) -> Any:
    """The module ``name`` if something already imported it, else None.

    Encoding asks "is this a numpy scalar / a torch.Size?" of every value; an
    object can only be one if its module is loaded, so the codec never imports
    numpy or torch to answer (manifests are read by commands that need neither).
    """
    return sys.modules.get(name)


def _numpy_scalar(obj: object) -> bool:
    np = _loaded("numpy")
    return (
        np is not None
        and isinstance(obj, np.bool_ | np.integer | np.floating)
        and cast(Any, obj).dtype.name in _NUMPY_DTYPES
    )


def _torch_size(obj: object) -> bool:
    torch = _loaded("torch")
    return torch is not None and type(obj) is torch.Size


def _int_ok(value: int) -> bool:
    # CPython refuses decimal conversion of ints longer than sys.get_int_max_str_digits()
    # (4300 digits by default, never below 640); 2**2000 has only 603 digits.
    if value.bit_length() <= 2000:
        return True
    try:
        str(value)
    except ValueError:
        return False
    return True


class _Encoder:
    def __init__(self, hook: EncodeHook | None, root: str) -> None:
        self.hook = hook
        self.root = root
        self.parts: list[str | int] = []
        self.active: set[int] = set()  # ids of the containers on the current path

    def error(self, why: str) -> UnsupportedStateError:
        return UnsupportedStateError(f"cannot store {format_key_path(self.parts, self.root)}{why}")

    def need(self, depth: int, levels: int) -> None:
        if depth + levels > MAX_DEPTH:
            raise self.error(f": nested deeper than {MAX_DEPTH} levels")

    def key(self, key: object) -> str | int:
        if type(key) is str and is_valid_text(key):
            return key
        if type(key) is int and _int_ok(key):
            return key
        raise self.error(
            f": dict key {_repr(key)} of type {type_name(key)} cannot be stored; "
            "keys must be str (valid Unicode) or int (not bool)"
        )

    def enc(self, obj: object, depth: int) -> JsonValue:
        if obj is None or type(obj) is bool:
            return obj
        if type(obj) is str:
            if not is_valid_text(obj):
                raise self.error(": str contains a lone surrogate (not valid Unicode)")
            return obj
        if type(obj) is int:
            if not _int_ok(obj):
                raise self.error(": int has more decimal digits than sys.get_int_max_str_digits()")
            return obj
        # Before float: np.float64 subclasses float but must keep its numpy type.
        if _numpy_scalar(obj):
            scalar: Any = obj
            self.need(depth, 1)
            value = scalar.item()  # the exact Python bool / int / float
            return {"$numpy": scalar.dtype.name, "value": self.enc(value, depth + 1)}
        if type(obj) is float and math.isfinite(obj):
            return obj  # json writes repr(), which round-trips exactly, -0.0 included
        return self.enc_other(obj, depth)

    def enc_other(self, obj: object, depth: int) -> JsonValue:
        if type(obj) is float:
            self.need(depth, 1)
            return {"$float": "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}
        if type(obj) is bytes:
            self.need(depth, 1)
            return {"$bytes": base64.b64encode(obj).decode("ascii")}
        if _torch_size(obj):
            size = cast(tuple[int, ...], obj)
            self.need(depth, 2)
            if not all(0 <= dim < _SIZE_LIMIT for dim in size):
                raise self.error(f": torch.Size {size} has a negative or too large dimension")
            return {"$size": list(size)}
        if type(obj) is list or type(obj) is tuple or type(obj) is dict or type(obj) is OrderedDict:
            if id(obj) in self.active:
                raise self.error(": cyclic reference (the object contains itself)")
            self.active.add(id(obj))
            result = self.container(obj, depth)
            self.active.discard(id(obj))
            return result
        if self.hook is not None:
            tagged = self.hook(obj, format_key_path(self.parts, self.root))
            if tagged is not None:
                return self.check_hook_result(tagged, depth)
        raise self.error(f" (type {type_name(obj)}) without pickle; supported: {_SUPPORTED}")

    def container(
        self, obj: list[object] | tuple[object, ...] | dict[object, object], depth: int
    ) -> JsonValue:
        if isinstance(obj, list | tuple):
            levels = 1 if type(obj) is list else 2
            self.need(depth, levels)
            items: list[JsonValue] = []
            for index, item in enumerate(obj):
                self.parts.append(index)
                items.append(self.enc(item, depth + levels))
                self.parts.pop()
            return items if type(obj) is list else {"$tuple": items}
        if all(type(key) is str and not key.startswith("$") for key in obj):
            self.need(depth, 1)
            plain: dict[str, JsonValue] = {}
            for key, item in obj.items():
                assert isinstance(key, str)  # established by the all() above
                self.parts.append(self.key(key))
                plain[key] = self.enc(item, depth + 1)
                self.parts.pop()
            return plain
        # Keys JSON cannot carry (ints, or strs that would look like tags): list of pairs.
        self.need(depth, 3)
        pairs: list[JsonValue] = []
        for key, item in obj.items():
            self.parts.append(self.key(key))
            pairs.append([self.parts[-1], self.enc(item, depth + 3)])
            self.parts.pop()
        return {"$dict": pairs}

    def check_hook_result(self, tagged: JsonValue, depth: int) -> JsonValue:
        # A bad hook is a bug in the caller's code, hence TypeError rather than a state error.
        path = format_key_path(self.parts, self.root)
        tags = [k for k in tagged if k.startswith("$")] if type(tagged) is dict else []
        if len(tags) != 1 or tags[0] in RESERVED_TAGS:
            raise TypeError(
                f"encode hook returned {_repr(tagged)} for {path}; expected a dict with exactly "
                f"one '$' key that is not a builtin tag ({', '.join(sorted(RESERVED_TAGS))})"
            )
        problem = json_problem(tagged, MAX_DEPTH - depth)
        if problem is not None:
            raise TypeError(f"encode hook returned invalid JSON for {path}: {problem}")
        return tagged


def encode(obj: object, *, hook: EncodeHook | None = None, root: str = "state") -> JsonValue:
    """Encode ``obj`` as typed JSON that :func:`decode` turns back into an equal object.

    Plain JSON is used where it is exact; tagged objects carry the rest: ``$tuple``,
    ``$size`` (``torch.Size``), ``$dict`` (dicts with int keys or keys starting with
    ``$``), ``$bytes`` (base64), ``$float`` (nan/inf/-inf) and ``$numpy`` (numpy
    bool/int/uint/float scalars). ``OrderedDict`` is stored as a dict (order kept).
    Types are matched exactly, so subclasses (``IntEnum``, namedtuples, ``defaultdict``)
    go to ``hook`` rather than silently losing their type.

    Args:
        obj: The state to encode. Not modified.
        hook: Called as ``hook(obj, key_path)`` for any other object; returns a dict
            with exactly one non-builtin ``$`` key (e.g. ``{"$tensor": "name"}``) that
            is stored verbatim, or None to decline.
        root: Name of the root in key paths of error messages.

    Returns:
        A JSON value nested at most ``MAX_DEPTH`` levels, ready for :func:`dumps_strict`.

    Raises:
        UnsupportedStateError: An object cannot be stored without pickle, a dict key
            is not str/int, a reference is cyclic or the nesting exceeds ``MAX_DEPTH``;
            the message names the key path, e.g. ``state['optim']['foo']``.
        TypeError: ``hook`` returned something other than None or a valid tagged dict.
    """
    encoder = _Encoder(hook, root)
    try:
        return encoder.enc(obj, 0)
    except RecursionError:  # only if the caller's own stack is already nearly full
        raise encoder.error(": nested too deeply for the interpreter stack") from None


class _Decoder:
    def __init__(self, hook: DecodeHook | None, root: str, max_depth: int) -> None:
        self.hook = hook
        self.root = root
        self.max_depth = max_depth
        self.parts: list[str | int] = []

    def error(self, why: str) -> FormatError:
        return FormatError(f"invalid typed JSON at {format_key_path(self.parts, self.root)}: {why}")

    def need(self, depth: int, levels: int) -> None:
        if depth + levels > self.max_depth:
            raise self.error(f"nested deeper than {self.max_depth} levels")

    def dec(self, data: object, depth: int) -> object:
        if data is None or type(data) is bool or type(data) is int or type(data) is str:
            return data
        if type(data) is float:
            if not math.isfinite(data):
                raise self.error(f"non-finite number {data!r} is not JSON")
            return data
        if type(data) is list:
            self.need(depth, 1)
            return self.items(data, depth + 1)
        if type(data) is dict:
            self.need(depth, 1)
            return self.obj(data, depth)
        raise self.error(f"{type_name(data)} is not a JSON value")

    def items(self, data: list[object], depth: int) -> list[object]:
        out: list[object] = []
        for index, item in enumerate(data):
            self.parts.append(index)
            out.append(self.dec(item, depth))
            self.parts.pop()
        return out

    def obj(self, data: dict[object, object], depth: int) -> object:
        tags = [key for key in data if type(key) is not str or key.startswith("$")]
        if not tags:
            out: dict[object, object] = {}
            for key, item in data.items():
                self.parts.append(str(key))
                out[key] = self.dec(item, depth + 1)
                self.parts.pop()
            return out
        tag = tags[0]
        if len(tags) > 1 or type(tag) is not str:
            raise self.error(f"object has several '$' or non-string keys {_repr(tags)}")
        if tag not in RESERVED_TAGS:
            if self.hook is None:
                raise self.error(f"unknown tag {_repr(tag)}")
            # All keys are str here: a non-str key would have been a second entry in tags.
            tagged = cast("dict[str, JsonValue]", data)
            return self.hook(tagged, format_key_path(self.parts, self.root))
        return self.builtin(tag, data, depth)

    def builtin(self, tag: str, data: dict[object, object], depth: int) -> object:
        if set(data) != ({tag, "value"} if tag == "$numpy" else {tag}):
            raise self.error(f"malformed {tag} object with keys {_repr(sorted(data))}")
        payload = data[tag]
        if tag == "$float":
            return self.special_float(data, "$float object")
        if tag == "$bytes":
            return self.bytes_(payload)
        if tag == "$numpy":
            return self.numpy(payload, data["value"], depth)
        if type(payload) is not list:
            raise self.error(f"{tag} payload must be a list, not {type_name(payload)}")
        self.need(depth, 2)
        if tag == "$tuple":
            return tuple(self.items(payload, depth + 2))
        if tag == "$size":
            if not all(type(dim) is int and 0 <= dim < _SIZE_LIMIT for dim in payload):
                raise self.error(
                    f"$size payload must hold ints in [0, 2**63), got {_repr(payload)}"
                )
            import torch  # noqa: PLC0415 - only a state holding a torch.Size needs it

            return torch.Size(payload)
        return self.dict_(payload, depth)

    def special_float(self, data: dict[object, object], where: str) -> float:
        name = data.get("$float") if set(data) == {"$float"} else None
        if type(name) is not str or name not in _SPECIAL_FLOATS:
            raise self.error(f"{where} must be {{'$float': 'nan'|'inf'|'-inf'}}, not {_repr(data)}")
        return _SPECIAL_FLOATS[name]

    def bytes_(self, payload: object) -> bytes:
        if type(payload) is str:
            try:
                raw = base64.b64decode(payload, validate=True)
            except ValueError:  # binascii.Error, or non-ASCII characters
                raw = None
            # Canonical form only, so one byte string has exactly one encoding.
            if raw is not None and base64.b64encode(raw).decode("ascii") == payload:
                return raw
        raise self.error(f"$bytes payload must be canonical standard base64, got {_repr(payload)}")

    def dict_(self, payload: list[object], depth: int) -> dict[object, object]:
        out: dict[object, object] = {}
        for index, entry in enumerate(payload):
            if type(entry) is not list or len(entry) != 2:
                raise self.error(
                    f"$dict entry {index} must be a [key, value] list, got {_repr(entry)}"
                )
            self.need(depth, 3)
            key, value = entry
            if type(key) is not str and type(key) is not int:
                raise self.error(f"$dict entry {index} has a key of type {type_name(key)}")
            if key in out:
                raise self.error(f"$dict has duplicate key {_repr(key)}")
            self.parts.append(key)
            out[key] = self.dec(value, depth + 3)
            self.parts.pop()
        return out

    def numpy(self, name: object, value: object, depth: int) -> object:
        if type(name) is not str or name not in _NUMPY_DTYPES:
            raise self.error(f"$numpy dtype must be a bool/int/uint/float name, not {_repr(name)}")
        import numpy as np  # noqa: PLC0415 - only a state holding numpy scalars needs it

        dtype = np.dtype(name)
        if type(value) is bool and dtype.kind == "b":
            return dtype.type(value)
        if type(value) is int and dtype.kind in "iu":
            if np.iinfo(dtype).min <= value <= np.iinfo(dtype).max:
                return dtype.type(value)
        elif type(value) is dict and dtype.kind == "f":
            self.need(depth, 2)
            return dtype.type(self.special_float(value, "$numpy value"))
        # Range checked before the cast, which would warn and give inf on overflow.
        elif (
            type(value) is float and dtype.kind == "f" and abs(value) <= float(np.finfo(dtype).max)
        ):
            result = dtype.type(value)
            if float(result) == value:  # exact: encode never rounds
                return result
        raise self.error(f"$numpy value {_repr(value)} is not an exact {name}")


def decode(
    data: JsonValue,
    *,
    hook: DecodeHook | None = None,
    root: str = "state",
    max_depth: int = MAX_DEPTH,
) -> object:
    """Decode typed JSON produced by :func:`encode`; the strict inverse.

    Objects without ``$`` keys become dicts (key order kept); builtin tags must have
    exactly their documented shape and payload type; an object with exactly one
    other ``$`` key goes to ``hook``; any other ``$`` key is an error.

    Args:
        data: Parsed JSON, typically from :func:`loads_strict`. May be hostile.
        hook: Called as ``hook(tagged_dict, key_path)`` for non-builtin tags; must
            raise FormatError for a payload it rejects.
        root: Name of the root in key paths of error messages.
        max_depth: Maximum JSON nesting depth accepted.

    Returns:
        The decoded state; tuples, ``torch.Size``, bytes, special floats and numpy
        scalars are restored with their exact types (a numpy scalar as the canonical
        type of its dtype name, e.g. ``np.longlong`` comes back as ``np.int64``).

    Raises:
        FormatError: ``data`` is not valid typed JSON; the message names the key path.
    """
    decoder = _Decoder(hook, root, max_depth)
    try:
        return decoder.dec(data, 0)
    except RecursionError:  # only if max_depth exceeds what the stack can hold
        raise FormatError(f"invalid typed JSON at {root}: nested too deeply") from None


def dumps_strict(value: JsonValue, *, indent: int | None = None) -> str:
    """Serialise ``value`` as JSON text, keeping key order and non-ASCII characters.

    Raises:
        ValueError: ``value`` holds nan or infinity (``encode`` never produces them).
    """
    return json.dumps(value, allow_nan=False, ensure_ascii=False, indent=indent)


def loads_strict(
    text: str | bytes, *, max_depth: int = MAX_DEPTH, shape_checked: bool = False
) -> JsonValue:
    """Parse JSON text strictly (:func:`mouthguard.format.strict_json.parse`).

    Args:
        text: JSON text, or its UTF-8 bytes (no BOM).
        max_depth: Maximum nesting depth of arrays and objects.
        shape_checked: the caller checks the exact type of every value it uses
            (see :func:`~mouthguard.format.strict_json.parse`): the depth is then its own.

    Returns:
        The parsed value; numbers are finite, strings valid Unicode, keys unique.

    Raises:
        FormatError: Invalid UTF-8 or JSON, duplicate keys, NaN/Infinity literals,
            out-of-range numbers, lone surrogate escapes or nesting beyond ``max_depth``;
            the message starts with ``invalid JSON: ``.
    """
    try:
        return strict_json.parse(text, max_depth=max_depth, shape_checked=shape_checked)
    except strict_json.StrictJsonError as exc:
        raise FormatError(f"invalid JSON: {exc}") from None
