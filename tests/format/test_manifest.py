"""Tests of the self-checksummed manifest: round trips, corruption and hostile content.

The starting point is a manifest written by a real ``Checkpointer.save``. Damage to
its bytes (any flipped byte, any truncation) must fail the checksum; hostile content
with a *valid* checksum (made with :func:`seal`) must fail validation. Either way the
only exception is ManifestError, with a message saying what is wrong.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mouthguard
from mouthguard.errors import ManifestError
from mouthguard.format import manifest as manifest_module
from mouthguard.format import sealed as sealed_module
from mouthguard.format.checksum import xxh3_digest
from mouthguard.format.manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_FILES,
    MAX_STEP,
    Manifest,
    SaveTiming,
    parse_manifest,
    seal,
)
from mouthguard.policy.importance import Importance

_MARKER = b',\n "manifest_checksum": "'
_END = b'"\n}\n'


# --- fixtures ------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_raw(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The manifest bytes of a real save with several tensors, a tie and plain state."""
    root = tmp_path_factory.mktemp("store")
    shared = torch.arange(6.0).view(2, 3)
    state = {
        "model": {"fc": {"weight": shared, "bias": torch.zeros(3)}, "tied": shared},
        "optim": {"step": 12, "lr": 0.5, "betas": (0.9, 0.999)},
        "empty": torch.empty(0, dtype=torch.int64),
        "mask": torch.tensor([True, False]),
    }
    mouthguard.Checkpointer(root, run="r").save(1, state, reference={"loss": 2.5})
    return (root / "fast" / "r" / "000000000001" / "manifest.json").read_bytes()


@pytest.fixture
def body(saved_raw: bytes) -> dict[str, Any]:
    """A fresh, mutable copy of the saved manifest's body (without its checksum)."""
    parsed = json.loads(saved_raw)
    del parsed["manifest_checksum"]
    return parsed


def reject(body: dict[str, Any], match: str) -> ManifestError:
    """Seal ``body`` (so the checksum is valid) and assert parsing rejects it."""
    raw = seal(body)
    with pytest.raises(ManifestError, match=match) as info:
        parse_manifest(raw)
    return info.value


def seal_raw(prefix: bytes) -> bytes:
    """Append a valid checksum trailer to arbitrary prefix bytes."""
    return prefix + _MARKER + xxh3_digest(prefix).encode() + _END


def add_file(body: dict[str, Any], name: str, **extra: Any) -> dict[str, Any]:
    record = copy.deepcopy(body["files"][0])
    record["name"] = name
    record.update(extra)
    body["files"].append(record)
    return record


# --- round trip ----------------------------------------------------------------


def test_real_manifest_parses(saved_raw: bytes) -> None:
    m = parse_manifest(saved_raw)
    assert m.run == "r"
    assert m.step == 1
    assert m.importance is Importance.ROUTINE
    assert m.world_size == 1
    assert m.created.tzinfo is not None
    assert [f.name for f in m.files] == ["rank-00000.safetensors"]
    record = m.files[0]
    assert record.rank == 0
    assert record.data_offset == 4096
    assert record.checksum.startswith("xxh3-128:")
    assert record.sha256 is None
    names = {t.name for t in m.tensors}
    # The tied weight is stored once.
    assert names == {"model.fc.weight", "model.fc.bias", "empty", "mask"}
    weight = next(t for t in m.tensors if t.name == "model.fc.weight")
    assert (weight.dtype, weight.shape, weight.length) == ("F32", (2, 3), 24)
    assert m.tensor_bytes == 24 + 12 + 0 + 2
    assert m.nbytes == record.size == 4096 + m.tensor_bytes
    assert m.framework["mouthguard"] == mouthguard.__version__
    assert m.reference == {"loss": 2.5}
    assert m.states[0]["optim"]["step"] == 12  # type: ignore[index, call-overload]


def test_round_trip_is_byte_identical(saved_raw: bytes) -> None:
    m = parse_manifest(saved_raw)
    assert m.to_bytes() == saved_raw
    assert Manifest.from_bytes(m.to_bytes()) == m


