"""DCP's ``Metadata`` as explicit JSON: an encoder, and a decoder for hostile input.

``torch.distributed.checkpoint.FileSystemWriter`` pickles its ``Metadata`` into
``.metadata``; loading that runs pickle on bytes from storage. mouthguard never
does: the metadata is written field by field into the manifest's ``dcp`` member
and rebuilt field by field, so reading a checkpoint can never execute code.
(The checkpoint's *bytes items* -- non-tensor values such as a step counter --
are ``torch.save`` output produced by DCP's own planner; mouthguard stores them
as opaque ``U8`` tensors and hands them back to DCP's ``load_bytes`` unchanged.)

The JSON form::

    {"format": "mouthguard.dcp", "format_version": 1, "dcp_version": "1.0.0",
     "items": [                                   # state_dict_metadata, in order
       {"fqn": "model.w", "kind": "tensor", "dtype": "F32", "size": [10, 4],
        "properties": {"layout": "strided", "requires_grad": false,
                       "memory_format": "contiguous_format", "pin_memory": false},
        "chunks": [{"offsets": [0, 0], "sizes": [5, 4]}, ...]},
       {"fqn": "step", "kind": "bytes"}],
     "storage": [                                 # storage_data, keyed by MetadataIndex
       {"fqn": "model.w", "offset": [0, 0], "index": 0,
        "file": "rank-00000.safetensors", "tensor": "model.w",
        "checksum": "xxh3-128:..."}, ...],
     "planner_data": <typed JSON>, "storage_meta": {...} | null}

Each storage entry names the rank file and the tensor (in the manifest's tensor
table) holding one stored chunk or bytes item, with the xxh3-128 of exactly
those bytes: a resharded load reads only some chunks, so it cannot rely on the
whole-file checksum and checks each chunk against its own.

:func:`decode_metadata` validates everything before DCP sees it -- types, sizes,
dtypes, chunk bounds, that every chunk has exactly one stored location and that
the location exists in the manifest with a matching dtype and shape -- and
fails only with :class:`~mouthguard.errors.ManifestError` naming what is wrong.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from mouthguard.errors import FormatError, InvalidKeyError, ManifestError
from mouthguard.format import typed_json
from mouthguard.format.checksum import XXH3_128, validate_digest
from mouthguard.format.dtypes import dtype_code, torch_dtype, validate_shape
from mouthguard.format.manifest import Manifest, TensorRecord
from mouthguard.format.typed_json import JsonValue
from mouthguard.tiers.object_keys import validate_segment

FORMAT_NAME = "mouthguard.dcp"
FORMAT_VERSION = 1
#: Most state-dict entries, and most stored chunks, one checkpoint may declare.
MAX_ITEMS = 1 << 22
#: Most chunks one tensor may be split into.
MAX_CHUNKS = 1 << 20

_LAYOUTS: dict[str, torch.layout] = {
    "strided": torch.strided,
    "sparse_coo": torch.sparse_coo,
    "sparse_csr": torch.sparse_csr,
}
_MEMORY_FORMATS: dict[str, torch.memory_format] = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "preserve_format": torch.preserve_format,
}


@dataclass(frozen=True)
class StoredItem:
    """Where one DCP write item lives: ``Metadata.storage_data``'s values.

    Attributes:
        file: the rank file (a name in the manifest's file table).
        tensor: the tensor's name in that file (and in the manifest's tensor table).
        checksum: ``xxh3-128:<hex>`` of exactly the item's stored bytes.
    """

    file: str
    tensor: str
    checksum: str


# --- encoding ------------------------------------------------------------------


def _name_of(table: Mapping[str, object], value: object, what: str) -> str:
    for name, known in table.items():
        if known == value:
            return name
    raise FormatError(f"DCP metadata: {what} {value!r} cannot be stored")


def _properties_json(props: TensorProperties) -> dict[str, JsonValue]:
    return {
        "layout": _name_of(_LAYOUTS, props.layout, "layout"),
        "requires_grad": bool(props.requires_grad),
        "memory_format": _name_of(_MEMORY_FORMATS, props.memory_format, "memory format"),
        "pin_memory": bool(props.pin_memory),
    }


def _item_json(fqn: str, meta: object) -> dict[str, JsonValue]:
    if isinstance(meta, BytesStorageMetadata):
        return {"fqn": fqn, "kind": "bytes"}
    if not isinstance(meta, TensorStorageMetadata):
        raise FormatError(f"DCP metadata: {fqn!r} has unknown storage type {type(meta).__name__}")
    return {
        "fqn": fqn,
        "kind": "tensor",
        "dtype": dtype_code(meta.properties.dtype),
        "size": [int(d) for d in meta.size],
        "properties": _properties_json(meta.properties),
        "chunks": [
            {"offsets": [int(o) for o in c.offsets], "sizes": [int(s) for s in c.sizes]}
            for c in meta.chunks
        ],
    }


def _storage_json(index: MetadataIndex, stored: object) -> dict[str, JsonValue]:
    if not isinstance(stored, StoredItem):
        raise FormatError(f"DCP metadata: storage of {index.fqn!r} is not a mouthguard item")
    return {
        "fqn": index.fqn,
        "offset": None if index.offset is None else [int(o) for o in index.offset],
        "index": index.index,
        "file": stored.file,
        "tensor": stored.tensor,
        "checksum": stored.checksum,
    }


def _storage_meta_json(meta: StorageMeta | None) -> JsonValue:
    if meta is None:
        return None
    checkpoint_id = meta.checkpoint_id
    return {
        "checkpoint_id": None if checkpoint_id is None else os.fspath(checkpoint_id),
        "save_id": meta.save_id,
        "load_id": meta.load_id,
        "modules": [str(m) for m in meta.modules],
    }


def encode_metadata(metadata: Metadata) -> dict[str, JsonValue]:
    """Encode DCP ``metadata`` (whose ``storage_data`` maps to :class:`StoredItem`).

    Raises:
        FormatError: a dtype, layout or storage type cannot be stored.
        UnsupportedStateError: ``planner_data`` holds an object typed JSON cannot
            carry (the message names its key path).
    """
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise FormatError("DCP metadata has no storage_data mapping")
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "dcp_version": metadata.version,
        "items": [_item_json(fqn, meta) for fqn, meta in metadata.state_dict_metadata.items()],
        "storage": [_storage_json(index, stored) for index, stored in storage.items()],
        "planner_data": typed_json.encode(metadata.planner_data, root="planner_data"),
        "storage_meta": _storage_meta_json(metadata.storage_meta),
    }


# --- decoding ------------------------------------------------------------------


def _fail(where: str, why: str) -> NoReturn:
    raise ManifestError(f"invalid DCP metadata at {where}: {why}")


def _obj(value: JsonValue, where: str) -> dict[str, JsonValue]:
    if not isinstance(value, dict):
        _fail(where, f"expected an object, got {type(value).__name__}")
    return value


def _list(value: JsonValue, where: str, limit: int) -> list[JsonValue]:
    if not isinstance(value, list):
        _fail(where, f"expected a list, got {type(value).__name__}")
    if len(value) > limit:
        _fail(where, f"{len(value)} entries, more than the limit of {limit}")
    return value


def _str(obj: dict[str, JsonValue], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        _fail(f"{where}.{key}", f"expected a string, got {type(value).__name__}")
    return value


def _opt_str(obj: dict[str, JsonValue], key: str, where: str) -> str | None:
    return None if obj.get(key) is None else _str(obj, key, where)


def _bool(obj: dict[str, JsonValue], key: str, where: str) -> bool:
    value = obj.get(key)
    if not isinstance(value, bool):
        _fail(f"{where}.{key}", f"expected true or false, got {value!r}")
    return value


def _shape(value: JsonValue, where: str) -> tuple[int, ...]:
    try:
        return validate_shape(value, where)
    except FormatError as exc:  # its message starts with ``where``
        raise ManifestError(f"invalid DCP metadata at {exc}") from None


def _pick(table: Mapping[str, object], obj: dict[str, JsonValue], key: str, where: str) -> object:
    name = _str(obj, key, where)
    if name not in table:
        _fail(f"{where}.{key}", f"unknown value {name!r} (known: {sorted(table)})")
    return table[name]


def _properties(raw: JsonValue, dtype: torch.dtype, where: str) -> TensorProperties:
    obj = _obj(raw, where)
    layout = _pick(_LAYOUTS, obj, "layout", where)
    memory_format = _pick(_MEMORY_FORMATS, obj, "memory_format", where)
    assert isinstance(layout, torch.layout)
    assert isinstance(memory_format, torch.memory_format)
    return TensorProperties(
        dtype=dtype,
        layout=layout,
        requires_grad=_bool(obj, "requires_grad", where),
        memory_format=memory_format,
        pin_memory=_bool(obj, "pin_memory", where),
    )


def _chunk(raw: JsonValue, size: tuple[int, ...], where: str) -> ChunkStorageMetadata:
    obj = _obj(raw, where)
    offsets = _shape(obj.get("offsets"), f"{where}.offsets")
    sizes = _shape(obj.get("sizes"), f"{where}.sizes")
    if len(offsets) != len(size) or len(sizes) != len(size):
        _fail(where, f"offsets and sizes must have {len(size)} dimensions like the tensor")
    for dim, (offset, length, total) in enumerate(zip(offsets, sizes, size, strict=True)):
        if offset + length > total:
            _fail(where, f"dimension {dim}: {offset} + {length} lies outside the size {total}")
    return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))


def _item(raw: JsonValue, where: str) -> tuple[str, TensorStorageMetadata | BytesStorageMetadata]:
    obj = _obj(raw, where)
    fqn = _str(obj, "fqn", where)
    kind = obj.get("kind")
    if kind == "bytes":
        return fqn, BytesStorageMetadata()
    if kind != "tensor":
        _fail(f"{where}.kind", f"expected 'tensor' or 'bytes', got {kind!r}")
    try:
        dtype = torch_dtype(_str(obj, "dtype", where))
    except FormatError as exc:
        _fail(f"{where}.dtype", str(exc))
    size = _shape(obj.get("size"), f"{where}.size")
    chunks = _list(obj.get("chunks"), f"{where}.chunks", MAX_CHUNKS)
    return fqn, TensorStorageMetadata(
        properties=_properties(obj.get("properties"), dtype, f"{where}.properties"),
        size=torch.Size(size),
        chunks=[_chunk(c, size, f"{where}.chunks[{i}]") for i, c in enumerate(chunks)],
    )


def _storage_entry(raw: JsonValue, where: str) -> tuple[MetadataIndex, StoredItem]:
    obj = _obj(raw, where)
    fqn = _str(obj, "fqn", where)
    offset = obj.get("offset")
    index = obj.get("index")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
        _fail(f"{where}.index", f"expected a non-negative integer or null, got {index!r}")
    file = _str(obj, "file", where)
    try:
        validate_segment(file)
    except InvalidKeyError:
        _fail(f"{where}.file", f"{file!r} is not a file of this checkpoint")
    try:
        checksum = validate_digest(obj.get("checksum"), XXH3_128, where)
    except FormatError as exc:
        _fail(f"{where}.checksum", str(exc))
    key = MetadataIndex(
        fqn, None if offset is None else _shape(offset, f"{where}.offset"), index=index
    )
    return key, StoredItem(file=file, tensor=_str(obj, "tensor", where), checksum=checksum)


def _storage_meta(raw: JsonValue) -> StorageMeta:
    if raw is None:
        return StorageMeta()
    where = "storage_meta"
    obj = _obj(raw, where)
    modules = _list(obj.get("modules", []), f"{where}.modules", MAX_ITEMS)
    if not all(isinstance(m, str) for m in modules):
        _fail(f"{where}.modules", "expected a list of strings")
    return StorageMeta(
        checkpoint_id=_opt_str(obj, "checkpoint_id", where),
        save_id=_opt_str(obj, "save_id", where),
        load_id=_opt_str(obj, "load_id", where),
        modules=[str(m) for m in modules],
    )


def _check_location(
    index: MetadataIndex,
    stored: StoredItem,
    meta: TensorStorageMetadata | BytesStorageMetadata,
    records: Mapping[tuple[str, str], TensorRecord],
) -> None:
    """The stored tensor must exist in the manifest and match the item's dtype and shape."""
    where = f"storage of {index.fqn!r}" + ("" if index.offset is None else f" {list(index.offset)}")
    record = records.get((stored.file, stored.tensor))
    if record is None:
        _fail(where, f"tensor {stored.tensor!r} is not in {stored.file!r}")
    if isinstance(meta, BytesStorageMetadata):
        if index.offset is not None or record.dtype != "U8" or len(record.shape) != 1:
            _fail(where, "a bytes item must be stored as a 1-D U8 tensor without offset")
        return
    chunk = next((c for c in meta.chunks if index.offset == c.offsets), None)
    if chunk is None:
        _fail(where, "no chunk of the tensor starts at this offset")
    if record.dtype != dtype_code(meta.properties.dtype) or record.shape != tuple(chunk.sizes):
        _fail(where, f"stored as {record.dtype} {list(record.shape)}, which is not the chunk")


