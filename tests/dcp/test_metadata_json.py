"""DCP Metadata as JSON: exact round trips, and hostile input refused with ManifestError only."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from mouthguard.dcp import metadata_json
from mouthguard.dcp.metadata_json import StoredItem, decode_metadata, encode_metadata
from mouthguard.errors import FormatError, ManifestError, UnsupportedStateError
from mouthguard.format.manifest import Manifest, parse_manifest
from tests.dcp.conftest import Saved

Mutation = Callable[[dict[str, Any]], object]


@pytest.fixture(scope="module")
def manifest(saved: Saved) -> Manifest:
    """Step 1 of the 2-rank save: sharded chunks, a replicated tensor, bytes items."""
    return parse_manifest(
        (saved.root / "fast" / "r" / "000000000001" / "manifest.json").read_bytes()
    )


@pytest.fixture
def dcp_json(manifest: Manifest) -> dict[str, Any]:
    """A fresh mutable copy of the manifest's ``dcp`` member."""
    assert isinstance(manifest.dcp, dict)
    return copy.deepcopy(manifest.dcp)


def _item(doc: dict[str, Any], fqn: str) -> dict[str, Any]:
    return next(i for i in doc["items"] if i["fqn"] == fqn)


def _storage(doc: dict[str, Any], fqn: str) -> dict[str, Any]:
    return next(s for s in doc["storage"] if s["fqn"] == fqn)


def test_decoded_metadata_is_what_dcp_expects(manifest: Manifest) -> None:
    metadata = decode_metadata(manifest.dcp, manifest)
    embed = metadata.state_dict_metadata["model.embed.weight"]
    assert isinstance(embed, TensorStorageMetadata)
    assert embed.size == torch.Size([12, 6]) and embed.properties.dtype == torch.float32
    assert [tuple(c.offsets) for c in embed.chunks] == [(0, 0), (6, 0)]
    assert isinstance(metadata.state_dict_metadata["optim.step"], BytesStorageMetadata)
    stored = metadata.storage_data[MetadataIndex("model.embed.weight", [6, 0])]
    assert stored == StoredItem("rank-00001.safetensors", "model.embed.weight@6,0", stored.checksum)
    assert metadata.planner_data["model.embed.weight"] == ("model", "embed.weight")
    assert metadata.version == "1.0.0" and metadata.storage_meta is not None
    assert metadata.storage_meta.checkpoint_id == "r/000000000001"


def test_round_trip_is_exact(manifest: Manifest) -> None:
    decoded = decode_metadata(manifest.dcp, manifest)
    assert encode_metadata(decoded) == manifest.dcp
    assert decode_metadata(encode_metadata(decoded), manifest) == decoded


def test_planner_data_that_needs_pickle_is_refused_at_encode() -> None:
    metadata = Metadata(state_dict_metadata={}, planner_data={"x": object()}, storage_data={})
    with pytest.raises(UnsupportedStateError, match=r"planner_data\['x'\]"):
        encode_metadata(metadata)


def test_storage_of_another_plugin_is_refused_at_encode() -> None:
    metadata = Metadata(state_dict_metadata={}, storage_data={MetadataIndex("w"): "path"})
    with pytest.raises(FormatError, match="not a mouthguard item"):
        encode_metadata(metadata)


def _set(path: tuple[Any, ...], value: object) -> Mutation:
    def mutate(doc: dict[str, Any]) -> object:
        target: Any = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        return doc

    return mutate


def _then(change: Callable[[dict[str, Any]], object]) -> Mutation:
    """A mutation made in place (``list.append``...), returning the document."""

    def mutate(doc: dict[str, Any]) -> object:
        change(doc)
        return doc

    return mutate


