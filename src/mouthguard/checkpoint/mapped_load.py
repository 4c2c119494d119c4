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
* **Verified at receipt**: the one exception to hashing every byte here is a
  file the caller verified itself earlier in the same load: one it received,
  hashed chunk by chunk as it arrived and renamed in only because that digest
  was the manifest's (peer memory's fetch), or one it hashed in place with
  :func:`hashed_receipt` (a survivor's own file, hashed while the transfers
  run). The caller passes a :class:`Receipt` of each such file, taken in
  memory (right after the rename; before the hash, checked again after it); a
  file whose opened inode, size and times match its receipt is not hashed a
  second time (its header still is checked). Receipts are never read from
  disk, so nothing another process left in the area is trusted: every file
  without a matching receipt is hashed. The window this leaves -- between the
  receipt (the rename, or the end of the hash) and the mapping, the file could
  be rewritten in place without changing its inode or size (a write through a
  shared mapping need not update its times) -- is inside the
  node's private area, writable only by this user, who could as well rewrite
  the manifest there; it is the same trust the survivors' files get between
  their save and this load, closed by hashing them again only because nothing
  in this process saw them written.
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
from collections.abc import Collection
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Receipt:
    """A file this process received, hashed as it arrived and renamed in (see the module doc).

    Taken with :meth:`of` right after the rename; it identifies the file by
    path, device, inode, size and modification/change times, so a file
    replaced, truncated, extended or written through ``write(2)`` since no
    longer matches.
    """

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> Receipt:
        """The receipt of the file at ``path`` as it is now (not following a link)."""
        return cls.from_stat(path, os.lstat(path))

    @classmethod
    def from_stat(cls, path: str | os.PathLike[str], st: os.stat_result) -> Receipt:
        """The receipt of the file at ``path`` whose ``stat`` is ``st``."""
        return cls(
            os.fspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
        )


@dataclass
class Counters:
    """Process-wide tallies of :func:`map_copy`'s work, for tests and benchmarks.

    Bounded: two integers. Not synchronised (a concurrent load may lose a count).
    """

    hashed_bytes: int = 0
    trusted_files: int = 0


#: What map_copy did in this process (see :class:`Counters`).
counters = Counters()


def map_copy(
    tier: LocalTier,
    prefix: str,
    manifest: Manifest,
    *,
    rank: int = 0,
    into: object = None,
    device: torch.device | None = None,
    received: Collection[Receipt] = (),
) -> object:
    """Rank ``rank``'s state from one copy on ``tier``, as views of a private mapping.

    Arguments and errors are :func:`~mouthguard.checkpoint.reader.load_copy`'s;
    the module docstring states what the returned tensors are. ``received``:
    receipts of files this process received and verified in this load; the file
    matching one is not hashed again (every other one is).

    Raises:
        ObjectNotFoundError, ChecksumMismatchError, RankFileError, ManifestError:
            the copy is damaged (the caller falls back).
        StateMismatchError: ``into`` does not fit the checkpoint (no fallback helps).
    """
    record = rank_record(manifest, rank)
    check_references(manifest, rank)  # every reference is to a tensor of this file
    tensors = manifest.tensors_in(record.name)
    mapped, receipt = map_file(tier, prefix + record.name, record)
    try:
        verify_mapped(mapped, record, tensors, hash_bytes=receipt not in received)
    except BaseException:
        mapped.close()  # nothing views it yet
        raise
    loaded = {t.name: tensor_view(mapped, t.offset, t.length, t.dtype, t.shape) for t in tensors}
    if device is not None and device.type != "cpu":
        loaded = {name: tensor.to(device) for name, tensor in loaded.items()}
    return assemble(manifest, rank, loaded, into_targets(into))


def map_file(tier: LocalTier, key: str, record: FileRecord) -> tuple[mmap.mmap, Receipt]:
    """``key`` mapped copy-on-write at its recorded size, opened with the tier's checks.

    Also the :class:`Receipt` of the inode opened (from its descriptor, so it
    describes the very file mapped).

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
        opened = Receipt.from_stat(tier.path_of(key), os.fstat(fd))
        # The mapping keeps the file open; the descriptor is not needed past this.
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY), opened
    finally:
        os.close(fd)


def verify_mapped(
    mapped: mmap.mmap, record: FileRecord, tensors: list[TensorRecord], *, hash_bytes: bool = True
) -> None:
    """Check the mapped file's header against ``tensors`` and its every byte's checksum.

    ``hash_bytes=False`` checks the header only: for a file verified at receipt.

    Raises:
        RankFileError: the header disagrees with the manifest.
        ChecksumMismatchError: a byte differs from what was committed.
    """
    with memoryview(mapped) as whole:
        check_header(bytes(whole[: record.data_offset]), record, tensors)
        if not hash_bytes:
            counters.trusted_files += 1
            return
    verify_digest(_hashed(mapped, record), record)


def _hashed(mapped: mmap.mmap, record: FileRecord) -> StreamHasher:
    """A hasher fed ``record.size`` bytes of ``mapped``, a view at a time (no copy)."""
    hasher = StreamHasher(with_sha256=record.sha256 is not None)
    counters.hashed_bytes += record.size
    with memoryview(mapped) as whole:
        for start in range(0, record.size, HASH_CHUNK_BYTES):
            with whole[start : start + HASH_CHUNK_BYTES] as chunk:
                hasher.update(chunk)
    return hasher


def hashed_receipt(path: str | os.PathLike[str], record: FileRecord) -> Receipt | None:
    """Hash the file at ``path`` now: its :class:`Receipt` if every byte is ``record``'s.

    For a file this process will load in the same load without having received
    it (peer memory's survivor: its own file, hashed while its node's transfers
    are on the wire): the receipt is taken from the descriptor before the hash
    and the file's ``lstat`` compared with it after, so a file replaced, resized
    or written through ``write(2)`` meanwhile gets none. ``None`` (a mismatch, a
    change, a file that cannot be opened) costs only this hash: :func:`map_copy`
    then hashes the file itself and raises what it finds. The receipt vouches
    for the bytes under the same terms as one of a received file (module doc).
    """
    try:
        with open(path, "rb") as handle:
            before = Receipt.from_stat(path, os.fstat(handle.fileno()))
            if before.size != record.size or record.size == 0:
                return None
            mapped = mmap.mmap(handle.fileno(), record.size, access=mmap.ACCESS_READ)
        with mapped:
            hasher = _hashed(mapped, record)
        if Receipt.of(path) != before:
            return None
        verify_digest(hasher, record)
    except (OSError, ChecksumMismatchError):
        return None
    return before


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