def decode_metadata(raw: JsonValue, manifest: Manifest) -> Metadata:
    """Rebuild DCP ``Metadata`` from its JSON form, validating it as hostile input.

    Args:
        raw: the manifest's ``dcp`` member.
        manifest: the (already validated) manifest it came from: every stored
            location must name a tensor of its tensor table, with the item's dtype
            and shape.

    Returns:
        Metadata whose ``storage_data`` maps each ``MetadataIndex`` to a
        :class:`StoredItem`; every tensor chunk and bytes item has exactly one.

    Raises:
        ManifestError: anything is malformed, inconsistent or out of bounds.
    """
    obj = _obj(raw, "dcp")
    if obj.get("format") != FORMAT_NAME or obj.get("format_version") != FORMAT_VERSION:
        _fail("dcp", f"not {FORMAT_NAME} version {FORMAT_VERSION}")
    version = _opt_str(obj, "dcp_version", "dcp")
    state: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    for i, item in enumerate(_list(obj.get("items"), "items", MAX_ITEMS)):
        fqn, meta = _item(item, f"items[{i}]")
        if fqn in state:
            _fail(f"items[{i}]", f"duplicate fqn {fqn!r}")
        state[fqn] = meta
    records = {(t.file, t.name): t for t in manifest.tensors}
    storage: dict[MetadataIndex, StoredItem] = {}
    for i, entry in enumerate(_list(obj.get("storage"), "storage", MAX_ITEMS)):
        index, stored = _storage_entry(entry, f"storage[{i}]")
        if index.fqn not in state:
            _fail(f"storage[{i}]", f"{index.fqn!r} is not an item of the state dict")
        if index in storage:
            _fail(f"storage[{i}]", f"{index.fqn!r} is stored twice")
        _check_location(index, stored, state[index.fqn], records)
        storage[index] = stored
    _check_complete(state, storage)
    try:
        planner_data = typed_json.decode(obj.get("planner_data"), root="planner_data")
    except FormatError as exc:
        _fail("planner_data", str(exc))
    return Metadata(
        state_dict_metadata=dict(state),
        planner_data=planner_data,
        storage_data=storage,
        storage_meta=_storage_meta(obj.get("storage_meta")),
        version=version,
    )


def _check_complete(
    state: Mapping[str, TensorStorageMetadata | BytesStorageMetadata],
    storage: Mapping[MetadataIndex, StoredItem],
) -> None:
    """Every chunk and bytes item must be stored, or a load would fail half way."""
    for fqn, meta in state.items():
        if isinstance(meta, BytesStorageMetadata):
            wanted = [MetadataIndex(fqn)]
        else:
            wanted = [MetadataIndex(fqn, c.offsets) for c in meta.chunks]
            covered = sum(math.prod(c.sizes) for c in meta.chunks)
            if covered > math.prod(meta.size):
                _fail(f"item {fqn!r}", "its chunks hold more elements than the tensor")
        for index in wanted:
            if index not in storage:
                _fail(f"item {fqn!r}", f"chunk {index.offset} has no stored data")
