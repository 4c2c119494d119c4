"""Where a dataset without ``cache_dir`` keeps its S3 shards and its verification record.

**Verification record.** A local dataset read in place is hashed before its
first sample; the record of files that hashed right
(:class:`~mouthguard.data.fetching.verified.VerifiedFiles`) is kept by
:func:`default_verified_dir` in a private per-user directory that outlives the
process -- ``$MOUTHGUARD_VERIFIED_DIR``, else ``$XDG_CACHE_HOME/mouthguard/verified``,
else ``~/.cache/mouthguard/verified`` -- so a new training process does not hash
every shard again before its first sample. Its records are named by file path,
part and expected sha256 and trusted only while the file's stat stamp
(device, inode, size, mtime, ctime) is unchanged, so sharing it across runs and
datasets is safe. A directory that is not private (another owner, or writable by
group or others) is not used: a record there could be forged by someone else.

**S3 shards.** An S3 dataset needs somewhere on local disk to keep verified
shards. Without ``cache_dir`` it is a per-user cache that outlives the process,
so a second run starts warm: ``$MOUTHGUARD_CACHE_DIR``, else
``$XDG_CACHE_HOME/mouthguard/shards``, else ``~/.cache/mouthguard/shards`` --
never the system's temporary directory by default, which on many machines (and
in most containers) is a ``tmpfs``, where cached shards would live in RAM. Its
entries are named by their sha256 and verified as they are written, so one
cache serves every dataset and process of the user; like the verification
record it must be private (see above), and bounded: by ``cache_limit``, else
half of the space free on its filesystem. If it cannot be used, a fresh
temporary directory is (removed with its dataset). :func:`default_shard_dir`
says which, once per process and directory: where, on which filesystem and up to
how much -- a ``UserWarning`` when it keeps files in memory, so a user learns it
before the training process is out of memory rather than after; else a log line
(``WARNING``, so it shows without any logging set up).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

#: Filesystems whose files live in RAM (or swap).
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
#: Shard directories already named in this process (one line each, not one per dataset).
_SAID: set[str] = set()


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


def default_shard_dir(
    limit: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    mounts: str = "/proc/mounts",
) -> tuple[str, bool]:
    """``(directory, temporary)``: where an S3 dataset without ``cache_dir`` caches shards.

    ``temporary``: the per-user cache could not be used, so this is a new
    temporary directory, the caller's to remove. ``limit``: the cache's
    ``cache_limit``, for the line that names the directory (see the module docstring).

    Warns:
        UserWarning: the directory is on a RAM-backed filesystem (``tmpfs``).
    """
    chosen = _private_dir("MOUTHGUARD_CACHE_DIR", "shards", environ)
    temporary = chosen is None
    directory = tempfile.mkdtemp(prefix="mouthguard-data-") if chosen is None else chosen
    _say_once(directory, temporary, limit, mounts)
    return directory, temporary


def _say_once(directory: str, temporary: bool, limit: int | None, mounts: str) -> None:
    """Name where S3 shards go and how much they may take, once per process and directory."""
    if directory in _SAID:
        return
    _SAID.add(directory)
    kind = filesystem_type(directory, mounts)
    on = f", on {kind}" if kind else ""
    if limit is not None:
        much = f"up to {_gib(limit)} (cache_limit)"
    else:
        try:
            free = shutil.disk_usage(directory).free
        except OSError:  # the directory went meanwhile: the cache will say why
            free = 0
        much = f"up to half of the space free there ({_gib(free // 2)} now)"
    what = "a temporary directory, removed with its dataset" if temporary else "kept across runs"
    choose = "pass cache_dir= (a directory on a local disk) and cache_limit= to choose"
    if kind in RAM_FILESYSTEMS:
        warnings.warn(
            f"S3 shards are cached in {directory}{on}: in memory, {much}. {choose}.",
            stacklevel=4,
        )
        return
    log.warning("S3 shards are cached in %s (%s%s), %s; %s", directory, what, on, much, choose)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _private_dir(variable: str, leaf: str, environ: Mapping[str, str] | None) -> str | None:
    """``$variable``, else ``$XDG_CACHE_HOME/mouthguard/leaf``, else ``~/.cache/...``; if private.

    Made (mode 0700) if missing; None if it cannot be made or is not private
    (another owner, or writable by group or others).
    """
    env = os.environ if environ is None else environ
    named = env.get(variable)
    if named:
        chosen = Path(named)
    else:
        base = env.get("XDG_CACHE_HOME")
        chosen = (Path(base) if base else Path.home() / ".cache") / "mouthguard" / leaf
    try:
        chosen.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = chosen.stat()
    except OSError:
        return None
    private = info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return str(chosen) if private and stat.S_ISDIR(info.st_mode) else None


def default_verified_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The persistent, private verification-record directory, or None if unusable.

    See the module docstring for where it is and when it is refused.
    """
    return _private_dir("MOUTHGUARD_VERIFIED_DIR", "verified", environ)
