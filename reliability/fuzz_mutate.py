"""Mutators for the fuzz harness: bytes, JSON structure, and re-sealing.

Hostile JSON needs things ``json.dumps`` cannot write (duplicate keys, lone
surrogates, numbers beyond any float, 100 000-deep nesting), so documents are
serialised by :func:`dumps`, which understands two markers: :class:`Raw` (text
written verbatim) and :class:`Pairs` (an object whose keys may repeat).
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from typing import Any

from mouthguard.format.checksum import xxh3_digest

MARKER = b',\n "manifest_checksum": "'
END = b'"\n}\n'


@dataclass(frozen=True)
class Raw:
    """JSON text written as is (may be invalid JSON on purpose)."""

    text: str


@dataclass(frozen=True)
class Pairs:
    """A JSON object written from ``(key, value)`` pairs; keys may repeat."""

    items: tuple[tuple[str, Any], ...]


def _string(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: only an escape can carry it
        return json.dumps(value, ensure_ascii=True)
    return json.dumps(value, ensure_ascii=False)


def dumps(value: Any, indent: int = 1, level: int = 0) -> str:
    """Serialise like ``json.dumps(indent=1, ensure_ascii=False)``, with the markers."""
    pad, inner = "\n" + " " * (indent * level), "\n" + " " * (indent * (level + 1))
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Pairs | dict):
        items = value.items if isinstance(value, Pairs) else tuple(value.items())
        if not items:
            return "{}"
        body = ("," + inner).join(
            f"{_string(str(k))}: {dumps(v, indent, level + 1)}" for k, v in items
        )
        return "{" + inner + body + pad + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        body = ("," + inner).join(dumps(v, indent, level + 1) for v in value)
        return "[" + inner + body + pad + "]"
    return json.dumps(value, allow_nan=True)


def seal_prefix(prefix: bytes) -> bytes:
    """Append a valid checksum trailer to ``prefix`` (whatever it holds)."""
    return prefix + MARKER + xxh3_digest(prefix).encode() + END


def seal_text(text: str) -> bytes:
    """Seal serialised JSON the way :func:`mouthguard.format.sealed.seal` does."""
    raw = text.encode("utf-8", "surrogatepass")
    cut = raw.rfind(b"}")
    prefix = raw[:cut].rstrip() if cut >= 0 else raw
    return seal_prefix(prefix)


def split_sealed(raw: bytes) -> tuple[bytes, bytes]:
    """Split a sealed document into (prefix, trailer)."""
    cut = raw.rfind(MARKER)
    return (raw, b"") if cut < 0 else (raw[:cut], raw[cut:])


# --- byte mutations --------------------------------------------------------------

_INTERESTING_BYTES = [0x00, 0xFF, 0x7F, 0x80, 0x22, 0x5C, 0x7B, 0x7D, 0x5B, 0x5D, 0x2C, 0x3A, 0x0A]
_TOKENS = [
    b'"',
    b"\\",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\x00",
    b"\xff\xfe",
    b"\xed\xa0\x80",  # a UTF-8-encoded surrogate
    b"\xc0\xaf",  # overlong '/'
    b"NaN",
    b"Infinity",
    b"-0",
    b"1e999",
    b"99999999999999999999999999",
    b'"../"',
    b'"/etc/passwd"',
    b"\\ud800",
    b"\\u0000",
    b'"x": 1, "x": 2, ',
    b"[" * 300,
    b"]" * 300,
    b"\xef\xbb\xbf",  # BOM
]


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """One random byte-level mutation of ``data``."""
    buf = bytearray(data)
    op = rng.randrange(9)
    if not buf:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64)))
    pos = rng.randrange(len(buf))
    if op == 0:
        buf[pos] ^= 1 << rng.randrange(8)
    elif op == 1:
        buf[pos] = rng.choice(_INTERESTING_BYTES)
    elif op == 2:
        buf[pos] = rng.randrange(256)
    elif op == 3:
        del buf[rng.randrange(len(buf)) :]
    elif op == 4:
        buf[pos:pos] = rng.choice(_TOKENS)
    elif op == 5:
        end = min(len(buf), pos + rng.randrange(1, 64))
        del buf[pos:end]
    elif op == 6:
        end = min(len(buf), pos + rng.randrange(1, 64))
        buf[pos:pos] = buf[pos:end] * rng.randrange(1, 4)
    elif op == 7:
        buf[pos:pos] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 16)))
    else:
        other = rng.randrange(len(buf))
        buf[pos], buf[other] = buf[other], buf[pos]
    return bytes(buf)


# --- JSON mutations --------------------------------------------------------------

HOSTILE_STRINGS: list[str] = [
    "",
    ".",
    "..",
    "../x",
    "../../../../canary.txt",
    "../../../fifo",
    "/etc/passwd",
    "/",
    "a/b",
    "a\\b",
    "~",
    "manifest.json",
    "sidecar.hold.x.json",
    ".tmp-123",
    "-rf",
    "rank-00000.safetensors",
    "rank-00001.safetensors",
    "rank-00000.safetensors\x00.txt",
    "\x00",
    "a\nb",
    "\u202erank",  # right-to-left override
    "\uff52\uff41\uff4e\uff4b",  # fullwidth "rank"
    "\u0440\u0430\u0301\u043d\u043a",  # Cyrillic look-alike plus a combining mark
    "e\u0301",  # decomposed é
    "\ufeff",
    "\ud800",  # a lone surrogate
    "a" * 300,
    "x" * 100_000,
    "%2e%2e",
    "C:\\x",
    "U8",
    "F32",
    "BF16",
    "F8_E4M3",
    "__metadata__",
    "__storage__.x",
    "$tensor",
    "$tuple",
    "xxh3-128:" + "0" * 32,
    "xxh3-128:" + "A" * 32,
    "sha256:" + "0" * 64,
    "2024-01-01T00:00:00",  # naive
    "2024-01-01T00:00:00+00:00",
    "9999-12-31T23:59:59.999999+14:00",
    "0001-01-01T00:00:00-23:59",
    "transient",
    "critical",
    "golden",
]
HOSTILE_TIMES: list[str] = [
    "2024-01-01T00:00:00",  # naive: no offset
    "2024-01-01",
    "2024-01-01T00:00:00+00:00",
    "0001-01-01T00:00:00+00:00",
    "9999-12-31T23:59:59.999999+00:00",
    "2024-01-01T00:00:00+23:59",
    "2024-01-01T00:00:00-23:59",
    "2024-02-30T00:00:00+00:00",
    "2024-01-01T25:00:00+00:00",
    "2024-01-01T00:00:00Z",
    "2024-W01-1",
    "now",
    "",
]
HOSTILE_NUMBERS: list[Any] = [
    0,
    1,
    -1,
    2,
    7,
    8,
    4095,
    4096,
    4097,
    2**31,
    2**32 - 1,
    2**50,
    2**50 + 1,
    2**53 + 1,
    2**62,
    2**63 - 1,
    2**63,
    2**64,
    2**64 + 4096,
    -(2**63),
    10**15,
    10**15 + 1,
    10**30,
    1.5,
    -0.0,
    1e308,
    5e-324,
    True,
    False,
]
HOSTILE_RAW: list[Raw] = [
    Raw("NaN"),
    Raw("Infinity"),
    Raw("-Infinity"),
    Raw("1e999"),
    Raw("-1e999"),
    Raw("1" + "0" * 5000),
    Raw("-" + "9" * 700),
    Raw("1E400"),
    Raw("0.000000000000000000000000000000000000000000001"),
    Raw('"\\ud800"'),
    Raw('"\\udfff\\ud800"'),
    Raw('"\\u0000"'),
    Raw("[" * 100_000 + "]" * 100_000),
    Raw("[" * 257 + "]" * 257),
    Raw('{"a":' * 300 + "0" + "}" * 300),
    Raw("[" + ",".join(["0"] * 100_000) + "]"),
    Raw("[" + ",".join(["[]"] * 20_000) + "]"),
    Raw("{" + ",".join(f'"k{i}": 0' for i in range(20_000)) + "}"),
]


def hostile_value(rng: random.Random, original: Any) -> Any:
    """A value to put where ``original`` was: a type swap, an edge number, a bad name."""
    roll = rng.random()
    if isinstance(original, str) and len(original) >= 19 and original[4:5] == "-" and roll < 0.5:
        return rng.choice(HOSTILE_TIMES)  # an ISO timestamp: naive, far, odd offsets, junk
    if roll < 0.2 and isinstance(original, int) and not isinstance(original, bool):
        delta = rng.choice([1, -1, 8, -8, 4096, -4096, 2**32, 2**63, -(2**64)])
        return rng.choice([original + delta, -original, original * 2**32, 2**64 - original])
    if roll < 0.35 and isinstance(original, str) and original:
        return rng.choice(
            [
                "../" + original,
                original + "/..",
                "/" + original,
                original + "\x00",
                original.upper(),
                original[:-1],
                original + original,
                original.replace("0", "\u0660"),  # Arabic-Indic digit zero
            ]
        )
    if roll < 0.55:
        return rng.choice(HOSTILE_STRINGS)
    if roll < 0.8:
        return rng.choice(HOSTILE_NUMBERS)
    if roll < 0.9:
        return rng.choice([None, [], {}, [0], [-1], {"$tensor": "x"}, {"$view": {}}, [[]]])
    return rng.choice(HOSTILE_RAW)


Path_ = tuple[str | int, ...]


def paths(doc: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every node path of a parsed JSON document (root excluded)."""
    out: list[Path_] = []
    stack: list[tuple[Any, Path_]] = [(doc, prefix)]
    while stack:
        node, here = stack.pop()
        if here:
            out.append(here)
        if isinstance(node, dict):
            stack.extend((v, (*here, k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, (*here, i)) for i, v in enumerate(node))
    return out


def _get(doc: Any, path: Path_) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def mutate_json(rng: random.Random, doc: Any, *, focus: Path_ = ()) -> Any:
    """Apply one structure-aware mutation to a deep copy of ``doc`` and return it.

    ``focus`` restricts the mutated node to the subtree at that path (when it has nodes).
    The result may contain :class:`Raw` and :class:`Pairs` markers (serialise with
    :func:`dumps`).
    """
    doc = copy.deepcopy(doc)
    candidates = [p for p in paths(doc) if p[: len(focus)] == focus] or paths(doc)
    if not candidates:
        return hostile_value(rng, doc)
    path = rng.choice(candidates)
    parent, last = _get(doc, path[:-1]), path[-1]
    op = rng.randrange(10)
    if op <= 4:
        parent[last] = hostile_value(rng, parent[last])
    elif op == 5:  # delete the node
        del parent[last]
    elif op == 6 and isinstance(parent, dict):  # duplicate key, with a different value
        items = [(str(k), v) for k, v in parent.items()]
        items.insert(rng.randrange(len(items) + 1), (str(last), hostile_value(rng, parent[last])))
        if path[:-1]:
            grand = _get(doc, path[:-2])
            grand[path[-2]] = Pairs(tuple(items))
        else:
            return Pairs(tuple(items))
    elif op == 6 and isinstance(parent, list) and isinstance(last, int):  # duplicate records
        parent.insert(rng.randrange(len(parent) + 1), copy.deepcopy(parent[last]))
    elif op == 7:  # swap two nodes' values
        other = rng.choice(candidates)
        if other[: len(path)] != path and path[: len(other)] != other:
            other_parent = _get(doc, other[:-1])
            parent[last], other_parent[other[-1]] = other_parent[other[-1]], parent[last]
    elif op == 8 and isinstance(parent, dict):  # an unknown member
        parent[rng.choice(["extra", "$tensor", "__metadata__", "dcp", "x" * 40])] = hostile_value(
            rng, None
        )
    elif op == 8 and isinstance(parent, list):  # reorder
        rng.shuffle(parent)
    else:  # wrap the node one level deeper, or replace it with deep nesting
        parent[last] = rng.choice([[parent[last]], {"$tuple": [parent[last]]}, HOSTILE_RAW[12]])
    return doc


def strip_markers(value: Any) -> bool:
    """Whether ``value`` is free of markers (so the result is ordinary JSON data)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Raw | Pairs):
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True
