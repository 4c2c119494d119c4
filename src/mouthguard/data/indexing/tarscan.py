"""Indexing a user's tar: the standard library's ``tarfile`` over one streamed read, hostile input.

:func:`scan_tar` reads a tar once, front to back (chunks from a tier's range
reads, so a tar on S3 is never downloaded whole), hashes every byte and returns
the sha256 with the index of the samples ``webdataset.WebDataset`` would yield
from it: consecutive regular members whose names share a key
(:func:`~mouthguard.data.formats.names.webdataset_split`), each member's data offset
and size, each sample's span from its first header (extended headers
included) to its last member's padding. ``tarfile`` parses the headers -- GNU
long names, PAX records, any metadata a user's writer put there -- in stream
mode (``r|``), which never seeks back.

Nothing ``tarfile`` reports is trusted: it happily returns a member whose data
runs past the end of the file, a negative size (base-256 fields), and stops
silently at the first unreadable header after the first, taking the rest of
the file for padding. So every member is checked before the next is read
(:func:`_member_problem`: offsets increasing, size >= 0, data inside the file,
a name that is no absolute path and has no ``..``), GNU sparse members are
refused (their data is not one contiguous run), and everything after the last
member must be zeros. Anything wrong raises
:class:`~mouthguard.errors.AdoptionError` naming the file and the member.
Non-regular members (directories, links, devices) and names WebDataset skips
are skipped as it skips them -- after the same checks.

Memory: ``tarfile`` reads extended headers (long names, PAX records) into
memory; they are bounded by the file's size, and the index by one entry per
member.
"""

from __future__ import annotations

import hashlib
import io
import sys
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from mouthguard.data.formats import names, tarfmt
from mouthguard.data.formats.index import Member, SampleEntry
from mouthguard.data.formats.records import MAX_UNIT_SAMPLES
from mouthguard.errors import AdoptionError, MouthguardError

#: Bytes handed to tarfile that stay visible to the end-of-archive check. tarfile
#: reads ahead of its position by one buffer (``tarfile.RECORDSIZE``); this is far more.
_RETAIN = 1024 * 1024
#: Leading bytes of compressed streams tarfile's ``r|*`` would unpack (WebDataset uses it).
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


@dataclass(frozen=True)
class TarScan:
    """What one read of a tar found: its sha256 and the samples WebDataset would yield."""

    sha256: str
    samples: tuple[SampleEntry, ...]
    #: The bytes read: the tar's size (a gzip-compressed shard's, once inflated).
    size: int


class _Stream(io.RawIOBase):
    """The chunks as a read-only stream, hashing what it hands out and keeping the last of it."""

    def __init__(self, chunks: Iterable[bytes], on_bytes: Callable[[int], None] | None) -> None:
        super().__init__()
        self._chunks: Iterator[bytes] = iter(chunks)
        self._current = memoryview(b"")
        self._on_bytes = on_bytes
        self.sha = hashlib.sha256()
        self.position = 0
        self.head = bytearray()  # the first bytes, to name a compressed file
        self.tail = bytearray()  # the last _RETAIN bytes handed out

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        while not self._current:
            chunk = next(self._chunks, None)
            if chunk is None:
                return False
            self._current = memoryview(chunk)
            if self._on_bytes is not None:
                self._on_bytes(len(chunk))
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        out = memoryview(buffer).cast("B")
        if not out or not self._fill():
            return 0
        n = min(len(out), len(self._current))
        piece = self._current[:n]
        out[:n] = piece
        self._current = self._current[n:]
        self._hand_out(piece)
        return n

    def _hand_out(self, piece: memoryview) -> None:
        self.sha.update(piece)
        self.position += len(piece)
        if len(self.head) < 8:
            self.head += piece[: 8 - len(self.head)]
        self.tail += piece
        if len(self.tail) > 2 * _RETAIN:
            del self.tail[: len(self.tail) - _RETAIN]

    def rest(self) -> Iterator[memoryview]:
        """What tarfile left unread, hashed and counted like the rest."""
        while self._fill():
            piece, self._current = self._current, memoryview(b"")
            self._hand_out(piece)
            yield piece


@dataclass
class _Sample:
    key: str
    start: int
    end: int = 0
    members: list[Member] = field(default_factory=list)


def _member_problem(info: tarfile.TarInfo, size: int, end: int) -> str | None:
    """Why ``info`` cannot be trusted (``size``: the file's, ``end``: the last member's)."""
    why = names.member_path_problem(info.name)
    if why is not None:
        return f"member name {info.name!r:.200} {why}"
    if info.offset < end or info.offset_data < info.offset + tarfmt.BLOCK:
        return f"member {info.name!r:.200} overlaps the member before it"
    if info.size < 0:
        return f"member {info.name!r:.200} has a negative size ({info.size})"
    if info.offset_data + info.size > size:
        return (
            f"member {info.name!r:.200} of {info.size} bytes at byte {info.offset_data} runs past "
            f"the end of the file ({size} bytes)"
        )
    if info.type == tarfile.GNUTYPE_SPARSE or info.sparse is not None:
        return f"member {info.name!r:.200} is a sparse file (its data is not one contiguous run)"
    return None


