"""Streaming checksums for files and manifests.

xxh3-128 is the integrity checksum on every file: it runs at tens of GiB/s, so
verification is cheap enough to do on every save and load. sha256 is optional
tamper evidence (about 15x slower). Digests are written ``<algorithm>:<hex>`` so
a manifest says which function produced them.

:func:`checksums_disabled` exists for the benchmarks alone (the cost of checksums
is a save with them over the same save without); no real save may use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator

import xxhash

from mouthguard.errors import FormatError

XXH3_128 = "xxh3-128"
SHA256 = "sha256"
_HEX_LENGTH = {XXH3_128: 32, SHA256: 64}
_DIGEST = re.compile(r"(xxh3-128|sha256):([0-9a-f]+)")

#: How many :func:`checksums_disabled` blocks are open (process-wide, every thread).
_disabled = [0]


@contextlib.contextmanager
def checksums_disabled() -> Iterator[None]:
    """Make new :class:`StreamHasher` objects skip hashing, for the benchmarks only.

    For measuring the cost of checksums only; never use it in a real save. Inside
    the block every hasher created (in any thread) counts bytes but hashes nothing,
    and its digests are well-formed placeholders (all zeros) that match no real
    data: a checkpoint saved this way fails verification on every load.
    """
    _disabled[0] += 1
    try:
        yield
    finally:
        _disabled[0] -= 1


class StreamHasher:
    """Incremental hasher producing ``algorithm:hex`` digests.

    Args:
        with_sha256: also compute sha256 over the same bytes.
    """

    def __init__(self, *, with_sha256: bool = False) -> None:
        self._xxh = xxhash.xxh3_128()
        self._sha = hashlib.sha256() if with_sha256 else None
        # Decided once, so a hasher never mixes hashed and skipped bytes.
        self._skip = _disabled[0] > 0
        self.nbytes = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Feed the next bytes, in file order."""
        if not self._skip:
            self._xxh.update(data)
            if self._sha is not None:
                self._sha.update(data)
        self.nbytes += memoryview(data).nbytes

    @property
    def xxh3(self) -> str:
        """The ``xxh3-128:<hex>`` digest of everything fed so far."""
        if self._skip:
            return f"{XXH3_128}:{'0' * _HEX_LENGTH[XXH3_128]}"
        return f"{XXH3_128}:{self._xxh.hexdigest()}"

    @property
    def sha256(self) -> str | None:
        """The ``sha256:<hex>`` digest, or None when not requested."""
        if self._sha is None:
            return None
        if self._skip:
            return f"{SHA256}:{'0' * _HEX_LENGTH[SHA256]}"
        return f"{SHA256}:{self._sha.hexdigest()}"


def xxh3_digest(data: bytes | bytearray | memoryview) -> str:
    """Return the ``xxh3-128:<hex>`` digest of ``data``."""
    return f"{XXH3_128}:{xxhash.xxh3_128_hexdigest(data)}"


def validate_digest(value: object, algorithm: str, where: str) -> str:
    """Return ``value`` if it is a well-formed ``algorithm:hex`` digest, else raise FormatError."""
    if not isinstance(value, str):
        raise FormatError(f"{where}: malformed {algorithm} digest {value!r}")
    match = _DIGEST.fullmatch(value)
    if (
        match is None
        or match.group(1) != algorithm
        or len(match.group(2)) != _HEX_LENGTH[algorithm]
    ):
        raise FormatError(f"{where}: malformed {algorithm} digest {value!r}")
    return value
