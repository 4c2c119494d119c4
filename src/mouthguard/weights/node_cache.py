"""A node-local copy of remote weights: S3 -> local NVMe -> GPU.

The first instance on a node pulls the files from the object store into a cache
directory; every later load on that node (another process, a restart, the next
autoscaled instance) reads the local copy at the local disk's speed.

Layout: ``<cache dir>/<source id>/<file name>/<version>``. The source id is a
hash of the source's URL, so two models never share a directory; the version
is a hash of the remote object's size and ETag (:func:`version_of`), so a copy
is served only while the remote object is the one it was copied from. A
fine-tuned model pushed to the same URL with the same shapes has new ETags: its
files are downloaded again (and reported in :attr:`Localized.refreshed`), never
served stale. The remote sizes and ETags come from one listing of the model's
directory (:meth:`~mouthguard.tiers.base.Tier.list_info`), not a request per file.

A file is downloaded through concurrent ranged reads into a temporary file in
its version's directory, hashed on the way when its checksum is known (and then
refused on a mismatch), fsynced, and renamed into place: a cached file is
complete or absent, and two processes caching at once each write their own
temporary file (the last rename wins, with the same bytes). Once a new version
is in place, the file's other versions are deleted, so the cache holds one copy
per file (a load that is reading an older version while a push lands may then
fail with ``ObjectNotFoundError``; it never reads mixed bytes). Files with
checksums are verified again while loading, every time, so a copy damaged on
the local disk is caught then.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import posixpath
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from mouthguard.errors import ChecksumMismatchError, ObjectNotFoundError, TierError
from mouthguard.format.checksum import StreamHasher
from mouthguard.io.read_ahead import read_in_order
from mouthguard.tiers.base import ObjectInfo
from mouthguard.tiers.local import LocalTier
from mouthguard.weights.source import WeightFile, WeightSource

log = logging.getLogger(__name__)

#: Size of each ranged read of a download.
DOWNLOAD_CHUNK_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Localized:
    """What :func:`localize` did.

    Attributes:
        source: the same files, read from the node-local copy.
        downloaded: bytes pulled from the remote source by this call.
        refreshed: files whose cached copy was of an older remote version (a new
            ETag or size) and were downloaded again.
    """

    source: WeightSource
    downloaded: int
    refreshed: tuple[str, ...]


def source_id(source: WeightSource) -> str:
    """The cache directory name of ``source``: a hash of where it lives."""
    return hashlib.sha256(source.description.encode()).hexdigest()[:24]


def version_of(info: ObjectInfo) -> str:
    """The cache name of one version of a remote object: a hash of its size and ETag.

    A tier that reports no ETag falls back to the modification time, and one that
    reports neither to the size alone (then a same-size rewrite is not seen).
    """
    stamp = info.etag if info.etag is not None else f"mtime:{info.mtime!r}"
    return hashlib.sha256(f"{info.size}\0{stamp}".encode()).hexdigest()[:24]


def remote_versions(source: WeightSource) -> dict[str, ObjectInfo]:
    """Each file's size and ETag by key, from one listing of the files' directory.

    Raises:
        ObjectNotFoundError: a file the source names is not in the listing.
        TierError: the listing failed.
    """
    parents = [file.key.rpartition("/")[0] for file in source.files]
    common = posixpath.commonpath(parents) if parents and all(parents) else ""
    listed = {info.key: info for info in source.tier.list_info(f"{common}/" if common else "")}
    for file in source.files:
        if file.key not in listed:
            raise ObjectNotFoundError(f"{source.where(file)}: no such object")
    return listed


def localize(source: WeightSource, cache_dir: Path) -> Localized:
    """``source`` read from a local copy under ``cache_dir``, fresh as of this call.

    Raises:
        ChecksumMismatchError: a downloaded file does not match its checksum
            (nothing is cached for it).
        TierError: the remote source cannot be read.
    """
    directory = cache_dir / source_id(source)
    directory.mkdir(parents=True, exist_ok=True)
    remote = remote_versions(source)
    downloaded, refreshed, files = 0, list[str](), list[WeightFile]()
    for file in source.files:
        info = remote[file.key]
        version = version_of(info)
        target = directory / file.name / version
        if not (target.is_file() and target.stat().st_size == info.size):
            older = _versions(directory / file.name, keep=version)
            with source.naming(file):
                _download(source, file, info, target)
            downloaded += info.size
            if older:
                refreshed.append(file.name)
                log.info(
                    "%s changed since it was cached (now %d bytes, ETag %s): downloaded again",
                    source.where(file),
                    info.size,
                    info.etag,
                )
            for path in older:  # one copy per file: the older versions go
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        files.append(replace(file, key=f"{file.name}/{version}"))
    local = LocalTier(directory, name="weights-cache", domain="local")
    opened = replace(source, tier=local, files=tuple(files))
    return Localized(opened, downloaded, tuple(refreshed))


def _versions(folder: Path, keep: str) -> list[Path]:
    """The cached versions of one file other than ``keep`` (never temporary files).

    Creates ``folder`` if missing. A file in its place is a copy in the earlier
    one-file-per-name layout, of no known version: it is removed (a cache miss).
    """
    if folder.is_file() or folder.is_symlink():
        folder.unlink()
    folder.mkdir(exist_ok=True)
    return [p for p in folder.iterdir() if p.name != keep and not p.name.startswith(".")]


def _download(source: WeightSource, file: WeightFile, info: ObjectInfo, target: Path) -> None:
    """Copy ``file`` (the version ``info`` describes) to ``target``, or nothing at all.

    Raises:
        ChecksumMismatchError: the bytes do not match the file's checksum.
        TierError: the remote object changed while it was read (its ranges may
            mix two versions), or the read failed.
    """
    size = info.size
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
                f"{source.where(file)}: downloaded bytes do not match the manifest"
            )
        now = source.tier.head(file.key)
        if (now.size, now.etag) != (info.size, info.etag):
            raise TierError(
                f"{source.where(file)} changed on the remote while it was "
                f"downloaded (ETag {info.etag} -> {now.etag}): nothing cached; load again"
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
