"""The per-shard index: where every sample and member lies, for random access without tar parsing.

Format (strict JSON, one line, written by :func:`encode_index`)::

    {"format": "mouthguard-shard-index", "version": 1,
     "shard": "shard-000000.tar", "size": 20480,
     "samples": [[KEY, OFFSET, LENGTH, [[EXT, DATA_OFFSET, SIZE], ...]], ...]}

``OFFSET``/``LENGTH`` is the sample's span in the shard: from its first member's
tar header to the end of its last member's padding. ``DATA_OFFSET``/``SIZE`` is a
member's data, absolute in the shard. Lists rather than objects keep an index of
a quarter-million samples at a few MiB.

An index is hostile input until :func:`parse_index` accepted it, even though the
reader has checked its sha256 against the manifest first (an unsigned manifest
may be forged along with it). Parsing checks every type and name, that the
index is the shard's and counts as many samples as the manifest, and that the
members tile each span exactly, in order: header, data, padding, next header,
and the spans tile the shard from byte 0 to its end-of-archive blocks. An index
that passes can only point at bytes of its own shard, and it describes every
member a tar reader would find there.

An **adopted** shard's index (``adopted=True``: a user's tar, indexed in place by
:mod:`~mouthguard.data.indexing.tarscan`) has the same format and looser geometry: a
user's tar may hold extended headers (GNU long names, PAX), directories and
metadata members between samples, so spans need not tile the shard. What still
holds: samples in order and non-overlapping, each member's data after at least
one header block and after the previous member's padding, every span ending
where its last member's padding does, and nothing past the shard's end. Keys
and extensions follow the adopted rules (:func:`~mouthguard.data.formats.names.member_path_problem`,
:func:`~mouthguard.data.formats.names.adopted_ext_problem`), and a key may recur, as
WebDataset yields a key twice when its members are not adjacent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

from mouthguard.data.formats import names, tarfmt
from mouthguard.errors import FormatError, SampleError, ShardDamagedError
from mouthguard.format.typed_json import JsonValue, loads_strict

INDEX_FORMAT = "mouthguard-shard-index"
INDEX_VERSION = 1
#: Nesting of a valid index: object > samples > sample > members > member.
_MAX_DEPTH = 5


class Member(NamedTuple):
    """One member (one extension) of a sample: where its data lies in the shard."""

    ext: str
    offset: int
    size: int


class SampleEntry(NamedTuple):
    """One sample: its key, its span in the shard, its members in tar order."""

    key: str
    offset: int
    length: int
    members: tuple[Member, ...]


class ShardIndex(NamedTuple):
    """A parsed, validated index of one shard."""

    shard: str
    size: int
    samples: tuple[SampleEntry, ...]


def encode_index(shard: str, size: int, samples: Sequence[SampleEntry]) -> bytes:
    """The index's bytes (deterministic: the same samples give the same bytes)."""
    body = {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "shard": shard,
        "size": size,
        "samples": [
            [s.key, s.offset, s.length, [[m.ext, m.offset, m.size] for m in s.members]]
            for s in samples
        ],
    }
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8") + b"\n"


#: A named tuple made from its fields without its Python-level ``__new__`` (a third of
#: the cost of making one): for the two made per sample of every index parsed.
_new = tuple.__new__


