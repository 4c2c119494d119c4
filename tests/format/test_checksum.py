"""Tests of the streaming hasher, and of the benchmark-only switch that disables it."""

from __future__ import annotations

import hashlib

from mouthguard.format.checksum import (
    SHA256,
    XXH3_128,
    StreamHasher,
    checksums_disabled,
    validate_digest,
    xxh3_digest,
)

DATA = [b"header", bytearray(b"x" * 5000), memoryview(b"tail")]
WHOLE = b"".join(bytes(d) for d in DATA)


def _fed(**kwargs: bool) -> StreamHasher:
    hasher = StreamHasher(**kwargs)
    for chunk in DATA:
        hasher.update(chunk)
    return hasher


def test_streamed_digests_equal_the_one_shot_digests() -> None:
    hasher = _fed(with_sha256=True)
    assert hasher.nbytes == len(WHOLE)
    assert hasher.xxh3 == xxh3_digest(WHOLE)
    assert hasher.sha256 == f"{SHA256}:{hashlib.sha256(WHOLE).hexdigest()}"
    assert _fed().sha256 is None


def test_disabled_hashers_count_bytes_and_give_wellformed_placeholders() -> None:
    with checksums_disabled():
        hasher = _fed(with_sha256=True)
        plain = _fed()
    assert hasher.nbytes == len(WHOLE)  # the writer's size check still holds
    assert hasher.xxh3 == f"{XXH3_128}:{'0' * 32}" != xxh3_digest(WHOLE)
    assert hasher.sha256 == f"{SHA256}:{'0' * 64}"
    assert validate_digest(hasher.xxh3, XXH3_128, "x") == hasher.xxh3
    assert validate_digest(hasher.sha256, SHA256, "x") == hasher.sha256
    assert plain.sha256 is None


def test_the_switch_is_decided_per_hasher_and_undone_on_exit() -> None:
    with checksums_disabled():
        inside = StreamHasher()
        with checksums_disabled():
            pass
        still_inside = StreamHasher()  # leaving a nested block keeps the outer one
    after = StreamHasher()
    for hasher in (inside, still_inside, after):
        hasher.update(WHOLE)
    assert inside.xxh3 == still_inside.xxh3 == f"{XXH3_128}:{'0' * 32}"
    assert after.xxh3 == xxh3_digest(WHOLE)
