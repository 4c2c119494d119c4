"""The shard index: a round trip, and hostile indexes refused with the shard named."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data.formats.index import Member, SampleEntry, encode_index, parse_index
from mouthguard.errors import ShardDamagedError

from ..helpers import index_path, write_dataset

Body = dict[str, Any]


@pytest.fixture
def index(tmp_path: Path) -> tuple[Body, int, int]:
    """A real index (parsed JSON) with its shard's size and sample count."""
    manifest = write_dataset(tmp_path, n=6)
    shard = manifest.shards[0]
    body = json.loads(index_path(tmp_path / "ds", 0).read_bytes())
    return body, shard.size, shard.samples


def _parse(body: Body, size: int, count: int) -> object:
    raw = json.dumps(body).encode()
    return parse_index(raw, shard="shard-000000.tar", size=size, count=count)


def test_round_trip(index: tuple[Body, int, int]) -> None:
    body, size, count = index
    parsed = parse_index(
        json.dumps(body).encode(), shard="shard-000000.tar", size=size, count=count
    )
    assert len(parsed.samples) == count
    first = parsed.samples[0]
    assert type(first) is SampleEntry and type(first.members[0]) is Member
    key, offset, length, members = body["samples"][0]
    assert first == SampleEntry(key, offset, length, tuple(Member(*m) for m in members))
    again = encode_index(parsed.shard, parsed.size, parsed.samples)
    assert json.loads(again) == body


def _set(path: list[Any], value: Any) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        target: Any = body
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return change


HOSTILE: dict[str, Callable[[Body], None]] = {
    "wrong format": _set(["format"], "tar-index"),
    "wrong version": _set(["version"], 2),
    "another shard": _set(["shard"], "shard-000001.tar"),
    "another size": _set(["size"], 999),
    "one sample too few": lambda b: b["samples"].pop(),
    "samples not a list": _set(["samples"], {"a": 1}),
    "extra member": _set(["extra"], 1),
    "sample not a list": _set(["samples", 0], "x"),
    "key not a string": _set(["samples", 0, 0], 5),
    "key with a dot": _set(["samples", 0, 0], "x.y"),
    "key traversal": _set(["samples", 0, 0], "../x"),
    "offset a bool": _set(["samples", 0, 1], False),
    "negative length": _set(["samples", 0, 2], -1),
    "gap before a sample": _set(["samples", 1, 1], 512 * 100),
    "overlapping spans": lambda b: b["samples"][1].__setitem__(1, b["samples"][0][1]),
    "no members": _set(["samples", 0, 3], []),
    "member misplaced": lambda b: b["samples"][0][3][0].__setitem__(1, 0),
    "member past its span": lambda b: b["samples"][0][3][-1].__setitem__(2, 10**6),
    "extension upper case": _set(["samples", 0, 3, 0, 0], "TXT"),
    "extension traversal": _set(["samples", 0, 3, 0, 0], "../x"),
    "duplicate extension": lambda b: b["samples"][0][3].append(
        copy.deepcopy(b["samples"][0][3][0])
    ),
    "duplicate key": lambda b: b["samples"][1].__setitem__(0, b["samples"][0][0]),
    "past the end": _set(["samples", -1, 2], 10**9),
    "float offset": _set(["samples", 0, 1], 0.0),
    # The strict parser leaves the depth of an index to its shape checks (shape_checked):
    "member nested deep": _set(["samples", 0, 3, 0], [[[[[["txt", 512, 1]]]]]]),
    "members nested deep": _set(["samples", 0, 3], [[[[[[]]]]]]),
    "offset nested deep": _set(["samples", 0, 1], [[[[[0]]]]]),
    "format nested deep": _set(["format"], [[[[[[["mouthguard-shard-index"]]]]]]]),
    "key a lone surrogate": _set(["samples", 0, 0], "k\ud800"),
    "extension a lone surrogate": _set(["samples", 0, 3, 0, 0], "t\udfff"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_index_is_refused_naming_the_shard(index: tuple[Body, int, int], case: str) -> None:
    body, size, count = index
    changed = copy.deepcopy(body)
    HOSTILE[case](changed)
    with pytest.raises(ShardDamagedError, match=r"shard shard-000000\.tar") as caught:
        _parse(changed, size, count)
    assert caught.value.shard == "shard-000000.tar"


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"[1, 2]", b'{"a": 1, "a": 2}', b"[" * 100 + b"]" * 100, b"\xff\xfe"],
)
def test_garbage_is_refused(raw: bytes) -> None:
    with pytest.raises(ShardDamagedError, match="shard-000000"):
        parse_index(raw, shard="shard-000000.tar", size=10240, count=1)


