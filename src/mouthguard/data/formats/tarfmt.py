"""The tar bytes of a shard: deterministic USTAR members, written and checked without tarfile's I/O.

A shard is exactly what ``tarfile.open(mode="w", format=tarfile.USTAR_FORMAT)``
writes for the same members with fixed metadata (mtime 0, uid/gid 0, empty
uname/gname, mode 0644, regular files): per member a 512-byte header from
:meth:`tarfile.TarInfo.tobuf`, the data, zero padding to 512 bytes; at the end
two zero blocks and zero padding to a 10240-byte record. The same members
therefore always give the same bytes, and any tar reader (WebDataset included)
reads them. The writer only needs the header bytes, so it streams members
without a ``TarFile`` and knows every offset as it goes.

USTAR has no extended headers, so one member is always exactly one header
block: a sample's index entry can be checked against its header cheaply
(:func:`header_problem`). The price is USTAR's name limit: a member name must
split at a ``/`` into at most 155 + 100 bytes, which bounds keys (about 95 bytes
for a key without ``/``); longer keys are refused when written.
"""

from __future__ import annotations

import tarfile

from mouthguard.errors import SampleError

BLOCK = tarfile.BLOCKSIZE  # 512
RECORD = tarfile.RECORDSIZE  # 10240: tarfile pads the archive to whole records
#: USTAR's size field holds 11 octal digits.
MAX_MEMBER_SIZE = 8**11 - 1
_ZEROS = bytes(2 * RECORD)  # the longest run of zeros a shard needs: its end (< 2 records)
_MAGIC = b"ustar\x0000"


def padding(size: int) -> int:
    """Zero bytes that follow ``size`` bytes of member data (to a whole block)."""
    return -size % BLOCK


def member_header(name: str, size: int) -> bytes:
    """The 512-byte USTAR header of a regular file ``name`` of ``size`` bytes.

    Raises:
        SampleError: the name does not fit a USTAR header, or the member is too large.
    """
    if not 0 <= size <= MAX_MEMBER_SIZE:
        raise SampleError(f"member {name!r} is {size} bytes; a tar member holds at most 8 GiB")
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    try:
        header = info.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict")
    except ValueError as exc:  # "name is too long" and friends
        raise SampleError(
            f"member name {name!r} does not fit a USTAR tar header ({exc}): shorten the key "
            "(at most 100 bytes after its last '/', 155 before it)"
        ) from None
    assert len(header) == BLOCK  # USTAR: no extended headers, ever
    return header


def zeros(count: int) -> memoryview:
    """A read-only view of ``count`` zero bytes (``count`` < two records)."""
    if not 0 <= count <= len(_ZEROS):
        raise ValueError(f"{count} zero bytes requested; at most {len(_ZEROS)}")
    return memoryview(_ZEROS)[:count]


def archive_end(size_so_far: int) -> int:
    """Zero bytes that end an archive of ``size_so_far`` bytes, as ``tarfile`` writes them.

    Two zero blocks, then padding to a whole record.
    """
    end = size_so_far + 2 * BLOCK
    return 2 * BLOCK + (-end % RECORD)


def _octal(field: bytes) -> int | None:
    text = field.rstrip(b"\x00 ").lstrip(b" ")
    if not text or any(c not in b"01234567" for c in text):
        return None
    return int(text, 8)


def header_problem(block: bytes | memoryview, name: str, size: int) -> str | None:
    """Why ``block`` is not the USTAR header of regular file ``name`` of ``size`` bytes.

    Returns None when it is. Checks the magic, the header checksum, the type, the
    name (prefix + name fields) and the size, so an index that points anywhere
    but at the member it names is caught before the member's bytes are used.
    """
    raw = bytes(block)
    if len(raw) != BLOCK or raw[257:265] != _MAGIC:
        return "no USTAR header where the index puts one"
    stored = _octal(raw[148:156])
    if stored is None or stored != sum(raw[:148]) + 8 * 32 + sum(raw[156:]):
        return "tar header checksum mismatch"
    if raw[156:157] not in (b"0", b"\x00"):
        return "tar member is not a regular file"
    prefix, base = raw[345:500].rstrip(b"\x00"), raw[0:100].rstrip(b"\x00")
    found = (prefix + b"/" + base) if prefix else base
    if found != name.encode("utf-8"):
        return f"tar header names {found[:120]!r}, the index {name!r}"
    if _octal(raw[124:136]) != size:
        return f"tar header size differs from the index's {size} for {name!r}"
    return None


def member_mismatch(block: bytes | memoryview, name: bytes, size: int) -> str | None:
    """Why ``block`` is not the header of member ``name`` (UTF-8) of ``size`` bytes.

    The reader's per-sample check of a *verified* packed shard: the shard's bytes
    already matched the manifest's sha256, so the header's own checksum adds
    nothing; what is left to catch is an index that points anywhere but at the
    member it names -- the magic, the type, the name and the size. The size field
    is first compared with the one this package's writer produces (one bytes
    compare); any other spelling of a number is parsed as :func:`header_problem`
    does. None when it is the member's header.
    """
    raw = bytes(block)
    if len(raw) != BLOCK or raw[257:265] != _MAGIC:
        return "no USTAR header where the index puts one"
    if raw[156:157] not in (b"0", b"\x00"):
        return "tar member is not a regular file"
    prefix, base = raw[345:500].rstrip(b"\x00"), raw[0:100].rstrip(b"\x00")
    found = (prefix + b"/" + base) if prefix else base
    if found != name:
        return f"tar header names {found[:120]!r}, the index {name.decode(errors='replace')!r}"
    if raw[124:136] != b"%011o\x00" % size and _octal(raw[124:136]) != size:
        return (
            f"tar header size differs from the index's {size} for {name.decode(errors='replace')!r}"
        )
    return None
