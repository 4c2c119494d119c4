"""POSIX helpers of the local tier: error wording and the sweep of interrupted writes."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path

from mouthguard.errors import TierError
from mouthguard.tiers.object_keys import MAX_KEY_LENGTH, is_valid_segment

#: Name prefix of the local tier's temporary files: dot-named, so never an object.
TMP_PREFIX = ".tmp-"


def describe_oserror(exc: OSError) -> str:
    """Return a clear, lower-case description of ``exc`` (ENOSPC is spelled out)."""
    if exc.errno == errno.ENOSPC:
        return "no space left on device (ENOSPC)"
    if exc.errno == errno.EDQUOT:
        return "disk quota exceeded, no space left for this user (EDQUOT)"
    if exc.errno:
        return f"{os.strerror(exc.errno).lower()} ({errno.errorcode.get(exc.errno, exc.errno)})"
    return str(exc)


def links_below(root: Path, dir_key: str) -> bool:
    """Whether ``root`` or a directory of ``dir_key`` under it is a symbolic link.

    ``dir_key`` is empty or valid key segments each ending with ``/`` (no ``.``,
    ``..`` or empty segment); ``root`` is a real path (no link among its
    components when the tier was made). Only the components that exist are
    looked at: past one that does not, nothing can be a link. The answer is that of
    ``os.path.realpath(root / dir_key) != str(root / dir_key)`` for such paths,
    except that the root's own parents are not looked at again: one ``lstat`` per
    component below the root instead of realpath's one per component from ``/``,
    in Python (54 against 10 µs for a key two levels under a root six deep; every
    operation of the local tier asks this once).
    """
    path = os.fspath(root)
    parts = dir_key.split("/")[:-1] if dir_key else []
    for part in ("", *parts):
        if part:
            path = f"{path}/{part}"
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return False  # realpath, not strict, takes an unreadable component as no link
        if stat.S_ISLNK(mode):
            return True
    return False


XATTR_PREFIX = "user.mouthguard."
#: errnos meaning "this filesystem (or mount) does not do user xattrs": advisory, so not an error
_NO_XATTR = (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES, errno.E2BIG, errno.ERANGE)


def set_xattrs(path: Path, tags: Mapping[str, str]) -> bool:
    """Set ``user.mouthguard.<tag>`` attributes on a file; False where unsupported.

    Raises:
        OSError: for errors other than "not supported here" (e.g. the file vanished).
    """
    try:
        for name, value in tags.items():
            os.setxattr(path, XATTR_PREFIX + name, value.encode(), follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _NO_XATTR:
            return False
        raise
    return True


def get_xattrs(path: Path) -> dict[str, str]:
    """The ``user.mouthguard.*`` attributes of a file (empty where unsupported)."""
    try:
        names = [n for n in os.listxattr(path, follow_symlinks=False) if n.startswith(XATTR_PREFIX)]
        return {
            n[len(XATTR_PREFIX) :]: os.getxattr(path, n, follow_symlinks=False).decode(
                errors="replace"
            )
            for n in names
        }
    except OSError as exc:
        if exc.errno in _NO_XATTR:
            return {}
        raise


def scan_dir(
    root: Path, dir_key: str, on_error: Callable[[OSError], TierError]
) -> list[tuple[str, bool]]:
    """Return ``(name, is_dir)`` for the regular files and real directories in ``dir_key``.

    Names that are not valid key segments are skipped, which includes every
    dot-name (temporary files). A ``dir_key`` reached through a symbolic link is
    not part of the tier and scans as empty.
    """
    if links_below(root, dir_key):
        return []
    directory = root / dir_key
    try:
        with os.scandir(directory) as scan:
            return [
                (e.name, e.is_dir(follow_symlinks=False))
                for e in scan
                if is_valid_segment(e.name)
                and (e.is_dir(follow_symlinks=False) or e.is_file(follow_symlinks=False))
            ]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise on_error(exc) from exc


def walk_keys(
    scan: Callable[[str], list[tuple[str, bool]]], dir_key: str, prefix: str
) -> Generator[str, None, None]:
    """Yield, in key order, the keys under ``dir_key`` that start with ``prefix``."""
    # Sorting directories as "name/" keeps the walk in global key order
    # ("a-b" < "a/x" < "a0"), so keys stream out without a global sort.
    entries = sorted((n + "/" if d else n, d) for n, d in scan(dir_key))
    for name, is_dir in entries:
        key = dir_key + name
        if is_dir:
            if key.startswith(prefix) or prefix.startswith(key):
                yield from walk_keys(scan, key, prefix)
        elif key.startswith(prefix) and len(key) <= MAX_KEY_LENGTH:
            yield key


@dataclass
class DebrisSweep:
    """Removes what writers killed inside ``put`` left under ``prefix``.

    Debris is temporary files (a write in progress) and empty directories (a
    writer killed between ``mkdir`` and creating its temporary file). Only debris
    older than ``cutoff`` (a unix time) is removed: younger debris may belong to
    a writer still in flight in another process. Symbolic links are never
    followed.

    Attributes:
        root: the tier's root directory (a realpath).
        prefix: key prefix to sweep (empty or ending with ``/``, or a plain prefix).
        cutoff: debris modified at or after this time is kept.
        on_error: builds the TierError for an unexpected OSError at a key path.
        prune: removes a directory and its now-empty parents up to the root.
    """

    root: Path
    prefix: str
    cutoff: float
    on_error: Callable[[str, OSError], TierError]
    prune: Callable[[Path], None]

    def run(self) -> int:
        """Sweep and return how many items (files and directories) were removed."""
        return self._sweep(self.prefix[: self.prefix.rfind("/") + 1])

    def _sweep(self, dir_key: str) -> int:
        if links_below(self.root, dir_key):
            return 0
        directory = self.root / dir_key
        try:
            with os.scandir(directory) as scan:
                entries = list(scan)
        except (FileNotFoundError, NotADirectoryError):
            return 0
        except OSError as exc:
            raise self.on_error(dir_key or "/", exc) from exc
        removed = 0
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and is_valid_segment(entry.name):
                sub = f"{dir_key}{entry.name}/"
                if sub.startswith(self.prefix) or self.prefix.startswith(sub):
                    removed += self._sweep(sub)
            elif (
                entry.name.startswith(TMP_PREFIX)
                and dir_key.startswith(self.prefix)
                and entry.is_file(follow_symlinks=False)
            ):
                removed += self._remove_if_stale(entry, dir_key)
        if removed:
            self.prune(directory)
        elif (
            dir_key.startswith(self.prefix) and dir_key and _is_stale_empty(directory, self.cutoff)
        ):
            self.prune(directory)
            removed += 1
        return removed

    def _remove_if_stale(self, entry: os.DirEntry[str], dir_key: str) -> int:
        try:
            if entry.stat(follow_symlinks=False).st_mtime >= self.cutoff:
                return 0
            Path(entry.path).unlink()
        except FileNotFoundError:
            return 0  # its writer finished (or another sweeper was faster)
        except OSError as exc:
            raise self.on_error(dir_key, exc) from exc
        return 1


def _is_stale_empty(directory: Path, cutoff: float) -> bool:
    try:
        return directory.stat().st_mtime < cutoff and not any(directory.iterdir())
    except OSError:
        return False
