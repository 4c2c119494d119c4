"""The file work under :class:`~mouthguard.tiers.local.LocalTier`: paths, fsyncs, temporaries.

:class:`LocalFiles` holds what the local tier does to files and directories
below its operations -- resolving a key to a path without following links,
creating directories durably one level at a time, syncing files and
directories (never retrying a failed ``fsync``), opening temporary files and
objects, writing a buffer or a stream (through
:mod:`~mouthguard.io.direct_write` when large), pruning emptied directories --
so that ``local.py`` reads as the tier's operations and their crash-safety rules.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Iterable
from pathlib import Path

from mouthguard.errors import (
    DurabilityError,
    InvalidKeyError,
    ObjectNotFoundError,
    TierError,
)
from mouthguard.io.direct_write import DIRECT_MIN_BYTES, WriteError, write_stream
from mouthguard.tiers.base import PutData, StableChunks, Tier, iter_buffers
from mouthguard.tiers.object_keys import validate_key
from mouthguard.tiers.posix import TMP_PREFIX, describe_oserror, links_below

# O_NONBLOCK: opening a FIFO planted in the root must not hang a reader; it has
# no effect on regular files.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# Linux moves at most ~2 GiB per write call; larger chunks are split.
_MAX_IO = 1 << 30
# A concurrent delete() may prune a parent directory that put() just created.
_PUT_ATTEMPTS = 3
#: errno values of an open or stat that mean "no such object".
MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENXIO)


def file_stamp(st: os.stat_result) -> str:
    """A local object's version stamp (its ``etag``): modification time and inode, in hex."""
    return f"{st.st_mtime_ns:x}-{st.st_ino:x}"


class LinkedPathError(InvalidKeyError):
    """A key whose parent path passes through a symbolic link inside the root."""


class LocalFiles(Tier):
    """The file helpers of :class:`~mouthguard.tiers.local.LocalTier` (see the module docstring).

    Abstract: the subclass is the tier. It sets ``root`` (the real path of the
    root directory), ``_durable`` and ``_direct_io`` before the first call.
    """

    root: Path
    _durable: bool
    _direct_io: bool

    def _path(self, key: str) -> Path:
        validate_key(key)
        path = self.root / key
        if links_below(self.root, key[: key.rfind("/") + 1]):
            raise LinkedPathError(
                f"key {key!r} on tier {self.name!r} passes through a symbolic link: refused"
            )
        return path

    def _error(
        self, op: str, key: str, exc: OSError, cls: type[TierError] = TierError
    ) -> TierError:
        return cls(
            f"cannot {op} {key!r} on tier {self.name!r} ({self.root}): {describe_oserror(exc)}"
        )

    def _sync_fd(self, fd: int, key: str, what: str) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            raise DurabilityError(
                f"fsync of {what} failed for {key!r} on tier {self.name!r}: "
                f"{describe_oserror(exc)}; the write is abandoned (fsync is never retried)"
            ) from exc

    def _sync_dir(self, directory: Path, key: str) -> None:
        try:
            fd = os.open(directory, _DIR_FLAGS)
        except OSError as exc:
            raise self._error("open the directory to fsync", key, exc, DurabilityError) from exc
        try:
            self._sync_fd(fd, key, f"directory {str(directory)!r}")
        finally:
            os.close(fd)

    def _mkdirs(self, base: Path, names: Iterable[str], key: str) -> bool:
        """Create ``base/name0/name1/...`` one level at a time; False if a level vanished.

        Each new directory's entry is synced in its parent (when durable), so
        the path of an object survives a power loss together with its bytes.
        """
        directory = base
        for name in names:
            directory /= name
            try:
                directory.mkdir()
            except FileExistsError:
                mode = os.lstat(directory).st_mode
                if not stat.S_ISDIR(mode):
                    cls = InvalidKeyError if stat.S_ISLNK(mode) else TierError
                    raise cls(
                        f"cannot store {key!r} on tier {self.name!r}: "
                        f"{str(directory)!r} is not a directory"
                    ) from None
                continue
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise self._error("create the directories of", key, exc) from exc
            if self._durable:
                self._sync_dir(directory.parent, key)
        return True

    def _open_temp(self, key: str, parent: Path) -> tuple[int, Path]:
        for _ in range(_PUT_ATTEMPTS):
            if not parent.is_dir() and not self._mkdirs(self.root, key.split("/")[:-1], key):
                continue
            tmp = parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
            try:
                return os.open(tmp, _TMP_FLAGS, 0o644), tmp
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise self._error("create a temporary file for", key, exc) from exc
        raise TierError(
            f"cannot store {key!r} on tier {self.name!r}: its directory keeps disappearing"
        )

    def _write_all(self, fd: int, key: str, data: PutData) -> tuple[int, bool]:
        """Write ``data`` to ``fd``; return the size and whether pages were cached.

        Streams and large buffers go through the aligned pipeline (O_DIRECT where
        possible); small buffers (manifests, sidecars) are written directly.
        """
        whole = isinstance(data, bytes | bytearray | memoryview)
        if not isinstance(data, bytes | bytearray | memoryview) or (
            memoryview(data).nbytes >= DIRECT_MIN_BYTES
        ):
            try:
                outcome = write_stream(
                    fd,
                    iter_buffers(data),
                    stable=whole or isinstance(data, StableChunks),
                    direct=self._direct_io,
                )
            except WriteError as exc:
                raise self._error("write", key, exc.cause) from exc.cause
            return outcome.size, not outcome.direct
        size = 0
        # Errors raised by ``data`` itself propagate unchanged: they are the caller's.
        for chunk in iter_buffers(data):
            view = chunk
            while view.nbytes:
                try:
                    written = os.write(fd, view[:_MAX_IO])
                except OSError as exc:
                    raise self._error("write", key, exc) from exc
                if written <= 0:
                    raise TierError(f"cannot write {key!r} on tier {self.name!r}: no progress")
                view = view[written:]
                size += written
        return size, False

    def _open_object(self, key: str) -> tuple[int, int]:
        path = self._path(key)
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError as exc:
            cls = ObjectNotFoundError if exc.errno in MISSING_ERRNOS else TierError
            raise self._error("open", key, exc, cls) from exc
        try:
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise self._error("stat", key, exc) from exc
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ObjectNotFoundError(f"{key!r} on tier {self.name!r} is not an object")
        return fd, st.st_size

    def _prune(self, directory: Path) -> None:
        # Best effort and not fsync-ed: an empty directory that reappears after a
        # crash holds no object, so it is invisible to list() and list_dirs().
        while directory != self.root:
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent
