"""A node-local copy of remote weights: S3 -> local NVMe -> GPU.

The first instance on a node pulls the files from the object store into a cache
directory; every later load on that node (another process, a restart, the next
autoscaled instance) reads the local copy at the local disk's speed.

Layout: ``<cache dir>/<source id>/<file name>``, where the source id is a hash of
the source's URL, so two models never share a directory. A file is downloaded
through concurrent ranged reads into a temporary file in the same directory,
hashed on the way when its checksum is known (and then refused on a mismatch),
fsynced, and renamed into place: a cached file is complete or absent, and two
processes caching at once each write their own temporary file (the last rename
wins, with the same bytes). A cached file counts as present when its size
matches the remote one; files with checksums are verified again while loading,
every time, so a copy damaged on the local disk is caught then.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from dataclasses import replace
from pathlib import Path

from mouthguard.checkpoint.read_ahead import read_in_order
from mouthguard.errors import ChecksumMismatchError
from mouthguard.format.checksum import StreamHasher
from mouthguard.tiers.local import LocalTier
from mouthguard.weights.source import WeightFile, WeightSource

#: Size of each ranged read of a download.
DOWNLOAD_CHUNK_BYTES = 16 * 1024 * 1024


def source_id(source: WeightSource) -> str:
    """The cache directory name of ``source``: a hash of where it lives."""
    return hashlib.sha256(source.description.encode()).hexdigest()[:24]


def localize(source: WeightSource, cache_dir: Path) -> tuple[WeightSource, int]:
    """``source`` read from a local copy under ``cache_dir``; also the bytes downloaded now.

    Raises:
        ChecksumMismatchError: a downloaded file does not match its checksum
            (nothing is cached for it).
        TierError: the remote source cannot be read.
    """
    directory = cache_dir / source_id(source)
    directory.mkdir(parents=True, exist_ok=True)
    downloaded = 0
    files = []
    for file in source.files:
        size = source.tier.head(file.key).size
        target = directory / file.name
        if not (target.is_file() and target.stat().st_size == size):
            _download(source, file, size, target)
            downloaded += size
        files.append(replace(file, key=file.name))
    local = LocalTier(directory, name="weights-cache", domain="local")
    return WeightSource(local, tuple(files), source.kind, source.description), downloaded


def _download(source: WeightSource, file: WeightFile, size: int, target: Path) -> None:
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
    hasher = StreamHasher(with_sha256=file.sha256 is not None) if file.checksum else None
    buffers = [bytearray(DOWNLOAD_CHUNK_BYTES) for _ in range(5)]
    jobs = (
        (offset, memoryview(buffers[i % len(buffers)])[: min(DOWNLOAD_CHUNK_BYTES, size - offset)])
        for i, offset in enumerate(range(0, size, DOWNLOAD_CHUNK_BYTES))
    )
    try:
        with temporary.open("wb") as out:
            for chunk in read_in_order(source.tier, file.key, jobs, ahead=len(buffers) - 1):
                if hasher is not None:
                    hasher.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if hasher is not None and (
            hasher.xxh3 != file.checksum or (file.sha256 and hasher.sha256 != file.sha256)
        ):
            raise ChecksumMismatchError(
                f"{source.description}/{file.name}: downloaded bytes do not match the manifest"
            )
        temporary.replace(target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