def test_seal_of_unchanged_body_reproduces_manifest(saved_raw: bytes, body: dict[str, Any]) -> None:
    assert seal(body) == saved_raw


def test_tensors_in_and_file_lookup(saved_raw: bytes) -> None:
    m = parse_manifest(saved_raw)
    ordered = m.tensors_in("rank-00000.safetensors")
    assert [t.offset for t in ordered] == sorted(t.offset for t in m.tensors)
    assert m.file("rank-00000.safetensors") is m.files[0]
    with pytest.raises(ManifestError, match="no file"):
        m.file("rank-00001.safetensors")


def test_sha256_round_trips(body: dict[str, Any]) -> None:
    body["files"][0]["sha256"] = "sha256:" + "ab" * 32
    m = parse_manifest(seal(body))
    assert m.files[0].sha256 == "sha256:" + "ab" * 32
    assert parse_manifest(m.to_bytes()) == m


def test_multi_rank_manifest_parses(body: dict[str, Any]) -> None:
    add_file(body, "rank-00001.safetensors", rank=1, size=4096)  # a rank without tensors
    body["world_size"] = 2
    body["states"].append({"step": 1})
    m = parse_manifest(seal(body))
    assert [(f.name, f.rank) for f in m.files] == [
        ("rank-00000.safetensors", 0),
        ("rank-00001.safetensors", 1),
    ]
    assert m.tensors_in("rank-00001.safetensors") == []
    assert m.nbytes == m.files[0].size + 4096


# --- the optional DCP member ---------------------------------------------------


def test_manifest_without_dcp_has_no_dcp_member(saved_raw: bytes) -> None:
    """Existing manifests (and so their checksums) are unchanged by the optional field."""
    assert b'"dcp"' not in saved_raw
    m = parse_manifest(saved_raw)
    assert m.dcp is None and not m.is_dcp


def test_dcp_member_round_trips_byte_identically(body: dict[str, Any]) -> None:
    body["dcp"] = {"format": "mouthguard.dcp", "items": [{"fqn": "w", "size": [2, 3]}]}
    raw = seal(body)
    m = parse_manifest(raw)
    assert m.is_dcp and m.dcp == body["dcp"]
    assert m.to_bytes() == raw


@pytest.mark.parametrize("value", [None, [], "pickle", 1, True])
def test_dcp_member_must_be_an_object(body: dict[str, Any], value: object) -> None:
    body["dcp"] = value
    reject(body, "'dcp' must be an object")


