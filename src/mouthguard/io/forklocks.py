r"""Lock files that a forked child lets go of: descriptors for ``flock``\ s held across forks.

A ``flock`` belongs to the open file, not to the process, and a forked child
(a DataLoader worker) shares every open file of its parent. A lock the parent
holds while it forks stays held by the child's copy after the parent released
it: every other process then waits on it for as long as the child lives, and
the child itself waits forever the first time it asks for that lock. So every
descriptor opened here is noted, and a forked child replaces its copies with
``/dev/null`` as it starts (see :func:`_let_go_in_child`).

Invariants:

* A descriptor is noted in the same step as it is opened (under :data:`_guard`,
  which a fork takes first), so no fork sees one opened and not noted. A lock
  taken *after* a fork on a descriptor opened before it would still be shared,
  which is why the noting is tied to the open, not to the ``flock``.
* The child's copies keep their numbers (``dup2`` of ``/dev/null``), so a
  stale object in the child that later closes one closes only that, never a
  descriptor the child opened since with the same number.
* Waiting for a lock happens outside :data:`_guard`: a fork in this process
  never waits for another process's lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

_noted: set[int] = set()
_guard = threading.Lock()


def open_lock_file(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """Open ``path`` for locking (``O_CLOEXEC`` added); a forked child lets go of it.

    Close the descriptor with :func:`close_lock_file`, never ``os.close``.
    """
    with _guard:
        fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
        _noted.add(fd)
    return fd


def close_lock_file(fd: int) -> None:
    """Close a descriptor of :func:`open_lock_file` (releasing its lock). Errors are ignored."""
    with _guard:
        _noted.discard(fd)
        with contextlib.suppress(OSError):
            os.close(fd)


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block."""
    fd = open_lock_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        close_lock_file(fd)  # releases the lock


def try_lock(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int | None:
    """A descriptor holding an exclusive lock on ``path``; None if someone holds it or it is gone.

    Release with :func:`close_lock_file`.
    """
    try:
        fd = open_lock_file(path, flags)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        close_lock_file(fd)
        return None
    except BaseException:
        close_lock_file(fd)
        raise
    return fd


def _let_go_in_child() -> None:
    """In a forked child: point every noted descriptor at /dev/null (its parent keeps the lock)."""
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for fd in _noted:
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)
    _noted.clear()
    _guard.release()  # taken by the forking thread, which the child continues


os.register_at_fork(
    before=_guard.acquire,
    after_in_parent=_guard.release,
    after_in_child=_let_go_in_child,
)
