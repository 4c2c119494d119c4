"""The disk tier's files: segment data files and their append-only index logs.

Blocks are packed into a few large files instead of one file per block (a
million small files is a metadata storm: creates, directory lookups and inode
churn on every eviction). Segment ``N`` is two files in the disk directory::

    seg-000000000N.kvd   data: payloads back to back, each starting on a 4 KiB
                         boundary and zero-padded to the next (O_DIRECT-ready)
    seg-000000000N.kvi   index log: a header, then records appended in order

Index log::

    header   b"MGKVIDX1" | u64 segment id | u64 xxh3-64 of the 16 bytes before
    record   u32 body length | body | u64 xxh3-64 of body
    body     u8 1 (put)  | key[16] | u64 offset | u64 nbytes | checksum[16] | desc
             u8 2 (drop) | key[16] | u64 offset

All integers little-endian. A put record is appended only after its payload was
handed to the kernel, so the log never runs ahead of the data on a clean path.

**Recovery rule** (:func:`read_log`): records are read in order until the first
one that is short or fails its checksum -- a torn append -- and the log is cut
there; nothing after a damaged record is trusted. A put whose payload would end
past the data file's end (a half-written tail) is discarded. A drop removes the
put of the same key at the same offset. Payload bytes are not read at recovery:
each is verified against its checksum (which binds the key) on every read, so a
payload lost in a crash is a miss when first read, never data. Opening a cache
therefore reads only the small index logs, never the data.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy.typing as npt
import xxhash

from mouthguard.errors import FormatError
from mouthguard.io.direct_read import read_direct
from mouthguard.io.direct_write import ALIGN, BLOCK_BYTES, BOUNCE_BUFFERS, copy_into
from mouthguard.kvcache.blocks import BlockDesc, Payload, padded, parse_desc
from mouthguard.kvcache.keys import KEY_BYTES

IDX_MAGIC = b"MGKVIDX1"
_HEADER = struct.Struct("<8sQQ")
_LEN = struct.Struct("<I")
_SUM = struct.Struct("<Q")
_PUT = struct.Struct(f"<B{KEY_BYTES}sQQ16s")
_DROP = struct.Struct(f"<B{KEY_BYTES}sQ")
PUT, DROP = 1, 2
#: A body larger than this is garbage, not a record (descriptions are tiny).
_MAX_BODY = 4096
#: Payloads at least this large are read with O_DIRECT (no page-cache copy).
DIRECT_READ_BYTES = 256 * 1024


def data_path(directory: Path, segment: int) -> Path:
    """The data file of ``segment``."""
    return directory / f"seg-{segment:010d}.kvd"


def index_path(directory: Path, segment: int) -> Path:
    """The index log of ``segment``."""
    return directory / f"seg-{segment:010d}.kvi"


def segment_ids(directory: Path) -> set[int]:
    """Ids of every segment with a data or an index file in ``directory``."""
    found = set()
    for path in directory.glob("seg-*.kv[di]"):
        with contextlib.suppress(ValueError):
            found.add(int(path.stem.removeprefix("seg-")))
    return found


@dataclass(frozen=True)
class SegmentEntry:
    """Where a block's payload lives on disk, and how to check and rebuild it."""

    segment: int
    offset: int
    nbytes: int
    checksum: bytes
    desc: BlockDesc

    @property
    def span(self) -> int:
        """Bytes the record occupies in its data file."""
        return padded(self.nbytes)


def log_header(segment: int) -> bytes:
    """The first bytes of ``segment``'s index log."""
    head = IDX_MAGIC + struct.pack("<Q", segment)
    return head + _SUM.pack(xxhash.xxh3_64_intdigest(head))


def _frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body + _SUM.pack(xxhash.xxh3_64_intdigest(body))


def put_record(key: bytes, location: SegmentEntry) -> bytes:
    """The index-log record announcing a payload."""
    body = _PUT.pack(PUT, key, location.offset, location.nbytes, location.checksum)
    return _frame(body + location.desc.encode())


def drop_record(key: bytes, offset: int) -> bytes:
    """The index-log record retiring the payload of ``key`` at ``offset``."""
    return _frame(_DROP.pack(DROP, key, offset))


def read_log(path: Path, segment: int, data_size: int) -> tuple[dict[bytes, SegmentEntry], int]:
    """Live locations of a segment's index log and the length of its valid prefix.

    See the module docstring for the rule. A missing or foreign header yields
    nothing and a valid length of 0 (the caller discards the segment).
    """
    raw = path.read_bytes()
    if len(raw) < _HEADER.size or raw[: _HEADER.size] != log_header(segment):
        return {}, 0
    live: dict[bytes, SegmentEntry] = {}
    position = _HEADER.size
    while position + _LEN.size <= len(raw):
        (length,) = _LEN.unpack_from(raw, position)
        end = position + _LEN.size + length + _SUM.size
        if length > _MAX_BODY or end > len(raw):
            break
        body = raw[position + _LEN.size : end - _SUM.size]
        if _SUM.unpack_from(raw, end - _SUM.size)[0] != xxhash.xxh3_64_intdigest(body):
            break
        try:
            _apply(body, segment, data_size, live)
        except FormatError:
            break  # checksummed yet malformed: written by something else; trust nothing after
        position = end
    return live, position


