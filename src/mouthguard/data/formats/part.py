"""A part of a data file that the manifest gives a sha256 of: the unit verified before use."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """Bytes of a data file the manifest gives a sha256 of: a whole shard, or a byte range.

    Attributes:
        name: the data file's name (for messages and ``ShardDamagedError.shard``).
        what: what the bytes are, for messages (``shard``, ``footer``, ``row group 3``).
        file_size: the whole file's size, as the manifest records it.
        offset: where the bytes start in the file.
        size: how many.
        sha256: their sha256.
    """

    name: str
    what: str
    file_size: int
    offset: int
    size: int
    sha256: str
