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

The file work below the operations (paths, fsyncs, temporary files, writes) is in
:mod:`mouthguard.tiers.local_files`, which ``LocalTier`` inherits.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import stat
import time
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path

from typing_extensions import override

from mouthguard.errors import (
    DurabilityError,
    ObjectExistsError,
    ObjectNotFoundError,
    TierError,
)
from mouthguard.io.direct_read import DIRECT_READ_MIN_BYTES, read_direct
from mouthguard.io.direct_write import drop_cached
from mouthguard.tiers.base import (
    ObjectInfo,
    PutData,
    PutMode,
    TierCapabilities,
)
from mouthguard.tiers.local_files import MISSING_ERRNOS, LinkedPathError, LocalFiles, file_stamp
from mouthguard.tiers.object_keys import (
    validate_dir_prefix,
    validate_prefix,
    validate_rename,
)
from mouthguard.tiers.posix import (
    TMP_PREFIX,
    DebrisSweep,
    get_xattrs,
    scan_dir,
    set_xattrs,
    walk_keys,
)
from mouthguard.tiers.ranges import check_range


class LocalTier(LocalFiles):
    """A tier over a POSIX directory (local disk, NVMe, or a POSIX network filesystem).

    Args:
        root: the directory holding the objects; created (``mkdir -p``) if missing.
        name: the tier's name in the store configuration.
        domain: the failure domain of the directory.
        durable: ``fsync`` files and directories so that a completed ``put``
            survives a power loss. Turn off only for scratch tiers and tests.
        direct_io: write large objects with O_DIRECT where the filesystem allows
            (:mod:`~mouthguard.io.direct_write`); off, they go through the page
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

    def open_object(self, key: str) -> tuple[int, int]:
        """Open ``key`` for reading as the tier reads it; ``(fd, size)``, the caller closes fd.

        For a caller that maps the file (``mmap``) rather than reading it: the same
        checks as every read (``O_NOFOLLOW``, a regular file, no link on the way).

        Raises:
            ObjectNotFoundError: no such object, or it is not a regular file.
            TierError: it cannot be opened.
        """
        return self._open_object(key)

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

        Large ranges are read with O_DIRECT where allowed (:mod:`~mouthguard.io.direct_read`:
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
            cls = ObjectNotFoundError if exc.errno in MISSING_ERRNOS else TierError
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
            if exc.errno in MISSING_ERRNOS:
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


# What other modules import from here: TMP_PREFIX lives in posix.py, LinkedPathError
# and file_stamp in local_files.py since the file helpers moved; their path stays.
__all__ = ["TMP_PREFIX", "LinkedPathError", "LocalTier", "file_stamp"]