class _Parser:
    def __init__(self, shard: str, size: int, adopted: bool) -> None:
        self.shard = shard
        self.size = size
        self.adopted = adopted
        self.good_exts: set[str] = set()  # extensions already checked in this index

    def fail(self, why: str) -> ShardDamagedError:
        return ShardDamagedError(f"shard {self.shard}: index {why}", shard=self.shard)

    def integer(self, value: JsonValue, what: str, low: int = 0) -> int:
        if type(value) is not int or value < low:
            raise self.fail(f"{what} must be an integer >= {low}, got {value!r:.40}")
        return value

    def sample(self, raw: JsonValue, cursor: int, number: int) -> SampleEntry:
        # Every check below runs for every sample of every index a DataLoader worker
        # reads (about 1,600 a 16 MiB shard of 10 KB samples): messages are formatted
        # only on failure, and the writer's own shape -- a plain key, members of an
        # extension seen before -- takes the fewest steps.
        if type(raw) is not list or len(raw) != 4:
            raise self.fail(f"sample {number} is not a [key, offset, length, members] list")
        key, offset, length, members = raw
        if type(key) is not str or not key:
            raise self.fail(f"sample {number} key is not a non-empty string")
        if self.adopted or not names.is_plain_key(key):
            self.key(key, number)
        if not (type(offset) is int and offset >= 0):
            offset = self.integer(offset, f"sample {key!r} offset")
        if not (type(length) is int and length >= 1):
            length = self.integer(length, f"sample {key!r} length", 1)
        if self.adopted and offset < cursor:
            raise self.fail(f"sample {key!r} starts before the previous sample ends")
        if not self.adopted and offset != cursor:  # packed samples tile the shard
            raise self.fail(f"sample {key!r} does not start where the previous sample ends")
        if type(members) is not list or not members:
            raise self.fail(f"sample {key!r} has no members")
        parsed, at = self.members(members, key, offset)
        if at != offset + length:
            raise self.fail(f"sample {key!r} span does not end where its last member does")
        if offset + length > self.size - (0 if self.adopted else 2 * tarfmt.BLOCK):
            raise self.fail(f"sample {key!r} runs past the end of the shard")
        return _new(SampleEntry, (key, offset, length, parsed))

    def members(
        self, members: list[JsonValue], key: str, at: int
    ) -> tuple[tuple[Member, ...], int]:
        """Sample ``key``'s members, from its span's start ``at``; and where its last one ends."""
        parsed: list[Member] = []
        good_exts = self.good_exts
        for item in members:
            if (
                type(item) is list
                and len(item) == 3
                and item[0] in good_exts
                and type(item[1]) is int
                and type(item[2]) is int
                and item[1] >= 0
                and item[2] >= 0
            ):
                member = _new(Member, item)  # an extension checked before, two plain ints
            else:
                member = self.member(item, key)  # checked in full (and refused, or remembered)
            # Header, then data, then padding; an adopted tar may put more headers between.
            where = at + tarfmt.BLOCK
            if member.offset < where if self.adopted else member.offset != where:
                raise self.fail(f"sample {key!r} member {member.ext!r} is not where tar puts it")
            for earlier in parsed:
                if earlier.ext == member.ext:
                    raise self.fail(f"sample {key!r} has member {member.ext!r} twice")
            parsed.append(member)
            at = member.offset + member.size + tarfmt.padding(member.size)
        return tuple(parsed), at

    def key(self, key: str, number: int) -> None:
        if self.adopted:
            why = names.member_path_problem(key)
            if why is not None:
                raise self.fail(f"sample {number} key {key!r:.80} {why}")
            return
        try:
            names.check_key(key)
        except SampleError as exc:
            raise self.fail(f"sample {number}: {exc}") from None

    def member(self, raw: JsonValue, key: str) -> Member:
        if type(raw) is not list or len(raw) != 3:
            raise self.fail(f"sample {key!r} has a member that is not [ext, offset, size]")
        ext, offset, size = raw
        if type(ext) is not str:
            raise self.fail(f"sample {key!r} has a member whose extension is not a string")
        if self.adopted:
            why = names.adopted_ext_problem(ext)
            if why is not None:
                raise self.fail(f"sample {key!r} {why}")
        else:
            try:
                names.check_ext(ext, key)
            except SampleError as exc:
                raise self.fail(str(exc)) from None
        member = Member(
            ext,
            self.integer(offset, f"sample {key!r} member {ext!r} offset"),
            self.integer(size, f"sample {key!r} member {ext!r} size"),
        )
        self.good_exts.add(ext)  # samples repeat the same few extensions
        return member


def parse_index(
    raw: bytes, *, shard: str, size: int | None, count: int, adopted: bool = False
) -> ShardIndex:
    """Parse and validate the index of ``shard`` (``size`` bytes, ``count`` samples).

    ``adopted``: the shard is a user's tar (see the module docstring).
    ``size`` None: the tar's size is the index's own (a gzip-compressed shard:
    the manifest records the compressed file's; the inflated tar must then be
    as long as its index says, :func:`~mouthguard.data.reading.gztar.unpack`).

    Raises:
        ShardDamagedError: anything at all is wrong; the message names the shard.
    """
    parser = _Parser(shard, 0 if size is None else size, adopted)
    try:
        # Every value taken from the body below has its exact type checked (which bounds
        # its depth at _MAX_DEPTH): the strict parser's own walk over it is skipped.
        body = loads_strict(raw, max_depth=_MAX_DEPTH, shape_checked=True)
    except FormatError as exc:
        raise parser.fail(f"is not valid JSON: {exc}") from None
    expected = {"format", "version", "shard", "size", "samples"}
    if type(body) is not dict or set(body) != expected:
        raise parser.fail(f"must be an object with exactly the members {sorted(expected)}")
    if body["format"] != INDEX_FORMAT or body["version"] != INDEX_VERSION:
        raise parser.fail(f"is not a {INDEX_FORMAT} version {INDEX_VERSION}")
    if size is None:
        own = body["size"]
        if type(own) is not int or own < tarfmt.BLOCK:
            raise parser.fail(f"states a size of {own!r:.20} bytes")
        size = parser.size = own
    if body["shard"] != shard or body["size"] != size:
        raise parser.fail(
            f"describes {body['shard']!r:.80} of {body['size']!r:.20} bytes, "
            f"not {shard!r} of {size} bytes"
        )
    samples = body["samples"]
    if type(samples) is not list or len(samples) != count:
        found = len(samples) if type(samples) is list else "no list of"
        raise parser.fail(f"lists {found} samples; the manifest says {count}")
    parsed: list[SampleEntry] = []
    keys: set[str] = set()
    cursor = 0
    for number, raw_sample in enumerate(samples):
        entry = parser.sample(raw_sample, cursor, number)
        if entry.key in keys and not adopted:
            raise parser.fail(f"lists sample {entry.key!r} twice")
        keys.add(entry.key)
        parsed.append(entry)
        cursor = entry.offset + entry.length
    if not adopted and cursor + tarfmt.archive_end(cursor) != size:
        raise parser.fail("does not end where the shard's end-of-archive blocks begin")
    return ShardIndex(shard, size, tuple(parsed))
