"""Gzip-compressed tars (``.tar.gz``, ``.tgz``) of an adopted dataset: read as one stream.

Gzip cannot be read from the middle, so such a shard has no range table: it is
verified whole (its sha256 is the compressed file's), then read front to back.
Its index counts offsets in the tar inside the stream. :func:`gunzip` turns the
file's chunks into the tar's, and :func:`unpack` writes the tar of a verified
shard into an anonymous temporary file (unlinked at once, gone when closed),
where the reader reads samples by offset as in any tar.

Bounds: :func:`gunzip` holds at most one input chunk and :data:`_STEP` bytes of
output at a time, and stops with an error past ``limit`` bytes of output (a
shard that inflates beyond what its index says is damage, not a reason to fill a
disk). :func:`unpack`'s file holds exactly the tar, whose size the verified
index states; one exists per open shard (the loader's open shards are bounded
by its prefetch depth).
"""

from __future__ import annotations

import os
import tempfile
import zlib
from collections.abc import Iterable, Iterator

from mouthguard.data.fetching.cache import ShardFile
from mouthguard.data.fetching.cachefiles import write_at
from mouthguard.errors import ShardDamagedError

#: Output bytes inflated per step: what one step holds in memory.
_STEP = 4 * 1024 * 1024
#: Compressed bytes read from the verified file per step.
_READ = 1024 * 1024


class GzipError(ValueError):
    """The bytes are not a complete gzip stream, or inflate past the limit."""


def gunzip(chunks: Iterable[bytes], *, limit: int | None = None) -> Iterator[bytes]:
    """The decompressed bytes of the one gzip member in ``chunks``.

    One member, nothing after it: WebDataset reads a shard with ``tarfile``'s
    stream mode, which stops with an error at the end of the first member, so a
    file of several (``bgzip``, ``cat a.gz b.gz``) would not read as indexed.

    Raises:
        GzipError: not gzip, corrupt (gzip's own CRC or length check fails), cut
            short, empty, followed by more bytes, or more than ``limit`` bytes
            once inflated.
    """
    inflater = zlib.decompressobj(wbits=31)
    out = 0
    begun = False
    for chunk in chunks:
        data = bytes(chunk)
        while data:
            if inflater.eof:
                raise GzipError(
                    "holds more after its first gzip member (several members, or trailing "
                    "bytes), which WebDataset does not read: compress the tar as one gzip "
                    "stream (gzip, pigz)"
                )
            begun = True
            try:
                piece = inflater.decompress(data, _STEP)
            except zlib.error as exc:
                raise GzipError(f"not a readable gzip stream: {exc}") from None
            data = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
            out += len(piece)
            if limit is not None and out > limit:
                raise GzipError(f"inflates to more than {limit} bytes")
            if piece:
                yield piece
    if not begun:
        raise GzipError("the file is empty")
    piece = inflater.flush()
    out += len(piece)
    if limit is not None and out > limit:
        raise GzipError(f"inflates to more than {limit} bytes")
    if piece:
        yield piece
    if not inflater.eof:
        raise GzipError("the gzip stream is cut short")


def _file_chunks(file: ShardFile) -> Iterator[bytes]:
    for at in range(0, file.size, _READ):
        yield file.read(at, min(_READ, file.size - at))


def unpack(file: ShardFile, tar_size: int, directory: str | None = None) -> ShardFile:
    """The tar inside the verified gzip shard ``file``, in an anonymous temporary file.

    ``tar_size``: the tar's size, as the shard's verified index states it; the
    stream must inflate to exactly that. ``directory``: where the file is made
    (default: the system's temporary directory). ``file`` stays open (the
    caller closes it).

    Raises:
        ShardDamagedError: the stream is not gzip, is corrupt, or inflates to
            another size than the index says (names the shard).
    """
    handle = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115 - its fd outlives this call
    try:
        at = 0
        try:
            for piece in gunzip(_file_chunks(file), limit=tar_size):
                write_at(handle.fileno(), piece, at)
                at += len(piece)
        except GzipError as exc:
            raise ShardDamagedError(f"shard {file.name}: {exc}", shard=file.name) from None
        if at != tar_size:
            raise ShardDamagedError(
                f"shard {file.name}: inflates to {at} bytes, its index says {tar_size}",
                shard=file.name,
            )
        fd = os.dup(handle.fileno())
    finally:
        handle.close()
    return ShardFile(fd, tar_size, file.name)
