"""The shard cache's file primitives: sha256 of a file's bytes, stat stamps.

Used by :mod:`~mouthguard.data.fetching.cache` and by the readers that verify files in
place (:mod:`~mouthguard.data.fetching.verified`), whose locks come from
:mod:`mouthguard.io.forklocks`. A stamp is the ``stat`` key of a file as
it was when its bytes last hashed right (see the cache's module docstring).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

#: Bytes hashed per read, into one buffer that the whole range reuses: small enough that
#: its pages stay warm (a fresh 8 MiB ``bytes`` per read faulted 2,048 new pages in each
#: time), large enough to amortise the call. 128 MiB hashed on a 2-CPU VM: 0.096-0.101
#: CPU-s, against 0.111-0.138 with a fresh 8 MiB ``bytes`` per read (8 runs each, cold
#: and warm file).
_HASH_CHUNK = 1024 * 1024

#: The most bytes :func:`write_at` hands to one ``pwrite``. A larger write lets the kernel
#: fill the file's page cache with 2 MiB folios, and where the machine is a virtual one
#: whose free memory is handed back to its host (virtio-balloon free page reporting, in
#: 2 MiB blocks), those folios are taken from memory the host must fault in again, page by
#: page, during the copy. Measured on such a VM (2 CPUs): 128 MiB written in 2 or 4 MiB
#: pieces took 0.17-0.21 CPU-s in 3 of 12 tries and 0.03-0.04 in the rest, in 1 MiB pieces
#: or less 0.03-0.04 every time; in the cold S3 epoch with 4 workers, the workers' samples
#: in ``pwrite`` fell from 110-163 to 23-27 (docs/benchmarks-data.md). Elsewhere the extra
#: calls cost a few microseconds per MiB.
WRITE_PIECE = 1024 * 1024


def write_at(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of ``data`` to ``fd`` at ``offset``, at most :data:`WRITE_PIECE` per ``pwrite``.

    A short write is continued where it stopped; an error (a full disk) propagates,
    with an unknown prefix of ``data`` written.
    """
    view = memoryview(data).cast("B")
    at, done = offset, 0
    while done < view.nbytes:
        written = os.pwrite(fd, view[done : done + WRITE_PIECE], at)
        done, at = done + written, at + written


def hash_range(fd: int, start: int, size: int) -> str:
    """sha256 hex of bytes ``[start, start + size)`` of ``fd`` ("" if the file is shorter)."""
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(min(_HASH_CHUNK, size)))
    done = 0
    while done < size:
        got = os.preadv(fd, [buffer[: min(buffer.nbytes, size - done)]], start + done)
        if not got:
            return ""  # a wrong size never matches a sha256
        digest.update(buffer[:got])
        done += got
    return digest.hexdigest()


def hash_fd(fd: int, size: int) -> str:
    """sha256 hex of the first ``size`` bytes of ``fd`` (and of nothing past them)."""
    if os.pread(fd, 1, size):
        return ""  # longer than it should be
    return hash_range(fd, 0, size)


def read_stamp(path: Path) -> list[int] | None:
    """The stat key a stamp file records; None if it is missing or unreadable."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, list) else None


def stat_key(fd: int) -> list[int]:
    """``[device, inode, size, mtime_ns, ctime_ns]`` of ``fd``, as a verification stamp holds."""
    st = os.fstat(fd)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