def _apply(body: bytes, segment: int, data_size: int, live: dict[bytes, SegmentEntry]) -> None:
    if not body:
        raise FormatError("empty index record")
    if body[0] == PUT and len(body) > _PUT.size:
        _, key, offset, nbytes, checksum = _PUT.unpack_from(body)
        desc = parse_desc(body[_PUT.size :], nbytes)
        if offset % ALIGN == 0 and offset + padded(nbytes) <= data_size:
            live[key] = SegmentEntry(segment, offset, nbytes, checksum, desc)
        # else: the payload's tail never reached the data file: discarded
    elif body[0] == DROP and len(body) == _DROP.size:
        _, key, offset = _DROP.unpack(body)
        if key in live and live[key].offset == offset:
            del live[key]
    else:
        raise FormatError(f"unknown index record type {body[0]}")


def append(path: Path, data: bytes) -> None:
    """Append ``data`` to a file, all of it (an ``O_APPEND`` descriptor; short writes resumed).

    A failed append is cut back off the file, so no torn record is left in the
    middle of the log to hide the records appended after it (recovery stops at
    the first bad record). Only the store's one writer appends, so the length
    read first is still the file's end.

    Raises:
        OSError: a write failed or made no progress (a full disk): the caller
            must treat the records as not written.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        start = os.fstat(fd).st_size
        try:
            _write_all(fd, memoryview(data), path.name)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def _write_all(fd: int, view: memoryview, name: str) -> None:
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, f"append to {name} made no progress")
        view = view[written:]


def write_payloads(fd: int, offset: int, payloads: Sequence[Payload], direct: bool) -> bool:
    """Write payloads back to back from ``offset``, each padded (see the module docstring).

    Payloads kept in aligned frames (every one :func:`~mouthguard.kvcache.blocks.encode`
    makes) go to the kernel as they are, one ``pwritev`` per :data:`_IOV_MAX`;
    others are gathered into page-aligned bounce buffers so each ``pwrite`` is
    large. With O_DIRECT on ``fd`` either bypasses the page cache. Returns whether
    O_DIRECT held (a filesystem that takes the flag but refuses the I/O is
    written buffered).

    Raises:
        OSError: a write failed.
    """
    if all(p.frame is not None for p in payloads):
        frames = [memoryview(p.frame.data).cast("B") for p in payloads if p.frame is not None]
        return _pwritev(fd, frames, offset, direct)
    buffer = BOUNCE_BUFFERS.take()
    view = memoryview(buffer)
    filled, position = 0, offset
    try:
        for payload in payloads:
            source = memoryview(payload.data.data).cast("B")
            done = 0
            while done < source.nbytes:
                n = min(BLOCK_BYTES - filled, source.nbytes - done)
                copy_into(buffer, filled, source[done : done + n])
                filled, done = filled + n, done + n
                if filled == BLOCK_BYTES:
                    direct = _pwrite(fd, view[:filled], position, direct)
                    position, filled = position + filled, 0
            pad = padded(source.nbytes) - source.nbytes
            view[filled : filled + pad] = bytes(pad)  # fits: BLOCK_BYTES is a multiple of ALIGN
            filled += pad
            if filled == BLOCK_BYTES:
                direct = _pwrite(fd, view[:filled], position, direct)
                position, filled = position + filled, 0
        if filled:
            direct = _pwrite(fd, view[:filled], position, direct)
    finally:
        view.release()
        BOUNCE_BUFFERS.give(buffer)
    return direct


#: Buffers per ``pwritev`` (Linux's IOV_MAX).
_IOV_MAX = 1024


def _pwritev(fd: int, views: list[memoryview], offset: int, direct: bool) -> bool:
    """Write ``views`` back to back from ``offset``, resuming short writes.

    Returns whether O_DIRECT held: a refused O_DIRECT (EINVAL) is switched off
    on ``fd`` and the write retried buffered.
    """
    views = list(views)
    position = offset
    first = 0
    while first < len(views):
        try:
            written = os.pwritev(fd, views[first : first + _IOV_MAX], position)
        except OSError as exc:
            if exc.errno == errno.EINVAL and direct:
                flags = fcntl.fcntl(fd, fcntl.F_GETFL)
                fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~getattr(os, "O_DIRECT", 0))
                direct = False
                continue
            raise
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        position += written
        while written and first < len(views):  # drop what was written
            if written >= views[first].nbytes:
                written -= views[first].nbytes
                first += 1
            else:
                views[first] = views[first][written:]
                written = 0
    return direct


def _pwrite(fd: int, view: memoryview, offset: int, direct: bool) -> bool:
    return _pwritev(fd, [view], offset, direct)


def read_payload(path: Path, offset: int, out: npt.NDArray[Any]) -> None:
    """Fill ``out`` (1-D uint8) from ``path`` at ``offset``; large reads skip the page cache.

    Raises:
        OSError: the file is gone or the read failed.
        EOFError: the file ends before the payload does.
    """
    view = memoryview(out.data).cast("B")
    if view.nbytes >= DIRECT_READ_BYTES:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if read_direct(fd, offset, view):
                return
        finally:
            os.close(fd)
    # Buffered: a fresh descriptor, since a refused O_DIRECT may have left the flag set.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        done = 0
        while done < view.nbytes:
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                raise EOFError(f"{path.name} ends at {offset + done}")
            done += got
    finally:
        os.close(fd)