def test_dcp_member_counts_towards_the_size_limit(
    body: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    body["dcp"] = {"blob": "x" * 10_000}
    raw = seal(body)
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", len(raw) - 1)
    with pytest.raises(ManifestError, match="limit"):
        parse_manifest(raw)


# --- the optional save member (how the save went) -----------------------------


def test_a_checkpointer_save_records_its_timing(saved_raw: bytes, body: dict[str, Any]) -> None:
    save = parse_manifest(saved_raw).save
    assert save is not None and save.mode == "sync"
    assert save.seconds > 0 and save.stall_seconds == save.seconds  # a sync save blocks throughout
    assert set(body["save"]) == {"mode", "seconds", "stall_seconds"}


def test_an_async_save_records_a_stall_shorter_than_the_save(tmp_path: Any) -> None:
    ckpt = mouthguard.Checkpointer(tmp_path, run="r", background=False)
    ckpt.save_async(3, {"w": torch.ones(1 << 16)}).result()
    raw = (tmp_path / "fast" / "r" / "000000000003" / "manifest.json").read_bytes()
    save = parse_manifest(raw).save
    assert save is not None and save.mode == "async"
    # An ordering, not a speed: both are measured from the same start on one monotonic
    # clock, the stall when save_async returns, the save's seconds later, in its job.
    assert 0 < save.stall_seconds <= save.seconds


def test_a_manifest_without_the_save_member_parses(body: dict[str, Any]) -> None:
    """Manifests written before the member existed (and DCP's) have no timing."""
    del body["save"]
    raw = seal(body)
    m = parse_manifest(raw)
    assert m.save is None and m.to_bytes() == raw and b'"save"' not in raw


def test_save_member_round_trips_byte_identically(body: dict[str, Any]) -> None:
    body["save"] = {"mode": "async", "seconds": 2, "stall_seconds": 0.25}
    m = parse_manifest(seal(body))
    assert m.save == SaveTiming("async", 2.0, 0.25)
    assert parse_manifest(m.to_bytes()).save == m.save


@pytest.mark.parametrize(
    "value",
    [
        None,
        [],
        {"mode": "sync", "seconds": 1.0},  # a member missing
        {"mode": "sync", "seconds": 1.0, "stall_seconds": 1.0, "extra": 1},
        {"mode": "eventually", "seconds": 1.0, "stall_seconds": 1.0},
        {"mode": 1, "seconds": 1.0, "stall_seconds": 1.0},
        {"mode": "sync", "seconds": True, "stall_seconds": 1.0},
        {"mode": "sync", "seconds": "1", "stall_seconds": 1.0},
        {"mode": "sync", "seconds": -1.0, "stall_seconds": 1.0},
        {"mode": "sync", "seconds": 1.0, "stall_seconds": 10**400},
        {"mode": "sync", "seconds": 1e300, "stall_seconds": 1.0},
    ],
)
def test_save_member_is_checked_as_hostile_input(body: dict[str, Any], value: object) -> None:
    body["save"] = value
    reject(body, "save")


# --- corruption of the bytes ---------------------------------------------------


def test_every_single_bit_flip_is_detected(saved_raw: bytes) -> None:
    for position in range(len(saved_raw)):
        damaged = bytearray(saved_raw)
        damaged[position] ^= 0x01
        with pytest.raises(ManifestError):
            parse_manifest(bytes(damaged))


@pytest.mark.parametrize("replacement", [b" ", b"\x00", b"0", b'"', b"\n", b"\xff", b"}"])
def test_every_single_byte_replacement_is_detected(saved_raw: bytes, replacement: bytes) -> None:
    changed = 0
    for position in range(len(saved_raw)):
        if saved_raw[position : position + 1] == replacement:
            continue
        damaged = saved_raw[:position] + replacement + saved_raw[position + 1 :]
        with pytest.raises(ManifestError):
            parse_manifest(damaged)
        changed += 1
    assert changed > len(saved_raw) // 2


def test_every_truncation_is_detected(saved_raw: bytes) -> None:
    for length in range(len(saved_raw)):
        with pytest.raises(ManifestError):
            parse_manifest(saved_raw[:length])


@pytest.mark.parametrize("suffix", [b"\n", b" ", b"x", b"{}", b'"\n}\n'])
def test_appended_bytes_are_detected(saved_raw: bytes, suffix: bytes) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(saved_raw + suffix)


def test_inserted_whitespace_is_detected(saved_raw: bytes) -> None:
    # Semantically the same JSON, but not the bytes that were checksummed.
    for position in range(1, len(saved_raw), 7):
        with pytest.raises(ManifestError):
            parse_manifest(saved_raw[:position] + b" " + saved_raw[position:])


def test_corruption_message_names_checksum(saved_raw: bytes) -> None:
    damaged = saved_raw.replace(b'"step": 1', b'"step": 2')
    with pytest.raises(ManifestError, match="checksum mismatch"):
        parse_manifest(damaged)
    with pytest.raises(ManifestError, match="no checksum trailer"):
        parse_manifest(saved_raw[:-1])


@pytest.mark.parametrize(
    "raw", [b"", b"{}", b"null", b"\x00" * 64, b'{"format": "mouthguard.checkpoint"}\n']
)
def test_non_manifests_are_rejected(raw: bytes) -> None:
    with pytest.raises(ManifestError, match="no checksum trailer"):
        parse_manifest(raw)


# --- hostile content with a valid checksum --------------------------------------


@pytest.mark.parametrize(
    "name",
    ["../x", "..", ".", "/etc/passwd", "a/b", "a\\b", ".hidden", "", " ", "x" * 300, "nul\x00"],
)
def test_file_names_outside_the_checkpoint_are_rejected(body: dict[str, Any], name: str) -> None:
    old = body["files"][0]["name"]
    body["files"][0]["name"] = name
    for tensor in body["tensors"]:
        tensor["file"] = name
    error = reject(body, "outside its checkpoint")
    assert repr(name)[:20] in str(error)
    assert old not in str(error)


def test_manifest_json_as_file_name_is_rejected(body: dict[str, Any]) -> None:
    body["files"][0]["name"] = MANIFEST_NAME
    for tensor in body["tensors"]:
        tensor["file"] = MANIFEST_NAME
    reject(body, "reserved file name 'manifest.json'")


def test_duplicate_file_names_are_rejected(body: dict[str, Any]) -> None:
    add_file(body, body["files"][0]["name"])
    reject(body, "duplicate or reserved file name 'rank-00000.safetensors'")


@pytest.mark.parametrize("name", [None, 3, ["a"], {"a": 1}, True])
def test_non_string_file_name_is_rejected(body: dict[str, Any], name: object) -> None:
    body["files"][0]["name"] = name
    reject(body, "'name' must be a string")


def test_tensor_past_end_of_file_is_rejected(body: dict[str, Any]) -> None:
    size = body["files"][0]["size"]
    last = max(body["tensors"], key=lambda t: t["offset"] + t["length"])
    last["offset"] = size + 100
    reject(body, "gap before tensor")


def test_file_shorter_than_its_tensors_is_rejected(body: dict[str, Any]) -> None:
    body["files"][0]["size"] -= 1
    reject(body, r"end at byte \d+ but the file has \d+ bytes")


def test_file_longer_than_its_tensors_is_rejected(body: dict[str, Any]) -> None:
    body["files"][0]["size"] += 4096
    reject(body, r"end at byte \d+ but the file has \d+ bytes")


def test_tensor_inside_header_is_rejected(body: dict[str, Any]) -> None:
    first = min(body["tensors"], key=lambda t: t["offset"])
    first["offset"] -= 8
    reject(body, "overlaps another tensor or the header")


def test_overlapping_tensors_are_rejected(body: dict[str, Any]) -> None:
    by_offset = sorted((t for t in body["tensors"] if t["length"] > 0), key=lambda t: t["offset"])
    by_offset[1]["offset"] = by_offset[0]["offset"]
    reject(body, "overlaps another tensor")


def test_gap_between_tensors_is_rejected(body: dict[str, Any]) -> None:
    ordered = sorted(body["tensors"], key=lambda t: (t["offset"], t["length"]))
    for tensor in ordered[1:]:
        tensor["offset"] += 4
    body["files"][0]["size"] += 4
    reject(body, "has a gap before tensor")


def test_tensor_in_unknown_file_is_rejected(body: dict[str, Any]) -> None:
    body["tensors"][0]["file"] = "rank-00009.safetensors"
    reject(body, "refers to unknown file 'rank-00009.safetensors'")


def test_duplicate_tensor_is_rejected(body: dict[str, Any]) -> None:
    body["tensors"].append(copy.deepcopy(body["tensors"][0]))
    reject(body, "duplicate tensor")


@pytest.mark.parametrize(
    "step", ["1", True, False, -1, MAX_STEP + 1, 10**40, 1.0, None, [1], {"v": 1}]
)
def test_malformed_step_is_rejected(body: dict[str, Any], step: object) -> None:
    body["step"] = step
    reject(body, "'step' must be an integer")


def test_step_boundaries_are_accepted(body: dict[str, Any]) -> None:
    for step in (0, MAX_STEP):
        body["step"] = step
        assert parse_manifest(seal(body)).step == step


def test_missing_step_is_rejected(body: dict[str, Any]) -> None:
    del body["step"]
    reject(body, "'step' must be an integer")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("size", -1, "'size' must be an integer"),
        ("size", "4120", "'size' must be an integer"),
        ("size", 2**60, "'size' must be an integer"),
        ("size", 4120.0, "'size' must be an integer"),
        ("rank", 1, "'rank' must be an integer"),
        ("rank", -1, "'rank' must be an integer"),
        ("rank", False, "'rank' must be an integer"),
        ("data_offset", 4095, "data_offset"),
        ("data_offset", 0, "not a padded header end"),
        ("data_offset", 8192, "data_offset"),
        ("checksum", "xxh3-128:XYZ", "malformed xxh3-128 digest"),
        ("checksum", "xxh3-128:" + "0" * 31, "malformed xxh3-128 digest"),
        ("checksum", "xxh3-128:" + "0" * 33, "malformed xxh3-128 digest"),
        ("checksum", "xxh3-128:" + "A" * 32, "malformed xxh3-128 digest"),
        ("checksum", "sha256:" + "0" * 32, "malformed xxh3-128 digest"),
        ("checksum", "0" * 32, "malformed xxh3-128 digest"),
        ("checksum", " xxh3-128:" + "0" * 32, "malformed xxh3-128 digest"),
        ("checksum", "xxh3-128:" + "0" * 32 + "\n", "malformed xxh3-128 digest"),
        ("checksum", 12, "malformed xxh3-128 digest"),
        ("checksum", None, "malformed xxh3-128 digest"),
        ("sha256", "sha256:" + "0" * 63, "malformed sha256 digest"),
        ("sha256", "xxh3-128:" + "0" * 32, "malformed sha256 digest"),
        ("sha256", "sha256:" + "g" * 64, "malformed sha256 digest"),
        ("sha256", 0, "malformed sha256 digest"),
    ],
)
def test_malformed_file_fields_are_rejected(
    body: dict[str, Any], field: str, value: object, match: str
) -> None:
    body["files"][0][field] = value
    reject(body, match)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("shape", [2.0, 3], "malformed shape"),
        ("shape", [2, 3.5], "malformed shape"),
        ("shape", [True, 3], "malformed shape"),
        ("shape", [-2, -3], "malformed shape"),
        ("shape", ["2", 3], "malformed shape"),
        ("shape", "2,3", "malformed shape"),
        ("shape", None, "malformed shape"),
        ("shape", [1] * 65, "malformed shape"),
        ("shape", [3, 2, 1, 1], None),  # same element count: accepted
        ("shape", [7], "length does not match"),
        ("length", 25, "length does not match"),
        ("length", -24, "'length' must be an integer"),
        ("length", "24", "'length' must be an integer"),
        ("offset", -1, "'offset' must be an integer"),
        ("offset", 4096.0, "'offset' must be an integer"),
        ("offset", None, "'offset' must be an integer"),
        ("dtype", "F128", "unknown tensor dtype"),
        ("dtype", "F64", "length does not match"),
        ("dtype", None, "'dtype' must be a string"),
        ("name", 5, "'name' must be a string"),
        ("file", None, "'file' must be a string"),
    ],
)
def test_malformed_tensor_fields_are_rejected(
    body: dict[str, Any], field: str, value: object, match: str | None
) -> None:
    weight = next(t for t in body["tensors"] if t["name"] == "model.fc.weight")
    weight[field] = value
    if match is None:
        assert parse_manifest(seal(body)).tensors[0].shape == (3, 2, 1, 1)
    else:
        reject(body, match)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("files", {"0": {}}, "files must be a non-empty list"),
        ("files", [], "files must be a non-empty list"),
        ("files", None, "files must be a non-empty list"),
        ("files", "rank-00000.safetensors", "files must be a non-empty list"),
        ("files", [1], r"files\[0\] is not an object"),
        ("tensors", {}, "tensors must be a list"),
        ("tensors", None, "tensors must be a list"),
        ("tensors", ["x"], r"tensors\[0\] is not an object"),
        ("states", [], "states must be a list with one entry per rank"),
        ("states", [{}, {}], "states must be a list with one entry per rank"),
        ("states", {"0": {}}, "states must be a list with one entry per rank"),
        ("states", None, "states must be a list with one entry per rank"),
        ("format_version", 2, "unsupported manifest format_version 2"),
        ("format_version", 0, "unsupported manifest format_version 0"),
        ("format_version", "1", "unsupported manifest format_version '1'"),
        ("format_version", None, "unsupported manifest format_version None"),
        ("format", "mouthguard.checkpoint.v2", "not a mouthguard manifest"),
        ("format", "safetensors", "not a mouthguard manifest"),
        ("format", None, "not a mouthguard manifest"),
        ("world_size", 0, "world_size must be at least 1"),
        ("world_size", -1, "'world_size' must be an integer"),
        ("world_size", MAX_FILES + 1, "'world_size' must be an integer"),
        ("world_size", 10**100, "'world_size' must be an integer"),
        ("world_size", "1", "'world_size' must be an integer"),
        ("world_size", True, "'world_size' must be an integer"),
        ("world_size", 2, "one file per rank"),
        ("run", "../other", "invalid"),
        ("run", "a/b", "invalid"),
        ("run", 7, "'run' must be a string"),
        ("importance", "priceless", "unknown importance"),
        ("importance", None, "'importance' must be a string"),
        ("created", "yesterday", "Invalid isoformat|invalid"),
        ("created", 1700000000, "'created' must be a string"),
        ("framework", {"torch": 2}, "framework must map names to version strings"),
        ("framework", ["torch"], "framework must map names to version strings"),
    ],
)
def test_malformed_top_level_fields_are_rejected(
    body: dict[str, Any], key: str, value: object, match: str
) -> None:
    body[key] = value
    reject(body, match)


