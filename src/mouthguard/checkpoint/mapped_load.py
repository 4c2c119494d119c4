"""Loading a rank's state as views of a private mapping of its file: no read, no copy.

For a copy in memory already (peer memory's node area on /dev/shm), reading the
file into new tensors is a second copy of bytes that are in RAM: the same CPU
and memory-bandwidth work as a read from a disk, minus the disk. Here the file
is mapped copy-on-write (``MAP_PRIVATE``) and each tensor is a view of the
mapping, so a load costs the page mapping and one hash of the bytes.

Contract:

* **Verified before it returns**: the file's size, its safetensors header
  against the manifest, and the checksum of every byte (read through the
  mapping the tensors view) are checked before any tensor is handed out; a
  mismatch raises and unmaps, so the caller falls back as with a read.
* **Writable, private**: the caller may write its tensors (optimizer updates in
  place); a written page is copied into this process and never reaches the
  file, so the copy in the area (and every other process mapping it) is untouched.
* **Stable**: the views keep showing the verified bytes because the files of a
  node area are never written in place: a file is written once under a
  temporary name and renamed in, or unlinked (prune); an unlinked file's pages
  live until its last mapping goes. Do not use this for a tier whose files
  are rewritten in place: unwritten pages of a private mapping follow the file.
* **Memory**: the mapping shares the area's pages (no new memory until the
  caller writes; then at most one private page per page written, so at most
  the state's size). It is released when the last tensor viewing it is freed;
  the file descriptor is closed before this returns. Until then the area's
  pages of the file stay allocated even if a prune unlinks it.

Tensors asked for elsewhere (``into=`` tensors, ``device=``) get the verified
bytes copied from the mapping: one copy, no read.
"""

from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING

from mouthguard.checkpoint.reader import (
    assemble,
    check_header,
    check_references,
    into_targets,
    rank_record,
    verify_digest,
)
from mouthguard.errors import ChecksumMismatchError
from mouthguard.format.checksum import StreamHasher
from mouthguard.format.dtypes import torch_dtype
from mouthguard.format.manifest import FileRecord, Manifest, TensorRecord
from mouthguard.tiers.local import LocalTier

if TYPE_CHECKING:
    import torch

#: Bytes hashed at a time: a view of the mapping, not a copy.
HASH_CHUNK_BYTES = 16 * 1024 * 1024


def map_copy(
    tier: LocalTier,
    prefix: str,
    manifest: Manifest,
    *,
    rank: int = 0,
    into: object = None,
    device: torch.device | None = None,
) -> object:
    """Rank ``rank``'s state from one copy on ``tier``, as views of a private mapping.

    Arguments and errors are :func:`~mouthguard.checkpoint.reader.load_copy`'s;
    the module docstring states what the returned tensors are.

    Raises:
        ObjectNotFoundError, ChecksumMismatchError, RankFileError, ManifestError:
            the copy is damaged (the caller falls back).
        StateMismatchError: ``into`` does not fit the checkpoint (no fallback helps).
    """
    record = rank_record(manifest, rank)
    check_references(manifest, rank)  # every reference is to a tensor of this file
    tensors = manifest.tensors_in(record.name)
    mapped = map_file(tier, prefix + record.name, record)
    try:
        verify_mapped(mapped, record, tensors)
    except BaseException:
        mapped.close()  # nothing views it yet
        raise
    loaded = {t.name: tensor_view(mapped, t.offset, t.length, t.dtype, t.shape) for t in tensors}
    if device is not None and device.type != "cpu":
        loaded = {name: tensor.to(device) for name, tensor in loaded.items()}
    return assemble(manifest, rank, loaded, into_targets(into))


def map_file(tier: LocalTier, key: str, record: FileRecord) -> mmap.mmap:
    """``key`` mapped copy-on-write at its recorded size, opened with the tier's checks.

    Raises:
        ObjectNotFoundError: no such file.
        ChecksumMismatchError: its size is not the record's.
    """
    fd, size = tier.open_object(key)
    try:
        if size != record.size:
            raise ChecksumMismatchError(
                f"{record.name}: size is {size} bytes, manifest says {record.size} "
                "(truncated, extended or replaced)"
            )
        # The mapping keeps the file open; the descriptor is not needed past this.
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)


def verify_mapped(mapped: mmap.mmap, record: FileRecord, tensors: list[TensorRecord]) -> None:
    """Check the mapped file's header against ``tensors`` and its every byte's checksum.

    Raises:
        RankFileError: the header disagrees with the manifest.
        ChecksumMismatchError: a byte differs from what was committed.
    """
    hasher = StreamHasher(with_sha256=record.sha256 is not None)
    with memoryview(mapped) as whole:
        check_header(bytes(whole[: record.data_offset]), record, tensors)
        for start in range(0, record.size, HASH_CHUNK_BYTES):
            with whole[start : start + HASH_CHUNK_BYTES] as chunk:
                hasher.update(chunk)
    verify_digest(hasher, record)


def tensor_view(
    mapped: mmap.mmap, offset: int, length: int, dtype: str, shape: tuple[int, ...]
) -> torch.Tensor:
    """``length`` bytes at ``offset`` as a ``dtype`` tensor viewing the mapping.

    A copy only where the file's layout leaves the bytes unaligned for ``dtype``
    (the view would be invalid); the mapping lives as long as a view of it does.
    """
    import torch  # noqa: PLC0415 - listing and verifying checkpoints must not import torch

    kind = torch_dtype(dtype)
    if length == 0:
        return torch.empty(shape, dtype=kind)
    flat = torch.frombuffer(mapped, dtype=torch.uint8, count=length, offset=offset)
    if flat.data_ptr() % kind.itemsize:
        flat = flat.clone()
    return flat.view(kind).reshape(shape)
