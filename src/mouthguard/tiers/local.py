"""A POSIX directory tier that follows the crash-safe write rules.

Key ``a/b/c`` is the regular file ``<root>/a/b/c``. ``put`` writes a dot-named
temporary file in the destination directory, syncs it with ``fsync``, publishes
it with ``rename`` (overwrite) or ``link`` (create-only, atomic: the kernel
refuses an existing name) and then syncs the directory, so that after ``put``
returns both the bytes and the name survive a power loss. Every directory it
creates is made durable the same way, one level at a time.

The tier never leaves its root: keys are validated before any I/O, a key whose
parent path passes through a symbolic link is refused, and final components are
opened with ``O_NOFOLLOW``. Symbolic links and other non-regular files inside
the root are not objects: ``list`` skips them and ``get``/``head`` report them
as missing. (A concurrent process that swaps a directory for a link between the
check and the open is out of scope: the root belongs to this tier.)

A failed ``fsync`` raises :class:`DurabilityError` and is never retried: the
kernel may already have dropped the dirty pages, so a retry proves nothing.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import stat
import time
import uuid
from collections.abc import Generator, Iterable, Iterator, Mapping
from pathlib import Path

from typing_extensions import override

from mouthguard.errors import (
    DurabilityError,
    InvalidKeyError,
    ObjectExistsError,
    ObjectNotFoundError,
    TierError,
)
from mouthguard.tiers.base import (
    ObjectInfo,
    PutData,
    PutMode,
    StableChunks,
    Tier,
    TierCapabilities,
    iter_buffers,
)
from mouthguard.tiers.direct_read import DIRECT_READ_MIN_BYTES, read_direct
from mouthguard.tiers.direct_write import DIRECT_MIN_BYTES, WriteError, drop_cached, write_stream
from mouthguard.tiers.object_keys import (
    validate_dir_prefix,
    validate_key,
    validate_prefix,
    validate_rename,
)
from mouthguard.tiers.posix import (
    TMP_PREFIX,
    DebrisSweep,
    describe_oserror,
    get_xattrs,
    scan_dir,
    set_xattrs,
    walk_keys,
)
from mouthguard.tiers.ranges import check_range

# O_NONBLOCK: opening a FIFO planted in the root must not hang a reader; it has
# no effect on regular files.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# Linux moves at most ~2 GiB per write call; larger chunks are split.
_MAX_IO = 1 << 30
# A concurrent delete() may prune a parent directory that put() just created.
_PUT_ATTEMPTS = 3
_MISSING = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENXIO)


def file_stamp(st: os.stat_result) -> str:
    """A local object's version stamp (its ``etag``): modification time and inode, in hex."""
    return f"{st.st_mtime_ns:x}-{st.st_ino:x}"


class LinkedPathError(InvalidKeyError):
    """A key whose parent path passes through a symbolic link inside the root."""