HOSTILE: dict[str, tuple[Mutation, str]] = {
    "not an object": (lambda d: [d], "expected an object"),
    "other format": (_set(("format",), "pickle"), "not mouthguard.dcp"),
    "newer version": (_set(("format_version",), 2), "not mouthguard.dcp"),
    "items not a list": (_set(("items",), {"a": 1}), r"items: expected a list"),
    "fqn not a string": (_set(("items", 0, "fqn"), 7), r"items\[0\].fqn"),
    "unknown kind": (_set(("items", 0, "kind"), "pickle"), r"items\[0\].kind"),
    "unknown dtype": (_set(("items", 0, "dtype"), "F128"), "unknown tensor dtype"),
    "dtype not a string": (_set(("items", 0, "dtype"), ["F32"]), r"items\[0\].dtype"),
    "negative size": (_set(("items", 0, "size"), [-12, 6]), "malformed shape"),
    "boolean size": (_set(("items", 0, "size"), [True, 6]), "malformed shape"),
    "size beyond int64": (_set(("items", 0, "size"), [2**40, 2**40]), "too large"),
    "chunk outside": (_set(("items", 0, "chunks", 1, "offsets"), [7, 0]), "outside the size"),
    "chunk rank": (_set(("items", 0, "chunks", 0, "sizes"), [6]), "dimensions"),
    "negative offset": (_set(("items", 0, "chunks", 0, "offsets"), [-1, 0]), "malformed"),
    "chunks not a list": (_set(("items", 0, "chunks"), None), "chunks: expected a list"),
    "odd layout": (_set(("items", 0, "properties", "layout"), "jagged"), "unknown value"),
    "odd format": (_set(("items", 0, "properties", "memory_format"), 1), "expected a string"),
    "grad as text": (_set(("items", 0, "properties", "requires_grad"), "no"), "true or false"),
    "no properties": (_set(("items", 0, "properties"), None), "properties: expected an object"),
    "duplicate fqn": (_then(lambda d: d["items"].append(d["items"][0])), "duplicate fqn"),
    "unknown fqn stored": (_set(("storage", 0, "fqn"), "ghost"), "not an item"),
    "file outside": (_set(("storage", 0, "file"), "../rank-00000.safetensors"), "not a file"),
    "unknown tensor": (_set(("storage", 0, "tensor"), "nope"), "is not in"),
    "other algorithm": (_set(("storage", 0, "checksum"), "md5:" + "0" * 32), "malformed"),
    "short checksum": (_set(("storage", 0, "checksum"), "xxh3-128:00"), "malformed"),
    "negative index": (_set(("storage", 0, "index"), -1), "non-negative"),
    "bool index": (_set(("storage", 0, "index"), True), "non-negative"),
    "offset nowhere": (_set(("storage", 0, "offset"), [3, 0]), "no chunk"),
    "missing storage": (_then(lambda d: d["storage"].pop(0)), "has no stored data"),
    "stored twice": (_then(lambda d: d["storage"].append(d["storage"][0])), "stored twice"),
    "planner_data tag": (_set(("planner_data",), {"$evil": 1}), "planner_data"),
    "modules not strings": (_set(("storage_meta", "modules"), [1]), "list of strings"),
    "checkpoint_id not a string": (_set(("storage_meta", "checkpoint_id"), 5), "checkpoint_id"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_metadata_is_rejected(
    manifest: Manifest, dcp_json: dict[str, Any], case: str
) -> None:
    mutate, match = HOSTILE[case]
    with pytest.raises(ManifestError, match=match) as info:
        decode_metadata(mutate(dcp_json), manifest)  # type: ignore[arg-type]
    assert "DCP metadata" in str(info.value)


def test_location_must_match_the_chunk(manifest: Manifest, dcp_json: dict[str, Any]) -> None:
    _storage(dcp_json, "model.fc.weight")["tensor"] = "model.fc.bias"  # other shape, same file
    with pytest.raises(ManifestError, match="which is not the chunk"):
        decode_metadata(dcp_json, manifest)


def test_bytes_item_must_be_stored_as_u8(manifest: Manifest, dcp_json: dict[str, Any]) -> None:
    _item(dcp_json, "model.fc.bias")["kind"] = "bytes"
    with pytest.raises(ManifestError, match="1-D U8"):
        decode_metadata(dcp_json, manifest)


def test_chunks_larger_than_the_tensor_are_rejected(
    manifest: Manifest, dcp_json: dict[str, Any]
) -> None:
    item = _item(dcp_json, "model.norm.scale")
    item["chunks"].append(dict(item["chunks"][0], offsets=[0]))
    with pytest.raises(ManifestError, match="more elements"):
        decode_metadata(dcp_json, manifest)


def test_item_count_is_bounded(
    manifest: Manifest, dcp_json: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metadata_json, "MAX_ITEMS", 3)
    with pytest.raises(ManifestError, match="more than the limit of 3"):
        decode_metadata(dcp_json, manifest)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    yield path


def test_any_replaced_value_is_accepted_or_refused_cleanly(
    manifest: Manifest, dcp_json: dict[str, Any]
) -> None:
    """Every node replaced by hostile values: decode succeeds or raises ManifestError only."""
    hostile: list[object] = [None, -1, 2**70, True, "x", [], {}, [-1], 1.5]
    paths = [p for p in _leaves(dcp_json) if p]
    assert len(paths) > 200
    refused = 0
    for path in paths:
        for value in hostile:
            doc = json.loads(json.dumps(dcp_json))
            _set(path, value)(doc)
            try:
                decode_metadata(doc, manifest)
            except ManifestError:
                refused += 1
    assert refused > len(paths) * 4
