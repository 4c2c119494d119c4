"""Byte ranges of reads: the one check every tier applies to ``get`` and ``read_into``.

A tier never returns a short read silently: a range that is negative, reversed
or runs past the object's end is an error, with the same message on every tier.
"""

from __future__ import annotations

from mouthguard.errors import TierError


def check_range(key: str, size: int, start: int, end: int | None) -> int:
    """Validate the byte range ``[start, end)`` of an object of ``size`` bytes.

    Args:
        key: the object's key (for the error message).
        size: the object's size in bytes.
        start: first byte to read; must be ``>= 0``.
        end: one past the last byte; ``None`` means ``size``. Must satisfy
            ``start <= end <= size``.

    Returns:
        The effective ``end``.

    Raises:
        TierError: the range is negative, reversed or runs past the object's end.
            A short read is never returned silently.
    """
    stop = size if end is None else end
    if start < 0 or stop < start or stop > size:
        raise TierError(
            f"invalid byte range [{start}, {end}) for {key!r}: the object has {size} bytes"
        )
    return stop