@pytest.mark.parametrize("key", ["format", "format_version", "run", "files", "tensors", "states"])
def test_missing_required_field_is_rejected(body: dict[str, Any], key: str) -> None:
    del body[key]
    with pytest.raises(ManifestError):
        parse_manifest(seal(body))


def test_file_without_ranks_of_world_rejected_by_rank_bound(body: dict[str, Any]) -> None:
    add_file(body, "rank-00001.safetensors", rank=5)
    body["world_size"] = 2
    body["states"].append(None)
    reject(body, "'rank' must be an integer in \\[0, 1\\]")


def test_oversized_input_is_rejected_before_parsing(
    saved_raw: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("an oversized manifest must not be parsed")

    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", len(saved_raw) - 1)
    monkeypatch.setattr(sealed_module, "xxh3_digest", fail)
    monkeypatch.setattr(sealed_module.typed_json, "loads_strict", fail)
    with pytest.raises(ManifestError, match=f"manifest is {len(saved_raw)} bytes, larger than"):
        parse_manifest(saved_raw)


def test_size_limit_is_inclusive(saved_raw: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", len(saved_raw))
    assert parse_manifest(saved_raw).step == 1


def test_default_size_limit_is_256_mib() -> None:
    assert manifest_module.MAX_MANIFEST_BYTES == 256 * 1024 * 1024


def test_deeply_nested_json_is_rejected() -> None:
    for prefix in (
        b"[" * 100_000,
        b'{"a": ' + b"[" * 100_000,
        b"{" + b'"a": {' * 50_000,
        b'{"states": [' + b"[" * 1000 + b"]" * 1000,
    ):
        with pytest.raises(ManifestError, match="not valid JSON"):
            parse_manifest(seal_raw(prefix))


def test_deep_but_balanced_state_is_rejected(body: dict[str, Any]) -> None:
    deep: Any = 0
    for _ in range(300):
        deep = [deep]
    body["states"] = [deep]
    reject(body, "nested deeper")


@pytest.mark.parametrize(
    "prefix",
    [
        b"\xff\xfe{",  # not UTF-8
        b'{"format": "mouthguard.checkpoint", "format": "mouthguard.checkpoint"',  # duplicate key
        b'{"step": NaN',
        b'{"step": 1e999',
        b"[1, 2",  # body is an array
    ],
)
def test_bad_json_with_valid_checksum_is_rejected(prefix: bytes) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(seal_raw(prefix))


@pytest.mark.parametrize("body", [{}, {"format": FORMAT_NAME}, {"a": [1, {"b": None}]}])
def test_sealed_non_manifest_objects_are_rejected(body: dict[str, Any]) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(seal(body))


def test_checksum_key_inside_body_is_rejected(body: dict[str, Any]) -> None:
    body["manifest_checksum"] = xxh3_digest(b"")
    with pytest.raises(ManifestError, match="duplicate object key"):
        parse_manifest(seal(body))


def test_checksum_is_over_raw_bytes(saved_raw: bytes) -> None:
    # Re-serialised differently (compact), the same content is not the sealed bytes.
    parsed = json.loads(saved_raw)
    compact = json.dumps(parsed, separators=(",", ":")).encode()
    with pytest.raises(ManifestError):
        parse_manifest(compact)
    assert parse_manifest(saved_raw).step == parsed["step"]


@pytest.mark.parametrize("shape", [[0, 2**63], [0, 2**70], [2**62, 2**62, 0]])
def test_tensor_dims_beyond_int64_are_rejected(body: dict[str, Any], shape: list[int]) -> None:
    body["tensors"].append(
        {
            "name": "huge_empty",
            "file": body["files"][0]["name"],
            "dtype": "F32",
            "shape": shape,
            "offset": body["files"][0]["data_offset"],
            "length": 0,
        }
    )
    with pytest.raises(ManifestError, match="shape"):
        parse_manifest(seal(body))


# --- property tests --------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)),
        min_size=1,
        max_size=4,
    ),
    st.integers(min_value=0),
    st.binary(max_size=8),
)
def test_random_byte_mutations_only_raise_manifest_error(
    saved_raw: bytes, edits: list[tuple[int, int]], cut: int, insert: bytes
) -> None:
    damaged = bytearray(saved_raw)
    for position, value in edits:
        damaged[position % len(damaged)] = value
    position = cut % (len(damaged) + 1)
    damaged[position:position] = insert
    try:
        parsed = parse_manifest(bytes(damaged))
    except ManifestError:
        return
    assert bytes(damaged) == saved_raw
    assert parsed == parse_manifest(saved_raw)