# --- adopted shards: a user's tar, with extended headers and gaps between samples ---


def _adopted() -> Body:
    """Sample 0 has an extended header before its member; a directory entry sits before 1."""
    return {
        "format": "mouthguard-shard-index",
        "version": 1,
        "shard": "a/x.tar",
        "size": 10240,
        "samples": [
            ["./d/" + "k" * 150, 0, 1536, [["jpg", 1024, 10]]],
            ["./d/" + "k" * 150, 2048, 2048, [["json", 2560, 600], ["txt", 4096, 0]]],
        ],
    }


def _parse_adopted(body: Body) -> object:
    return parse_index(
        json.dumps(body).encode(), shard="a/x.tar", size=10240, count=2, adopted=True
    )


def test_an_adopted_index_may_skip_bytes_and_repeat_a_key() -> None:
    parsed = _parse_adopted(_adopted())
    assert [s.key for s in parsed.samples] == ["./d/" + "k" * 150] * 2  # type: ignore[attr-defined]
    with pytest.raises(ShardDamagedError):  # a packed shard's index may not
        parse_index(json.dumps(_adopted()).encode(), shard="a/x.tar", size=10240, count=2)


ADOPTED_HOSTILE: dict[str, Callable[[Body], None]] = {
    "overlapping samples": _set(["samples", 1, 1], 1024),
    "a member without a header before it": _set(["samples", 0, 3, 0, 1], 0),
    "members overlapping": _set(["samples", 1, 3, 1, 1], 3072),
    "span not ending at its last member": _set(["samples", 1, 2], 2560),
    "past the end": lambda b: b.__setitem__("size", 4000),
    "key traversal": _set(["samples", 0, 0], "../x"),
    "key absolute": _set(["samples", 0, 0], "/x"),
    "key with a control character": _set(["samples", 0, 0], "a\x01b"),
    "extension upper case": _set(["samples", 0, 3, 0, 0], "JPG"),
    "extension naming metadata": _set(["samples", 0, 3, 0, 0], "__key__"),
    "duplicate extension": _set(["samples", 1, 3, 1, 0], "json"),
}


@pytest.mark.parametrize("case", sorted(ADOPTED_HOSTILE))
def test_hostile_adopted_index_is_refused(case: str) -> None:
    body = _adopted()
    ADOPTED_HOSTILE[case](body)
    with pytest.raises(ShardDamagedError, match=r"a/x\.tar"):
        parse_index(
            json.dumps(body).encode(),
            shard="a/x.tar",
            size=body["size"] if case == "past the end" else 10240,
            count=2,
            adopted=True,
        )


@pytest.mark.parametrize(
    ("size", "fits"), [(10240, True), (4000, False), (True, False), ("10240", False), (0, False)]
)
def test_a_gzip_shards_index_states_the_tar_size_and_is_held_to_it(
    size: object, fits: bool
) -> None:
    """``size=None`` (a ``.tgz``: the manifest has the compressed size): the index's own counts."""
    body = _adopted() | {"shard": "a/x.tgz", "size": size}
    raw = json.dumps(body).encode()
    if fits:
        parsed = parse_index(raw, shard="a/x.tgz", size=None, count=2, adopted=True)
        assert parsed.size == 10240
        return
    with pytest.raises(ShardDamagedError, match=r"a/x\.tgz"):
        parse_index(raw, shard="a/x.tgz", size=None, count=2, adopted=True)