def _check_member(info: tarfile.TarInfo, size: int, end: int, name: str) -> None:
    why = _member_problem(info, size, end)
    if why is not None:
        raise AdoptionError(f"{name}: {why}")


def _data_end(info: tarfile.TarInfo) -> int:
    # tarfile skips data only for regular files and unknown types; so does this.
    has_data = info.isreg() or info.type not in tarfile.SUPPORTED_TYPES
    size = info.size if has_data else 0
    return info.offset_data + size + tarfmt.padding(size)


class _Grouper:
    """Members into samples exactly as WebDataset's ``group_by_keys`` does."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.samples: list[SampleEntry] = []
        self.current: _Sample | None = None

    def add(self, info: tarfile.TarInfo) -> None:
        split = names.webdataset_split(info.name) if info.isreg() else None
        if split is None:
            return
        key, ext = split
        why = names.adopted_ext_problem(ext)
        if why is not None:
            raise AdoptionError(f"{self.name}: member {info.name!r:.200} {why}")
        current = self.current
        if current is None or current.key != key:
            self.flush()
            current = self.current = _Sample(key, info.offset)
        if any(m.ext == ext for m in current.members):  # WebDataset raises on it too
            raise AdoptionError(
                f"{self.name}: sample {key!r:.200} has member {ext!r} twice (at byte {info.offset})"
            )
        current.members.append(Member(ext, info.offset_data, info.size))
        current.end = _data_end(info)

    def flush(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            entry = SampleEntry(
                current.key, current.start, current.end - current.start, tuple(current.members)
            )
            self.samples.append(entry)
            if len(self.samples) > MAX_UNIT_SAMPLES:
                raise AdoptionError(f"{self.name}: more than {MAX_UNIT_SAMPLES} samples")


def scan_tar(
    chunks: Iterable[bytes],
    size: int | None,
    name: str,
    *,
    on_bytes: Callable[[int], None] | None = None,
) -> TarScan:
    """Read the tar ``name`` of ``size`` bytes from ``chunks`` (in order); see the module docstring.

    Args:
        chunks: the file's bytes, front to back.
        size: its size (every offset is checked against it); None: not known
            before the end (a tar inflated from gzip), every offset is then
            checked against the bytes there turned out to be.
        name: its path, for messages.
        on_bytes: called with the size of each chunk as it is read (progress).

    Raises:
        AdoptionError: the file is not a tar WebDataset can read exactly as indexed,
            or it holds no sample; the message names the file and why.
        TierError: the chunks could not be read.
    """
    stream = _Stream(chunks, on_bytes)
    grouper = _Grouper(name)
    end = 0
    bound = size if size is not None else sys.maxsize
    try:
        tar = tarfile.open(fileobj=stream, mode="r|", encoding="utf-8")  # noqa: SIM115
        for info in tar:
            _check_member(info, bound, end, name)
            grouper.add(info)
            end = _data_end(info)
            # tarfile keeps every member it read (typeshed omits the attribute); WebDataset
            # clears the list the same way.
            tar.members = []  # type: ignore[attr-defined]
        stopped = tar.offset
    except MouthguardError:
        raise
    except Exception as exc:  # noqa: BLE001 - tarfile's errors on hostile bytes are many kinds
        raise AdoptionError(f"{name}: not a readable tar: {_why(stream, exc)}") from None
    grouper.flush()
    _check_end(stream, stopped, size, name)
    if end > stream.position:  # only where the size was not known: checked per member otherwise
        raise AdoptionError(
            f"{name}: the last member's data runs past the end of the tar ({stream.position} bytes)"
        )
    if not grouper.samples:
        raise AdoptionError(f"{name}: holds no sample WebDataset would yield")
    return TarScan(stream.sha.hexdigest(), tuple(grouper.samples), stream.position)


def _why(stream: _Stream, exc: Exception) -> str:
    head = bytes(stream.head)
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            if kind == "gzip":
                return "it is gzip-compressed: name it .tar.gz or .tgz to index it as such"
            return (
                f"it is {kind}-compressed; only plain and gzip-compressed tars can be "
                "indexed (recompress it with gzip, or store it uncompressed)"
            )
    return f"{type(exc).__name__}: {exc}"


def _check_end(stream: _Stream, stopped: int, size: int | None, name: str) -> None:
    """Everything from where tarfile stopped to the end of the file must be zeros."""
    seen = stream.position - len(stream.tail)
    if stopped < seen:  # never: tarfile reads ahead by one buffer only
        raise AdoptionError(f"{name}: tarfile stopped at byte {stopped}, out of view")
    if any(stream.tail[stopped - seen :]):
        raise AdoptionError(_garbage(name, stopped))
    for piece in stream.rest():
        if any(piece):
            raise AdoptionError(_garbage(name, stopped))
    if size is not None and stream.position != size:
        raise AdoptionError(f"{name}: read {stream.position} bytes, expected {size}")


def _garbage(name: str, at: int) -> str:
    return (
        f"{name}: unreadable tar data from byte {at} on (tarfile and WebDataset stop "
        "reading there and would silently drop the rest)"
    )
