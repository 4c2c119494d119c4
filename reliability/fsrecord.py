"""Record the file-system operations of a real save, as the power-loss harness replays them.

:class:`Recorder` replaces, for the duration of a ``with`` block, the ``os``
functions through which the local tier does every mutation (``open`` with
``O_CREAT``, ``write``, ``pwrite``, ``ftruncate``, ``fsync``, ``fdatasync``,
``rename``, ``replace``, ``link``, ``unlink``, ``remove``, ``mkdir``,
``rmdir``; ``pathlib`` calls the same functions). Each wrapper performs the
real call and then appends what it did to a JSON-lines log, inside one lock, so
the log's order is the order in which the calls completed -- across the
threads of this process and, through an ``flock`` on the log file, across the
processes (ranks) that record into the same log.

Operations name inodes by their real inode number; a ``create`` or ``mkdir``
(re)binds a number, so the replayer (:mod:`reliability.crashstates`) can tell a
reused inode number from the file it used to be. Only paths under ``root`` are
recorded; calls with ``dir_fd`` or other keyword arguments pass through
unrecorded (the local tier makes none). Extended attributes (importance hints)
are advisory and not recorded.

A ``mark`` line carries what the driver knows at that moment (a save was
acknowledged, retention is about to delete a step): a crash state cut after the
mark is held to it.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Op = dict[str, Any]

_PATCHED = (
    "open",
    "close",
    "write",
    "pwrite",
    "ftruncate",
    "fsync",
    "fdatasync",
    "rename",
    "replace",
    "link",
    "unlink",
    "remove",
    "mkdir",
    "rmdir",
)


class Recorder:
    """Records mutations under ``root`` into ``log`` while active (a context manager).

    Args:
        root: the directory whose subtree is recorded (it must exist; its inode
            is the replay's root).
        log: the JSON-lines file the operations are appended to (shared by all
            processes recording one scenario).
    """

    def __init__(self, root: Path, log: Path) -> None:
        self.root = Path(os.path.realpath(root))
        self.log = log
        self._real: dict[str, Any] = {}
        self._fds: dict[int, int] = {}  # open fd -> inode number, for fds under root
        self._lock = threading.RLock()
        self._file: Any = None

    # --- activation ----------------------------------------------------------------

    def __enter__(self) -> Recorder:
        self._file = self.log.open("ab", buffering=0)
        self._real = {name: getattr(os, name) for name in _PATCHED}
        for name in _PATCHED:
            setattr(os, name, getattr(self, f"_{name}"))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, real in self._real.items():
            setattr(os, name, real)
        self._file.close()

    def mark(self, **fields: Any) -> None:
        """Append a driver event (e.g. ``mark(ev="acked", step=3)``) at this point of the log."""
        with self._logged() as emit:
            emit({"op": "mark", **fields})

    # --- helpers -------------------------------------------------------------------

    @contextlib.contextmanager
    def _logged(self) -> Iterator[Any]:
        """Hold both locks for one real call and the log lines it produces."""
        lines: list[bytes] = []

        def emit(op: Op) -> None:
            lines.append(json.dumps(op, sort_keys=True).encode() + b"\n")

        with self._lock:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
            try:
                yield emit
                if lines:
                    self._file.write(b"".join(lines))
            finally:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)

    def _inside(self, path: Any) -> Path | None:
        """The absolute path if it lies under the root (parent resolved), else None."""
        p = Path(os.fsdecode(path))
        p = p if p.is_absolute() else Path.cwd() / p
        parent = Path(os.path.realpath(p.parent))
        full = parent / p.name
        if full == self.root or self.root in full.parents:
            return full
        return None

    @staticmethod
    def _ino(path: Path) -> int | None:
        try:
            return os.lstat(path).st_ino
        except OSError:
            return None

    # --- the wrappers ---------------------------------------------------------------

    def _open(self, path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        where = self._inside(path) if not kw else None
        if where is None:
            return int(self._real["open"](path, flags, mode, **kw))
        with self._logged() as emit:
            existed = self._ino(where) is not None
            fd = int(self._real["open"](path, flags, mode))
            st = os.fstat(fd)
            self._fds[fd] = st.st_ino
            if flags & os.O_CREAT and not existed:
                kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
                emit(
                    {
                        "op": "create",
                        "kind": kind,
                        "dir": os.lstat(where.parent).st_ino,
                        "name": where.name,
                        "ino": st.st_ino,
                    }
                )
        return fd

    def _close(self, fd: int) -> None:
        with self._lock:
            self._fds.pop(fd, None)
            self._real["close"](fd)

    def _write(self, fd: int, data: Any) -> int:
        if fd not in self._fds:
            return int(self._real["write"](fd, data))
        with self._logged() as emit:
            n = int(self._real["write"](fd, data))
            end = os.lseek(fd, 0, os.SEEK_CUR)
            emit(self._write_op(fd, end - n, bytes(memoryview(data).cast("B")[:n])))
        return n

    def _pwrite(self, fd: int, data: Any, offset: int) -> int:
        if fd not in self._fds:
            return int(self._real["pwrite"](fd, data, offset))
        with self._logged() as emit:
            n = int(self._real["pwrite"](fd, data, offset))
            emit(self._write_op(fd, offset, bytes(memoryview(data).cast("B")[:n])))
        return n

    def _write_op(self, fd: int, offset: int, data: bytes) -> Op:
        return {
            "op": "write",
            "ino": self._fds[fd],
            "off": offset,
            "data": base64.b64encode(data).decode(),
        }

    def _ftruncate(self, fd: int, length: int) -> None:
        if fd not in self._fds:
            self._real["ftruncate"](fd, length)
            return
        with self._logged() as emit:
            self._real["ftruncate"](fd, length)
            emit({"op": "truncate", "ino": self._fds[fd], "size": length})

    def _fsync(self, fd: int) -> None:
        self._sync("fsync", fd)

    def _fdatasync(self, fd: int) -> None:
        self._sync("fdatasync", fd)

    def _sync(self, name: str, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        if fd not in self._fds:
            self._real[name](fd)
            return
        with self._logged() as emit:
            self._real[name](fd)
            emit({"op": "fsync", "ino": self._fds[fd]})

    def _rename(self, src: Any, dst: Any, **kw: Any) -> None:
        self._move("rename", src, dst, **kw)

    def _replace(self, src: Any, dst: Any, **kw: Any) -> None:
        self._move("replace", src, dst, **kw)

    def _move(self, name: str, src: Any, dst: Any, **kw: Any) -> None:
        s, d = (self._inside(src), self._inside(dst)) if not kw else (None, None)
        if s is None or d is None:
            self._real[name](src, dst, **kw)
            return
        with self._logged() as emit:
            ino = self._ino(s)
            self._real[name](src, dst)
            emit(
                {
                    "op": "rename",
                    "ino": ino,
                    "sdir": os.lstat(s.parent).st_ino,
                    "sname": s.name,
                    "dir": os.lstat(d.parent).st_ino,
                    "name": d.name,
                }
            )

    def _link(self, src: Any, dst: Any, **kw: Any) -> None:
        s, d = (self._inside(src), self._inside(dst)) if not kw else (None, None)
        if s is None or d is None:
            self._real["link"](src, dst, **kw)
            return
        with self._logged() as emit:
            self._real["link"](src, dst)
            emit(
                {
                    "op": "link",
                    "ino": os.lstat(d).st_ino,
                    "dir": os.lstat(d.parent).st_ino,
                    "name": d.name,
                }
            )

    def _unlink(self, path: Any, **kw: Any) -> None:
        self._remove_entry("unlink", path, **kw)

    def _remove(self, path: Any, **kw: Any) -> None:
        self._remove_entry("remove", path, **kw)

    def _rmdir(self, path: Any, **kw: Any) -> None:
        self._remove_entry("rmdir", path, **kw)

    def _remove_entry(self, name: str, path: Any, **kw: Any) -> None:
        where = self._inside(path) if not kw else None
        if where is None:
            self._real[name](path, **kw)
            return
        with self._logged() as emit:
            parent = os.lstat(where.parent).st_ino
            self._real[name](path)
            emit({"op": "unlink", "dir": parent, "name": where.name})

    def _mkdir(self, path: Any, mode: int = 0o777, **kw: Any) -> None:
        where = self._inside(path) if not kw else None
        if where is None:
            self._real["mkdir"](path, mode, **kw)
            return
        with self._logged() as emit:
            self._real["mkdir"](path, mode)
            emit(
                {
                    "op": "create",
                    "kind": "dir",
                    "dir": os.lstat(where.parent).st_ino,
                    "name": where.name,
                    "ino": os.lstat(where).st_ino,
                }
            )


def read_log(log: Path) -> list[Op]:
    """The operations of a log, in order (write data decoded to bytes)."""
    ops: list[Op] = []
    for line in log.read_bytes().splitlines():
        op = json.loads(line)
        if op["op"] == "write":
            op["data"] = base64.b64decode(op["data"])
        ops.append(op)
    return ops