class LocalTier(Tier):
    """A tier over a POSIX directory (local disk, NVMe, or a POSIX network filesystem).

    Args:
        root: the directory holding the objects; created (``mkdir -p``) if missing.
        name: the tier's name in the store configuration.
        domain: the failure domain of the directory.
        durable: ``fsync`` files and directories so that a completed ``put``
            survives a power loss. Turn off only for scratch tiers and tests.
        direct_io: write large objects with O_DIRECT where the filesystem allows
            (:mod:`~mouthguard.tiers.direct_write`); off, they go through the page
            cache, whose written pages are dropped after the ``fsync``.

    Attributes:
        root: the real path (symbolic links resolved) of the root directory.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        name: str = "local",
        domain: str = "local",
        *,
        durable: bool = True,
        direct_io: bool = True,
    ) -> None:
        super().__init__(name, domain)
        self._durable = durable
        self._direct_io = direct_io
        self._capabilities = TierCapabilities(
            atomic_rename=True,
            conditional_put=True,
            object_lock=False,
            durable=durable,
            persistent=True,
        )
        real = Path(os.path.realpath(os.fspath(root)))
        self.root = real
        base, missing = real, []
        while not base.exists():
            missing.append(base.name)
            base = base.parent
        if not self._mkdirs(base, reversed(missing), str(real)) or not real.is_dir():
            raise TierError(f"tier root {str(real)!r} is not a directory")
        self.root = Path(os.path.realpath(real))

    @property
    @override
    def capabilities(self) -> TierCapabilities:
        """Atomic rename and conditional put; durable as configured; persistent."""
        return self._capabilities

    @override
    def location(self, prefix: str = "") -> str:
        """Return the absolute path of the directory ``root/prefix``."""
        validate_prefix(prefix)
        return str(self.root / prefix) if prefix else str(self.root)

    def path_of(self, key: str) -> Path:
        """Return the file path of ``key`` (validated; it may not exist yet).

        Raises:
            InvalidKeyError: ``key`` is invalid or its parent path passes through a link.
        """
        return self._path(key)

    # --- helpers -----------------------------------------------------------

    def _path(self, key: str) -> Path:
        validate_key(key)
        path = self.root / key
        # realpath resolves only the components that exist; any symbolic link
        # among them makes the result differ from the lexical path.
        if os.path.realpath(path.parent) != str(path.parent):
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
            cls = ObjectNotFoundError if exc.errno in _MISSING else TierError
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

    # --- the tier interface ------------------------------------------------

    @override
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        """Store ``data`` under ``key`` via a temporary file, all-or-nothing.

        On any failure the temporary file is removed and no partial object is
        visible. If the final directory ``fsync`` fails, the freshly published
        object is removed again (the caller is told the write failed).

        Raises:
            InvalidKeyError: ``key`` is invalid or passes through a symbolic link.
            ObjectExistsError: ``mode`` is CREATE and ``key`` exists (atomic).
            DurabilityError: an ``fsync`` failed (durable tiers only).
            TierError: any other I/O failure, e.g. no space left on device.
        """
        path = self._path(key)
        fd, tmp = self._open_temp(key, path.parent)
        try:
            try:
                size, cached = self._write_all(fd, key, data)
                if self._durable:
                    self._sync_fd(fd, key, "the data")
                if cached:
                    drop_cached(fd)  # a checkpoint written once must not crowd out hot data
                st = os.fstat(fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise
            try:
                os.close(fd)
            except OSError as exc:
                raise self._error("close", key, exc) from exc
            self._publish(key, tmp, path, mode)
        finally:
            # After os.replace the name is gone already; the unlink is then a no-op.
            with contextlib.suppress(OSError):
                tmp.unlink()
        if self._durable:
            try:
                self._sync_dir(path.parent, key)
            except DurabilityError:
                with contextlib.suppress(OSError):
                    if os.lstat(path).st_ino == st.st_ino:
                        path.unlink()
                raise
        return ObjectInfo(key, size, st.st_mtime, file_stamp(st))

    def _publish(self, key: str, tmp: Path, path: Path, mode: PutMode) -> None:
        if mode is PutMode.OVERWRITE:
            try:
                tmp.replace(path)
            except OSError as exc:
                raise self._error("publish", key, exc) from exc
            return
        try:
            # link() fails if the name exists: an atomic create-only publish.
            path.hardlink_to(tmp)
        except FileExistsError:
            if stat.S_ISREG(os.lstat(path).st_mode):
                raise ObjectExistsError(
                    f"object {key!r} already exists on tier {self.name!r}"
                ) from None
            raise TierError(
                f"cannot create {key!r} on tier {self.name!r}: a non-object is in the way"
            ) from None
        except OSError as exc:
            raise self._error("publish", key, exc) from exc

    @override
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Return bytes ``[start, end)`` of the object (bulk loads should use ``read_into``).

        Raises:
            InvalidKeyError: ``key`` is invalid or passes through a symbolic link.
            ObjectNotFoundError: no regular file under ``key``.
            TierError: the range is negative, reversed or past the end; I/O errors.
        """
        fd, size = self._open_object(key)
        try:
            stop = check_range(key, size, start, end)
            buf = bytearray(stop - start)
            self._pread_exact(fd, key, start, memoryview(buf))
        finally:
            os.close(fd)
        return bytes(buf)

    @override
    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Fill ``out`` with the object's bytes from ``offset``.

        Large ranges are read with O_DIRECT where allowed (:mod:`.direct_read`:
        no page-cache pollution, one copy); others with ``preadv`` straight into
        ``out``.

        Raises:
            InvalidKeyError: ``key`` is invalid or passes through a symbolic link.
            ObjectNotFoundError: no regular file under ``key``.
            TierError: the range runs past the end, or the file ended early.
        """
        target = out.cast("B")
        fd, size = self._open_object(key)
        try:
            check_range(key, size, offset, offset + target.nbytes)
            if self._direct_io and target.nbytes >= DIRECT_READ_MIN_BYTES:
                try:
                    if read_direct(fd, offset, target):
                        return
                except EOFError as exc:
                    raise TierError(f"short read of {key!r} on tier {self.name!r}: {exc}") from None
                except OSError as exc:
                    raise self._error("read", key, exc) from exc
            self._pread_exact(fd, key, offset, target)
        finally:
            os.close(fd)

    def _pread_exact(self, fd: int, key: str, offset: int, target: memoryview) -> None:
        pos = 0
        while pos < target.nbytes:
            try:
                got = os.preadv(fd, [target[pos:]], offset + pos)
            except OSError as exc:
                raise self._error("read", key, exc) from exc
            if got <= 0:
                # The size was checked on this open file: it was truncated meanwhile.
                raise TierError(
                    f"short read of {key!r} on tier {self.name!r}: end of file after "
                    f"{offset + pos} of {offset + target.nbytes} bytes"
                )
            pos += got

    @override
    def head(self, key: str) -> ObjectInfo:
        """Return the object's info; links and non-regular files are not objects.

        The ``etag`` is :func:`file_stamp`: a publish renames a new file into place,
        so every write gives the key a new inode and a new stamp.
        """
        path = self._path(key)
        try:
            st = os.lstat(path)
        except OSError as exc:
            cls = ObjectNotFoundError if exc.errno in _MISSING else TierError
            raise self._error("stat", key, exc, cls) from exc
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFoundError(f"{key!r} on tier {self.name!r} is not an object")
        return ObjectInfo(key, st.st_size, st.st_mtime, file_stamp(st))

    @override
    def exists(self, key: str) -> bool:
        """Whether ``key`` is an object; a key through a planted link names none."""
        try:
            return super().exists(key)
        except LinkedPathError:
            return False

    @override
    def list(self, prefix: str = "") -> Iterator[str]:
        """Yield, sorted, the keys of regular files starting with ``prefix``.

        Dot-names (temporary files), symbolic links, non-regular files and names
        that are not valid keys are skipped. ``prefix`` is validated eagerly.
        """
        validate_prefix(prefix)
        return self._walk(prefix[: prefix.rfind("/") + 1], prefix)

    def _scan(self, dir_key: str) -> builtins.list[tuple[str, bool]]:
        return scan_dir(self.root, dir_key, lambda exc: self._error("list", dir_key or "/", exc))

    def _walk(self, dir_key: str, prefix: str) -> Generator[str, None, None]:
        return walk_keys(self._scan, dir_key, prefix)

    def _has_objects(self, dir_key: str) -> bool:
        walk = self._walk(dir_key, dir_key)
        try:
            return next(walk, None) is not None
        finally:
            walk.close()

    # ``builtins.list``: in the class body ``list`` names the method above.
    @override
    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Return the sorted sub-directory names under ``prefix`` that hold an object.

        Raises:
            InvalidKeyError: ``prefix`` is invalid or neither empty nor ``/``-terminated.
        """
        validate_dir_prefix(prefix)
        scan = self._scan(prefix)
        return sorted(n for n, d in scan if d and self._has_objects(f"{prefix}{n}/"))

    @override
    def delete(self, key: str) -> bool:
        """Delete the object ``key`` and prune directories left empty.

        Returns:
            Whether an object existed. Links and directories are not objects and
            are left alone (``False``).
        """
        path = self._path(key)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return False
            path.unlink()
        except OSError as exc:
            if exc.errno in _MISSING:
                return False
            raise self._error("delete", key, exc) from exc
        if self._durable:
            self._sync_dir(path.parent, key)
        self._prune(path.parent)
        return True

    @override
    def annotate(self, key: str, tags: Mapping[str, str]) -> bool:
        """Set the tags as ``user.mouthguard.<tag>`` xattrs; False where the filesystem can't."""
        fd, _ = self._open_object(key)  # validates the key, refuses links and non-files
        os.close(fd)
        try:
            return set_xattrs(self._path(key), tags)
        except OSError as exc:
            raise self._error("annotate", key, exc) from exc

    @override
    def annotations(self, key: str) -> dict[str, str]:
        """The ``user.mouthguard.*`` xattrs of the object."""
        fd, _ = self._open_object(key)
        os.close(fd)
        try:
            return get_xattrs(self._path(key))
        except OSError as exc:
            raise self._error("read the annotations of", key, exc) from exc

    @override
    def rename_prefix(self, src: str, dst: str) -> None:
        """Move the directory ``root/src`` to ``root/dst`` with one ``rename``.

        Raises:
            InvalidKeyError: ``src`` or ``dst`` is invalid or passes through a link.
            TierError: the prefixes overlap, or an I/O error.
            ObjectNotFoundError: no object under ``src/``.
            ObjectExistsError: ``dst`` exists and is not an empty directory.
            DurabilityError: the ``fsync`` of a parent directory failed.
        """
        src_p, dst_p = validate_rename(src, dst)
        src_path, dst_path = self._path(src_p[:-1]), self._path(dst_p[:-1])
        # _has_objects is also false for a missing src, a file, or a symbolic link.
        if not self._has_objects(src_p):
            raise ObjectNotFoundError(f"nothing under {src_p!r} on tier {self.name!r}")
        if not self._mkdirs(self.root, dst_p.split("/")[:-2], dst_p):
            raise TierError(f"cannot create the parent directory of {dst_p!r}: it vanished")
        try:
            src_path.rename(dst_path)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise self._error("rename to", dst_p, exc, ObjectExistsError) from exc
            cls = ObjectNotFoundError if exc.errno == errno.ENOENT else TierError
            raise self._error(f"rename {src_p!r} to", dst_p, exc, cls) from exc
        if self._durable:
            self._sync_dir(dst_path.parent, dst_p)
            if src_path.parent != dst_path.parent:
                self._sync_dir(src_path.parent, src_p)
        self._prune(src_path.parent)

    @override
    def collect_incomplete(self, prefix: str, older_than_seconds: float) -> int:
        """Remove temporary files older than ``older_than_seconds`` left under ``prefix``.

        A writer killed inside ``put`` leaves its ``.tmp-`` file behind; ``list``
        never shows it, but it holds disk space. Temporary files of writers still
        in flight are younger than the threshold and are kept. Only directories
        whose key path starts with ``prefix`` are swept.

        Returns:
            How many temporary files were removed.
        """
        validate_prefix(prefix)
        sweep = DebrisSweep(
            root=self.root,
            prefix=prefix,
            cutoff=time.time() - older_than_seconds,
            on_error=lambda where, exc: self._error("clean up", where, exc),
            prune=self._prune,
        )
        return sweep.run()
