"""Sequential file writes at the disk's speed: aligned, ``O_DIRECT`` where possible, pipelined.

:func:`write_stream` writes a stream of byte chunks to an open file descriptor
from offset 0. It is what :class:`~mouthguard.tiers.local.LocalTier` uses for
every large ``put``:

* **O_DIRECT** is switched on for the descriptor with ``fcntl`` when the
  filesystem accepts it. Checkpoint bytes then bypass the page cache: a save
  neither evicts the training data the loader keeps hot nor leaves gigabytes of
  dirty pages for the kernel to flush later. Where the filesystem refuses it
  (tmpfs, some FUSE and network filesystems) the same pipeline writes buffered,
  and the caller drops the written pages after ``fsync`` (:func:`drop_cached`).
* **Aligned, large writes.** O_DIRECT needs the buffer address, file offset and
  length aligned to the logical block size; chunks are gathered into page-aligned
  bounce buffers of :data:`BLOCK_BYTES`. Chunks wrapped in
  :class:`~mouthguard.tiers.base.StableChunks` that are already aligned (the async
  save's staging image) are written straight from their memory: no copy at all.
  The last partial block is padded with zeros, written, and the file is truncated
  back to its exact size.
* **Pipelined and parallel.** Up to :data:`IN_FLIGHT` blocks are being written by
  the process's one I/O pool (:mod:`~mouthguard.io.pool`; ``pwrite`` releases the
  GIL) while the caller fills the next block, so the producer's work (checksums,
  copies) overlaps the disk's. Bounce copies use ``memmove`` through ctypes, which
  also releases the GIL.

Contract: on return every byte was handed to the kernel in order-independent
``pwrite`` calls at its final offset and the file has exactly the returned size.
Durability (``fsync``) stays with the caller. On error nothing more is submitted,
the writes in flight are waited for, and the first error is raised: the caller
discards the temporary file, so a partially written file is never published.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import threading
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass

from mouthguard.clock import SYSTEM_CLOCK, Clock
from mouthguard.io.pool import SHARED

#: Alignment of O_DIRECT buffers, offsets and lengths (covers 512 B and 4 KiB sectors).
ALIGN = 4096
#: Size of one bounce buffer and of the largest single write.
BLOCK_BYTES = 32 * 1024 * 1024
#: Blocks being written at once per file (bounds memory: IN_FLIGHT x BLOCK_BYTES).
IN_FLIGHT = 4
#: A partly filled block older than this is written as far as it is aligned, so a
#: slow producer's bytes reach the disk steadily instead of a block at a time.
FLUSH_AFTER_SECONDS = 0.1
#: Streams smaller than this are not worth the pipeline (manifests, sidecars).
DIRECT_MIN_BYTES = 1024 * 1024


class _BufferPool:
    """Page-aligned bounce buffers (anonymous mmaps), kept for reuse across files."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self) -> mmap.mmap:
        with self._lock:
            if self._free:
                return self._free.pop()
        return mmap.mmap(-1, BLOCK_BYTES)

    def give(self, buf: mmap.mmap) -> None:
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(buf)
                return
        with contextlib.suppress(BufferError):  # a view still exported: the GC unmaps it
            buf.close()


#: Shared by writes and direct reads of this process.
BOUNCE_BUFFERS = _BufferPool(keep=2 * IN_FLIGHT)


def address_of(view: memoryview) -> int:
    """The address of a contiguous buffer's first byte (read-only buffers too)."""
    if view.nbytes == 0:
        return 0
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    # ctypes refuses read-only buffers; a zero-copy numpy array exposes the address.
    import numpy as np  # noqa: PLC0415 - numpy is a dependency of torch, loaded anyway

    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def copy_into(dst: mmap.mmap | memoryview, at: int, src: memoryview) -> None:
    """Copy ``src`` into ``dst[at:]`` with memmove, which runs without the GIL.

    Raises:
        ValueError: the copy would not fit (memmove itself checks nothing).
    """
    target = memoryview(dst)
    if at < 0 or at + src.nbytes > target.nbytes or target.readonly:
        raise ValueError(f"cannot copy {src.nbytes} bytes to offset {at} of {target.nbytes}")
    if src.nbytes:
        ctypes.memmove(address_of(target) + at, address_of(src), src.nbytes)


def enable_direct(fd: int) -> bool:
    """Switch ``fd`` to O_DIRECT; False where the platform or filesystem refuses."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | flag)
    except OSError:
        return False
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & flag)


def _disable_direct(fd: int) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~getattr(os, "O_DIRECT", 0))


def drop_cached(fd: int) -> None:
    """Ask the kernel to drop the file's clean cached pages (after ``fsync``); advisory."""
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


class WriteError(Exception):
    """The file system failed a write; ``cause`` is its OSError.

    Kept apart from OSErrors raised by the chunk iterable itself, which belong to
    the caller and propagate unchanged.
    """

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True)
class WriteOutcome:
    """What :func:`write_stream` did: bytes written and whether O_DIRECT held to the end."""

    size: int
    direct: bool


