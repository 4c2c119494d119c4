"""Ranged reads that bypass the page cache: O_DIRECT into aligned buffers, then one copy.

A cold checkpoint load is one large sequential read of a file nobody will read
again soon. Through the page cache it costs the kernel's readahead, a copy into
user memory, and gigabytes of cache evicting the training data; with O_DIRECT
the device writes straight into an aligned bounce buffer and only the copy into
the destination remains (destinations -- tensor memory at arbitrary offsets --
are rarely aligned themselves). Several such reads run in parallel from
:mod:`~mouthguard.io.read_ahead`.

Contract of :func:`read_direct`: fill ``out`` with the bytes at ``offset``, or
return False before copying anything when the filesystem refuses O_DIRECT, so
the caller reads buffered instead (``pread`` moves no file position, so there
is nothing to undo). A file that ends before ``offset + len(out)`` raises
``EOFError``.
"""

from __future__ import annotations

import errno
import os

from mouthguard.io.direct_write import (
    ALIGN,
    BLOCK_BYTES,
    BOUNCE_BUFFERS,
    copy_into,
    enable_direct,
)

#: Smaller reads are not worth the bounce buffer (headers, manifests, sidecars).
DIRECT_READ_MIN_BYTES = 1024 * 1024


def read_direct(fd: int, offset: int, out: memoryview) -> bool:
    """Fill ``out`` from ``fd`` at ``offset`` with O_DIRECT (see the module docstring).

    Raises:
        EOFError: the file ended early.
        OSError: the read failed.
    """
    if not enable_direct(fd):
        return False
    end = offset + out.nbytes
    position = offset - offset % ALIGN
    block = BOUNCE_BUFFERS.take()
    view = memoryview(block)
    try:
        while position < end:
            want = min(BLOCK_BYTES, -(-(end - position) // ALIGN) * ALIGN)
            try:
                got = os.preadv(fd, [view[:want]], position)
            except OSError as exc:
                if exc.errno == errno.EINVAL and position < offset + ALIGN:
                    return False  # took the flag, refuses the I/O: read buffered
                raise
            low, high = max(offset, position), min(end, position + got)
            if high > low:
                copy_into(out, low - offset, view[low - position : high - position])
            if position + got >= end:
                break
            if got < want:
                raise EOFError(f"end of file at {position + got}, wanted up to {end}")
            position += got
    finally:
        view.release()
        BOUNCE_BUFFERS.give(block)
    return True
