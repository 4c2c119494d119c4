"""One rank's DCP write items as one safetensors rank file, checksummed as it streams.

Every write item becomes one tensor of the rank file: a tensor chunk keeps its
dtype and the chunk's shape; a bytes item (``WriteItemType.BYTE_IO``, DCP's own
``torch.save`` of a non-tensor value) becomes a 1-D ``U8`` tensor of its bytes.
Tensor names are the item's fqn, with ``@<offsets>`` for a chunk that does not
start at the origin (``model.w@5,0``), so a plain safetensors reader sees
familiar names; the authoritative mapping is the ``storage`` table of the DCP
metadata, so a name is only ever disambiguated (``#2``), never interpreted.

Bytes items are resolved up front (the header needs their length, and DCP
itself materialises them eagerly); tensors are resolved one at a time while the
file streams, so at most one tensor's contiguous CPU copy exists at once. The
file's xxh3-128 (for the manifest) and each item's own xxh3-128 (for resharded
reads) are computed on the same buffers as they stream, with no second pass.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.planner import SavePlanner, WriteItem, WriteItemType

from mouthguard.checkpoint.catalog import rank_file_name
from mouthguard.checkpoint.writer import WRITE_CHUNK_BYTES, file_records
from mouthguard.dcp.metadata_json import StoredItem
from mouthguard.errors import FormatError
from mouthguard.format.checksum import StreamHasher
from mouthguard.format.dtypes import dtype_code
from mouthguard.format.manifest import FileRecord, TensorRecord
from mouthguard.format.rank_file import RankFileLayout, build_layout, byte_view
from mouthguard.tiers.base import PutMode, Tier

_RESERVED = "__metadata__"


@dataclass(frozen=True)
class WrittenRankFile:
    """What one rank wrote: its file's manifest records and each item's location."""

    file: FileRecord
    tensors: tuple[TensorRecord, ...]
    items: tuple[tuple[WriteItem, StoredItem, int], ...]  # (item, location, bytes)


def item_dtype(item: WriteItem) -> str:
    """The safetensors dtype code an item is stored as.

    Raises:
        FormatError: the tensor's dtype cannot be stored in a safetensors file.
    """
    if item.type == WriteItemType.BYTE_IO:
        return "U8"
    if item.tensor_data is None:
        raise FormatError(f"DCP write item {item.index.fqn!r} has no tensor data")
    try:
        return dtype_code(item.tensor_data.properties.dtype)
    except FormatError as exc:
        raise FormatError(f"DCP item {item.index.fqn!r}: {exc}") from None


def _base_name(item: WriteItem) -> str:
    offset = item.index.offset
    if offset is None or not any(offset):
        return item.index.fqn
    return f"{item.index.fqn}@{','.join(str(int(o)) for o in offset)}"


def tensor_names(items: Sequence[WriteItem]) -> list[str]:
    """Unique tensor names for ``items`` (in order), as stored in the rank file."""
    used: set[str] = {_RESERVED}
    names = []
    for item in items:
        base = name = _base_name(item)
        count = 1
        while name in used:
            count += 1
            name = f"{base}#{count}"
        used.add(name)
        names.append(name)
    return names


def _bytes_of(planner: SavePlanner, item: WriteItem) -> bytes:
    data = planner.resolve_data(item)
    if not isinstance(data, io.BytesIO):
        raise FormatError(f"DCP bytes item {item.index.fqn!r} resolved to {type(data).__name__}")
    return data.getvalue()


def _tensor_of(planner: SavePlanner, item: WriteItem, shape: tuple[int, ...]) -> torch.Tensor:
    data = planner.resolve_data(item)
    if not isinstance(data, torch.Tensor):
        raise FormatError(f"DCP tensor item {item.index.fqn!r} resolved to {type(data).__name__}")
    assert item.tensor_data is not None  # checked by item_dtype when laying out
    # DCP allows any device and any view: only the projection is saved.
    tensor = data.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    if tuple(tensor.shape) != shape or tensor.dtype != item.tensor_data.properties.dtype:
        raise FormatError(
            f"DCP item {item.index.fqn!r} resolved to {tensor.dtype} {list(tensor.shape)}, "
            f"planned {item.tensor_data.properties.dtype} {list(shape)}"
        )
    return tensor


class _Streamer:
    """Yields the rank file's bytes, feeding the file hasher and one hasher per item."""

    def __init__(
        self,
        planner: SavePlanner,
        items: Sequence[WriteItem],
        layout: RankFileLayout,
        payloads: dict[int, bytes],
        *,
        with_sha256: bool,
    ) -> None:
        self.planner = planner
        self.items = items
        self.layout = layout
        self.payloads = payloads
        self.file_hasher = StreamHasher(with_sha256=with_sha256)
        self.item_digests: list[str] = []

    def __iter__(self) -> Iterator[memoryview]:
        header = memoryview(self.layout.header)
        self.file_hasher.update(header)
        yield header
        for position, (item, entry) in enumerate(zip(self.items, self.layout.entries, strict=True)):
            payload = self.payloads.pop(position, None)
            if payload is not None:
                data = memoryview(payload)
            else:
                tensor = _tensor_of(self.planner, item, entry.shape)
                data = byte_view(tensor)
            if data.nbytes != entry.length:
                raise FormatError(f"DCP item {item.index.fqn!r} changed size while being saved")
            item_hasher = StreamHasher()
            for start in range(0, data.nbytes, WRITE_CHUNK_BYTES):
                chunk = data[start : start + WRITE_CHUNK_BYTES]
                self.file_hasher.update(chunk)
                item_hasher.update(chunk)
                yield chunk
            self.item_digests.append(item_hasher.xxh3)


def write_items(
    tier: Tier,
    staging: str,
    *,
    rank: int,
    items: Sequence[WriteItem],
    planner: SavePlanner,
    metadata: dict[str, str],
    with_sha256: bool = False,
) -> WrittenRankFile:
    """Stream rank ``rank``'s write items into ``staging`` on ``tier`` (create-only).

    Bytes items come first, then tensors in plan order. The put is all-or-nothing
    (a tier contract), so a failure leaves no rank file behind.

    Raises:
        FormatError: an item cannot be stored or does not match its plan.
        TierError: the tier failed.
    """
    ordered = sorted(items, key=lambda i: i.type != WriteItemType.BYTE_IO)  # stable
    payloads: dict[int, bytes] = {}
    shapes: list[tuple[int, ...]] = []
    for position, item in enumerate(ordered):
        if item.type == WriteItemType.BYTE_IO:
            payloads[position] = _bytes_of(planner, item)
            shapes.append((len(payloads[position]),))
        else:
            item_dtype(item)
            assert item.tensor_data is not None
            shapes.append(tuple(int(s) for s in item.tensor_data.chunk.sizes))
    names = tensor_names(ordered)
    layout = build_layout(
        [(n, item_dtype(i), s) for n, i, s in zip(names, ordered, shapes, strict=True)],
        metadata,
    )
    name = rank_file_name(rank)
    stream = _Streamer(planner, ordered, layout, payloads, with_sha256=with_sha256)
    info = tier.put(staging + name, stream, mode=PutMode.CREATE)
    record, tensor_list = file_records(name, rank, layout, info.size, stream.file_hasher)
    tensors = tuple(tensor_list)
    located = tuple(
        (item, StoredItem(file=name, tensor=entry.name, checksum=digest), entry.length)
        for item, entry, digest in zip(ordered, layout.entries, stream.item_digests, strict=True)
    )
    return WrittenRankFile(record, tensors, located)
