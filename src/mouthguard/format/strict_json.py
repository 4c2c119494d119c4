"""One hardened JSON parser for everything read back from storage.

Manifests, sidecars and rank-file headers come from storage that anyone with
write access may have crafted, and Python's ``json`` is lenient where that
matters: it keeps the last of two equal keys, reads ``NaN``, ``Infinity`` and
``1e400`` (as infinity), accepts lone surrogates and recurses as deep as the
text goes. :func:`parse` refuses all of that, within limits its caller chooses
(depth, size, and whether integers must fit a double as safetensors' reader
requires), so that every format is parsed by the same rules and a hostile text
only ever raises :class:`StrictJsonError`.

Invariant: what :func:`parse` returns is made of ``dict`` (``str`` keys, unique),
``list``, ``str`` (valid Unicode), ``int``, finite ``float``, ``bool`` and
``None``, nested at most ``max_depth`` levels. :func:`json_problem` checks the
same of any Python value (e.g. what an encoder hook produced).
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from collections.abc import Iterable
from typing import NoReturn, TypeAlias

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None

_SURROGATE = re.compile("[\ud800-\udfff]")
_short = reprlib.Repr()  # error messages stay short even on hostile input
_short.maxstring = _short.maxother = 60
short_repr = _short.repr


class StrictJsonError(ValueError):
    """A text is not strict JSON within the limits; the message says why (no context).

    Callers add their own context ("invalid JSON: ...", "rank file header is not
    valid JSON: ...") and raise their own error type.
    """


def deeper_than(limit: int) -> str:
    """The one wording of "too deep", for parsed text and Python values alike."""
    return f"nested deeper than {limit} levels (the nesting limit)"


def is_valid_text(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8: a lone surrogate is a valid ``str`` but cannot."""
    return _SURROGATE.search(text) is None


def type_name(obj: object) -> str:
    """``obj``'s type as a message names it: ``int``, ``numpy.float64``."""
    module, name = type(obj).__module__, type(obj).__qualname__
    return name if module == "builtins" else f"{module}.{name}"


def _leaf_problem(item: object) -> str | None:
    if type(item) is str:
        return (
            None if is_valid_text(item) else f"string {short_repr(item)} contains a lone surrogate"
        )
    if type(item) is float:
        return None if math.isfinite(item) else f"non-finite number {item!r}"
    if item is None or type(item) is bool or type(item) is int:
        return None
    return f"{type_name(item)} is not a JSON type"


def json_problem(value: object, max_depth: int, *, strings: bool = True) -> str | None:
    r"""Return why ``value`` is not strict JSON nested at most ``max_depth`` deep, or None.

    Types are matched exactly (a ``bool`` subclass or a ``tuple`` is not JSON).
    Iterative, so hostile depth cannot exhaust the interpreter stack.
    ``strings=False`` skips the lone-surrogate check of strings, for a value
    :func:`parse` made of a text that holds neither a surrogate nor a ``\u``
    escape, so none of its strings can hold one.
    """
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if type(item) is list:
            children: Iterable[object] = item
            problem = None
        elif type(item) is dict:
            children = item.values()
            problem = _keys_problem(item, strings=strings)
        else:
            problem = _leaf_problem(item)
            if problem is not None:
                return problem
            continue
        if problem is None and depth >= max_depth:
            problem = deeper_than(max_depth)
        if problem is None:
            problem = _children_problem(children, stack, depth + 1, strings=strings)
        if problem is not None:
            return problem
    return None


def _keys_problem(item: dict[object, object], *, strings: bool) -> str | None:
    for key in item:
        if type(key) is not str:
            return "object key is not a string"
        if strings and _SURROGATE.search(key) is not None:
            return _leaf_problem(key)
    return None


def _children_problem(
    children: Iterable[object], stack: list[tuple[object, int]], depth: int, *, strings: bool
) -> str | None:
    """Check the leaves among ``children``; push the containers (at ``depth``).

    Leaves are checked here rather than pushed: an index holds thousands of them.
    """
    for child in children:
        if type(child) is list or type(child) is dict:
            stack.append((child, depth))
        elif type(child) is str:
            if strings and _SURROGATE.search(child) is not None:
                return _leaf_problem(child)
        elif type(child) is float:
            if not math.isfinite(child):
                return _leaf_problem(child)
        elif not (child is None or type(child) is int or type(child) is bool):
            return _leaf_problem(child)
    return None


def _reject_constant(name: str) -> NoReturn:
    raise StrictJsonError(f"{name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # e.g. 1e400, which json would silently read as inf
        raise StrictJsonError(f"number {short_repr(text)} is out of range")
    return value


def _int_within_double(text: str) -> int:
    value = int(text)
    try:
        float(value)
    except OverflowError:  # past the double range, which safetensors' reader refuses
        raise StrictJsonError(f"number {short_repr(text)} is out of range") from None
    return value


def _unique_pairs(pairs: list[tuple[str, JsonValue]]) -> dict[str, JsonValue]:
    result = dict(pairs)
    if len(result) != len(pairs):  # json itself would silently keep the last value
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise StrictJsonError(f"duplicate object key {short_repr(key)}")
            seen.add(key)
    return result


def parse(
    data: str | bytes,
    *,
    max_depth: int,
    max_bytes: int | None = None,
    ints_within_double: bool = False,
    first_byte: int = 0,
    source: str = "the text",
    shape_checked: bool = False,
) -> JsonValue:
    r"""Parse JSON text strictly; hostile input only ever raises StrictJsonError.

    Args:
        data: JSON text, or its UTF-8 bytes (no BOM).
        max_depth: deepest nesting of arrays and objects accepted (the top-level
            container is level 1).
        max_bytes: longest ``data`` accepted, in bytes (characters for ``str``);
            ``None``: no limit here. Callers that know the size before reading
            should refuse it then too.
        ints_within_double: refuse integers a double cannot hold (safetensors'
            reader does; Python's json reads any number of digits).
        first_byte: offset of ``data``'s first byte in ``source``, for the
            position named when it is not UTF-8.
        source: what ``data`` was read from, for that same message.
        shape_checked: the caller checks the exact type of every value it takes
            from the result, and refuses anything else (as the shard index parser
            does), which bounds the depth of what it accepts; so the walk over the
            whole value, which checks leaf types and depth, is skipped -- unless
            the text could hold a lone surrogate (it has a ``\u`` escape or a
            surrogate), when it runs anyway. The walk is a third of the cost of
            parsing a shard index; keys are still unique, numbers still finite.

    Returns:
        The parsed value; see the module docstring for what it is made of (its
        depth, with ``shape_checked``, is the caller's to check).

    Raises:
        StrictJsonError: too long, not UTF-8, not JSON, a duplicate key, a
            ``NaN``/``Infinity`` literal, an out-of-range number, a lone
            surrogate, or nesting beyond ``max_depth``.
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise StrictJsonError(f"{len(data)} bytes, more than the {max_bytes} accepted")
    if not isinstance(data, str):
        try:
            data = str(data, "utf-8")
        except UnicodeDecodeError as exc:  # its own text names a codec, not the problem
            raise StrictJsonError(
                f"not UTF-8 (byte {first_byte + exc.start} of {source})"
            ) from None
    try:
        value: JsonValue = json.loads(
            data,
            object_pairs_hook=_unique_pairs,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            parse_int=_int_within_double if ints_within_double else None,
        )
    except StrictJsonError:
        raise
    except ValueError as exc:  # JSONDecodeError, or an int beyond sys.get_int_max_str_digits()
        raise StrictJsonError(str(exc)) from None
    except RecursionError:  # the C parser recurses; its limit is far above any max_depth
        raise StrictJsonError(deeper_than(max_depth)) from None
    # A lone surrogate can only come from the text itself or a \\u escape in it.
    strings = "\\u" in data or _SURROGATE.search(data) is not None
    if shape_checked and not strings:
        return value
    problem = json_problem(value, max_depth, strings=strings)
    if problem is not None:
        raise StrictJsonError(problem)
    return value
