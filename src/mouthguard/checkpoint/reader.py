"""Reading a checkpoint copy from one tier with every byte verified.

Rank files are read in chunks straight into the destination tensors' memory,
several chunks in flight at once (:mod:`~mouthguard.io.read_ahead`) but
handed back in file order; each chunk is fed to the checksum right after it
lands (still in cache), so verification needs no second pass and no second copy
of the state. Before any tensor byte is trusted the copy is checked against its
manifest: the object's size, the rank file's own safetensors header, and the
coverage of every tensor. A copy is accepted only when the full-file checksum
matches.

Contract for ``into=``: when a load fails verification the ``into`` tensors may
already hold some bytes of the rejected copy. The caller (``Checkpointer.load``)
falls back to an older copy, which overwrites them entirely; if nothing valid is
left it raises, and the ``into`` contents are then undefined.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mouthguard.checkpoint.catalog import manifest_key
from mouthguard.errors import (
    ChecksumMismatchError,
    FormatError,
    ManifestError,
    RankFileError,
    StateMismatchError,
    TierError,
)
from mouthguard.format import typed_json
from mouthguard.format.checksum import StreamHasher
from mouthguard.format.dtypes import torch_dtype
from mouthguard.format.manifest import FileRecord, Manifest, TensorRecord, parse_manifest
from mouthguard.format.rank_file import byte_view, parse_header
from mouthguard.format.state_tree import (
    STORAGE_PREFIX,
    iter_tensors,
    tensor_references,
    unflatten_state,
)
from mouthguard.io.host_ring import HostRing, Landing, device_bytes, read_landings
from mouthguard.io.read_ahead import READ_AHEAD, read_in_order
from mouthguard.tiers.base import Tier
from mouthguard.tiers.key_material import Keyring

if TYPE_CHECKING:
    import torch

READ_CHUNK_BYTES = 16 * 1024 * 1024

#: Called between the chunks of a verifying read, from the reading thread; it may
#: block (bounded) to let a checkpoint save have the disk. Background jobs pass
#: their burst gate's ``wait``; foreground reads pass nothing.
Pause = Callable[[], object]


def read_manifest(tier: Tier, run: str, step: int, keys: Keyring | None = None) -> Manifest:
    """Read and validate the manifest of ``run``/``step`` on ``tier``.

    With ``keys`` (manifest signing keys) the manifest must carry a valid signature
    and the sha256 of every file, which the verified reads below then check.

    Raises:
        ObjectNotFoundError: the checkpoint is not committed on this tier.
        SignatureError: ``keys`` given and the signature is missing or wrong.
        ManifestError: the manifest is corrupt, hostile, or names another run/step.
    """
    return validated_manifest(tier.get(manifest_key(run, step)), run, step, keys)


def validated_manifest(raw: bytes, run: str, step: int, keys: Keyring | None = None) -> Manifest:
    """Parse and validate the manifest bytes of ``run``/``step`` (:func:`read_manifest`'s checks).

    Raises:
        SignatureError: ``keys`` given and the signature is missing or wrong.
        ManifestError: the manifest is corrupt, hostile, or names another run/step.
    """
    manifest = parse_manifest(raw, keys)
    if manifest.run != run or manifest.step != step:
        raise ManifestError(
            f"manifest in {run}/{step} describes {manifest.run}/{manifest.step} (moved or forged)"
        )
    return manifest


@dataclass
class _Target:
    """One tensor being read: the bytes to fill and the tensor that owns them.

    A tensor in host memory is filled by the reads themselves; one on a device
    (``staged``) through the host ring, its copies overlapping the next reads.
    """

    record: TensorRecord
    tensor: torch.Tensor
    copy_to: torch.Tensor | None = None  # an ``into`` tensor filled after verification

    @property
    def staged(self) -> bool:
        """Whether the bytes go through the host ring to a device."""
        return self.tensor.device.type != "cpu"


def _check_object(tier: Tier, key: str, record: FileRecord) -> None:
    info = tier.head(key)
    if info.size != record.size:
        raise ChecksumMismatchError(
            f"{record.name}: size is {info.size} bytes, manifest says {record.size} "
            "(truncated, extended or replaced)"
        )


def check_header(header: bytes, record: FileRecord, expected: list[TensorRecord]) -> None:
    """Check a rank file's safetensors header against the manifest's records of it.

    Raises:
        RankFileError: the header is malformed or lists other tensors or places.
    """
    try:
        entries, _ = parse_header(header, record.size)
    except RankFileError as exc:
        raise RankFileError(f"{record.name}: {exc}") from None
    got = [(e.name, e.dtype, e.shape, e.offset, e.length) for e in entries]
    want = [(t.name, t.dtype, t.shape, t.offset, t.length) for t in expected]
    if sorted(got) != sorted(want):
        raise RankFileError(f"{record.name}: safetensors header disagrees with the manifest")


def verify_digest(hasher: StreamHasher, record: FileRecord) -> None:
    """Check the digests of a file's every byte (fed to ``hasher``) against its record.

    Raises:
        ChecksumMismatchError: the xxh3 (or the sha256, when recorded) differs.
    """
    if hasher.xxh3 != record.checksum:
        raise ChecksumMismatchError(
            f"{record.name}: checksum mismatch (manifest {record.checksum}, read {hasher.xxh3})"
        )
    if record.sha256 is not None and hasher.sha256 != record.sha256:
        raise ChecksumMismatchError(f"{record.name}: sha256 mismatch (tampered or corrupt)")


def _read_header(tier: Tier, key: str, record: FileRecord, hasher: StreamHasher) -> bytes:
    header = bytearray(record.data_offset)
    tier.read_into(key, 0, memoryview(header))
    hasher.update(header)
    return bytes(header)


def _landings(targets: list[_Target]) -> Iterator[Landing]:
    """Every target's bytes in chunks: straight into host tensors, through the ring otherwise."""
    for target in targets:
        offset, length = target.record.offset, target.record.length
        if target.staged:
            flat = device_bytes(target.tensor)
            for start in range(0, length, READ_CHUNK_BYTES):
                n = min(READ_CHUNK_BYTES, length - start)
                yield Landing(offset + start, n, parts=((0, n, flat[start : start + n]),))
            continue
        view = byte_view(target.tensor)
        for start in range(0, length, READ_CHUNK_BYTES):
            chunk = view[start : start + READ_CHUNK_BYTES]
            yield Landing(offset + start, chunk.nbytes, direct=chunk)


def verify_file(
    tier: Tier, prefix: str, manifest: Manifest, record: FileRecord, *, pause: Pause | None = None
) -> None:
    """Read every byte of one file and check size, header and checksums.

    ``pause`` is called before every chunk (see :data:`Pause`); reads already in
    flight finish, no new one starts until it returns.

    Raises:
        ObjectNotFoundError: the file is missing.
        ChecksumMismatchError, RankFileError: the bytes are not what was committed.
    """
    key = prefix + record.name
    if pause is not None:
        pause()
    _check_object(tier, key, record)
    hasher = StreamHasher(with_sha256=record.sha256 is not None)
    header = _read_header(tier, key, record, hasher)
    check_header(header, record, manifest.tensors_in(record.name))
    size = min(READ_CHUNK_BYTES, max(record.size - record.data_offset, 1))
    # READ_AHEAD + 1 buffers in rotation: a buffer is refilled only after it was hashed.
    scratch = [memoryview(bytearray(size)) for _ in range(READ_AHEAD + 1)]
    jobs: Iterator[tuple[int, memoryview]] = (
        (offset, scratch[i % len(scratch)][: min(size, record.size - offset)])
        for i, offset in enumerate(range(record.data_offset, record.size, size))
    )
    if pause is not None:
        jobs = _paused(jobs, pause)
    for chunk in read_in_order(tier, key, jobs):
        hasher.update(chunk)
    verify_digest(hasher, record)


def _paused(
    jobs: Iterator[tuple[int, memoryview]], pause: Pause
) -> Iterator[tuple[int, memoryview]]:
    for job in jobs:
        pause()
        yield job


def verify_copy(tier: Tier, prefix: str, manifest: Manifest, *, pause: Pause | None = None) -> None:
    """Verify every file of a checkpoint copy and the skeleton's tensor references.

    ``pause``: called between chunks, so a background verification yields (:data:`Pause`).
    """
    for rank in range(manifest.world_size):
        check_references(manifest, rank)
    for record in manifest.files:
        verify_file(tier, prefix, manifest, record, pause=pause)


def rank_record(manifest: Manifest, rank: int) -> FileRecord:
    """The manifest's record of rank ``rank``'s file (ManifestError if it has none)."""
    for record in manifest.files:
        if record.rank == rank:
            return record
    raise ManifestError(f"manifest has no file for rank {rank}")


def check_references(manifest: Manifest, rank: int) -> dict[str, list[str]]:
    """Rank ``rank``'s tensor references (stored name -> key paths), all in its file.

    Raises:
        ManifestError: the state refers to a tensor its file does not hold.
    """
    refs = tensor_references(manifest.states[rank])
    stored = {t.name for t in manifest.tensors_in(rank_record(manifest, rank).name)}
    missing = sorted(set(refs) - stored)
    if missing:
        raise ManifestError(
            f"state of rank {rank} refers to tensors not in its file: {missing[:5]}"
        )
    return refs


def into_targets(into: object) -> dict[str, torch.Tensor]:
    """The tensors of ``load(into=...)`` by key path (none for ``into=None``)."""
    if into is None:
        return {}
    return {typed_json.format_key_path(parts): t for parts, t in iter_tensors(into)}


def _plan(
    manifest: Manifest, rank: int, into_map: dict[str, torch.Tensor], device: torch.device | None
) -> list[_Target]:
    # Here, not at the top: verifying and listing copies (the CLI) must not import torch.
    import torch  # noqa: PLC0415

    refs = check_references(manifest, rank)
    targets = []
    for record in manifest.tensors_in(rank_record(manifest, rank).name):
        dtype = torch_dtype(record.dtype)
        # Shared-storage blobs are never read into an into= tensor: their views are
        # rebuilt on a fresh blob and copied into place by value afterwards.
        paths = [] if record.name.startswith(STORAGE_PREFIX) else refs.get(record.name, [])
        dest = next((into_map[p] for p in paths if p in into_map), None)
        if dest is not None:
            path = next(p for p in paths if p in into_map)
            if dest.dtype != dtype or tuple(dest.shape) != record.shape:
                raise StateMismatchError(
                    f"{path}: checkpoint has {dtype} {list(record.shape)}, "
                    f"into= has {dest.dtype} {list(dest.shape)}"
                )
            if dest.device.type in {"cpu", "cuda"} and dest.is_contiguous():
                targets.append(_Target(record, dest))  # filled in place, also on a GPU
                continue
            targets.append(_Target(record, torch.empty(record.shape, dtype=dtype), copy_to=dest))
            continue
        targets.append(_Target(record, torch.empty(record.shape, dtype=dtype, device=device)))
    return targets


def load_copy(
    tier: Tier,
    prefix: str,
    manifest: Manifest,
    *,
    rank: int = 0,
    into: object = None,
    device: torch.device | None = None,
) -> object:
    """Load rank ``rank``'s state from one copy, verifying every byte.

    Args:
        tier: the tier holding the copy.
        prefix: the copy's key prefix (``<run>/<step>/``).
        manifest: the copy's validated manifest.
        rank: which rank's file and state to load.
        into: optional state whose tensors (matched by key path) are filled in place
            and returned in the result instead of new tensors.
        device: where tensors not given by ``into`` are created (default: the CPU).
            Tensors on a CUDA device, new or ``into``, are filled through a small
            ring of pinned host buffers: reads, checksum and host-to-device copies
            overlap, and host memory stays at the ring's size.

    Raises:
        ObjectNotFoundError, ChecksumMismatchError, RankFileError, ManifestError:
            the copy is damaged (the caller falls back).
        StateMismatchError: ``into`` does not fit the checkpoint (no fallback helps).
    """
    record = rank_record(manifest, rank)
    key = prefix + record.name
    _check_object(tier, key, record)  # the real size bounds every allocation below
    into_map = into_targets(into)
    targets = _plan(manifest, rank, into_map, device)
    hasher = StreamHasher(with_sha256=record.sha256 is not None)
    header = _read_header(tier, key, record, hasher)
    check_header(header, record, [t.record for t in targets])
    staged = next((t.tensor.device for t in targets if t.staged), None)
    ring = None if staged is None else HostRing(staged, slots=READ_AHEAD + 1)
    for chunk in read_landings(tier, key, _landings(targets), ring):
        hasher.update(chunk)
    verify_digest(hasher, record)

    loaded = {t.record.name: t.copy_to if t.copy_to is not None else t.tensor for t in targets}
    for target in targets:
        if target.copy_to is not None:
            target.copy_to.copy_(target.tensor)
    return assemble(manifest, rank, loaded, into_map)


def assemble(
    manifest: Manifest,
    rank: int,
    loaded: dict[str, torch.Tensor],
    into_map: dict[str, torch.Tensor],
) -> object:
    """Rank ``rank``'s state from its verified tensors (``loaded``: stored name -> tensor).

    A tensor of ``into_map`` (key path -> tensor) that is not already the loaded one
    is filled by value.

    Raises:
        StateMismatchError: an ``into`` tensor does not fit the checkpoint.
        ManifestError: the state refers to a tensor that is not stored.
    """

    def lookup(name: str, _path: str) -> torch.Tensor:
        return loaded[name]

    def finish(tensor: torch.Tensor, path: str) -> torch.Tensor:
        dest = into_map.get(path)
        if dest is None or dest is tensor or _same_view(dest, tensor):
            return tensor
        if dest.dtype != tensor.dtype or dest.shape != tensor.shape:
            raise StateMismatchError(
                f"{path}: checkpoint has {tensor.dtype} {list(tensor.shape)}, "
                f"into= has {dest.dtype} {list(dest.shape)}"
            )
        dest.copy_(tensor)
        return dest

    try:
        return unflatten_state(manifest.states[rank], lookup, finish if into_map else None)
    except (FormatError, TierError):
        raise
    except KeyError as exc:
        raise ManifestError(f"state refers to unknown tensor {exc}") from None


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.device == b.device
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.storage_offset() == b.storage_offset()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )
