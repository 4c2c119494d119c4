"""The sandbox around a fuzzed store: canaries, FIFOs, and a watch on everything outside.

Layout::

    sandbox/
      canary.txt            # a file next to the store root
      fifo                  # a FIFO: any blocking open of it hangs (the watchdog sees it)
      canary/               # a valid checkpoint tree, a rank file, sidecars, secrets
      store/
        canary-between.txt  # next to the tier roots: one '..' out of a tier
        fast/  durable/     # the tier roots

Linux inotify (through ctypes) reports every open, read, write, create, delete and
attribute change of the watched paths outside the tier roots, by any process, so
"nothing outside the store is read or written" is observed, not assumed. A
snapshot (lstat + content hash) taken before and after backs up the writes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

IN_ACCESS = 0x1
IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_OPEN = 0x20
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_ISDIR = 0x40000000
READS = IN_ACCESS | IN_OPEN
WRITES = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
_EVENT = struct.Struct("iIII")
_NAMES = {
    IN_ACCESS: "read",
    IN_MODIFY: "write",
    IN_ATTRIB: "attrib",
    IN_CLOSE_WRITE: "close-write",
    IN_OPEN: "open",
    IN_MOVED_FROM: "moved-from",
    IN_MOVED_TO: "moved-to",
    IN_CREATE: "create",
    IN_DELETE: "delete",
    IN_DELETE_SELF: "delete-self",
    IN_MOVE_SELF: "move-self",
    IN_Q_OVERFLOW: "queue-overflow",
}


@dataclass(frozen=True)
class Event:
    """One thing that happened to a watched path."""

    path: str
    mask: int

    @property
    def is_write(self) -> bool:
        return bool(self.mask & (WRITES | IN_Q_OVERFLOW))

    def __str__(self) -> str:
        kinds = [name for bit, name in _NAMES.items() if self.mask & bit]
        return f"{'+'.join(kinds) or hex(self.mask)} {self.path}"


class Watch:
    """An inotify watch on directories (not recursive: add each one)."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("c")
        self._libc = ctypes.CDLL(name, use_errno=True)
        fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.fd: int = fd
        self._dirs: dict[int, str] = {}
        #: per watched directory: entry names that belong to the store (not outside).
        self._inside: dict[int, set[str]] = {}

    def add(self, directory: Path, *, inside: set[str] | None = None) -> None:
        mask = READS | WRITES
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(directory), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory} failed")
        self._dirs[wd] = str(directory)
        self._inside[wd] = inside or set()

    def drain(self) -> list[Event]:
        """Every event since the last drain, except those on the store's own entries."""
        out: list[Event] = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return out
            except OSError as exc:  # pragma: no cover - EINTR
                if exc.errno == errno.EINTR:
                    continue
                raise
            pos = 0
            while pos < len(buf):
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, pos)
                name = buf[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0")
                pos += _EVENT.size + length
                entry = os.fsdecode(name)
                if entry and entry in self._inside.get(wd, set()):
                    continue
                base = self._dirs.get(wd, "?")
                out.append(Event(str(Path(base, entry)) if entry else base, mask))

    def close(self) -> None:
        os.close(self.fd)


def _snapshot(root: Path, skip: set[Path]) -> dict[str, tuple[int, int, int, str]]:
    """lstat + content hash of everything under ``root`` except ``skip`` (FIFOs not opened)."""
    out: dict[str, tuple[int, int, int, str]] = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(directory, d) not in skip]
        for name in [*files, *dirs]:
            path = Path(directory, name)
            if path in skip:
                continue
            st = path.lstat()
            digest = ""
            if path.is_file() and not path.is_symlink():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            elif path.is_symlink():
                digest = str(path.readlink())
            out[str(path)] = (st.st_mode, st.st_size, st.st_ino, digest)
    return out


@dataclass
class Sandbox:
    """The directories of one sandbox and the watch over its outside."""

    root: Path
    store: Path
    canary: Path
    fifo: Path
    watch: Watch | None = None
    before: dict[str, tuple[int, int, int, str]] = field(default_factory=dict)
    #: distinct outside paths seen written, created, deleted or changed.
    written: set[str] = field(default_factory=set)

    @property
    def tiers(self) -> tuple[Path, Path]:
        return self.store / "fast", self.store / "durable"

    def start(self) -> None:
        """Snapshot the outside and start watching it (after the setup wrote it)."""
        self.before = _snapshot(self.root, {*self.tiers})
        directories = [Path(d) for d, _dirs, _files in os.walk(self.canary)]
        watch = Watch()
        watch.add(self.root, inside={"store"})
        watch.add(self.store, inside={"fast", "durable"})
        for directory in directories:
            watch.add(directory)
        watch.drain()  # adding the watches is not the store's doing
        self.watch = watch

    def events(self) -> list[Event]:
        found = self.watch.drain() if self.watch is not None else []
        self.written.update(e.path for e in found if e.is_write)
        return found

    def finish(self) -> list[str]:
        """Stop watching; return the outside paths whose snapshot changed."""
        self.events()
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        after = _snapshot(self.root, {*self.tiers})
        changed = sorted(
            p for p in set(self.before) | set(after) if self.before.get(p) != after.get(p)
        )
        self.written.update(changed)
        return changed


def make_sandbox(workdir: Path) -> Sandbox:
    """Create the sandbox directories, canaries and FIFOs (not yet watched)."""
    root = workdir / "sandbox"
    if root.exists():
        shutil.rmtree(root)
    store = root / "store"
    canary = root / "canary"
    for directory in (store / "fast", store / "durable", canary):
        directory.mkdir(parents=True)
    (root / "canary.txt").write_text("canary next to the store root\n")
    (store / "canary-between.txt").write_text("canary next to the tier roots\n")
    (canary / "secret.txt").write_text("must never be read through the store\n")
    os.mkfifo(root / "fifo")
    os.mkfifo(canary / "fifo")
    return Sandbox(root, store, canary, root / "fifo")
