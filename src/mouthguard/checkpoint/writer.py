"""Writing a checkpoint copy to one tier: rank files, then the manifest that commits them.

Call order for one copy (the save's coordinator runs it through
:mod:`~mouthguard.checkpoint.commit`, every rank writes its own file)::

    staging = staging_prefix(tier, run, step, txn)      # partial dir, or final prefix
    record  = write_rank_file(tier, staging, rank, flat) # streams + checksums inline
    commit_bytes(tier, staging, final, manifest bytes)   # manifest last => committed

Commit protocol:

* Tiers with ``atomic_rename`` (POSIX): every file, then ``manifest.json``, is
  written into ``<run>/<step>.partial-<txn>/`` (each ``put`` fsyncs the file and its
  directory); the directory is then renamed to ``<run>/<step>/`` and the parent
  fsynced. A crash at any point leaves either no ``<step>/`` directory or a
  complete one; a partial directory is invisible and collected after a grace period.
* Tiers without rename (object stores): data objects are written under the final
  prefix, then the manifest with a create-only put. Until the manifest exists the
  objects are invisible garbage.

Checksums are computed on the bytes as they stream to the tier, so there is no
second pass over the data. Tensors on a GPU stream through a small ring of pinned
host buffers (:mod:`~mouthguard.io.host_ring`): the next chunks' device-to-host
copies run while the current one is hashed and written, and host memory stays at
the ring's size however large the state.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from mouthguard.checkpoint.catalog import checkpoint_prefix, partial_prefix, rank_file_name
from mouthguard.errors import CheckpointExistsError, FormatError, ObjectExistsError
from mouthguard.format.checksum import StreamHasher
from mouthguard.format.dtypes import dtype_code
from mouthguard.format.manifest import MANIFEST_NAME, FileRecord, TensorRecord
from mouthguard.format.rank_file import RankFileLayout, build_layout, byte_view
from mouthguard.format.state_tree import FlatState
from mouthguard.io.host_ring import HostRing, device_bytes, stream_from_device
from mouthguard.tiers.base import PutMode, StableChunks, Tier
from mouthguard.version import VERSION

if TYPE_CHECKING:
    import torch

#: Slices small enough that a slice just checksummed is still in cache when written.
WRITE_CHUNK_BYTES = 8 * 1024 * 1024
#: Slices of a staging image: large, because the image is written in place (no copy)
#: and each slice is hashed while the previous one is on its way to the disk.
IMAGE_CHUNK_BYTES = 64 * 1024 * 1024


def staging_prefix(tier: Tier, run: str, step: int, txn: str) -> str:
    """Where a save writes before committing: a partial dir, or the final prefix."""
    if tier.capabilities.atomic_rename:
        return partial_prefix(run, step, txn)
    return checkpoint_prefix(run, step)


def layout_for(flat: FlatState, metadata: dict[str, str]) -> RankFileLayout:
    """The rank-file layout of ``flat``: header plus tensors back to back in order."""
    return build_layout(
        [(t.name, dtype_code(t.tensor.dtype), tuple(t.tensor.shape)) for t in flat.tensors],
        metadata,
    )


def _stream(flat: FlatState, layout: RankFileLayout, hasher: StreamHasher) -> Iterator[memoryview]:
    header = memoryview(layout.header)
    hasher.update(header)
    yield header
    pairs = list(zip(flat.tensors, layout.entries, strict=True))
    for stored, entry in pairs:
        if stored.tensor.numel() * stored.tensor.element_size() != entry.length:
            raise FormatError(f"tensor {stored.name!r} changed size while being saved")
    # Consecutive tensors on one device stream through one ring, so device-to-host
    # copies run ahead across tensor boundaries while the disk writes.
    for device, run in itertools.groupby(pairs, key=lambda p: p[0].tensor.device):
        if device.type == "cpu":
            chunks = _host_chunks(stored.tensor for stored, _ in run)
        else:
            ring = HostRing(device, slot_bytes=WRITE_CHUNK_BYTES)
            chunks = stream_from_device((device_bytes(s.tensor) for s, _ in run), ring)
        for chunk in chunks:
            hasher.update(chunk)
            yield chunk


def _host_chunks(tensors: Iterable[torch.Tensor]) -> Iterator[memoryview]:
    for tensor in tensors:
        # One tensor at a time: a contiguous copy only when the tensor needs it.
        data = byte_view(tensor.detach().contiguous())
        for start in range(0, data.nbytes, WRITE_CHUNK_BYTES):
            yield data[start : start + WRITE_CHUNK_BYTES]


def write_rank_file(
    tier: Tier,
    staging: str,
    *,
    rank: int,
    flat: FlatState,
    metadata: dict[str, str],
    with_sha256: bool = False,
) -> tuple[FileRecord, list[TensorRecord]]:
    """Stream one rank file to ``staging`` on ``tier``; return its manifest records."""
    name = rank_file_name(rank)
    layout = layout_for(flat, metadata)
    hasher = StreamHasher(with_sha256=with_sha256)
    info = tier.put(staging + name, _stream(flat, layout, hasher), mode=PutMode.CREATE)
    return file_records(name, rank, layout, info.size, hasher)


def write_rank_image(
    tier: Tier,
    staging: str,
    *,
    rank: int,
    layout: RankFileLayout,
    image: memoryview,
    with_sha256: bool = False,
) -> tuple[FileRecord, list[TensorRecord]]:
    """Write a complete rank-file image (an async save's staging buffer) to ``staging``.

    The image is handed to the tier as stable chunks, so a local tier writes it
    with O_DIRECT straight from the buffer; each chunk is hashed just before it
    is handed over, while the previous one is being written.
    """
    if image.nbytes != layout.size:
        raise FormatError(f"staging image has {image.nbytes} bytes, layout needs {layout.size}")
    hasher = StreamHasher(with_sha256=with_sha256)

    def chunks() -> Iterator[memoryview]:
        for start in range(0, image.nbytes, IMAGE_CHUNK_BYTES):
            chunk = image[start : start + IMAGE_CHUNK_BYTES]
            hasher.update(chunk)
            yield chunk

    name = rank_file_name(rank)
    info = tier.put(staging + name, StableChunks(chunks()), mode=PutMode.CREATE)
    return file_records(name, rank, layout, info.size, hasher)


def file_records(
    name: str, rank: int, layout: RankFileLayout, written: int, hasher: StreamHasher
) -> tuple[FileRecord, list[TensorRecord]]:
    """The manifest records of a rank file just written, after checking its size."""
    if written != layout.size or hasher.nbytes != layout.size:
        raise FormatError(f"{name}: wrote {written} bytes, expected {layout.size}")
    record = FileRecord(
        name=name,
        rank=rank,
        size=layout.size,
        data_offset=layout.data_offset,
        checksum=hasher.xxh3,
        sha256=hasher.sha256,
    )
    tensors = [
        TensorRecord(e.name, name, e.dtype, e.shape, e.offset, e.length) for e in layout.entries
    ]
    return record, tensors


def commit_bytes(tier: Tier, staging: str, final: str, manifest_bytes: bytes) -> None:
    """Write the manifest's exact bytes last, create-only; make the checkpoint visible.

    Exact bytes, so a signature survives and replicas stay byte-identical.

    Raises:
        CheckpointExistsError: a committed checkpoint already holds ``final``.
    """
    try:
        tier.put(staging + MANIFEST_NAME, manifest_bytes, mode=PutMode.CREATE)
        if staging != final:
            tier.rename_prefix(staging.rstrip("/"), final.rstrip("/"))
    except ObjectExistsError:
        raise CheckpointExistsError(
            f"checkpoint {final} already exists on tier {tier.name!r}"
        ) from None


def framework_versions() -> dict[str, str]:
    """Versions recorded in every manifest, for diagnosing a resume across upgrades."""
    import platform  # noqa: PLC0415 - only needed here

    import torch  # noqa: PLC0415 - commands that never save (the CLI) must not load torch

    return {
        "mouthguard": VERSION,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def utc_now() -> dt.datetime:
    """The commit timestamp (timezone-aware UTC)."""
    return dt.datetime.now(dt.UTC)
