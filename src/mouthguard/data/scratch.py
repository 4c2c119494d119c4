"""Where a dataset without ``cache_dir`` keeps its S3 shards, and a warning if that is RAM.

An S3 dataset needs somewhere to keep verified shards. Without ``cache_dir`` it
takes a fresh directory under the system's temporary directory, which on many
machines (and in most containers) is a ``tmpfs``: the shards then live in RAM,
and the cache's default limit -- half the filesystem's free space -- is half the
free memory. :func:`default_shard_dir` makes that directory and warns, naming it,
when its filesystem keeps files in memory, so a user learns it before the
training process is out of memory rather than after.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

#: Filesystems whose files live in RAM (or swap).
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def filesystem_type(path: str | os.PathLike[str], mounts: str = "/proc/mounts") -> str | None:
    """The type of the filesystem holding ``path`` (the longest mount point above it), or None."""
    target = os.path.realpath(path)
    best, kind = "", None
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def default_shard_dir(mounts: str = "/proc/mounts") -> str:
    """A new temporary directory for shards; warns when it is in RAM.

    Warns:
        UserWarning: the directory is on a RAM-backed filesystem (``tmpfs``).
    """
    directory = tempfile.mkdtemp(prefix="mouthguard-data-")
    kind = filesystem_type(directory, mounts)
    if kind in RAM_FILESYSTEMS:
        warnings.warn(
            f"S3 shards are cached in {directory}, on {kind}: in memory, up to half of "
            "what is free. Pass cache_dir= (a directory on a local disk) and cache_limit= "
            "to keep them on disk.",
            stacklevel=3,
        )
    return directory
