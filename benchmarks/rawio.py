"""The disk's limit: the state's bytes written and read with O_DIRECT, several blocks in flight.

No format, no checksums: the tensors are copied into page-aligned 32 MiB buffers
and written sequentially with ``pwrite`` from a few threads (``IN_FLIGHT`` blocks
at once, as a queue depth), then ``fsync``; the read does the same with
``preadv`` into those buffers only. A single synchronous writer leaves most of a
fast NVMe's (or a cloud volume's) bandwidth unused, and any real writer with a
few writes in flight would then beat "the limit".

If the filesystem refuses ``O_DIRECT`` (at open or at the first write), buffered
I/O + ``fsync`` is used and the row says so.
"""

from __future__ import annotations

import mmap
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from benchmarks.harness import fsync_path

BLOCK = 32 * 1024 * 1024
IN_FLIGHT = 4
ALIGN = 4096
NAME = "raw.bin"


class _RefusedError(Exception):
    """O_DIRECT was refused at write time."""


class RawIO:
    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state
        self.direct_ok: bool | None = None

    def describe(self) -> str:
        mode = "O_DIRECT" if self.direct_ok else "buffered, O_DIRECT refused"
        return f"{mode}, {BLOCK >> 20} MiB blocks, {IN_FLIGHT} in flight"

    def write(self, d: Path) -> None:
        direct = self.direct_ok is not False and hasattr(os, "O_DIRECT")
        try:
            self._write(d / NAME, direct)
        except _RefusedError:
            direct = False
            self._write(d / NAME, direct)
        self.direct_ok = direct
        fsync_path(d)

    def _blocks(self, views: list[torch.Tensor]) -> Iterator[tuple[int, int]]:
        """Fill the buffers round robin; yield (buffer index, bytes filled) per block."""
        i = fill = 0
        for t in self.state.values():
            src = t.reshape(-1).view(torch.uint8)
            pos, n = 0, src.numel()
            while pos < n:
                take = min(BLOCK - fill, n - pos)
                views[i][fill : fill + take].copy_(src[pos : pos + take])
                fill, pos = fill + take, pos + take
                if fill == BLOCK:
                    yield i, fill
                    i, fill = (i + 1) % IN_FLIGHT, 0
        if fill:
            yield i, fill

    def _write(self, path: Path, direct: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        try:
            fd = os.open(path, flags | (os.O_DIRECT if direct else 0), 0o644)
        except OSError:
            if not direct:
                raise
            raise _RefusedError from None
        bufs = [mmap.mmap(-1, BLOCK) for _ in range(IN_FLIGHT)]  # page-aligned
        views = [torch.frombuffer(b, dtype=torch.uint8) for b in bufs]
        total = 0
        try:
            with ThreadPoolExecutor(IN_FLIGHT) as pool:
                pending: deque[Future[int]] = deque()
                # A buffer is refilled only once the write submitted IN_FLIGHT blocks
                # ago (from that same buffer) has finished: wait for it first.
                for i, n in self._gated_blocks(views, pending):
                    padded = -(-n // ALIGN) * ALIGN if direct else n
                    pending.append(pool.submit(_pwrite_all, fd, bufs[i], padded, total))
                    total += n
                while pending:
                    pending.popleft().result()
            if direct:
                os.ftruncate(fd, total)  # drop the last block's padding
            os.fsync(fd)
        except OSError:
            if not direct:
                raise
            raise _RefusedError from None
        finally:
            os.close(fd)
            del views  # before closing the buffers they view
            for b in bufs:
                b.close()

    def _gated_blocks(
        self, views: list[torch.Tensor], pending: deque[Future[int]]
    ) -> Iterator[tuple[int, int]]:
        gen = self._blocks(views)
        while True:
            if len(pending) == IN_FLIGHT:
                pending.popleft().result()  # frees the buffer filled next
            try:
                yield next(gen)
            except StopIteration:
                return

    def read(self, d: Path) -> int:
        flags = os.O_RDONLY | (os.O_DIRECT if self.direct_ok else 0)
        bufs = [mmap.mmap(-1, BLOCK) for _ in range(IN_FLIGHT)]
        fd = os.open(d / NAME, flags)
        total = 0
        try:
            size = os.fstat(fd).st_size
            with ThreadPoolExecutor(IN_FLIGHT) as pool:
                pending: deque[Future[int]] = deque()
                for k, offset in enumerate(range(0, size, BLOCK)):
                    if len(pending) == IN_FLIGHT:
                        total += pending.popleft().result()
                    pending.append(pool.submit(os.preadv, fd, [bufs[k % IN_FLIGHT]], offset))
                while pending:
                    total += pending.popleft().result()
        finally:
            os.close(fd)
            for b in bufs:
                b.close()
        assert total == size, (total, size)
        return total


def _pwrite_all(fd: int, buf: mmap.mmap, n: int, offset: int) -> int:
    done = 0
    with memoryview(buf) as whole:
        while done < n:
            with whole[done:n] as view:  # released at once: the buffer is closed later
                done += os.pwrite(fd, view, offset + done)
    return done