_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "rank-00000.safetensors",
            "F32",
            "F128",
            "../x",
            "manifest.json",
            "xxh3-128:" + "0" * 32,
            "2024-01-01T00:00:00+00:00",
            "9999-12-31T23:59:59.999999-23:59",
            "routine",
            {"$tensor": "model.fc.weight"},
        ]
    )
)
_json = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


@settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_sealed_mutations_only_raise_manifest_error(
    saved_raw: bytes, data: st.DataObject
) -> None:
    original = json.loads(saved_raw)
    del original["manifest_checksum"]
    mutated = copy.deepcopy(original)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3), label="edits")):
        path = data.draw(st.sampled_from(_paths(mutated)[1:]), label="path")
        parent = mutated
        for part in path[:-1]:
            parent = parent[part]
        action = data.draw(st.sampled_from(["replace", "delete", "insert"]), label="action")
        if action == "delete":
            del parent[path[-1]]
        elif action == "insert" and isinstance(parent, list):
            parent.insert(path[-1], copy.deepcopy(data.draw(_json, label="value")))
        else:
            # Deep copies: later edits must never mutate an object hypothesis handed out.
            parent[path[-1]] = copy.deepcopy(data.draw(_json, label="value"))
    raw = seal(mutated)
    try:
        parsed = parse_manifest(raw)
    except ManifestError:
        return
    # Whatever is accepted is a consistent manifest that re-serialises stably.
    assert isinstance(parsed, Manifest)
    assert parse_manifest(parsed.to_bytes()) == parsed
    for record in parsed.files:
        tensors = parsed.tensors_in(record.name)
        cursor = record.data_offset
        for tensor in tensors:
            assert tensor.offset == cursor
            cursor += tensor.length
        assert cursor == record.size
        assert 0 <= record.rank < parsed.world_size
    assert len(parsed.states) == parsed.world_size


def test_format_constants() -> None:
    assert FORMAT_NAME == "mouthguard.checkpoint"
    assert FORMAT_VERSION == 1
