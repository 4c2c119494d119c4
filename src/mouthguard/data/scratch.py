"""Where a dataset without ``cache_dir`` keeps its S3 shards and its verification record.

**Verification record.** A local dataset read in place is hashed before its
first sample; the record of files that hashed right
(:class:`~mouthguard.data.verified.VerifiedFiles`) is kept by
:func:`default_verified_dir` in a private per-user directory that outlives the
process -- ``$MOUTHGUARD_VERIFIED_DIR``, else ``$XDG_CACHE_HOME/mouthguard/verified``,
else ``~/.cache/mouthguard/verified`` -- so a new training process does not hash
every shard again before its first sample. Its records are named by file path,
part and expected sha256 and trusted only while the file's stat stamp
(device, inode, size, mtime, ctime) is unchanged, so sharing it across runs and
datasets is safe. A directory that is not private (another owner, or writable by
group or others) is not used: a record there could be forged by someone else.

**S3 shards.**
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
import stat
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


def default_verified_dir(environ: dict[str, str] | None = None) -> str | None:
    """The persistent, private verification-record directory, or None if unusable.

    See the module docstring for where it is and when it is refused.
    """
    env = os.environ if environ is None else environ
    named = env.get("MOUTHGUARD_VERIFIED_DIR")
    if named:
        chosen = Path(named)
    else:
        base = env.get("XDG_CACHE_HOME")
        chosen = (Path(base) if base else Path.home() / ".cache") / "mouthguard" / "verified"
    try:
        chosen.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = chosen.stat()
    except OSError:
        return None
    private = info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return str(chosen) if private and stat.S_ISDIR(info.st_mode) else None