class _Pipeline:
    """Writes (offset, view) jobs in parallel; at most IN_FLIGHT outstanding."""

    def __init__(self, fd: int, direct: bool) -> None:
        self.fd = fd
        self.direct = direct
        self._mode_lock = threading.Lock()
        self._pending: deque[tuple[Future[None], mmap.mmap | None]] = deque()

    def submit(self, offset: int, view: memoryview, bounce: mmap.mmap | None) -> None:
        while len(self._pending) >= IN_FLIGHT:
            self._retire_oldest()
        self._pending.append((SHARED.submit(self.write, offset, view), bounce))

    def _retire_oldest(self) -> None:
        future, bounce = self._pending.popleft()
        try:
            future.result()
        finally:
            if bounce is not None:
                BOUNCE_BUFFERS.give(bounce)

    def drain(self) -> None:
        """Wait for every write; raise the first error after all have finished."""
        first: BaseException | None = None
        while self._pending:
            try:
                self._retire_oldest()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the rest finish
                first = first or exc
        if first is not None:
            raise first

    def _write(self, offset: int, view: memoryview) -> None:
        done = 0
        while done < view.nbytes:
            try:
                written = os.pwrite(self.fd, view[done:], offset + done)
            except OSError as exc:
                # Some filesystems accept the O_DIRECT flag but refuse the I/O:
                # continue buffered (still correct, just through the page cache).
                if exc.errno == errno.EINVAL and self.direct:
                    self._fall_back()
                    continue
                raise
            if written <= 0:
                raise OSError(errno.EIO, "write made no progress")
            done += written

    def write(self, offset: int, view: memoryview) -> None:
        """Run one write job; OSErrors come back as :class:`WriteError`."""
        try:
            self._write(offset, view)
        except OSError as exc:
            raise WriteError(exc) from exc

    def _fall_back(self) -> None:
        with self._mode_lock:
            if self.direct:
                _disable_direct(self.fd)
                self.direct = False


def write_stream(
    fd: int,
    chunks: Iterable[memoryview],
    *,
    stable: bool = False,
    direct: bool = True,
    clock: Clock = SYSTEM_CLOCK,
) -> WriteOutcome:
    """Write ``chunks`` to ``fd`` from offset 0, aligned and pipelined (see module doc).

    Args:
        fd: a freshly created, empty file opened for writing.
        chunks: byte-format contiguous memoryviews, written in order.
        stable: the chunks stay valid until this returns (may be written in place).
        direct: try O_DIRECT (False: buffered writes through the same pipeline).
        clock: measures how long a partly filled block has waited for
            :data:`FLUSH_AFTER_SECONDS` (the real clock by default).

    Raises:
        WriteError: a write failed (e.g. ENOSPC); whatever ``chunks`` raises propagates.
    """
    pipeline = _Pipeline(fd, direct and enable_direct(fd))
    offset = 0  # file offset of the next byte of the stream
    block: mmap.mmap | None = None
    filled = 0
    started = 0.0  # when the current block began to fill
    try:
        for chunk in chunks:
            view = chunk
            while view.nbytes:
                if block is None and stable and _aligned(view) and view.nbytes >= ALIGN:
                    n = min(view.nbytes - view.nbytes % ALIGN, BLOCK_BYTES)
                    pipeline.submit(offset, view[:n], None)
                    offset, view = offset + n, view[n:]
                    continue
                if block is None:
                    block, filled, started = BOUNCE_BUFFERS.take(), 0, clock.monotonic()
                n = min(BLOCK_BYTES - filled, view.nbytes)
                copy_into(block, filled, view[:n])
                filled, view = filled + n, view[n:]
                if filled == BLOCK_BYTES:
                    pipeline.submit(offset, memoryview(block), block)
                    offset, block, filled = offset + BLOCK_BYTES, None, 0
                elif filled >= ALIGN and clock.monotonic() - started > FLUSH_AFTER_SECONDS:
                    # A slow producer (a throttled link, a remote source): write what
                    # is aligned now rather than hold it until the block fills.
                    aligned = filled - filled % ALIGN
                    spill = BOUNCE_BUFFERS.take()
                    copy_into(spill, 0, memoryview(block)[aligned:filled])
                    pipeline.submit(offset, memoryview(block)[:aligned], block)
                    offset, block, filled = offset + aligned, spill, filled - aligned
                    started = clock.monotonic()
        size = offset + filled
        if block is not None:
            # The tail: padded to the alignment for O_DIRECT, truncated back below.
            padded = -(-filled // ALIGN) * ALIGN if pipeline.direct else filled
            memoryview(block)[filled:padded] = bytes(padded - filled)
            pipeline.submit(offset, memoryview(block)[:padded], block)
            block = None
        pipeline.drain()
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
        except OSError as exc:
            raise WriteError(exc) from exc
    except BaseException:
        if block is not None:
            BOUNCE_BUFFERS.give(block)
        with contextlib.suppress(BaseException):
            pipeline.drain()
        raise
    return WriteOutcome(size, pipeline.direct)


def _aligned(view: memoryview) -> bool:
    return address_of(view) % ALIGN == 0
